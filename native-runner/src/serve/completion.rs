//! `POST /v1/chat/completions` and `POST /v1/completions`: submit the job, then answer with one JSON
//! body or stream server-sent events (`data: {...}\n\n` ... `data: [DONE]\n\n`).

use super::api::{self, Endpoint};
use super::error::ApiError;
use super::worker::{Event, Job};
use super::{respond_error, respond_json, State};
use hearth_core::chat::{ToolCallDelta, ToolCallFormat, ToolCallParser};
use hearth_core::constraint::GrammarUsage;
use hearth_core::engine::{FinishReason, Generation};
use hearth_core::request::response::{
    chat_logprobs, completion_logprobs, echoed_completion_logprobs, echoed_prompt_logprobs,
};
use hearth_core::request::Prompt;
use hearth_core::sampling::TokenLogprob;
use hearth_core::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::time::Instant;

/// Handles one request; returns the HTTP status sent (for the metrics).
pub fn handle(state: &State, mut request: tiny_http::Request, endpoint: Endpoint, received: Instant) -> u16 {
    let body = match super::read_body(&mut request) {
        Ok(body) => body,
        Err(e) => return respond_error(request, &e),
    };
    let parsed = match api::parse(endpoint, &body) {
        Ok(parsed) => parsed,
        Err(e) => return respond_error(request, &e),
    };
    if let Some(model) = &parsed.model {
        if !state.model_names.contains(model) {
            let e = ApiError::not_found(
                format!("The model '{model}' does not exist; this server has '{}'.", state.model_id),
                Some("model"),
                "model_not_found",
            );
            return respond_error(request, &e);
        }
    }
    let generation = &parsed.generation;
    let (stream, include_usage, choices) = (generation.stream, generation.include_usage, generation.n);
    let echo = match &parsed.prompt {
        Prompt::Text(text) if generation.echo => {
            Some(Echo { text: text.clone(), scored: generation.options.prompt_logprobs.is_some() })
        }
        _ => None,
    };
    let (prompt, options, tools, prediction) = match state
        .prompter
        .prepare(&parsed)
        .and_then(|(p, o, tools)| Ok((p, o, tools, state.prompter.prediction(&parsed)?)))
    {
        Ok(prepared) => prepared,
        Err(e) => return respond_error(request, &e),
    };
    // (An echo's streamed log-probabilities name the prompt's tokens.)
    let prompt_ids = if stream && echo.as_ref().is_some_and(|e| e.scored) { prompt.clone() } else { Vec::new() };
    let (sender, events) = mpsc::channel();
    if let Err(e) = state.queue.submit(Job { prompt, prediction, options, choices, events: sender, received }) {
        return respond_error(request, &e);
    }
    // Nothing is sent before the scheduler admits the prompt, so its errors keep their status.
    let tokens = match events.recv() {
        Ok(Event::Started { prompt_tokens, cached_tokens }) => {
            PromptTokens { total: prompt_tokens, cached: cached_tokens }
        }
        Ok(Event::Failed(e)) => return respond_error(request, &e),
        _ => return respond_error(request, &ApiError::internal("The engine stopped before answering.")),
    };
    let reply = Reply {
        id: next_id(endpoint),
        endpoint,
        model: state.model_id.clone(),
        created: unix_now(),
        tokenizer: &state.prompter.tokenizer,
        echo,
        tools,
    };
    if stream {
        stream_events(request, &reply, &events, tokens, include_usage, choices, &prompt_ids)
    } else {
        let mut generations: Vec<Option<Generation>> = (0..choices).map(|_| None).collect();
        for event in events.iter() {
            match event {
                Event::Done { choice, generation } => generations[choice] = Some(generation),
                Event::Failed(e) => return respond_error(request, &e),
                Event::Started { .. } | Event::Delta { .. } | Event::PromptScored(_) => {}
            }
        }
        match generations.into_iter().collect::<Option<Vec<_>>>() {
            Some(g) => respond_json(request, 200, &reply.full(&g, tokens)),
            None => respond_error(request, &ApiError::internal("The engine stopped before finishing.")),
        }
    }
}

