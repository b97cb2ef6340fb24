//! Generation: [`Engine`], the batching scheduler with one request at a time, and [`Session`], one
//! sequence evaluated directly (perplexity, benchmarks, tests). Their options and results.

use crate::backend::{Backend, Readback};
use crate::block_on::block_on;
use crate::chat::ChatTemplate;
use crate::error::{CoreError, Result};
use crate::gguf::GgufFile;
use crate::graph::LogitsMode;
use crate::kv::{KvType, SeqId};
use crate::model::ModelConfig;
use crate::runner::{BatchEntry, Runner, StepOutput};
use crate::sampling::{SamplingParams, StopStrings, TokenLogprob};
use crate::scheduler::{Drafting, Scheduler, SchedulerEvent, SchedulerOptions};
use crate::speculative::{BatchedDraftModel, SpeculativeMetrics, SpeculativeOptions};
use crate::tokenizer::{StreamDecoder, Tokenizer};
// std's Instant panics on wasm32-unknown-unknown (no clock); web-time reads performance.now() there.
#[cfg(not(target_arch = "wasm32"))]
pub use std::time::Instant;
#[cfg(target_arch = "wasm32")]
pub use web_time::Instant;

#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Context size in tokens; 0 = min(training context, 4096).
    pub n_ctx: usize,
    /// Prompt tokens evaluated per forward pass.
    pub prefill_chunk: usize,
    /// How K/V values are stored.
    pub kv_type: KvType,
    /// Positions per KV block.
    pub kv_block_size: usize,
    /// Bytes for the KV pool; `None`: room for `max_sequences` full contexts.
    pub kv_memory: Option<u64>,
    /// Sequences expected at once (1 for a session; the batch size of a server).
    pub max_sequences: usize,
    /// Logits for the first N token ids only (`None`: the whole vocabulary): a draft model's
    /// shortlist. BPE vocabularies number their tokens in merge order, so the first ids are the
    /// common pieces, and the output head, a small model's largest mat-mul, shrinks in
    /// proportion. Tokens past N can still be read, never predicted.
    pub logits_vocab: Option<usize>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            n_ctx: 0,
            prefill_chunk: 256,
            kv_type: KvType::F16,
            kv_block_size: 16,
            kv_memory: None,
            max_sequences: 1,
            logits_vocab: None,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Generate through the model's end-of-generation tokens instead of stopping at them (false
    /// for normal use; true when a benchmark needs exactly `max_tokens`).
    pub ignore_eos: bool,
    /// Report each output token's log-probability and this many alternatives at its position
    /// (`None`: none; see [`crate::sampling::TokenLogprob`]). Such a request decodes without
    /// drafts.
    pub logprobs: Option<usize>,
    /// Report each prompt token's log-probability given the tokens before it (the first has
    /// none) and this many alternatives (`None`: none): completions' `echo` with `logprobs`. The
    /// prompt is then evaluated whole, never taken from the prefix cache, and the steps that
    /// evaluate it read back every row's logits.
    pub prompt_logprobs: Option<usize>,
    /// Structured output: the answer is constrained to this grammar (compiled by the scheduler
    /// when the request is submitted; a grammar it cannot compile refuses the request). Such a
    /// request reads back whole logits rows and decodes without drafts.
    pub grammar: Option<crate::constraint::GrammarRequest>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The caller's callback asked to stop.
    Cancelled,
    /// The context is full.
    ContextFull,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Timings {
    /// Prompt tokens actually evaluated (the rest came from the KV cache).
    pub prompt_evaluated: usize,
    pub prompt_ms: f64,
    pub ttft_ms: f64,
    pub decode_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    /// Inter-token latencies in ms (decode steps).
    pub itl_ms: Vec<f64>,
}

