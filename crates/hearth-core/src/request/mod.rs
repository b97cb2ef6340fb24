//! The one request schema of every surface: `hearth serve`'s OpenAI endpoints, the browser's
//! `engine.chat.completions.create` / `engine.completions.create` (hearth-llm forwards the request
//! as JSON) and `hearth run`, whose flags fill the same fields. One validation turns a request into
//! what the engine runs, so the same request gives the same tokens on every surface. A parameter
//! hearth does not implement is refused by name, never ignored: a client asking for something
//! gets it or a clear error.
//!
//! Names are OpenAI's, plus the extensions vLLM and llama-server accept (`top_k`, `min_p`,
//! `repetition_penalty` or `repeat_penalty`, `repeat_last_n`, `ignore_eos`) and hearth's own
//! `speculative`. `docs/REQUESTS.md` lists every parameter with its range and default.

mod history;
mod prompt;
pub mod response;
mod structured;
#[cfg(test)]
mod tests;
mod tools;

pub use history::{TokenHistory, HISTORY_CAPACITY};
pub use prompt::{templated_add_bos, Prompt};
pub use tools::{Function, ToolChoice, ToolRequest};

use crate::engine::GenerateOptions;
use crate::error::CoreError;
use crate::sampling::{SamplingParams, MAX_TOP_LOGPROBS};
use crate::speculative::{SpeculativeOptions, DEFAULT_MIN_CONFIDENCE};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Which endpoint a request came to: chat takes `messages`, completions a `prompt`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// The ranges requests are checked against.
pub const MAX_TEMPERATURE: f32 = 2.0;
pub const MAX_STOP_STRINGS: usize = 16;
/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: usize = 16;
/// Most draft tokens one speculative step may verify (the KV rollback margin).
pub const MAX_DRAFT_TOKENS: usize = crate::runner::ROLLBACK_MARGIN;

/// `stop`: one string or a list of them.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    /// Random padding of streamed events against length side channels: nothing to hide on a
    /// local server; accepted.
    pub include_obfuscation: Option<bool>,
}

/// How a request drafts tokens for speculative decoding (hearth's extension; the browser's
/// `speculative: { mode, draftTokens, ... }`, `hearth run --lookup` / `--draft-model`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeRequest {
    pub mode: SpeculativeMode,
    /// Most draft tokens per step (the length adapts within 0..=K); default: 15 for prompt
    /// lookup (drafting is free), 5 for a draft model.
    #[serde(alias = "draftTokens")]
    pub draft_tokens: Option<i64>,
    /// Draft and verify K tokens every step instead of adapting.
    #[serde(default, alias = "fixedLength")]
    pub fixed_length: bool,
    /// Draft model: stop drafting where its top token is less likely than this (0 drafts the
    /// full length).
    #[serde(alias = "draftMinP")]
    pub draft_min_p: Option<f32>,
    /// Draft model: prompt lookup first, the draft model where nothing matches.
    #[serde(default)]
    pub lookup: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpeculativeMode {
    /// Drafts copied from the prompt and output (no model).
    Lookup,
    /// Drafts from the draft model loaded with the engine.
    DraftModel,
}

/// A validated [`SpeculativeRequest`].
#[derive(Clone, Debug, PartialEq)]
pub struct Speculation {
    pub mode: SpeculativeMode,
    /// Draft model: prompt lookup first.
    pub lookup_first: bool,
    pub options: SpeculativeOptions,
    /// Draft model: the confidence below which it stops drafting.
    pub draft_min_p: f32,
}

