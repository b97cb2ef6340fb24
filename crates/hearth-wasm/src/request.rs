//! What JS sends: load options, the prompt (text or chat messages) and sampling options, as JSON.
//! Parsed strictly (unknown fields are errors) so a typo is reported instead of silently ignored.

use crate::error::{Result, WasmError};
use hearth_core::engine::{EngineOptions, GenerateOptions};
use hearth_core::kv::KvType;
use hearth_core::sampling::SamplingParams;
use hearth_core::speculative::DEFAULT_MIN_CONFIDENCE;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadOptions {
    /// Context size in tokens; 0 or absent = min(training context, 4096).
    #[serde(default)]
    pub n_ctx: usize,
    /// Prompt tokens per forward pass.
    #[serde(default)]
    pub prefill_chunk: Option<usize>,
    /// KV storage type: "f16" (default), "q8_0", "q4_0" or "f32".
    #[serde(default)]
    pub kv_type: Option<String>,
    /// Bytes for the KV cache (default: one full context, shared by the batch).
    #[serde(default)]
    pub kv_memory: Option<u64>,
    /// Requests evaluated together in one forward pass (default [`crate::host::DEFAULT_MAX_BATCH`]).
    #[serde(default)]
    pub max_batch: Option<usize>,
}

impl LoadOptions {
    pub fn parse(json: &str) -> Result<Self> {
        if json.trim().is_empty() {
            return Ok(LoadOptions::default());
        }
        serde_json::from_str(json).map_err(|e| WasmError::bad_request("load options", e.to_string()))
    }

    pub fn engine_options(&self) -> Result<EngineOptions> {
        let defaults = EngineOptions::default();
        let prefill_chunk = self.prefill_chunk.unwrap_or(defaults.prefill_chunk);
        if prefill_chunk == 0 {
            return Err(WasmError::bad_request("load options", "prefill_chunk must be at least 1"));
        }
        let kv_type = match &self.kv_type {
            Some(name) => KvType::parse(name).map_err(|e| WasmError::bad_request("load options", e.to_string()))?,
            None => defaults.kv_type,
        };
        Ok(EngineOptions { n_ctx: self.n_ctx, prefill_chunk, kv_type, kv_memory: self.kv_memory, ..defaults })
    }
}

/// The prompt: a JSON string (raw completion, tokenized with the model's BOS default) or a JSON
/// array of OpenAI-shaped chat messages (rendered with the model's chat template).
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Messages(serde_json::Value),
}

impl PromptInput {
    pub fn parse(json: &str) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| WasmError::bad_request("prompt", format!("not JSON: {e}")))?;
        match value {
            serde_json::Value::String(text) => Ok(PromptInput::Text(text)),
            serde_json::Value::Array(ref messages) => {
                if messages.is_empty() {
                    return Err(WasmError::bad_request("messages", "the list of messages is empty"));
                }
                for (index, message) in messages.iter().enumerate() {
                    let role = message.get("role").and_then(|r| r.as_str());
                    if role.is_none() {
                        return Err(WasmError::bad_request(
                            "messages",
                            format!("message {index} has no string 'role' (expected an object like {{\"role\": \"user\", \"content\": \"...\"}})"),
                        ));
                    }
                }
                Ok(PromptInput::Messages(value))
            }
            other => Err(WasmError::bad_request(
                "prompt",
                format!("expected a string or an array of messages, got {}", json_kind(&other)),
            )),
        }
    }
}

/// `stop`: one string or a list of strings (OpenAI accepts both).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// Sampling and length options, named as in the OpenAI API where one exists.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestOptions {
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<StopField>,
    #[serde(default)]
    pub ignore_eos: bool,
    /// Speculative decoding, as `hearth run --lookup` / `--draft-model` / `--draft-tokens`.
    pub speculative: Option<SpeculativeRequest>,
}