/// What every response object of one request shares.
struct Reply<'a> {
    id: String,
    endpoint: Endpoint,
    model: String,
    created: u64,
    /// For the tokens' text in `logprobs`.
    tokenizer: &'a Tokenizer,
    /// Completions' `echo`.
    echo: Option<Echo>,
    /// Chat with tools: the format the model writes calls in (answers become `tool_calls`).
    tools: Option<ToolCallFormat>,
}

/// Completions' `echo`: each choice's text starts with the prompt's.
struct Echo {
    text: String,
    /// With `logprobs`: the prompt's tokens' log-probabilities come before the answer's.
    scored: bool,
}

impl Reply<'_> {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "choices": choices})
    }

    /// The non-streaming answer: one choice per generation, in order.
    fn full(&self, generations: &[Generation], prompt: PromptTokens) -> Value {
        // (The first choice scored the prompt for all of them.)
        let prompt_scores = generations.first().and_then(|g| Some((&g.prompt_tokens, g.prompt_logprobs.as_deref()?)));
        let choices: Vec<Value> = generations
            .iter()
            .enumerate()
            .map(|(index, g)| {
                let mut finish = finish_reason(g.finish_reason);
                let logprobs = match (g.logprobs.as_deref(), prompt_scores) {
                    (Some(l), Some((tokens, scores))) if self.echo.is_some() => {
                        echoed_completion_logprobs(self.tokenizer, tokens, scores, l)
                    }
                    (Some(l), _) => self.logprobs(l, 0).0,
                    (None, _) => Value::Null,
                };
                match self.endpoint {
                    Endpoint::Chat => {
                        let mut message = json!({"role": "assistant", "content": g.text});
                        if let Some(format) = self.tools {
                            let (content, calls) = format.parser().parse(&g.text);
                            message["content"] = json!(content);
                            if !calls.is_empty() {
                                let calls: Vec<Value> =
                                    calls.iter().enumerate().map(|(i, c)| c.to_json(&self.call_id(index, i))).collect();
                                message["tool_calls"] = json!(calls);
                                if g.finish_reason == FinishReason::Stop {
                                    finish = "tool_calls";
                                }
                            }
                        }
                        json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish})
                    }
                    Endpoint::Completions => {
                        let echo = self.echo.as_ref().map_or("", |e| e.text.as_str());
                        let text = format!("{echo}{}", g.text);
                        json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish})
                    }
                }
            })
            .collect();
        let mut body = self.envelope(false, Value::Array(choices));
        body["usage"] = usage(prompt, generations);
        body
    }

    /// One streamed chunk of choice `index` carrying `text` (and `finish_reason` on its last),
    /// with `logprobs` (null, or the log-probabilities of the tokens since its last chunk).
    fn chunk(&self, index: usize, text: &str, role: bool, finish: Option<&str>, logprobs: Value) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat if role => {
                json!({"index": index, "delta": {"role": "assistant", "content": text}, "logprobs": logprobs, "finish_reason": finish})
            }
            Endpoint::Chat if finish.is_some() => {
                json!({"index": index, "delta": {}, "logprobs": logprobs, "finish_reason": finish})
            }
            Endpoint::Chat => {
                json!({"index": index, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": finish})
            }
            Endpoint::Completions => {
                json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish})
            }
        };
        self.envelope(true, json!([choice]))
    }

    /// The id of choice `choice`'s call `index`.
    fn call_id(&self, choice: usize, index: usize) -> String {
        let request = self.id.rsplit('-').next().unwrap_or_default();
        format!("call_{request}_{choice}_{index}")
    }

    /// A streamed chunk of choice `choice` carrying one piece of a tool-call answer.
    fn tool_chunk(&self, choice: usize, delta: &ToolCallDelta, logprobs: Value) -> Value {
        let delta = match delta {
            ToolCallDelta::Content(text) => json!({"content": text}),
            ToolCallDelta::Call { index, name } => json!({"tool_calls": [{
                "index": index, "id": self.call_id(choice, *index), "type": "function",
                "function": {"name": name, "arguments": ""},
            }]}),
            ToolCallDelta::Arguments { index, text } => {
                json!({"tool_calls": [{"index": index, "function": {"arguments": text}}]})
            }
        };
        self.envelope(true, json!([{"index": choice, "delta": delta, "logprobs": logprobs, "finish_reason": null}]))
    }

    /// The endpoint's `logprobs` object for these tokens (completions count their text offsets
    /// from `offset`); and the offset after them.
    fn logprobs(&self, logprobs: &[TokenLogprob], offset: usize) -> (Value, usize) {
        match self.endpoint {
            Endpoint::Chat => (chat_logprobs(self.tokenizer, logprobs), offset),
            Endpoint::Completions => completion_logprobs(self.tokenizer, logprobs, offset),
        }
    }
}