/// A completion or chat request as clients send it. Every field is optional here; [`Request::validate`]
/// says which are required and checks the values.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub model: Option<String>,
    pub messages: Option<Vec<Value>>,
    pub prompt: Option<Value>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    #[serde(alias = "repeat_penalty")]
    pub repetition_penalty: Option<f32>,
    /// How many recent tokens the penalties look at: -1 (default) the whole history, 0 none.
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub ignore_eos: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// OpenAI's predicted output: `{"type": "content", "content": text or text parts}`.
    pub prediction: Option<Value>,
    pub speculative: Option<SpeculativeRequest>,
    /// An end-user id (OpenAI's abuse monitoring): accepted, nothing to do with it locally.
    pub user: Option<String>,
    /// OpenAI's other bookkeeping fields, meaningless for a local engine and accepted as such: a
    /// safety id (like `user`), a prompt-cache routing key (the prefix cache needs none), a
    /// service tier (there is one), metadata of stored completions. `store: true` is refused.
    pub safety_identifier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub service_tier: Option<String>,
    pub metadata: Option<Value>,
    pub store: Option<bool>,
    /// Chat: `true` for the tokens' log-probabilities, `top_logprobs` (0 … 20) alternatives
    /// each; completions: the number of alternatives (0 … 20).
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<Value>,
    /// Choices to generate for the prompt, sharing its KV blocks (1 … 16).
    pub n: Option<i64>,
    /// Completions: the prompt's text before the completion's, and with `logprobs` the prompt
    /// tokens' log-probabilities before the completion's.
    pub echo: Option<Value>,
    /// Structured output (see [`structured`]): OpenAI's response format, vLLM's
    /// `structured_outputs`, llama-server's `json_schema` and `grammar`.
    pub response_format: Option<Value>,
    pub structured_outputs: Option<Value>,
    pub json_schema: Option<Value>,
    pub grammar: Option<Value>,
    /// Chat: tool calling (see [`tools`]).
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
    // OpenAI parameters hearth does not implement yet. Parsed so that a request using them is
    // refused by name; their neutral values are accepted.
    pub best_of: Option<Value>,
    pub suffix: Option<Value>,
}

/// What a valid request asks the engine for.
#[derive(Clone, Debug)]
pub struct ValidRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    pub generation: ValidGeneration,
}

/// What a valid request asks the engine for, but its prompt: the limits, the generation options
/// and how the answer is delivered.
#[derive(Clone, Debug)]
pub struct ValidGeneration {
    /// `None`: up to the end of the context (see [`ValidGeneration::options_for`]).
    pub max_tokens: Option<usize>,
    /// The name the client gave the limit (`max_tokens` or `max_completion_tokens`), for errors.
    pub max_tokens_param: &'static str,
    /// The generation options with `max_tokens` left at 0.
    pub options: GenerateOptions,
    pub stream: bool,
    pub include_usage: bool,
    /// Text the answer is expected to repeat: drafts are copied from it.
    pub prediction: Option<String>,
    pub speculative: Option<Speculation>,
    /// Choices to generate (`n`); choice `i` samples with the seed + `i`.
    pub n: usize,
    /// Completions' `echo`: the answer starts with the prompt (and its tokens' log-probabilities
    /// when `options.prompt_logprobs` asks for them).
    pub echo: bool,
    /// Chat: the tools offered to the model (rendered by its template, their calls constrained
    /// and parsed: [`ToolRequest::apply`]).
    pub tools: Option<ToolRequest>,
}

impl ValidGeneration {
    /// The generation options for a prompt of `prompt_len` tokens in a context of `n_ctx`:
    /// `max_tokens` as asked, else the rest of the context. A prompt that leaves no room, or a
    /// `max_tokens` past the context, is a [`CoreError::ContextOverflow`].
    pub fn options_for(&self, prompt_len: usize, n_ctx: usize) -> Result<GenerateOptions, CoreError> {
        let max_tokens = completion_limit(self.max_tokens, prompt_len, n_ctx)?;
        Ok(GenerateOptions { max_tokens, ..self.options.clone() })
    }
}