impl Timings {
    /// Rates from the raw measurements: prefill over the evaluated prompt tokens, decode over the
    /// inter-token gaps (the first token's time is TTFT, not decode).
    pub fn new(prompt_evaluated: usize, prompt_ms: f64, ttft_ms: f64, decode_ms: f64, itl_ms: Vec<f64>) -> Self {
        Timings {
            prompt_evaluated,
            prompt_ms,
            ttft_ms,
            decode_ms,
            prefill_tok_s: per_second(prompt_evaluated, prompt_ms),
            decode_tok_s: per_second(itl_ms.len(), itl_ms.iter().sum()),
            itl_ms,
        }
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Generation {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub timings: Timings,
    /// Draft statistics when the request drafted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeMetrics>,
    /// One per token of `tokens` when the request asked for them ([`GenerateOptions::logprobs`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// One per prompt token after the first when the request asked for them
    /// ([`GenerateOptions::prompt_logprobs`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<TokenLogprob>>,
    /// Mask timings when the answer was constrained ([`GenerateOptions::grammar`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub constraint: Option<crate::constraint::ConstraintStats>,
}

/// A model loaded on a backend with one sequence in its KV pool: evaluates tokens, keeps them in
/// context, rolls back. No tokenizer and no sampling: perplexity, benchmarks and tests drive it
/// directly.
pub struct Session {
    runner: Runner,
    seq: SeqId,
    prefill_chunk: usize,
    /// [n_out, n_vocab] of the last eval.
    logits: Vec<f32>,
}

impl Session {
    /// Loads the weights of `file` onto `backend`. `on_progress(done_bytes, total_bytes)`.
    pub fn load(
        file: &GgufFile,
        backend: Box<dyn Backend>,
        options: &EngineOptions,
        on_progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let mut runner = Runner::load(file, backend, options, on_progress)?;
        let seq = runner.kv_mut().add_sequence();
        Ok(Session { runner, seq, prefill_chunk: options.prefill_chunk.max(1), logits: Vec::new() })
    }

    /// A session on a runner already loaded (e.g. one an [`Engine`] gave back).
    pub fn from_runner(mut runner: Runner, prefill_chunk: usize) -> Self {
        let seq = runner.kv_mut().add_sequence();
        Session { runner, seq, prefill_chunk: prefill_chunk.max(1), logits: Vec::new() }
    }

    /// The runner back, without this session's sequence (its full blocks stay in the prefix cache).
    pub fn into_runner(mut self) -> Runner {
        self.runner.kv_mut().remove_sequence(self.seq);
        self.runner
    }

    pub fn config(&self) -> &ModelConfig {
        self.runner.config()
    }

    pub fn parameters(&self) -> crate::model::ParameterCount {
        self.runner.parameters()
    }

    pub fn backend(&self) -> &dyn Backend {
        self.runner.backend()
    }

    /// The backend's device time per kernel family since the last call ([`Backend::kernel_profile`]).
    pub fn kernel_profile(&mut self) -> Option<Vec<crate::backend::KernelTime>> {
        self.runner.kernel_profile()
    }

    /// Prompt tokens evaluated per forward pass.
    pub fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    pub fn n_ctx(&self) -> usize {
        self.runner.n_ctx()
    }

    /// Positions still free in the context.
    pub fn remaining(&self) -> usize {
        self.n_ctx().saturating_sub(self.history().len())
    }

    /// Tokens currently held in the KV cache.
    pub fn history(&self) -> &[u32] {
        self.runner.kv().tokens(self.seq)
    }

    /// Bytes of KV memory per token of context.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.runner.kv_layout().bytes_per_token()
    }

    /// Forgets everything after the first `len` tokens (rollback for speculative decoding,
    /// regenerate, editing a chat).
    pub fn rollback(&mut self, len: usize) -> Result<()> {
        self.runner.kv_mut().truncate(self.seq, len)
    }

    pub fn reset(&mut self) {
        // Truncating to 0 always succeeds; full blocks stay in the prefix cache.
        let _ = self.runner.kv_mut().truncate(self.seq, 0);
    }

    /// Forgets every cached block not used by this session (for cold-start measurements).
    pub fn clear_prefix_cache(&mut self) {
        self.runner.kv_mut().clear_cache();
    }

    /// Keeps the longest part of `prompt` whose K/V are already stored — from this session's
    /// history, then from the prefix cache — leaving at least one token to evaluate. Returns the
    /// number of prompt tokens kept.
    pub fn prepare_prompt(&mut self, prompt: &[u32]) -> Result<usize> {
        if prompt.is_empty() {
            return Err(CoreError::InvalidArgument("the prompt is empty".into()));
        }
        let mut common = self.history().iter().zip(prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
        if !self.runner.kv().can_truncate(self.seq, common) {
            common = 0;
        }
        self.rollback(common)?;
        let gained = self.runner.kv_mut().reuse_cached_prefix(self.seq, prompt)?;
        Ok(common + gained)
    }

    /// Appends `tokens` to the context and returns logits: `[n_vocab]` for the last token
    /// (`LogitsMode::Last`) or `[tokens.len(), n_vocab]` (`LogitsMode::All`).
    /// Synchronous: [`Session::eval_async`] polled once (see [`crate::block_on`]).
    pub fn eval(&mut self, tokens: &[u32], mode: LogitsMode) -> Result<&[f32]> {
        block_on(self.eval_async(tokens, mode))
    }

    /// [`Session::eval`] for backends whose logits arrive later (WebGPU in a browser).
    pub async fn eval_async(&mut self, tokens: &[u32], mode: LogitsMode) -> Result<&[f32]> {
        self.check_eval(tokens)?;
        self.logits.clear();
        for chunk in tokens.chunks(self.prefill_chunk) {
            let logits = self.runner.step_async(&[BatchEntry { seq: self.seq, tokens: chunk }], mode).await?;
            if mode == LogitsMode::All {
                self.logits.extend_from_slice(logits);
            } else {
                self.logits.clear();
                self.logits.extend_from_slice(logits);
            }
        }
        Ok(&self.logits)
    }

    fn check_eval(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(CoreError::InvalidArgument("eval needs at least one token".into()));
        }
        let needed = self.history().len() + tokens.len();
        if needed > self.n_ctx() {
            return Err(CoreError::ContextOverflow { needed, capacity: self.n_ctx() });
        }
        Ok(())
    }

    /// Appends `tokens` and returns what `readback` asks for about the last one: its logits
    /// `[n_vocab]`, or its top-k candidates (see [`crate::sampling::Sampler::readback`]). Earlier
    /// prompt chunks read back only their top 1.
    pub async fn eval_for_async(&mut self, tokens: &[u32], readback: Readback) -> Result<StepOutput<'_>> {
        self.check_eval(tokens)?;
        let last_start = (tokens.len() - 1) / self.prefill_chunk * self.prefill_chunk;
        for chunk in tokens[..last_start].chunks(self.prefill_chunk) {
            self.runner
                .step_for_async(&[BatchEntry { seq: self.seq, tokens: chunk }], LogitsMode::Last, Readback::TopK(1))
                .await?;
        }
        self.runner
            .step_for_async(&[BatchEntry { seq: self.seq, tokens: &tokens[last_start..] }], LogitsMode::Last, readback)
            .await
    }

