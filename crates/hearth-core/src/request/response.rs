//! The log-probabilities of a response in OpenAI's shapes, for the server and the browser alike:
//! chat's `choices[].logprobs.content` and the legacy completions' `choices[].logprobs`.

use crate::sampling::TokenLogprob;
use crate::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

/// What a log-probability of `-inf` (a token the row gave no probability) is sent as: JSON has
/// no infinity, and vLLM sends this.
const NO_PROBABILITY: f32 = -9999.0;

fn finite(logprob: f32) -> f32 {
    if logprob.is_finite() {
        logprob
    } else {
        NO_PROBABILITY
    }
}

/// A token's text and bytes (a byte-level token may hold part of a UTF-8 character: its text
/// then has U+FFFD where the bytes do not decode, and `bytes` says what they are).
fn token_text(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer.token_bytes(id);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat's `logprobs` object: `{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}`.
pub fn chat_logprobs(tokenizer: &Tokenizer, logprobs: &[TokenLogprob]) -> Value {
    let entry = |id: u32, logprob: f32| {
        let (token, bytes) = token_text(tokenizer, id);
        json!({"token": token, "logprob": finite(logprob), "bytes": bytes})
    };
    let content: Vec<Value> = logprobs
        .iter()
        .map(|l| {
            let mut chosen = entry(l.token, l.logprob);
            chosen["top_logprobs"] = l.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
            chosen
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// The legacy completions' `logprobs` object: `{tokens, token_logprobs, top_logprobs,
/// text_offset}`, each token's offset in characters of the completion text counted from
/// `offset` (the characters before these tokens, when streaming). Returns it and the offset after.
pub fn completion_logprobs(tokenizer: &Tokenizer, logprobs: &[TokenLogprob], offset: usize) -> (Value, usize) {
    let mut offset = offset;
    let (mut tokens, mut token_logprobs, mut top_logprobs, mut text_offset) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for l in logprobs {
        let (token, _) = token_text(tokenizer, l.token);
        text_offset.push(offset);
        offset += token.chars().count();
        tokens.push(token);
        token_logprobs.push(finite(l.logprob));
        let top: Map<String, Value> =
            l.top.iter().map(|&(id, lp)| (token_text(tokenizer, id).0, json!(finite(lp)))).collect();
        top_logprobs.push(Value::Object(top));
    }
    let value = json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    });
    (value, offset)
}

/// The legacy completions' `logprobs` object of an echoed answer (`echo` with `logprobs`): the
/// prompt's tokens ([`echoed_prompt_logprobs`]), then the completion's; text offsets run over
/// both.
pub fn echoed_completion_logprobs(
    tokenizer: &Tokenizer,
    prompt_tokens: &[u32],
    prompt_logprobs: &[TokenLogprob],
    logprobs: &[TokenLogprob],
) -> Value {
    let (mut prompt, offset) = echoed_prompt_logprobs(tokenizer, prompt_tokens, prompt_logprobs);
    let (answer, _) = completion_logprobs(tokenizer, logprobs, offset);
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        if let (Some(Value::Array(all)), Value::Array(rest)) = (prompt.get_mut(key), &answer[key]) {
            all.extend(rest.iter().cloned());
        }
    }
    prompt
}

/// The legacy completions' `logprobs` object of an echoed prompt, and the text offset after it:
/// the first token with null entries (nothing predicts it), each other scored given the tokens
/// before it ([`crate::engine::Generation::prompt_logprobs`]).
pub fn echoed_prompt_logprobs(
    tokenizer: &Tokenizer,
    prompt_tokens: &[u32],
    prompt_logprobs: &[TokenLogprob],
) -> (Value, usize) {
    let first = prompt_tokens.first().map(|&id| TokenLogprob { token: id, logprob: f32::NAN, top: Vec::new() });
    let scored: Vec<TokenLogprob> = first.into_iter().chain(prompt_logprobs.iter().cloned()).collect();
    let (mut prompt, offset) = completion_logprobs(tokenizer, &scored, 0);
    if !scored.is_empty() {
        prompt["token_logprobs"][0] = Value::Null;
        prompt["top_logprobs"][0] = Value::Null;
    }
    (prompt, offset)
}
