//! The engine worker: one thread owns the [`Engine`] and serves jobs from a bounded queue, one at a
//! time, streaming events back to the HTTP thread of each request.

use super::api::{GenerationRequest, PromptInput};
use super::error::ApiError;
use super::metrics::Metrics;
use crate::load;
use hearth_core::engine::{Engine, FinishReason, Generation};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

pub enum Event {
    /// The prompt was accepted; generation begins.
    Started { prompt_tokens: usize },
    Delta(String),
    Done(Generation),
    Failed(ApiError),
}

pub struct Job {
    pub request: GenerationRequest,
    pub events: Sender<Event>,
    pub received: Instant,
}

/// The sending side of the queue, shared by the HTTP threads.
#[derive(Clone)]
pub struct Queue {
    sender: SyncSender<Job>,
    capacity: usize,
    metrics: Arc<Metrics>,
}

impl Queue {
    pub fn new(sender: SyncSender<Job>, capacity: usize, metrics: Arc<Metrics>) -> Self {
        Queue { sender, capacity, metrics }
    }

    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.metrics.queue_depth.fetch_add(1, Ordering::SeqCst);
        let result = self.sender.try_send(job);
        if result.is_err() {
            self.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
        }
        match result {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(ApiError::queue_full(self.capacity)),
            Err(TrySendError::Disconnected(_)) => Err(ApiError::internal("The engine has stopped.")),
        }
    }
}

/// Serves jobs until every sender is gone.
pub fn run(mut engine: Engine, jobs: Receiver<Job>, metrics: Arc<Metrics>) {
    for job in jobs {
        metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
        metrics.running.fetch_add(1, Ordering::SeqCst);
        let event = match generate(&mut engine, &job, &metrics) {
            Ok(generation) => Event::Done(generation),
            Err(e) => Event::Failed(e),
        };
        metrics.running.fetch_sub(1, Ordering::SeqCst);
        // The client may be gone; nothing to do then.
        let _ = job.events.send(event);
    }
}

fn generate(engine: &mut Engine, job: &Job, metrics: &Metrics) -> Result<Generation, ApiError> {
    let request = &job.request;
    let (text, templated) = match &request.prompt {
        PromptInput::Chat(messages) => {
            let template = engine
                .chat_template()
                .ok_or_else(|| ApiError::bad_request("This model has no chat template; use /v1/completions.", None, None))?;
            let text = template
                .render(messages, true)
                .map_err(|e| ApiError::bad_request(format!("The chat template rejected the messages: {e}"), Some("messages"), None))?;
            (text, true)
        }
        PromptInput::Text(text) => (text.clone(), false),
    };
    let prompt = load::tokenize_prompt(engine, &text, templated)
        .map_err(|e| ApiError::bad_request(format!("Cannot tokenize the prompt: {e:#}"), None, None))?;
    let n_ctx = engine.session().n_ctx();
    let too_long = |requested: usize| {
        ApiError::bad_request(
            format!(
                "This model's maximum context length is {n_ctx} tokens. However, you requested {} tokens ({} in the prompt, {requested} for the completion).",
                prompt.len() + requested,
                prompt.len()
            ),
            Some(if requested == 0 { "messages" } else { "max_tokens" }),
            Some("context_length_exceeded"),
        )
    };
    if prompt.len() >= n_ctx {
        return Err(too_long(0));
    }
    let max_tokens = match request.max_tokens {
        Some(n) if n > n_ctx - prompt.len() => return Err(too_long(n)),
        Some(n) => n,
        None => n_ctx - prompt.len(),
    };
    let options = hearth_core::engine::GenerateOptions { max_tokens, ..request.options.clone() };
    if job.events.send(Event::Started { prompt_tokens: prompt.len() }).is_err() {
        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        return Err(ApiError::internal("The client went away."));
    }
    // Every request starts from an empty cache so that its output does not depend on the
    // requests before it (prefix reuse comes with the paged KV cache).
    engine.session_mut().reset();
    let generation = engine
        .generate(&prompt, &options, &mut |delta| job.events.send(Event::Delta(delta.to_string())).is_ok())
        .map_err(|e| ApiError::internal(format!("Generation failed: {e}")))?;
    if generation.finish_reason == FinishReason::Cancelled {
        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
    }
    // Text held back by stop-string matching reaches the callback late; the first sampled token
    // is what time-to-first-token means, so take the engine's ttft plus the queue wait.
    let queued_s = job.received.elapsed().as_secs_f64() - (generation.timings.prompt_ms + generation.timings.decode_ms) / 1e3;
    let ttft = (!generation.tokens.is_empty()).then(|| queued_s.max(0.0) + generation.timings.ttft_ms / 1e3);
    metrics.record_generation(prompt.len(), generation.tokens.len(), ttft, &generation.timings.itl_ms);
    Ok(generation)
}
