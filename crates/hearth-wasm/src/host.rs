//! The platform-independent half of the bindings: bytes → GGUF → a [`Scheduler`] on a backend;
//! requests are submitted and advanced together by [`EngineHost::step_async`] (continuous
//! batching, speculative requests included: their drafts come from prompt lookup, the
//! scheduler's draft model, or lookup then the draft model). Plain Rust, so it is tested natively;
//! `bindings.rs` only converts JS values and drives the steps on the JS event loop.

use crate::error::{Result, WasmError};
use crate::request::{LoadOptions, RequestOptions};
use hearth_core::backend::Backend;
use hearth_core::chat::{ChatTemplate, ToolCallDelta, ToolCallFormat, ToolCallParser};
use hearth_core::constraint::GrammarUsage;
use hearth_core::engine::{EngineOptions, FinishReason, Generation};
use hearth_core::gguf::{ByteSource, GgufFile};
use hearth_core::request::response::{chat_logprobs, completion_logprobs, echoed_completion_logprobs};
use hearth_core::request::{Endpoint, Prompt, SpeculativeMode};
use hearth_core::runner::Runner;
use hearth_core::sampling::TokenLogprob;
use hearth_core::scheduler::{Drafting, RequestId, Scheduler, SchedulerEvent, SchedulerOptions};
use hearth_core::speculative::{
    check_vocab_compatible, default_draft_vocab, BatchedDraftModel, SpeculativeMetrics, SpeculativeOptions,
};
use hearth_core::tokenizer::Tokenizer;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// Model bytes owned by wasm memory. `MemorySource` wants an `Arc<[u8]>`, and turning a `Vec` into
/// one copies it: for a model of hundreds of MB that doubles the (never shrinking) wasm heap.
pub struct OwnedBytes(pub Vec<u8>);

impl ByteSource for OwnedBytes {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn slice(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        self.0.get(start..start.checked_add(len)?)
    }
}

/// One finished request: what JS turns into OpenAI `usage` and `finish_reason`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens actually evaluated (the others were reused from the KV cache).
    pub prompt_evaluated: usize,
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub finish_reason: FinishReason,
    pub text: String,
    pub prompt_token_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub seed: u64,
    /// Speculative requests: draft tokens proposed and accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeMetrics>,
    /// Chat with tools: the answer's text outside calls (null when it is only calls) and its
    /// calls (`{name, arguments}`, arguments as JSON text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallReport>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<Option<String>>,
    /// The tokens' log-probabilities in OpenAI's `choices[].logprobs` shape for the request's
    /// kind, when it asked for them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<serde_json::Value>,
    /// Structured output: the masks' count and times (`usage.grammar`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grammar: Option<GrammarUsage>,
}

/// One tool call of a [`Report`].
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallReport {
    pub name: String,
    pub arguments: String,
}

impl Report {
    /// The report of a submitted request's `generation`.
    fn new(generation: Generation, submitted: Submitted, tokenizer: &Tokenizer) -> Self {
        let Submitted { seed, endpoint, echo, tool_calls } = submitted;
        let (content, tool_calls) = match tool_calls {
            Some((format, _)) => {
                let (content, calls) = format.parser().parse(&generation.text);
                let calls =
                    calls.into_iter().map(|c| ToolCallReport { name: c.name, arguments: c.arguments }).collect();
                (Some(content), Some(calls))
            }
            None => (None, None),
        };
        let prompt_scores = echo.as_ref().and_then(|e| e.prompt_logprobs.get());
        let logprobs = match (generation.logprobs.as_deref(), endpoint) {
            (Some(l), Some(Endpoint::Chat)) => Some(chat_logprobs(tokenizer, l)),
            (Some(l), Some(Endpoint::Completions)) => Some(match prompt_scores {
                Some(scores) => echoed_completion_logprobs(tokenizer, &generation.prompt_tokens, scores, l),
                None => completion_logprobs(tokenizer, l, 0).0,
            }),
            _ => None,
        };
        let text = match &echo {
            Some(echo) => format!("{}{}", echo.text, generation.text),
            None => generation.text,
        };
        let t = &generation.timings;
        Report {
            prompt_tokens: generation.prompt_tokens.len(),
            completion_tokens: generation.tokens.len(),
            prompt_evaluated: t.prompt_evaluated,
            ttft_ms: t.ttft_ms,
            prefill_tok_s: t.prefill_tok_s,
            decode_tok_s: t.decode_tok_s,
            finish_reason: generation.finish_reason,
            text,
            prompt_token_ids: generation.prompt_tokens,
            token_ids: generation.tokens,
            seed,
            grammar: GrammarUsage::of(generation.constraint.as_ref()),
            speculative: generation.speculative,
            logprobs,
            tool_calls,
            content,
        }
    }
}