    /// Appends `tokens` and returns what `readback` asks for about every one of them: logits
    /// `[tokens.len(), n_vocab]` or `tokens.len()` rows of candidates. More tokens than one
    /// prompt chunk are evaluated in chunks and return logits whatever `readback` says.
    pub async fn eval_all_for_async(&mut self, tokens: &[u32], readback: Readback) -> Result<StepOutput<'_>> {
        if readback == Readback::Logits || tokens.len() > self.prefill_chunk {
            return Ok(StepOutput::Logits(self.eval_async(tokens, LogitsMode::All).await?));
        }
        self.check_eval(tokens)?;
        self.runner.step_for_async(&[BatchEntry { seq: self.seq, tokens }], LogitsMode::All, readback).await
    }

    /// [`Session::eval_all_for_async`], synchronously.
    pub fn eval_all_for(&mut self, tokens: &[u32], readback: Readback) -> Result<StepOutput<'_>> {
        block_on(self.eval_all_for_async(tokens, readback))
    }

    /// [`Session::eval_for_async`], synchronously.
    pub fn eval_for(&mut self, tokens: &[u32], readback: Readback) -> Result<StepOutput<'_>> {
        block_on(self.eval_for_async(tokens, readback))
    }
}

/// A model ready to generate: a [`Scheduler`] over the loaded model, its tokenizer and its chat
/// template. [`Engine::generate`] is the scheduler with one request: the loop, the sampling,
/// the speculation and the streaming are the batching server's. The template is kept for the
/// caller, who renders a conversation with [`Engine::chat_template`] and tokenizes it with
/// [`Engine::tokenizer`]; `generate` takes token ids. Between calls the KV pool keeps what the
/// prefix cache holds (every full block of earlier prompts and answers), so a chat turn only
/// evaluates what is new.
pub struct Engine {
    scheduler: Scheduler,
    chat_template: Option<ChatTemplate>,
}

