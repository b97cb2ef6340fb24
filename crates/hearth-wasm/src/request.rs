//! What JS sends: load options and a request (the prompt, as text or chat messages, and the
//! request's other fields). In the browser they arrive as JS objects, decoded by `js.rs` straight
//! into these serde types; natively (the host tests, `native-runner`'s surfaces test) the same
//! types are read from JSON text. The prompt and the request are the core's one schema
//! ([`hearth_core::request`]), checked by its one validation, so the browser refuses and accepts
//! exactly what `hearth serve` does. Parsed strictly: a typo is reported, never ignored.

use crate::error::{Result, WasmError};
use hearth_core::engine::{EngineOptions, GenerateOptions};
use hearth_core::kv::KvType;
use hearth_core::request::{Endpoint, Prompt, Request, Speculation, ValidGeneration};
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

/// The prompt of a `generate` call: a JSON string (a completion prompt, tokenized with the model's
/// BOS default) or a JSON array of OpenAI-shaped chat messages (rendered with its chat template).
pub fn parse_prompt(json: &str) -> Result<Prompt> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| WasmError::bad_request("prompt", format!("not JSON: {e}")))?;
    let request = match value {
        serde_json::Value::String(_) => {
            Request { prompt: Some(value), ..Request::default() }.validate(Endpoint::Completions, 0)
        }
        serde_json::Value::Array(messages) => {
            Request { messages: Some(messages), ..Request::default() }.validate(Endpoint::Chat, 0)
        }
        other => {
            return Err(WasmError::bad_request(
                "prompt",
                format!("expected a string or an array of messages, got {}", json_kind(&other)),
            ))
        }
    };
    Ok(request?.prompt)
}

/// The endpoint of a request kind as the JS API names it: "chat" (messages) or "text" (a
/// completion prompt).
pub fn endpoint(kind: &str) -> Result<Endpoint> {
    match kind {
        "chat" => Ok(Endpoint::Chat),
        "text" => Ok(Endpoint::Completions),
        other => Err(WasmError::bad_request("request kind", format!("expected 'chat' or 'text', got '{other}'"))),
    }
}

/// A whole request of kind "chat" (messages) or "text" (a completion prompt) as JSON text: see
/// [`split_request`].
pub fn parse_request(kind: &str, json: &str) -> Result<(Prompt, RequestOptions)> {
    let endpoint = endpoint(kind)?;
    split_request(endpoint, Request::from_json(json.as_bytes())?)
}

/// A whole request for `endpoint`, however it was decoded: checked by the core's validation, then
/// split into the prompt and the rest.
pub fn split_request(endpoint: Endpoint, request: Request) -> Result<(Prompt, RequestOptions)> {
    let valid = request.validate(endpoint, 0)?;
    let options =
        RequestOptions { generation: valid.generation, endpoint: Some(endpoint), seed_given: request.seed.is_some() };
    Ok((valid.prompt, options))
}

/// The rest of a request (sampling, limits, stop strings, predicted output, speculative decoding,
/// choices, echo), as the OpenAI request object names it, checked by the core's validation.
#[derive(Debug, Clone)]
pub struct RequestOptions {
    generation: ValidGeneration,
    /// The request's kind, which says how `logprobs` and `echo` read and how they are reported.
    endpoint: Option<Endpoint>,
    /// Whether the request chose its seed (else each call chooses one).
    seed_given: bool,
}

impl Default for RequestOptions {
    fn default() -> Self {
        let generation = Request::default().validate_generation(None, 0).expect("the empty request is valid");
        RequestOptions { generation, endpoint: None, seed_given: false }
    }
}

impl RequestOptions {
    /// The options of a bare generation (`generate(prompt, options)`): no request kind, so no
    /// `logprobs` or `echo`.
    pub fn parse(json: &str) -> Result<Self> {
        if json.trim().is_empty() {
            return Ok(RequestOptions::default());
        }
        let request = Request::from_json(json.as_bytes())?;
        if request.messages.is_some() || request.prompt.is_some() {
            return Err(WasmError::bad_request(
                "generation options",
                "the prompt (messages or prompt) goes in the prompt argument",
            ));
        }
        let generation = request.validate_generation(None, 0)?;
        Ok(RequestOptions { generation, endpoint: None, seed_given: request.seed.is_some() })
    }

    /// The request's kind, when it came whole ([`split_request`]).
    pub fn endpoint(&self) -> Option<Endpoint> {
        self.endpoint
    }

    /// The generation options after a prompt of `prompt_len` tokens in a context of `n_ctx`, as
    /// the server makes them: `max_tokens` absent = up to the end of the context, past it = a
    /// context overflow; `seed` absent = `default_seed`.
    pub fn generate_options(&self, prompt_len: usize, n_ctx: usize, default_seed: u64) -> Result<GenerateOptions> {
        let mut options = self.generation.options_for(prompt_len, n_ctx)?;
        if !self.seed_given {
            options.sampling.seed = default_seed;
        }
        Ok(options)
    }

    /// Choices to generate (`n`; 1 unless asked).
    pub fn n_choices(&self) -> usize {
        self.generation.n
    }

    /// The tools a chat request offers the model.
    pub fn tools(&self) -> Option<&hearth_core::request::ToolRequest> {
        self.generation.tools.as_ref()
    }

    /// Whether the answer starts with the prompt (completions' `echo`).
    pub fn echo(&self) -> bool {
        self.generation.echo
    }

    /// The speculative decoding asked for.
    pub fn speculative(&self) -> Option<&Speculation> {
        self.generation.speculative.as_ref()
    }

    /// The predicted output's text (drafts are copied from it).
    pub fn prediction(&self) -> Option<&str> {
        self.generation.prediction.as_deref()
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
