//! The engine worker: one thread owns the continuous-batching [`Scheduler`] and loops: take new
//! jobs from the bounded queue (blocking only when idle), submit them, run one batched step, and
//! route each request's events to its HTTP thread. A request whose HTTP thread has gone (the
//! client disconnected, so its receiver was dropped) is cancelled at the first failed send, which
//! frees its KV blocks at once.

use super::api::request_error;
use super::error::ApiError;
use super::metrics::Metrics;
use hearth_core::chat::{ChatTemplate, ToolCallFormat};
use hearth_core::engine::{GenerateOptions, Generation};
use hearth_core::request::{Prompt, TokenHistory, ValidRequest};
use hearth_core::sampling::TokenLogprob;
use hearth_core::scheduler::{RequestId, Scheduler, SchedulerEvent};
use hearth_core::tokenizer::Tokenizer;
use hearth_core::{CoreError, DeviceFault};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What happens to a request's choices (`choice` is the index in `choices[]`), in order per
/// choice; the channel closes after every choice ended.
// (`Done` carries the whole result once per choice: not worth a box.)
#[allow(clippy::large_enum_variant)]
pub enum Event {
    /// The first choice was admitted into the batch; `cached_tokens` of the prompt came from the
    /// prefix cache. (The others start once it holds the prompt.)
    Started {
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    /// Streamed text, and the log-probabilities of the tokens chosen since the last delta when
    /// the request asked for them.
    Delta {
        choice: usize,
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    /// The prompt's tokens' log-probabilities (the first choice of a request that echoes its
    /// prompt with `logprobs`), before any delta.
    PromptScored(Vec<TokenLogprob>),
    Done {
        choice: usize,
        generation: Generation,
    },
    Failed(ApiError),
}

/// A tokenized request that fits the context, ready for the scheduler.
pub struct Job {
    pub prompt: Vec<u32>,
    /// The predicted output's tokens, if the request gave one.
    pub prediction: Option<Vec<u32>>,
    pub options: GenerateOptions,
    /// Choices to generate (`n`).
    pub choices: usize,
    pub events: Sender<Event>,
    pub received: Instant,
}

/// Turns requests into prompt tokens on the HTTP threads, so that what can never fit is refused
/// (400 context_length_exceeded) before it takes a place in the queue.
pub struct Prompter {
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// Positions one sequence may hold (the runner's context, capped by the KV pool).
    pub n_ctx: usize,
    /// The scheduler's prompts and answers: a conversation sent back continues from their ids.
    pub history: Arc<TokenHistory>,
}

impl Prompter {
    /// The predicted output's tokens (as the text would read inside the answer: no special
    /// tokens, no BOS).
    pub fn prediction(&self, request: &ValidRequest) -> Result<Option<Vec<u32>>, ApiError> {
        let Some(text) = &request.generation.prediction else { return Ok(None) };
        let tokens = self.tokenizer.encode(text, false, false).map_err(|e| {
            ApiError::bad_request(format!("Cannot tokenize the prediction: {e}"), Some("prediction"), None)
        })?;
        Ok(Some(tokens))
    }

    /// The prompt tokens (with the request's tools rendered by the template), the options with
    /// `max_tokens` resolved (as asked, or the rest of the context) and the tools' constraint,
    /// and the format of the model's tool calls when the request offers tools.
    pub fn prepare(
        &self,
        request: &ValidRequest,
    ) -> Result<(Vec<u32>, GenerateOptions, Option<ToolCallFormat>), ApiError> {
        let template = self.chat_template.as_ref();
        let tools = request.generation.tools.as_ref();
        let prompt = request
            .prompt
            .tokenize_with_tools(&self.tokenizer, template, None, tools, Some(&self.history))
            .map_err(|e| match e {
                CoreError::BadRequest { .. } => request_error(&e),
                other => ApiError::bad_request(format!("Cannot tokenize the prompt: {other}"), None, None),
            })?;
        let n_ctx = self.n_ctx;
        let generation = &request.generation;
        let options = generation.options_for(prompt.len(), n_ctx).map_err(|_| {
            let requested = generation.max_tokens.unwrap_or(0);
            ApiError::bad_request(
                format!(
                    "This model's maximum context length is {n_ctx} tokens. However, you requested {} tokens ({} in the prompt, {requested} for the completion).",
                    prompt.len() + requested,
                    prompt.len()
                ),
                Some(match (generation.max_tokens.is_some() && prompt.len() < n_ctx, &request.prompt) {
                    (true, _) => generation.max_tokens_param,
                    (false, Prompt::Chat(_)) => "messages",
                    (false, Prompt::Text(_)) => "prompt",
                }),
                Some("context_length_exceeded"),
            )
        })?;
        let mut options = options;
        let format = tools
            .map(|t| t.apply(template, &self.tokenizer, &mut options))
            .transpose()
            .map_err(|e| request_error(&e))?
            .flatten();
        Ok((prompt, options, format))
    }
}

/// The sending side of the queue, shared by the HTTP threads. It admits `max_batch + max_queue`
/// requests at once (generating, or waiting for a place in the batch) and refuses more with 429;
/// counting them, rather than the channel's length, keeps a burst that arrives during a long step
/// from being refused while batch places are free.
#[derive(Clone)]
pub struct Queue {
    sender: SyncSender<Job>,
    max_queue: usize,
    limit: usize,
    metrics: Arc<Metrics>,
}

impl Queue {
    /// The channel behind `sender` must hold `max_batch + max_queue` jobs.
    pub fn new(sender: SyncSender<Job>, max_batch: usize, max_queue: usize, metrics: Arc<Metrics>) -> Self {
        Queue { sender, max_queue, limit: max_batch + max_queue, metrics }
    }

    /// Queues a job; each of its choices takes one of the `max_batch + max_queue` places.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let places = job.choices as i64;
        if places > self.limit as i64 {
            return Err(ApiError::bad_request(
                format!("n = {places} is more choices than this server runs and queues at once ({}).", self.limit),
                Some("n"),
                None,
            ));
        }
        if self.metrics.accepted.fetch_add(places, Ordering::SeqCst) + places > self.limit as i64 {
            self.metrics.accepted.fetch_sub(places, Ordering::SeqCst);
            return Err(ApiError::queue_full(self.max_queue));
        }
        self.metrics.queue_depth.fetch_add(1, Ordering::SeqCst);
        let result = self.sender.try_send(job);
        if result.is_err() {
            self.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
            self.metrics.accepted.fetch_sub(places, Ordering::SeqCst);
        }
        match result {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(ApiError::queue_full(self.max_queue)),
            Err(TrySendError::Disconnected(_)) => Err(ApiError::internal("The engine has stopped.")),
        }
    }
}

/// A choice of a request inside the scheduler.
struct InFlight {
    events: Sender<Event>,
    /// Its index in the request's `choices[]`.
    choice: usize,
    /// Time spent in the queue before the scheduler got it (TTFT counts it).
    queued_s: f64,
    prompt_tokens: usize,
}

/// Serves jobs until every sender is gone. At most `max_batch` requests are inside the scheduler
/// (running or waiting for KV blocks); the rest wait in the bounded queue, which refuses with 429
/// when full.
pub fn run(mut scheduler: Scheduler, jobs: Receiver<Job>, metrics: Arc<Metrics>, max_batch: usize) {
    let mut in_flight: HashMap<RequestId, InFlight> = HashMap::new();
    let mut open = true;
    let mut tallies = TallyRefresh::for_model(&scheduler);
    loop {
        if scheduler.is_idle() && in_flight.is_empty() {
            if !open {
                return;
            }
            match jobs.recv() {
                Ok(job) => submit(&mut scheduler, &mut in_flight, job, &metrics),
                Err(_) => return,
            }
        }
        while open && in_flight.len() < max_batch {
            match jobs.try_recv() {
                Ok(job) => submit(&mut scheduler, &mut in_flight, job, &metrics),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        let mut gone = Vec::new();
        let stepped = scheduler.step(&mut |event| route(event, &mut in_flight, &metrics, &mut gone));
        if let Err(e) = stepped {
            // Not expected (the scheduler reports per-request failures as events); fail everyone.
            gone.extend(in_flight.keys().copied());
            let failure = api_error(&e, &metrics);
            for (_, request) in in_flight.drain() {
                metrics.accepted.fetch_sub(1, Ordering::SeqCst);
                let _ = request.events.send(Event::Failed(failure.clone()));
            }
        }
        let mut cancelled = 0;
        for id in gone {
            if in_flight.remove(&id).is_some() {
                metrics.accepted.fetch_sub(1, Ordering::SeqCst);
            }
            if scheduler.cancel(id).is_some() {
                cancelled += 1;
            }
        }
        // Publish the pool state before counting the cancellations, so that whoever sees the
        // cancellation in /metrics also sees the blocks it freed.
        metrics.set_scheduler(scheduler.stats());
        metrics.cancelled.fetch_add(cancelled, Ordering::SeqCst);
        let idle = scheduler.is_idle() && in_flight.is_empty();
        tallies.refresh(&mut scheduler, &metrics, idle);
    }
}

/// Publishes the expert tallies of a mixture of experts to /metrics: at most once a second while
/// the engine works, and whenever it falls idle (a GPU backend reads its counters back from the
/// device, a wait worth spreading out).
enum TallyRefresh {
    /// A model without experts, or a backend that cannot read its counters.
    Off,
    /// Published last at this time (`None`: not yet).
    On { last: Option<Instant> },
}

impl TallyRefresh {
    const INTERVAL: Duration = Duration::from_secs(1);

    fn for_model(scheduler: &Scheduler) -> Self {
        match scheduler.runner().config().moe {
            Some(_) => TallyRefresh::On { last: None },
            None => TallyRefresh::Off,
        }
    }

    fn refresh(&mut self, scheduler: &mut Scheduler, metrics: &Metrics, idle: bool) {
        let TallyRefresh::On { last } = *self else { return };
        if !idle && last.is_some_and(|t| t.elapsed() < Self::INTERVAL) {
            return;
        }
        match scheduler.runner_mut().expert_tallies() {
            Ok(tallies) => {
                metrics.set_expert_tallies(tallies);
                *self = TallyRefresh::On { last: Some(Instant::now()) };
            }
            Err(e) => {
                eprintln!("hearth serve: expert tallies are not counted: {e}");
                *self = TallyRefresh::Off;
            }
        }
    }
}

fn submit(scheduler: &mut Scheduler, in_flight: &mut HashMap<RequestId, InFlight>, job: Job, metrics: &Metrics) {
    metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
    let prompt_tokens = job.prompt.len();
    let drafting = scheduler.predicted_drafting(job.prediction);
    match scheduler.submit_choices(job.prompt, job.options, drafting, job.choices) {
        Ok(ids) => {
            let queued_s = job.received.elapsed().as_secs_f64();
            for (choice, id) in ids.into_iter().enumerate() {
                in_flight.insert(id, InFlight { events: job.events.clone(), choice, queued_s, prompt_tokens });
            }
        }
        Err(e) => {
            metrics.accepted.fetch_sub(job.choices as i64, Ordering::SeqCst);
            let _ = job.events.send(Event::Failed(api_error(&e, metrics)));
        }
    }
}

/// Sends one scheduler event to its request's HTTP thread; ids whose receiver is gone go to `gone`.
fn route(
    event: SchedulerEvent,
    in_flight: &mut HashMap<RequestId, InFlight>,
    metrics: &Metrics,
    gone: &mut Vec<RequestId>,
) {
    match event {
        SchedulerEvent::Started { id, prompt_tokens, cached_tokens } => {
            let sent = in_flight.get(&id).is_some_and(|r| {
                r.choice > 0 || r.events.send(Event::Started { prompt_tokens, cached_tokens }).is_ok()
            });
            if !sent {
                gone.push(id);
            }
        }
        SchedulerEvent::Text { id, delta, logprobs } => {
            let sent = in_flight
                .get(&id)
                .is_some_and(|r| r.events.send(Event::Delta { choice: r.choice, text: delta, logprobs }).is_ok());
            if !sent {
                gone.push(id);
            }
        }
        SchedulerEvent::PromptScored { id, logprobs } => {
            let sent = in_flight.get(&id).is_some_and(|r| r.events.send(Event::PromptScored(logprobs)).is_ok());
            if !sent {
                gone.push(id);
            }
        }
        SchedulerEvent::Finished { id, generation } => {
            let Some(request) = in_flight.remove(&id) else { return };
            metrics.accepted.fetch_sub(1, Ordering::SeqCst);
            // The scheduler's TTFT runs from its submit; add the time spent in the queue.
            let ttft = (!generation.tokens.is_empty()).then(|| request.queued_s + generation.timings.ttft_ms / 1e3);
            metrics.record_generation(request.prompt_tokens, &generation, ttft);
            let _ = request.events.send(Event::Done { choice: request.choice, generation });
        }
        SchedulerEvent::Failed { id, error } => {
            if let Some(request) = in_flight.remove(&id) {
                metrics.accepted.fetch_sub(1, Ordering::SeqCst);
                let _ = request.events.send(Event::Failed(api_error(&error, metrics)));
            }
        }
    }
}

/// The HTTP error of a failed request. A lost device is remembered: `/health` then answers 503 so
/// that whoever runs the server restarts it (every later step would fail too).
fn api_error(error: &CoreError, metrics: &Metrics) -> ApiError {
    match error {
        CoreError::ContextOverflow { .. } | CoreError::KvExhausted { .. } => ApiError::bad_request(
            format!("The request does not fit in the KV cache: {error}"),
            None,
            Some("context_length_exceeded"),
        ),
        CoreError::InvalidArgument(message) => ApiError::bad_request(message.clone(), None, None),
        // (A grammar the engine cannot compile, refused when the request is submitted.)
        CoreError::BadRequest { .. } => request_error(error),
        CoreError::Device { kind: DeviceFault::Lost, .. } => {
            metrics.device_lost.store(true, Ordering::SeqCst);
            ApiError::unavailable(
                format!("The GPU device was lost; the server must be restarted: {error}"),
                "device_lost",
            )
        }
        CoreError::Device { kind: DeviceFault::OutOfMemory, .. } => ApiError::unavailable(
            format!("The GPU ran out of memory; retry with a shorter request: {error}"),
            "device_out_of_memory",
        ),
        other => ApiError::internal(format!("Generation failed: {other}")),
    }
}