/// A piece of a tools answer as a host event: text outside calls streams as text.
fn tool_event(id: RequestId, delta: ToolCallDelta) -> HostEvent {
    match delta {
        ToolCallDelta::Content(delta) => HostEvent::Text { id, delta },
        delta => HostEvent::ToolCall { id, delta },
    }
}

/// Facts about the loaded model for `runtime_stats`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    pub architecture: String,
    pub n_ctx: usize,
    pub n_ctx_train: usize,
    pub n_vocab: usize,
    pub n_layer: usize,
    pub has_chat_template: bool,
    pub file_bytes: u64,
}

/// The batching state for `runtime_stats`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct BatchStats {
    /// Requests allowed in one batch.
    pub max_batch: usize,
    pub running: usize,
    pub waiting: usize,
    /// Largest number of requests evaluated in one forward pass since the model was loaded.
    pub max_batch_observed: usize,
    /// Batched forward passes run.
    pub steps: u64,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    pub preemptions: u64,
}

/// What happened to a request during [`EngineHost::step_async`].
#[derive(Debug)]
pub enum HostEvent {
    Text {
        id: RequestId,
        delta: String,
    },
    /// A request offering tools: a piece of a call (its name, or more of its arguments).
    ToolCall {
        id: RequestId,
        delta: ToolCallDelta,
    },
    Finished {
        id: RequestId,
        report: Box<Report>,
    },
    Failed {
        id: RequestId,
        error: WasmError,
    },
}

pub struct EngineHost {
    scheduler: Scheduler,
    chat_template: Option<ChatTemplate>,
    engine_options: EngineOptions,
    info: ModelInfo,
    submitted: HashMap<RequestId, Submitted>,
    stats: BatchStats,
}

/// What a running request's report needs beyond its generation.
#[derive(Default)]
struct Submitted {
    /// The seed it samples with (reported back).
    seed: u64,
    /// Its kind: how its log-probabilities are reported.
    endpoint: Option<Endpoint>,
    /// Completions' `echo`, shared by the request's choices.
    echo: Option<Arc<Echo>>,
    /// Chat with tools: its answer split into text and calls as it streams.
    tool_calls: Option<(ToolCallFormat, ToolCallParser)>,
}

/// An echoed prompt: streamed before the answer, and the start of its text and log-probabilities.
struct Echo {
    text: String,
    /// The prompt's tokens' log-probabilities, scored by the first choice (with `logprobs`).
    prompt_logprobs: OnceLock<Vec<TokenLogprob>>,
}

fn no_draft_model() -> WasmError {
    WasmError::bad_request("speculative", "mode 'draft-model' needs a draft model (createEngine({ draftModel }))")
}

/// Requests per batch unless the load options say otherwise.
pub const DEFAULT_MAX_BATCH: usize = 4;

impl EngineHost {
    /// Parses `bytes` as GGUF and loads it onto `backend`. `on_progress(done, total)` reports
    /// weight upload in bytes.
    pub fn load(
        bytes: Vec<u8>,
        options: &LoadOptions,
        backend: Box<dyn Backend>,
        on_progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        Self::load_source(Arc::new(OwnedBytes(bytes)), options, backend, on_progress)
    }