impl Engine {
    /// Loads a model onto `backend`. `on_progress(done_bytes, total_bytes)` reports weight upload.
    pub fn load(
        file: &GgufFile,
        backend: Box<dyn Backend>,
        options: &EngineOptions,
        on_progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let tokenizer = Tokenizer::from_gguf(&file.metadata)?;
        let chat_template = ChatTemplate::from_gguf(&file.metadata)?;
        let runner = Runner::load(file, backend, options, on_progress)?;
        Ok(Engine::from_parts(runner, tokenizer, chat_template, options))
    }

    /// An engine from a loaded runner (with `options`' prefill chunk and sequences at once) and
    /// the model's tokenizer and chat template.
    pub fn from_parts(
        runner: Runner,
        tokenizer: Tokenizer,
        chat_template: Option<ChatTemplate>,
        options: &EngineOptions,
    ) -> Self {
        let scheduler_options = SchedulerOptions {
            max_batch: options.max_sequences.max(1),
            prefill_chunk: options.prefill_chunk,
            ..SchedulerOptions::default()
        };
        Engine { scheduler: Scheduler::new(runner, tokenizer, scheduler_options), chat_template }
    }

    /// The runner and tokenizer back (e.g. for a [`Session`] that evaluates tokens directly).
    pub fn into_parts(self) -> (Runner, Tokenizer, Option<ChatTemplate>) {
        let (runner, tokenizer) = self.scheduler.into_parts();
        (runner, tokenizer, self.chat_template)
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    pub fn scheduler_mut(&mut self) -> &mut Scheduler {
        &mut self.scheduler
    }

    pub fn runner(&self) -> &Runner {
        self.scheduler.runner()
    }

    pub fn config(&self) -> &ModelConfig {
        self.runner().config()
    }

    pub fn parameters(&self) -> crate::model::ParameterCount {
        self.runner().parameters()
    }

    pub fn backend(&self) -> &dyn Backend {
        self.runner().backend()
    }

    pub fn n_ctx(&self) -> usize {
        self.runner().n_ctx()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        self.scheduler.tokenizer()
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// The backend's device time per kernel family since the last call ([`Backend::kernel_profile`]).
    pub fn kernel_profile(&mut self) -> Option<Vec<crate::backend::KernelTime>> {
        self.scheduler.runner_mut().kernel_profile()
    }

    /// Forgets every cached block (for cold-start measurements).
    pub fn clear_prefix_cache(&mut self) {
        self.scheduler.runner_mut().kv_mut().clear_cache();
    }

    /// Drafts with `draft` (same vocabulary; loaded with a sequence per request at once) for
    /// requests that ask for a draft model, within `options`' bounds by default.
    pub fn set_draft_model(&mut self, draft: BatchedDraftModel, options: SpeculativeOptions) {
        self.scheduler.set_draft_model(draft, options);
    }

    /// Generates a continuation of `prompt` (with the draft model, when one is set). Prompt
    /// tokens the prefix cache holds are reused. `on_text(delta)` receives streamed text;
    /// returning false cancels. Synchronous: [`Engine::generate_with_async`] polled once (see
    /// [`crate::block_on`]).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation> {
        block_on(self.generate_with_async(prompt, options, Drafting::Default, on_text))
    }

    /// [`Engine::generate`], drafting as `drafting` says (speculative decoding by prompt lookup,
    /// the draft model, or both). Greedy output is the same as without drafts; with sampling
    /// the output follows the same distribution (not the same tokens for a given seed).
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        drafting: Drafting,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation> {
        block_on(self.generate_with_async(prompt, options, drafting, on_text))
    }

    /// [`Engine::generate_with`] for backends whose logits arrive later (WebGPU in a browser):
    /// submits the request and steps the scheduler until it ends.
    pub async fn generate_with_async(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        drafting: Drafting,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation> {
        if !self.scheduler.is_idle() {
            return Err(CoreError::InvalidArgument(
                "the engine's scheduler is running other requests: step it until they end".into(),
            ));
        }
        let id = self.scheduler.submit_with(prompt.to_vec(), options.clone(), drafting)?;
        let mut outcome = None;
        let mut cancelled = false;
        while outcome.is_none() {
            let stepped = self
                .scheduler
                .step_async(&mut |event| match event {
                    SchedulerEvent::Text { delta, .. } if !cancelled => cancelled = !on_text(&delta),
                    SchedulerEvent::Finished { generation, .. } => outcome = Some(Ok(generation)),
                    SchedulerEvent::Failed { error, .. } => outcome = Some(Err(error)),
                    SchedulerEvent::Text { .. }
                    | SchedulerEvent::Started { .. }
                    | SchedulerEvent::PromptScored { .. } => {}
                })
                .await?;
            if cancelled && outcome.is_none() {
                outcome = self.scheduler.cancel(id).map(Ok);
            }
            if !stepped && outcome.is_none() {
                return Err(CoreError::InvalidArgument("the request left the scheduler without a result".into()));
            }
        }
        outcome.unwrap_or_else(|| Err(CoreError::InvalidArgument("the request ended without a result".into())))
    }
}

/// Turns chosen tokens into text to stream: end-of-generation tokens, stop strings (held-back text
/// is never emitted). Owns its state, so a scheduler can keep one per running request.
pub struct TextStream {
    decoder: StreamDecoder,
    stops: StopStrings,
    ignore_eos: bool,
    stop_string_hit: bool,
    /// Tokens kept in the output (an end-of-generation token is not).
    pub tokens: Vec<u32>,
    text: String,
}

impl TextStream {
    pub fn new(stop: &[String], ignore_eos: bool) -> Self {
        TextStream {
            decoder: StreamDecoder::default(),
            stops: StopStrings::new(stop.to_vec()),
            ignore_eos,
            stop_string_hit: false,
            tokens: Vec::new(),
            text: String::new(),
        }
    }

    /// Adds the next token: the text it releases, and `Some(reason)` when generation ends here.
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> (String, Option<FinishReason>) {
        if !self.ignore_eos && tokenizer.is_end_of_generation(token) {
            return (String::new(), Some(FinishReason::Stop));
        }
        self.tokens.push(token);
        let piece = self.decoder.push(tokenizer, token);
        let outcome = self.stops.push(&piece);
        self.text.push_str(&outcome.emit);
        if outcome.stopped {
            self.stop_string_hit = true;
            return (outcome.emit, Some(FinishReason::Stop));
        }
        (outcome.emit, None)
    }

    /// Releases held-back text (a partial UTF-8 character, a possible stop-string prefix) unless
    /// a stop string matched, in which case it belongs to the stop string. Returns (tail, tokens,
    /// full text).
    pub fn finish(mut self) -> (String, Vec<u32>, String) {
        let mut tail = String::new();
        if !self.stop_string_hit {
            let rest = self.stops.push(&self.decoder.flush());
            tail = rest.emit + &self.stops.finish();
            self.text.push_str(&tail);
        }
        (tail, self.tokens, self.text)
    }
}

pub(crate) fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn per_second(n: usize, ms: f64) -> f64 {
    if ms <= 0.0 {
        0.0
    } else {
        n as f64 / (ms / 1e3)
    }
}
