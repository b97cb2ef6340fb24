//! Request bodies of `/v1/chat/completions` and `/v1/completions`, validated into what the engine
//! worker needs. Every rejection is an [`ApiError`] naming the offending parameter.

use super::error::ApiError;
use hearth_core::chat::ChatMessage;
use hearth_core::engine::GenerateOptions;
use hearth_core::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// The fields shared by both endpoints (OpenAI names; `top_k`, `min_p` and `ignore_eos` are
/// extensions).
#[derive(Deserialize, Default)]
struct RequestBody {
    model: Option<String>,
    messages: Option<Vec<Value>>,
    prompt: Option<Value>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    seed: Option<i64>,
    stop: Option<OneOrMany>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    logit_bias: Option<BTreeMap<String, f32>>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<i64>,
    logprobs: Option<Value>,
    /// OpenAI's predicted output: `{"type": "content", "content": text or text parts}`.
    prediction: Option<Value>,
    /// Extension (as in llama-server): keep generating through end-of-generation tokens, so a
    /// request yields exactly `max_tokens` tokens (for benchmarks).
    ignore_eos: Option<bool>,
}

pub enum PromptInput {
    Chat(Vec<ChatMessage>),
    Text(String),
}

/// A validated request. `options.max_tokens` is filled in by the worker, which knows the prompt
/// length: `max_tokens` when given, else the rest of the context.
pub struct GenerationRequest {
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub max_tokens: Option<usize>,
    pub options: GenerateOptions,
    pub stream: bool,
    pub include_usage: bool,
    /// Text the answer is expected to repeat (OpenAI's predicted output): drafts are copied from it.
    pub prediction: Option<String>,
}

pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<GenerationRequest, ApiError> {
    let body: RequestBody = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("The request body is not valid JSON for this endpoint: {e}"), None, None))?;
    let prompt = match endpoint {
        Endpoint::Chat => PromptInput::Chat(parse_messages(body.messages.as_deref())?),
        Endpoint::Completions => PromptInput::Text(parse_prompt(body.prompt.as_ref())?),
    };
    if body.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("Only n = 1 is supported.", Some("n"), None));
    }
    if body.logprobs.as_ref().is_some_and(|v| !v.is_null() && *v != Value::Bool(false)) {
        return Err(ApiError::bad_request("logprobs are not supported yet.", Some("logprobs"), None));
    }
    let (max_tokens, max_param) = match (body.max_completion_tokens, body.max_tokens) {
        (Some(n), _) => (Some(n), "max_completion_tokens"),
        (None, n) => (n, "max_tokens"),
    };
    let max_tokens = match max_tokens {
        Some(n) if n < 1 => return Err(ApiError::bad_request(format!("{max_param} must be at least 1, got {n}."), Some(max_param), None)),
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        None => None,
    };
    let sampling = SamplingParams {
        temperature: in_range(body.temperature, 1.0, 0.0, 2.0, "temperature")?,
        top_p: in_range(body.top_p, 1.0, 0.0, 1.0, "top_p")?,
        min_p: in_range(body.min_p, 0.0, 0.0, 1.0, "min_p")?,
        top_k: match body.top_k {
            Some(k) if k < 0 => return Err(ApiError::bad_request("top_k must be ≥ 0 (0 = off).", Some("top_k"), None)),
            Some(k) => k as usize,
            None => 0,
        },
        presence_penalty: in_range(body.presence_penalty, 0.0, -2.0, 2.0, "presence_penalty")?,
        frequency_penalty: in_range(body.frequency_penalty, 0.0, -2.0, 2.0, "frequency_penalty")?,
        logit_bias: parse_logit_bias(body.logit_bias)?,
        // The OpenAI penalties count over everything generated so far.
        repeat_last_n: usize::MAX,
        seed: body.seed.map(|s| s as u64).unwrap_or_else(clock_seed),
        ..SamplingParams::default()
    };
    let stop = match body.stop {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) if v.len() > 4 => {
            return Err(ApiError::bad_request("At most 4 stop sequences are allowed.", Some("stop"), None))
        }
        Some(OneOrMany::Many(v)) => v,
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad_request("Stop sequences must not be empty.", Some("stop"), None));
    }
    let stream = body.stream.unwrap_or(false);
    let prediction = parse_prediction(body.prediction.as_ref())?;
    Ok(GenerationRequest {
        model: body.model,
        prompt,
        max_tokens,
        options: GenerateOptions { max_tokens: 0, sampling, stop, ignore_eos: body.ignore_eos.unwrap_or(false) },
        stream,
        include_usage: stream && body.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
        prediction,
    })
}