/// A request's prompt length and how much of it the prefix cache already held.
#[derive(Clone, Copy)]
struct PromptTokens {
    total: usize,
    cached: usize,
}

/// OpenAI's usage object over every choice (the prompt counted once); with speculative decoding
/// (`--lookup`, `--draft-model`, a predicted output), the draft tokens accepted and rejected go
/// where OpenAI reports a prediction's; with structured output, hearth's `grammar` extension
/// (masks computed, their median and 99th-percentile times).
fn usage(prompt: PromptTokens, generations: &[Generation]) -> Value {
    let completion: usize = generations.iter().map(|g| g.tokens.len()).sum();
    let mut usage = json!({
        "prompt_tokens": prompt.total,
        "completion_tokens": completion,
        "total_tokens": prompt.total + completion,
        "prompt_tokens_details": {"cached_tokens": prompt.cached},
    });
    let drafts: Vec<_> = generations.iter().filter_map(|g| g.speculative.as_ref()).collect();
    if !drafts.is_empty() {
        let accepted: usize = drafts.iter().map(|s| s.accepted).sum();
        let proposed: usize = drafts.iter().map(|s| s.proposed).sum();
        usage["completion_tokens_details"] = json!({
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": proposed - accepted,
        });
    }
    if let Some(grammar) = GrammarUsage::of(generations.iter().filter_map(|g| g.constraint.as_ref())) {
        usage["grammar"] = json!(grammar);
    }
    usage
}

fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::ContextFull | FinishReason::Cancelled => "length",
    }
}