    /// [`EngineHost::load`] from any byte source (in the browser on WebGPU: the JS-held file,
    /// read tensor by tensor, never copied whole into wasm memory). The source is dropped when
    /// this returns unless the backend keeps weight views into it (the CPU backend does).
    pub fn load_source(
        source: Arc<dyn ByteSource>,
        options: &LoadOptions,
        backend: Box<dyn Backend>,
        on_progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let engine_options = options.engine_options()?;
        let max_batch = options.max_batch.unwrap_or(DEFAULT_MAX_BATCH);
        if max_batch == 0 {
            return Err(WasmError::bad_request("load options", "max_batch must be at least 1"));
        }
        let file_bytes = source.len();
        let file = GgufFile::read(source)?;
        let architecture = file.architecture()?.to_string();
        let tokenizer = Tokenizer::from_gguf(&file.metadata)?;
        let chat_template = ChatTemplate::from_gguf(&file.metadata)?;
        let runner = hearth_core::runner::Runner::load(&file, backend, &engine_options, on_progress)?;
        let config = runner.config();
        let info = ModelInfo {
            architecture,
            n_ctx: runner.n_ctx(),
            n_ctx_train: config.n_ctx_train,
            n_vocab: config.n_vocab,
            n_layer: config.n_layer,
            has_chat_template: chat_template.is_some(),
            file_bytes,
        };
        let scheduler = Scheduler::new(
            runner,
            tokenizer,
            SchedulerOptions { max_batch, prefill_chunk: engine_options.prefill_chunk, ..SchedulerOptions::default() },
        );
        let stats = BatchStats { max_batch, ..BatchStats::default() };
        Ok(EngineHost { scheduler, chat_template, engine_options, info, submitted: HashMap::new(), stats })
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn backend_memory_bytes(&self) -> u64 {
        self.scheduler.runner().backend().memory_bytes()
    }

    pub fn batch_stats(&self) -> BatchStats {
        let mut stats = self.stats;
        let s = self.scheduler.stats();
        (stats.running, stats.waiting, stats.kv_blocks_used, stats.kv_blocks_total, stats.preemptions) =
            (s.running, s.waiting, s.kv_blocks_used, s.kv_blocks_total, s.preemptions);
        stats
    }

    /// No request is queued or running.
    pub fn is_idle(&self) -> bool {
        self.scheduler.is_idle()
    }

    /// Token ids → text, special tokens included (tests, debugging).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.scheduler.tokenizer().decode(ids, false).unwrap_or_default()
    }

    /// Prompt → token ids, by the core's one rule ([`Prompt::tokenize`]): chat messages through
    /// the model's template at `now_unix`, tokenized without a second BOS.
    pub fn tokenize(&self, input: &Prompt, now_unix: Option<i64>) -> Result<Vec<u32>> {
        let history = self.scheduler.token_history();
        let template = self.chat_template.as_ref();
        Ok(input.tokenize_with_tools(self.scheduler.tokenizer(), template, now_unix, None, Some(history))?)
    }

    /// The prompt's tokens and checked options of one request.
    fn prepare(
        &self,
        input: &Prompt,
        options: &RequestOptions,
        default_seed: u64,
        now_unix: Option<i64>,
    ) -> Result<(Vec<u32>, hearth_core::engine::GenerateOptions, Option<ToolCallFormat>)> {
        let tools = options.tools();
        let template = self.chat_template.as_ref();
        let tokenizer = self.scheduler.tokenizer();
        let history = Some(&**self.scheduler.token_history());
        let prompt = input.tokenize_with_tools(tokenizer, template, now_unix, tools, history)?;
        let mut generate_options = options.generate_options(prompt.len(), self.info.n_ctx, default_seed)?;
        let format = tools.map(|t| t.apply(template, tokenizer, &mut generate_options)).transpose()?.flatten();
        Ok((prompt, generate_options, format))
    }