/// The tokens a completion may generate after a prompt of `prompt_len` in a context of `n_ctx`:
/// `max_tokens` as asked, else the rest of the context. A prompt that leaves no room, or a
/// `max_tokens` past the context, is a [`CoreError::ContextOverflow`] on every surface.
pub fn completion_limit(max_tokens: Option<usize>, prompt_len: usize, n_ctx: usize) -> Result<usize, CoreError> {
    let room = n_ctx.saturating_sub(prompt_len);
    match max_tokens {
        _ if room == 0 => Err(CoreError::ContextOverflow { needed: prompt_len + 1, capacity: n_ctx }),
        Some(n) if n > room => Err(CoreError::ContextOverflow { needed: prompt_len + n, capacity: n_ctx }),
        Some(n) => Ok(n),
        None => Ok(room),
    }
}

/// A refusal naming the parameter.
fn bad(param: &str, message: impl Into<String>) -> CoreError {
    CoreError::BadRequest { param: Some(param.to_string()), message: message.into() }
}

impl Request {
    /// Parses a JSON request; a value of the wrong type names its parameter
    /// ("temperature: invalid type: string \"hot\", expected f32").
    pub fn from_json(json: &[u8]) -> Result<Request, CoreError> {
        let mut de = serde_json::Deserializer::from_slice(json);
        let request: Request = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            // A value of the wrong type or an unknown field has a parameter; broken JSON has none.
            let param = matches!(e.inner().classify(), serde_json::error::Category::Data)
                .then(|| path.split(['.', '[']).next().unwrap_or_default().to_string())
                .filter(|p| !p.is_empty());
            let message = match (&param, e.inner().classify()) {
                (Some(_), _) => format!("{path}: {}", e.inner()),
                (None, serde_json::error::Category::Data) => {
                    format!("The request must be a JSON object: {}", e.inner())
                }
                (None, _) => format!("The request is not valid JSON: {}", e.inner()),
            };
            CoreError::BadRequest { param, message }
        })?;
        de.end().map_err(|e| CoreError::BadRequest {
            param: None,
            message: format!("The request is not valid JSON: {e}"),
        })?;
        Ok(request)
    }

    /// Checks the request for `endpoint`; `default_seed` is used when it gives none.
    pub fn validate(&self, endpoint: Endpoint, default_seed: u64) -> Result<ValidRequest, CoreError> {
        let prompt = match endpoint {
            Endpoint::Chat => {
                if self.prompt.is_some() {
                    return Err(bad("prompt", "'prompt' belongs to completions; a chat request sends 'messages'."));
                }
                Prompt::from_messages(self.messages.as_deref())?
            }
            Endpoint::Completions => {
                if self.messages.is_some() {
                    return Err(bad(
                        "messages",
                        "'messages' belongs to chat completions; a completion request sends 'prompt'.",
                    ));
                }
                Prompt::from_completion(self.prompt.as_ref())?
            }
        };
        Ok(ValidRequest {
            model: self.model.clone(),
            prompt,
            generation: self.validate_generation(Some(endpoint), default_seed)?,
        })
    }

    /// Checks everything but the prompt: the request's generation as `endpoint` reads it, or
    /// (`None`) as a bare generation with no request kind, `hearth run`'s flags and the browser's
    /// `generate(prompt, options)`, where neither `echo` nor `logprobs` has a meaning.
    /// `default_seed` is used when it gives none.
    pub fn validate_generation(
        &self,
        endpoint: Option<Endpoint>,
        default_seed: u64,
    ) -> Result<ValidGeneration, CoreError> {
        let echo = self.echo_for(endpoint)?;
        let (max_tokens, mut options) = self.checked_options(default_seed)?;
        let max_tokens_param =
            if self.max_completion_tokens.is_some() { "max_completion_tokens" } else { "max_tokens" };
        if max_tokens == Some(0) && !echo {
            let message = match endpoint {
                Some(Endpoint::Completions) => {
                    format!("{max_tokens_param} must be at least 1 (0 goes with echo: the prompt scored alone).")
                }
                _ => format!("{max_tokens_param} must be at least 1."),
            };
            return Err(bad(max_tokens_param, message));
        }
        options.logprobs = self.logprobs_for(endpoint)?;
        options.prompt_logprobs = options.logprobs.filter(|_| echo);
        let speculative = self.speculation()?;
        let prediction = self.prediction_text()?;
        if prediction.is_some() && speculative.is_some() {
            return Err(bad(
                "prediction",
                "prediction drafts by prompt lookup on its own; send it without speculative, or speculative without it.",
            ));
        }
        let tools = self.tool_request()?;
        if tools.is_some() && endpoint == Some(Endpoint::Completions) {
            return Err(bad("tools", "tools belong to chat completions (the chat template renders them)."));
        }
        if tools.is_some() && options.grammar.is_some() {
            return Err(bad(
                "tools",
                "A request constrains its answer one way: tools, or a response format / grammar, not both.",
            ));
        }
        let stream = self.stream.unwrap_or(false);
        Ok(ValidGeneration {
            max_tokens,
            max_tokens_param,
            options,
            stream,
            include_usage: stream && self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
            prediction,
            speculative,
            n: self.choices()?,
            echo,
            tools,
        })
    }

    /// The choices asked for (`n`): 1 unless given, at most [`MAX_CHOICES`].
    pub fn choices(&self) -> Result<usize, CoreError> {
        match self.n {
            None => Ok(1),
            Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => Ok(n as usize),
            Some(n) => Err(bad("n", format!("n must be between 1 and {MAX_CHOICES}, got {n}."))),
        }
    }

    /// Whether the request echoes its prompt: completions only.
    fn echo_for(&self, endpoint: Option<Endpoint>) -> Result<bool, CoreError> {
        if !self.echo.as_ref().is_some_and(|v| !v.is_null() && *v != Value::Bool(false)) {
            return Ok(false);
        }
        match endpoint {
            Some(Endpoint::Chat) => {
                Err(bad("echo", "echo belongs to completions; a chat answer has no prompt text to repeat."))
            }
            None => Err(bad("echo", "echo belongs to completions requests: send it with a whole request.")),
            Some(Endpoint::Completions) => Ok(true),
        }
    }

    /// The length limit (`None`: the rest of the context; 0 allowed, for echo's prompt scoring)
    /// and the generation options (`max_tokens` 0, no log-probabilities) of the request.
    fn checked_options(&self, default_seed: u64) -> Result<(Option<usize>, GenerateOptions), CoreError> {
        self.refuse_unimplemented()?;
        let (max_tokens, max_param) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(n), _) => (Some(n), "max_completion_tokens"),
            (None, n) => (n, "max_tokens"),
        };
        let max_tokens = match max_tokens {
            Some(n) if n < 0 => return Err(bad(max_param, format!("{max_param} must be at least 1, got {n}."))),
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            None => None,
        };
        let repetition_penalty = self.repetition_penalty.unwrap_or(1.0);
        if !(repetition_penalty > 0.0 && repetition_penalty <= 100.0) {
            return Err(bad(
                "repetition_penalty",
                format!("repetition_penalty must be in (0, 100], got {repetition_penalty}."),
            ));
        }
        let repeat_last_n = match self.repeat_last_n {
            None | Some(-1) => usize::MAX,
            Some(n) if n < -1 => {
                return Err(bad(
                    "repeat_last_n",
                    format!("repeat_last_n must be -1 (the whole history), 0 (off) or more, got {n}."),
                ))
            }
            Some(n) => n as usize,
        };
        let sampling = SamplingParams {
            temperature: in_range(self.temperature, 1.0, 0.0, MAX_TEMPERATURE, "temperature")?,
            top_p: in_range(self.top_p, 1.0, 0.0, 1.0, "top_p")?,
            min_p: in_range(self.min_p, 0.0, 0.0, 1.0, "min_p")?,
            top_k: match self.top_k {
                Some(k) if k < 0 => return Err(bad("top_k", format!("top_k must be at least 0 (0 = off), got {k}."))),
                Some(k) => k as usize,
                None => 0,
            },
            repeat_penalty: repetition_penalty,
            repeat_last_n,
            presence_penalty: in_range(self.presence_penalty, 0.0, -2.0, 2.0, "presence_penalty")?,
            frequency_penalty: in_range(self.frequency_penalty, 0.0, -2.0, 2.0, "frequency_penalty")?,
            logit_bias: parse_logit_bias(self.logit_bias.as_ref())?,
            seed: self.seed.map(|s| s as u64).unwrap_or(default_seed),
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOP_STRINGS {
            return Err(bad(
                "stop",
                format!("At most {MAX_STOP_STRINGS} stop sequences are allowed, got {}.", stop.len()),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(bad("stop", "Stop sequences must not be empty."));
        }
        let options = GenerateOptions {
            max_tokens: 0,
            sampling,
            stop,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            logprobs: None,
            prompt_logprobs: None,
            grammar: self.grammar()?,
        };
        Ok((max_tokens, options))
    }

    /// How many alternatives per token the request wants with its tokens' log-probabilities
    /// (`None`: no log-probabilities), in the endpoint's terms: chat's `logprobs: true` with
    /// `top_logprobs: N`, completions' `logprobs: N`; a bare generation (no kind) has none to read.
    fn logprobs_for(&self, endpoint: Option<Endpoint>) -> Result<Option<usize>, CoreError> {
        let given = |v: &Option<Value>| v.clone().filter(|v| !v.is_null());
        let count = |v: &Value, param: &str| {
            v.as_u64()
                .filter(|&n| n as usize <= MAX_TOP_LOGPROBS)
                .map(|n| n as usize)
                .ok_or_else(|| bad(param, format!("{param} must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {v}.")))
        };
        match endpoint {
            None if given(&self.logprobs).is_some() || given(&self.top_logprobs).is_some() => Err(bad(
                "logprobs",
                "logprobs are read by the request's kind (chat or completions): send them with a whole request.",
            )),
            None => Ok(None),
            Some(Endpoint::Chat) => {
                let on = match given(&self.logprobs) {
                    None => false,
                    Some(Value::Bool(on)) => on,
                    Some(v) => {
                        return Err(bad(
                            "logprobs",
                            format!("logprobs is true or false in chat completions, got {v} (top_logprobs: N asks for alternatives)."),
                        ))
                    }
                };
                let top = given(&self.top_logprobs).map(|v| count(&v, "top_logprobs")).transpose()?;
                match (on, top) {
                    (false, Some(_)) => Err(bad("top_logprobs", "top_logprobs needs logprobs: true.")),
                    (false, None) => Ok(None),
                    (true, top) => Ok(Some(top.unwrap_or(0))),
                }
            }
            Some(Endpoint::Completions) => {
                if given(&self.top_logprobs).is_some() {
                    return Err(bad(
                        "top_logprobs",
                        "top_logprobs belongs to chat completions; a completion request sends logprobs: N (the alternatives per token).",
                    ));
                }
                match given(&self.logprobs) {
                    None | Some(Value::Bool(false)) => Ok(None),
                    Some(v) => count(&v, "logprobs").map(Some),
                }
            }
        }
    }

    /// The speculative decoding the request asks for, checked.
    pub fn speculation(&self) -> Result<Option<Speculation>, CoreError> {
        self.speculative.as_ref().map(validate_speculative).transpose()
    }

    /// The text of the request's predicted output, if it sends one.
    pub fn prediction_text(&self) -> Result<Option<String>, CoreError> {
        parse_prediction(self.prediction.as_ref())
    }

    /// OpenAI parameters with no implementation yet: refused unless they hold their neutral value.
    fn refuse_unimplemented(&self) -> Result<(), CoreError> {
        let unsupported = |param: &str, what: &str| bad(param, format!("{param} is not supported yet: {what}."));
        if self.best_of.as_ref().is_some_and(|v| !v.is_null() && v.as_i64() != Some(1)) {
            return Err(unsupported("best_of", "one candidate per request"));
        }
        if self.store == Some(true) {
            return Err(unsupported("store", "completions are not stored"));
        }
        if self.suffix.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(unsupported("suffix", "no insertion (fill-in-the-middle) completions"));
        }
        Ok(())
    }
}