/// `{"mode": "lookup" | "draft-model", "draft_tokens": K, "draft_min_p": P, "fixed_length": bool,
/// "lookup": bool}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeRequest {
    pub mode: SpeculativeMode,
    /// Most draft tokens per step (the length adapts within 0..=K); default 5 as the CLI.
    pub draft_tokens: Option<usize>,
    /// Draft and verify K tokens every step instead of adapting (`--fixed-draft-length`).
    #[serde(default)]
    pub fixed_length: bool,
    /// Draft model: stop drafting where its top token is less likely than this (0 drafts the full
    /// length), as `hearth run --draft-min-p`; default [`DEFAULT_MIN_CONFIDENCE`].
    pub draft_min_p: Option<f32>,
    /// Draft model: prompt lookup first, the draft model where nothing matches (`hearth run
    /// --lookup --draft-model`).
    #[serde(default)]
    pub lookup: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpeculativeMode {
    /// Drafts copied from the prompt and output (no model).
    Lookup,
    /// Drafts from the draft model loaded with the engine.
    DraftModel,
}

/// Draft tokens per step when a request does not say.
pub const DEFAULT_DRAFT_TOKENS: usize = 5;

impl SpeculativeRequest {
    pub fn draft_tokens(&self) -> usize {
        self.draft_tokens.unwrap_or(DEFAULT_DRAFT_TOKENS).max(1)
    }

    pub fn draft_min_p(&self) -> f32 {
        self.draft_min_p.unwrap_or(DEFAULT_MIN_CONFIDENCE)
    }
}

impl RequestOptions {
    pub fn parse(json: &str) -> Result<Self> {
        if json.trim().is_empty() {
            return Ok(RequestOptions::default());
        }
        serde_json::from_str(json).map_err(|e| WasmError::bad_request("generation options", e.to_string()))
    }

    /// Checked [`GenerateOptions`]; `max_tokens` absent = up to the end of the context
    /// (`remaining_context`), `seed` absent = `default_seed`.
    pub fn generate_options(&self, remaining_context: usize, default_seed: u64) -> Result<GenerateOptions> {
        let bad = |message: String| WasmError::bad_request("generation options", message);
        let temperature = self.temperature.unwrap_or(1.0);
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(bad(format!("temperature must be a finite number >= 0, got {temperature}")));
        }
        for (name, value) in [("top_p", self.top_p), ("min_p", self.min_p)] {
            if let Some(v) = value {
                if !(0.0..=1.0).contains(&v) {
                    return Err(bad(format!("{name} must be in [0, 1], got {v}")));
                }
            }
        }
        let repeat_penalty = self.repeat_penalty.unwrap_or(1.0);
        if !(repeat_penalty.is_finite() && repeat_penalty > 0.0) {
            return Err(bad(format!("repeat_penalty must be > 0, got {repeat_penalty}")));
        }
        for (name, value) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if let Some(v) = value {
                if !(-2.0..=2.0).contains(&v) {
                    return Err(bad(format!("{name} must be in [-2, 2], got {v}")));
                }
            }
        }
        let max_tokens = match self.max_tokens {
            Some(0) => return Err(bad("max_tokens must be at least 1".into())),
            Some(n) => n,
            None => remaining_context.max(1),
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(list)) => list.clone(),
        };
        if let Some(SpeculativeRequest { draft_tokens: Some(k), .. }) = &self.speculative {
            if !(1..=64).contains(k) {
                return Err(bad(format!("speculative.draft_tokens must be in [1, 64], got {k}")));
            }
        }
        if let Some(SpeculativeRequest { draft_min_p: Some(p), .. }) = &self.speculative {
            if !(0.0..=1.0).contains(p) {
                return Err(bad(format!("speculative.draft_min_p must be in [0, 1], got {p}")));
            }
        }
        if stop.iter().any(|s| s.is_empty()) {
            return Err(bad("stop strings must not be empty".into()));
        }
        Ok(GenerateOptions {
            max_tokens,
            sampling: SamplingParams {
                temperature,
                top_k: self.top_k.unwrap_or(0),
                top_p: self.top_p.unwrap_or(1.0),
                min_p: self.min_p.unwrap_or(0.0),
                repeat_penalty,
                presence_penalty: self.presence_penalty.unwrap_or(0.0),
                frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
                seed: self.seed.unwrap_or(default_seed),
                ..SamplingParams::default()
            },
            stop,
            ignore_eos: self.ignore_eos,
        })
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