/// Server-sent events over a chunked HTTP/1.1 response written by hand: tiny_http buffers response
/// bodies, and every token must reach the client at once. A failed write means the client went
/// away: returning drops `events`, so the worker's next send fails and the generation is cancelled.
fn stream_events(
    request: tiny_http::Request,
    reply: &Reply,
    events: &Receiver<Event>,
    prompt_tokens: PromptTokens,
    include_usage: bool,
    choices: usize,
    prompt_ids: &[u32],
) -> u16 {
    let mut out = SseWriter { inner: request.into_writer() };
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
    if out.raw(head.as_bytes()).is_err() {
        return 200;
    }
    if reply.endpoint == Endpoint::Chat {
        for index in 0..choices {
            if out.event(&reply.chunk(index, "", true, None, Value::Null).to_string()).is_err() {
                return 200;
            }
        }
    }
    // Per choice: log-probabilities sent so far, and (completions) the text offset reached.
    let (mut logprobs_sent, mut text_offset) = (vec![0; choices], vec![0; choices]);
    // An echo comes first: at once, or with the prompt's log-probabilities once they are scored.
    if let Some(echo) = reply.echo.as_ref().filter(|e| !e.scored) {
        for index in 0..choices {
            if out.event(&reply.chunk(index, &echo.text, false, None, Value::Null).to_string()).is_err() {
                return 200;
            }
        }
    }
    let mut ended = Vec::new();
    // Chat with tools: each choice's answer split into text and calls as it streams.
    let mut parsers: Vec<Option<ToolCallParser>> = (0..choices).map(|_| reply.tools.map(|f| f.parser())).collect();
    // The worker drops its senders after each choice's final event, which ends this loop.
    for event in events.iter() {
        let sent = match event {
            Event::Delta { choice, text, logprobs } => {
                let logprobs = if logprobs.is_empty() {
                    Value::Null
                } else {
                    logprobs_sent[choice] += logprobs.len();
                    let (value, offset) = reply.logprobs(&logprobs, text_offset[choice]);
                    text_offset[choice] = offset;
                    value
                };
                match parsers[choice].as_mut() {
                    None => out.event(&reply.chunk(choice, &text, false, None, logprobs).to_string()),
                    Some(parser) => {
                        let deltas = parser.push(&text);
                        if deltas.is_empty() && !logprobs.is_null() {
                            out.event(&reply.chunk(choice, "", false, None, logprobs).to_string())
                        } else {
                            let mut logprobs = Some(logprobs);
                            deltas.iter().try_for_each(|delta| {
                                let chunk = reply.tool_chunk(choice, delta, logprobs.take().unwrap_or(Value::Null));
                                out.event(&chunk.to_string())
                            })
                        }
                    }
                }
            }
            Event::Done { choice, generation: g } => {
                // The tokens whose text came last (held back, then released at the end).
                let sent = logprobs_sent[choice];
                let rest = g.logprobs.as_deref().map(|l| &l[sent.min(l.len())..]).unwrap_or_default();
                let logprobs = if rest.is_empty() { Value::Null } else { reply.logprobs(rest, text_offset[choice]).0 };
                let mut finish = finish_reason(g.finish_reason);
                let mut last = Ok(());
                if let Some(parser) = parsers[choice].as_mut() {
                    last = parser
                        .finish()
                        .iter()
                        .try_for_each(|delta| out.event(&reply.tool_chunk(choice, delta, Value::Null).to_string()));
                    if parser.has_calls() && g.finish_reason == FinishReason::Stop {
                        finish = "tool_calls";
                    }
                }
                let mut last =
                    last.and_then(|_| out.event(&reply.chunk(choice, "", false, Some(finish), logprobs).to_string()));
                ended.push(g);
                if include_usage && ended.len() == choices && last.is_ok() {
                    let mut chunk = reply.envelope(true, json!([]));
                    chunk["usage"] = usage(prompt_tokens, &ended);
                    last = out.event(&chunk.to_string());
                }
                last
            }
            Event::PromptScored(scores) => {
                let (logprobs, offset) = echoed_prompt_logprobs(reply.tokenizer, prompt_ids, &scores);
                let text = reply.echo.as_ref().map_or("", |e| e.text.as_str());
                (0..choices).try_for_each(|index| {
                    text_offset[index] = offset;
                    out.event(&reply.chunk(index, text, false, None, logprobs.clone()).to_string())
                })
            }
            Event::Failed(e) => out.event(&e.body().to_string()),
            Event::Started { .. } => Ok(()),
        };
        if sent.is_err() {
            return 200;
        }
    }
    let _ = out.event("[DONE]").and_then(|_| out.raw(b"0\r\n\r\n"));
    200
}

struct SseWriter {
    inner: Box<dyn Write + Send>,
}

impl SseWriter {
    fn raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(bytes)?;
        self.inner.flush()
    }

    /// `data: {payload}\n\n` as one HTTP chunk.
    fn event(&mut self, payload: &str) -> std::io::Result<()> {
        let data = format!("data: {payload}\n\n");
        self.raw(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes())
    }
}

fn next_id(endpoint: Endpoint) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
    format!("{prefix}-{:x}{:04x}", unix_now(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