/// `{"type": "content", "content": "..."}`, the content also as a list of text parts; null: none.
fn parse_prediction(prediction: Option<&Value>) -> Result<Option<String>, ApiError> {
    let bad = |m: &str| ApiError::bad_request(m, Some("prediction"), None);
    let Some(prediction) = prediction.filter(|p| !p.is_null()) else { return Ok(None) };
    if prediction.get("type").and_then(Value::as_str) != Some("content") {
        return Err(bad("prediction must be {\"type\": \"content\", \"content\": ...}."));
    }
    match prediction.get("content") {
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                (Some("text"), Some(text)) => Ok(text),
                _ => Err(bad("prediction content parts must be {\"type\": \"text\", \"text\": ...}.")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| Some(texts.concat())),
        _ => Err(bad("prediction.content must be a string or a list of text parts.")),
    }
}

fn in_range(value: Option<f32>, default: f32, low: f32, high: f32, param: &str) -> Result<f32, ApiError> {
    match value {
        None => Ok(default),
        Some(v) if (low..=high).contains(&v) => Ok(v),
        Some(v) => Err(ApiError::bad_request(format!("{param} must be between {low} and {high}, got {v}."), Some(param), None)),
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// `{"token id": bias}` with biases in [-100, 100]; -100 bans a token in practice.
fn parse_logit_bias(bias: Option<BTreeMap<String, f32>>) -> Result<BTreeMap<u32, f32>, ApiError> {
    let mut out = BTreeMap::new();
    for (token, value) in bias.unwrap_or_default() {
        let id: u32 = token
            .parse()
            .map_err(|_| ApiError::bad_request(format!("logit_bias key '{token}' is not a token id."), Some("logit_bias"), None))?;
        if !(-100.0..=100.0).contains(&value) {
            return Err(ApiError::bad_request(format!("logit_bias values must be in [-100, 100], got {value}."), Some("logit_bias"), None));
        }
        out.insert(id, value);
    }
    Ok(out)
}

/// Messages with string content, or content as a list of `{"type": "text", "text": ...}` parts.
fn parse_messages(messages: Option<&[Value]>) -> Result<Vec<ChatMessage>, ApiError> {
    let messages = match messages {
        None => return Err(ApiError::bad_request("'messages' is a required property.", Some("messages"), None)),
        Some([]) => return Err(ApiError::bad_request("'messages' must contain at least one message.", Some("messages"), None)),
        Some(m) => m,
    };
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let param = format!("messages.[{i}]");
            let bad = |what: &str| ApiError::bad_request(format!("{param}: {what}"), Some(&param), None);
            let role = m.get("role").and_then(Value::as_str).ok_or_else(|| bad("'role' must be a string"))?;
            let content = match m.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(text)) => Ok(text),
                        _ => Err(bad("only text content parts are supported")),
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .concat(),
                Some(_) => return Err(bad("'content' must be a string or a list of text parts")),
            };
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

/// A string, or a list holding one string.
fn parse_prompt(prompt: Option<&Value>) -> Result<String, ApiError> {
    let bad = |m: &str| ApiError::bad_request(m, Some("prompt"), None);
    match prompt {
        None => Err(bad("'prompt' is a required property.")),
        Some(Value::String(s)) if s.is_empty() => Err(bad("'prompt' must not be empty.")),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(s)] if !s.is_empty() => Ok(s.clone()),
            _ => Err(bad("'prompt' must be a non-empty string or a list of one string (batches are not supported).")),
        },
        Some(_) => Err(bad("'prompt' must be a string.")),
    }
}