fn in_range(value: Option<f32>, default: f32, low: f32, high: f32, param: &str) -> Result<f32, CoreError> {
    match value {
        None => Ok(default),
        Some(v) if (low..=high).contains(&v) => Ok(v),
        Some(v) => Err(bad(param, format!("{param} must be between {low} and {high}, got {v}."))),
    }
}

/// `{"token id": bias}` with biases in [-100, 100]; -100 bans a token in practice.
fn parse_logit_bias(bias: Option<&BTreeMap<String, f32>>) -> Result<BTreeMap<u32, f32>, CoreError> {
    let mut out = BTreeMap::new();
    for (token, &value) in bias.into_iter().flatten() {
        let id: u32 =
            token.parse().map_err(|_| bad("logit_bias", format!("logit_bias key '{token}' is not a token id.")))?;
        if !(-100.0..=100.0).contains(&value) {
            return Err(bad("logit_bias", format!("logit_bias values must be in [-100, 100], got {value}.")));
        }
        out.insert(id, value);
    }
    Ok(out)
}

/// `{"type": "content", "content": "..."}`, the content also as a list of text parts; null: none.
fn parse_prediction(prediction: Option<&Value>) -> Result<Option<String>, CoreError> {
    let invalid = |m: &str| bad("prediction", m);
    let Some(prediction) = prediction.filter(|p| !p.is_null()) else { return Ok(None) };
    if prediction.get("type").and_then(Value::as_str) != Some("content") {
        return Err(invalid("prediction must be {\"type\": \"content\", \"content\": ...}."));
    }
    match prediction.get("content") {
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                (Some("text"), Some(text)) => Ok(text),
                _ => Err(invalid("prediction content parts must be {\"type\": \"text\", \"text\": ...}.")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| Some(texts.concat())),
        _ => Err(invalid("prediction.content must be a string or a list of text parts.")),
    }
}