    /// Queues a request for the batch, speculative ones included: one scheduler request per
    /// choice (`n`), in choice order, sharing the prompt's KV blocks; choice `i` samples with the
    /// request's seed + `i`.
    pub fn submit(
        &mut self,
        input: &Prompt,
        options: &RequestOptions,
        default_seed: u64,
        now_unix: Option<i64>,
    ) -> Result<Vec<RequestId>> {
        let (prompt, generate_options, tools) = self.prepare(input, options, default_seed, now_unix)?;
        let seed = generate_options.sampling.seed;
        let drafting = match (options.speculative(), options.prediction()) {
            (Some(s), _) if s.mode == SpeculativeMode::Lookup => {
                Drafting::Lookup { reference: Vec::new(), options: s.options.clone() }
            }
            (Some(s), _) => {
                if self.scheduler.draft_model().is_none() {
                    return Err(no_draft_model());
                }
                let (options, min_confidence) = (s.options.clone(), s.draft_min_p);
                if s.lookup_first {
                    Drafting::LookupThenDraftModel { options, min_confidence }
                } else {
                    Drafting::DraftModel { options, min_confidence }
                }
            }
            // A predicted output reads as text inside the answer: no special tokens, no BOS.
            (None, Some(text)) => Drafting::Lookup {
                reference: self.scheduler.tokenizer().encode(text, false, false)?,
                options: SpeculativeOptions::lookup(),
            },
            (None, None) => Drafting::None,
        };
        let ids = self.scheduler.submit_choices(prompt, generate_options, drafting, options.n_choices())?;
        let echo = match input {
            Prompt::Text(text) if options.echo() => {
                Some(Arc::new(Echo { text: text.clone(), prompt_logprobs: OnceLock::new() }))
            }
            _ => None,
        };
        for (choice, &id) in ids.iter().enumerate() {
            let submitted = Submitted {
                seed: seed.wrapping_add(choice as u64),
                endpoint: options.endpoint(),
                echo: echo.clone(),
                tool_calls: tools.map(|format| (format, format.parser())),
            };
            self.submitted.insert(id, submitted);
        }
        Ok(ids)
    }

    /// Ends a request now and frees its KV blocks; its report (finish reason `cancelled`).
    pub fn cancel(&mut self, id: RequestId) -> Option<Report> {
        let generation = self.scheduler.cancel(id)?;
        let submitted = self.submitted.remove(&id).unwrap_or_default();
        Some(Report::new(generation, submitted, self.scheduler.tokenizer()))
    }

    /// One batched forward pass over every running request (admitting waiting ones first).
    /// Returns false when there was nothing to do.
    pub async fn step_async(&mut self, on_event: &mut dyn FnMut(HostEvent)) -> Result<bool> {
        let scheduler = &mut self.scheduler;
        let submitted = &mut self.submitted;
        // Reported after the step, which holds the tokenizer their log-probabilities need.
        let mut finished = Vec::new();
        let stepped = scheduler
            .step_async(&mut |event| match event {
                // An echoed prompt streams before the answer.
                SchedulerEvent::Started { id, .. } => {
                    if let Some(echo) = submitted.get(&id).and_then(|s| s.echo.as_ref()) {
                        on_event(HostEvent::Text { id, delta: echo.text.clone() });
                    }
                }
                SchedulerEvent::PromptScored { id, logprobs } => {
                    if let Some(echo) = submitted.get(&id).and_then(|s| s.echo.as_ref()) {
                        let _ = echo.prompt_logprobs.set(logprobs);
                    }
                }
                // (The browser reports log-probabilities with the last chunk.)
                SchedulerEvent::Text { id, delta, .. } => {
                    match submitted.get_mut(&id).and_then(|s| s.tool_calls.as_mut()) {
                        Some((_, parser)) => parser.push(&delta).into_iter().for_each(|d| on_event(tool_event(id, d))),
                        None => on_event(HostEvent::Text { id, delta }),
                    }
                }
                SchedulerEvent::Finished { id, generation } => {
                    if let Some((_, parser)) = submitted.get_mut(&id).and_then(|s| s.tool_calls.as_mut()) {
                        parser.finish().into_iter().for_each(|d| on_event(tool_event(id, d)));
                    }
                    finished.push((id, generation))
                }
                SchedulerEvent::Failed { id, error } => {
                    submitted.remove(&id);
                    on_event(HostEvent::Failed { id, error: error.into() });
                }
            })
            .await?;
        let finished_count = finished.len();
        for (id, generation) in finished {
            let report = Report::new(generation, submitted.remove(&id).unwrap_or_default(), scheduler.tokenizer());
            on_event(HostEvent::Finished { id, report: Box::new(report) });
        }
        if stepped {
            // Requests in this pass: those still running plus those it finished.
            let in_pass = scheduler.stats().running + finished_count;
            self.stats.steps += 1;
            self.stats.max_batch_observed = self.stats.max_batch_observed.max(in_pass);
        }
        Ok(stepped)
    }