fn validate_speculative(s: &SpeculativeRequest) -> Result<Speculation, CoreError> {
    let defaults = match s.mode {
        SpeculativeMode::Lookup => SpeculativeOptions::lookup(),
        SpeculativeMode::DraftModel => SpeculativeOptions::default(),
    };
    let draft_tokens = match s.draft_tokens {
        None => defaults.max_draft_tokens,
        Some(k) if (1..=MAX_DRAFT_TOKENS as i64).contains(&k) => k as usize,
        Some(k) => {
            return Err(bad(
                "speculative",
                format!("speculative.draft_tokens (draftTokens) must be in [1, {MAX_DRAFT_TOKENS}], got {k}."),
            ))
        }
    };
    if s.mode == SpeculativeMode::Lookup && s.lookup {
        return Err(bad("speculative", "speculative.lookup goes with mode 'draft-model' (prompt lookup first, the draft model where nothing matches); mode 'lookup' is lookup alone."));
    }
    let draft_min_p = match (s.mode, s.draft_min_p) {
        (SpeculativeMode::Lookup, Some(_)) => {
            return Err(bad("speculative", "speculative.draft_min_p (draftMinP) applies to mode 'draft-model' (where the draft model stops drafting); mode 'lookup' has no draft model."))
        }
        (_, Some(p)) if !(0.0..=1.0).contains(&p) => return Err(bad("speculative", format!("speculative.draft_min_p (draftMinP) must be in [0, 1], got {p}."))),
        (_, p) => p.unwrap_or(DEFAULT_MIN_CONFIDENCE),
    };
    Ok(Speculation {
        mode: s.mode,
        lookup_first: s.lookup,
        options: SpeculativeOptions { max_draft_tokens: draft_tokens, adaptive: !s.fixed_length },
        draft_min_p,
    })
}