    /// Runs one request of one choice (speculative or not) to its end; `on_text(delta)` streams text,
    /// returning false interrupts (the report then says `cancelled`). Synchronous:
    /// [`EngineHost::generate_async`] polled once (the backend must finish steps inside
    /// `submit`: the CPU backend; natively every backend).
    pub fn generate(
        &mut self,
        input: &Prompt,
        options: &RequestOptions,
        default_seed: u64,
        now_unix: Option<i64>,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Report> {
        // The inner result is the request's; the outer one fails only if the backend was async.
        hearth_core::block_on::block_on(async {
            Ok(self.generate_async(input, options, default_seed, now_unix, on_text).await)
        })?
    }

    /// [`EngineHost::generate`] for backends whose logits arrive later:
    /// submits the request and steps until it ends.
    pub async fn generate_async(
        &mut self,
        input: &Prompt,
        options: &RequestOptions,
        default_seed: u64,
        now_unix: Option<i64>,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Report> {
        if options.n_choices() != 1 {
            return Err(WasmError::bad_request(
                "n",
                "generate runs one choice: submit a request of several and step it",
            ));
        }
        let ids = self.submit(input, options, default_seed, now_unix)?;
        let Some(&id) = ids.first() else { return Err(WasmError::bad_request("n", "no choice was submitted")) };
        let mut outcome = None;
        let mut stop = false;
        while outcome.is_none() {
            self.step_async(&mut |event| match event {
                HostEvent::Text { id: of, delta } if of == id => stop |= !on_text(&delta),
                HostEvent::Finished { id: of, report } if of == id => outcome = Some(Ok(*report)),
                HostEvent::Failed { id: of, error } if of == id => outcome = Some(Err(error)),
                _ => {}
            })
            .await?;
            if stop && outcome.is_none() {
                outcome = self.cancel(id).map(Ok);
            }
        }
        outcome.unwrap_or_else(|| Err(WasmError::bad_request("state", "the request vanished")))
    }

    /// Loads a draft model (same vocabulary as this model) onto `backend` for speculative
    /// requests with mode `draft-model`. The vocabularies are compared before any weight loads.
    /// Any backend: in a browser a WebGPU draft has its passes awaited like the target's.
    pub fn load_draft(
        &mut self,
        source: Arc<dyn ByteSource>,
        backend: Box<dyn Backend>,
        on_progress: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        self.scheduler.take_draft_model();
        let file = GgufFile::read(source)?;
        let draft_tokenizer = self.check_draft_vocabulary(&file)?;
        // A shortlisted head where the vocabulary allows, as `hearth run --draft-model`; a
        // sequence per batch place, as the target's pool.
        let logits_vocab = default_draft_vocab(&file.metadata);
        let options = EngineOptions {
            n_ctx: self.info.n_ctx,
            max_sequences: self.stats.max_batch,
            logits_vocab,
            ..self.engine_options.clone()
        };
        let runner = Runner::load(&file, backend, &options, on_progress)?;
        let scheduler = &mut self.scheduler;
        let draft = BatchedDraftModel::new(runner, &draft_tokenizer, scheduler.tokenizer(), options.prefill_chunk)?;
        scheduler.set_draft_model(draft, SpeculativeOptions::default());
        Ok(())
    }

    /// The draft model's tokenizer if its vocabulary is this model's (`bad-argument` otherwise);
    /// reads only the GGUF header, so it runs before a large draft is copied anywhere.
    pub fn check_draft_vocabulary(&self, draft: &GgufFile) -> Result<Tokenizer> {
        let draft_tokenizer = Tokenizer::from_gguf(&draft.metadata)?;
        check_vocab_compatible(self.scheduler.tokenizer(), &draft_tokenizer)
            .map_err(|e| WasmError::bad_request("draft model", format!("it cannot draft for this model: {e}")))?;
        Ok(draft_tokenizer)
    }

    /// Frees the draft model (and its backend).
    pub fn unload_draft(&mut self) {
        self.scheduler.take_draft_model();
    }

    pub fn has_draft(&self) -> bool {
        self.scheduler.draft_model().is_some()
    }

    /// The draft model's backend ("wgpu", "cpu") and its memory in bytes, when one is loaded.
    pub fn draft_backend(&self) -> Option<(String, u64)> {
        let backend = self.scheduler.draft_model()?.runner().backend();
        Some((backend.name().to_string(), backend.memory_bytes()))
    }
}
