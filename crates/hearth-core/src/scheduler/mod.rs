//! Continuous batching over a [`Runner`]: requests join and leave the running batch at every step;
//! long prompts are prefilled in chunks interleaved with the decode steps of running requests;
//! admission waits for free KV blocks; when the pool runs out mid-generation the newest request is
//! preempted (its KV dropped, recomputed later, its output kept); cancellation frees blocks at once.
//!
//! While requests decode, a step carries only as many prompt tokens as keep it within
//! `max_stall` times a decode-only step ([`step_budget`]), so a long prompt never stalls the
//! running streams; with nothing decoding, prompts prefill `prefill_chunk` tokens per step.
//!
//! Results do not depend on batching or chunking: every op is row-independent on the backends,
//! and attention gives a key the same weight whichever step stored it (tests/kv_paging.rs).
//!
//! With [`SchedulerOptions::lookup`] or a draft model ([`Scheduler::set_draft_model`]), or both,
//! in steps that only decode each request also verifies drafts, weighed across the step's
//! requests ([`drafts`]); greedy outputs stay the same token for token. One request alone is
//! [`crate::engine::Engine::generate_with`]: the same loop.

mod drafts;
mod forced;
mod pass_costs;
mod request;
pub mod step_budget;

pub use pass_costs::PassCosts;
pub use request::RequestId;

use crate::backend::Readback;
use crate::block_on::block_on;
use crate::constraint::{GrammarCompiler, GrammarState};
use crate::engine::{FinishReason, GenerateOptions, Generation, Instant};
use crate::error::{CoreError, Result};
use crate::graph::LogitsMode;
use crate::kv::SeqId;
use crate::request::TokenHistory;
use crate::runner::{BatchEntry, Runner, StepOutput, ROLLBACK_MARGIN};
use crate::sampling::TokenLogprob;
use crate::speculative::verify::VerificationOutcome;
use crate::speculative::{BatchedDraftModel, DraftPolicy, DraftRequest, SpeculativeOptions};
use crate::tokenizer::Tokenizer;
use drafts::{DraftKind, DraftSource, EntryRows, FreeLookup, FreeStep, RequestDrafts};
use request::Active;
use std::collections::VecDeque;
use std::sync::Arc;
use step_budget::{StepCostModel, PROMPT_GRANULE};

/// The most drafts a request verifies in one step, whatever `--draft-tokens` says: rejected ones
/// are rolled back, and a sliding-window model keeps only this many positions past its window.
const MAX_DRAFT_ROWS: usize = ROLLBACK_MARGIN;

#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    /// Requests running at once.
    pub max_batch: usize,
    /// Prompt tokens per step, over all prefilling requests, while no request is decoding.
    pub prefill_chunk: usize,
    /// While requests decode, a step that also carries prompt chunks may take at most this many
    /// times as long as the decodes alone (learned online): the bound on the inter-token stall
    /// a newly arrived prompt causes. 1.0 admits a single 16-token granule per step.
    pub max_stall: f64,
    /// Speculative decoding by prompt lookup for every request, with these draft bounds (None:
    /// off); with a draft model as well, lookup drafts first and the draft model where nothing
    /// is copied. Requests draft in the steps that only decode; see [`drafts`].
    pub lookup: Option<SpeculativeOptions>,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions { max_batch: 8, prefill_chunk: 256, max_stall: 2.0, lookup: None }
    }
}

/// How a submitted request drafts for speculative decoding.
#[derive(Clone, Debug)]
pub enum Drafting {
    /// As the scheduler is set up: prompt lookup then its draft model when it has both
    /// ([`SchedulerOptions::lookup`], [`Scheduler::set_draft_model`]), else the one it has, else
    /// not at all.
    Default,
    /// Not at all.
    None,
    /// Prompt lookup, copying from the request's context and `reference` (a predicted output;
    /// may be empty), within `options`' bounds.
    Lookup { reference: Vec<u32>, options: SpeculativeOptions },
    /// The scheduler's draft model within `options`' bounds, stopping where its top token is less
    /// likely than `min_confidence`.
    DraftModel { options: SpeculativeOptions, min_confidence: f32 },
    /// Prompt lookup's free drafts where the output copies (at most
    /// [`SpeculativeOptions::lookup`]'s draft length, judged by a policy of their own), the
    /// scheduler's draft model elsewhere, within `options`' bounds and `min_confidence`.
    LookupThenDraftModel { options: SpeculativeOptions, min_confidence: f32 },
}

/// Where the first choice of a prompt is, for the others ([`Scheduler::submit_choices`]).
enum PromptHolder {
    /// Queued, or its prompt is not all in KV yet: the others wait.
    Evaluating,
    /// Running, with the prompt in this sequence.
    Holds(SeqId),
    /// Ended (its blocks are in the prefix cache) or cancelled.
    Gone,
}

/// What the last step carried, and the prompt budget it was planned with.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct StepPlanStats {
    /// Requests that sampled their next token from this step.
    pub decode_rows: usize,
    pub prompt_tokens: usize,
    /// Rows that verified drafts (prompt lookup's or the draft model's).
    pub draft_rows: usize,
    /// Prompt tokens the step was allowed (`prefill_chunk` when nothing was decoding).
    pub prompt_budget: usize,
}

/// What happened to a request during a step.
// (`Finished` carries the whole result, a few hundred bytes, once per request: not worth a box.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum SchedulerEvent {
    /// Admitted: its prompt starts evaluating (`cached_tokens` of it were already in KV).
    Started {
        id: RequestId,
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    /// Streamed text, with the log-probabilities of the tokens chosen since the last event
    /// when the request asks for them (`GenerateOptions::logprobs`; the text of a token may be
    /// held back, e.g. a possible stop string, and come with a later event). The rest arrive in
    /// [`Generation::logprobs`], which holds them all.
    Text {
        id: RequestId,
        delta: String,
        logprobs: Vec<TokenLogprob>,
    },
    /// The prompt's tokens' log-probabilities, once its last token is evaluated, for a request
    /// that scores its prompt ([`GenerateOptions::prompt_logprobs`]; completions' `echo`): entry
    /// `k` is prompt token `k + 1`'s. They come before any text, so an echo can be streamed first.
    PromptScored {
        id: RequestId,
        logprobs: Vec<TokenLogprob>,
    },
    Finished {
        id: RequestId,
        generation: Generation,
    },
    Failed {
        id: RequestId,
        error: CoreError,
    },
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct SchedulerStats {
    pub running: usize,
    pub waiting: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    pub prefix_hit_rate: f64,
    pub preemptions: u64,
    pub last_step: StepPlanStats,
    /// The learned step cost, `(fixed_ms, per_row_ms)`, once identified.
    pub step_cost_ms: Option<(f64, f64)>,
}

pub struct Scheduler {
    runner: Runner,
    tokenizer: Tokenizer,
    options: SchedulerOptions,
    waiting: VecDeque<Active>,
    running: Vec<Active>,
    next_id: RequestId,
    preemptions: u64,
    step_cost: StepCostModel,
    last_step: StepPlanStats,
    /// The draft policy the last request of each drafter and draft bounds ended with: the next
    /// one with the same starts from what it measured (pass costs) and learnt (how far copies
    /// run, how often drafts are kept). Bounds differ per request in the browser.
    /// (With free drafts ahead of a draft model, their policy too.)
    policies: Vec<LearntPolicy>,
    /// The draft model every request without a prediction drafts with, and its draft bounds.
    draft_model: Option<(BatchedDraftModel, SpeculativeOptions)>,
    /// What passes cost on this machine, measured or given at load: fresh policies start from
    /// them.
    pass_costs: Option<PassCosts>,
    /// Structured output's compiler for this model, built when the first constrained request
    /// arrives.
    grammars: Option<GrammarCompiler>,
    /// Recent prompts and answers with their ids: each finished answer is learnt here, and
    /// whoever tokenizes this model's next prompts reads it ([`Scheduler::token_history`]).
    history: Arc<TokenHistory>,
}

impl Scheduler {
    pub fn new(runner: Runner, tokenizer: Tokenizer, options: SchedulerOptions) -> Self {
        let max_stall = if options.max_stall.is_finite() {
            options.max_stall.max(1.0)
        } else {
            SchedulerOptions::default().max_stall
        };
        let options = SchedulerOptions {
            max_batch: options.max_batch.max(1),
            prefill_chunk: options.prefill_chunk.max(1),
            max_stall,
            ..options
        };
        Scheduler {
            runner,
            tokenizer,
            options,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 1,
            preemptions: 0,
            step_cost: StepCostModel::default(),
            last_step: StepPlanStats::default(),
            policies: Vec::new(),
            draft_model: None,
            pass_costs: None,
            grammars: None,
            history: Arc::new(TokenHistory::new()),
        }
    }

    /// The ids of the prompts and answers this scheduler ran: tokenizing a conversation through
    /// it ([`crate::request::Prompt::tokenize_with_tools`]) continues from the model's own tokens.
    pub fn token_history(&self) -> &Arc<TokenHistory> {
        &self.history
    }

    /// Every request drafts with `draft` (same vocabulary; its KV pool must hold a sequence per
    /// running request), up to `options.max_draft_tokens` a step, but one with a prediction
    /// (it copies from the prediction by prompt lookup).
    pub fn set_draft_model(&mut self, draft: BatchedDraftModel, options: SpeculativeOptions) {
        self.draft_model = Some((draft, options));
    }

    /// The draft model, if one is set.
    pub fn draft_model(&self) -> Option<&BatchedDraftModel> {
        self.draft_model.as_ref().map(|(draft, _)| draft)
    }

    /// The policies a new request of `kind` with draft bounds `options` starts from (the free
    /// drafts' for [`DraftKind::LookupThenModel`]): what the last one with the same learnt, or
    /// fresh from the pass costs measured at load.
    fn policies_for(&self, kind: DraftKind, options: &SpeculativeOptions) -> (DraftPolicy, Option<DraftPolicy>) {
        let fresh = |options: &SpeculativeOptions, with_draft: bool| {
            let mut policy = DraftPolicy::new(options);
            if let Some(costs) = &self.pass_costs {
                costs.seed(&mut policy, with_draft);
            }
            policy
        };
        let free_options = SpeculativeOptions { adaptive: options.adaptive, ..SpeculativeOptions::lookup() };
        let fresh_free = (kind == DraftKind::LookupThenModel).then(|| fresh(&free_options, false));
        match self.policies.iter().find(|l| l.kind == kind && l.options == *options) {
            Some(learnt) => (
                learnt.policy.for_next_request(),
                learnt.free_policy.as_ref().map(DraftPolicy::for_next_request).or(fresh_free),
            ),
            None => (fresh(options, kind != DraftKind::Lookup), fresh_free),
        }
    }

    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    /// The runner, to measure or reset it between requests (its KV holds only the running
    /// requests' sequences and the prefix cache).
    pub fn runner_mut(&mut self) -> &mut Runner {
        &mut self.runner
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Queues a request. Errors at once for what can never run (empty or too long prompt).
    pub fn submit(&mut self, prompt: Vec<u32>, options: GenerateOptions) -> Result<RequestId> {
        self.submit_with(prompt, options, Drafting::Default)
    }

    /// [`Self::submit`] with `prediction`, tokens the caller expects the answer to repeat (OpenAI's
    /// predicted output, e.g. the code being edited): the request drafts by prompt lookup, from its
    /// context and the prediction, whatever drafter the scheduler has.
    pub fn submit_predicted(
        &mut self,
        prompt: Vec<u32>,
        options: GenerateOptions,
        prediction: Option<Vec<u32>>,
    ) -> Result<RequestId> {
        let drafting = self.predicted_drafting(prediction);
        self.submit_with(prompt, options, drafting)
    }

    /// How a request with `prediction` drafts (see [`Self::submit_predicted`]); without one, as
    /// the scheduler is set up.
    pub fn predicted_drafting(&self, prediction: Option<Vec<u32>>) -> Drafting {
        match prediction {
            Some(reference) => Drafting::Lookup {
                reference,
                options: self.options.lookup.clone().unwrap_or_else(SpeculativeOptions::lookup),
            },
            None => Drafting::Default,
        }
    }

    /// [`Self::submit`], drafting as `drafting` says.
    pub fn submit_with(&mut self, prompt: Vec<u32>, options: GenerateOptions, drafting: Drafting) -> Result<RequestId> {
        let active = self.prepare(prompt, options, drafting)?;
        self.queue(active)
    }

    /// `n` choices of one prompt (OpenAI's `n`), choice `i` sampling with the seed + `i` (so the
    /// first is what [`Self::submit_with`] would give). The first evaluates the prompt; the others
    /// are admitted once it holds the prompt in KV and share its blocks, evaluating only the
    /// prompt's last token. Returns the choices' ids in order.
    pub fn submit_choices(
        &mut self,
        prompt: Vec<u32>,
        options: GenerateOptions,
        drafting: Drafting,
        n: usize,
    ) -> Result<Vec<RequestId>> {
        let mut choices: Vec<Active> = Vec::with_capacity(n);
        for i in 0..n.max(1) {
            let mut options = options.clone();
            options.sampling.seed = options.sampling.seed.wrapping_add(i as u64);
            if i > 0 {
                // (The same prompt's: the first choice reports them.)
                options.prompt_logprobs = None;
            }
            let mut active = match self.prepare(prompt.clone(), options, drafting.clone()) {
                Ok(active) => active,
                Err(e) => {
                    // (Frees the draft model's sequences of the choices prepared before.)
                    choices.into_iter().for_each(|a| drop(self.retire(a, FinishReason::Cancelled)));
                    return Err(e);
                }
            };
            active.shares_prompt_of = choices.first().map(|first| first.id);
            choices.push(active);
        }
        choices.into_iter().map(|active| self.queue(active)).collect()
    }

    /// A request's state, checked against the model, with its drafter.
    fn prepare(&mut self, prompt: Vec<u32>, options: GenerateOptions, drafting: Drafting) -> Result<Active> {
        if prompt.is_empty() {
            return Err(CoreError::InvalidArgument("the prompt is empty".into()));
        }
        let n_ctx = self.runner.n_ctx();
        if prompt.len() >= n_ctx {
            return Err(CoreError::ContextOverflow { needed: prompt.len() + 1, capacity: n_ctx });
        }
        let n_vocab = self.runner.config().n_vocab;
        let reference = match &drafting {
            Drafting::Lookup { reference, .. } => &reference[..],
            _ => &[],
        };
        if let Some(&bad) = prompt.iter().chain(reference).find(|&&t| t as usize >= n_vocab) {
            return Err(CoreError::InvalidArgument(format!("token id {bad} is outside the vocabulary of {n_vocab}")));
        }
        let drafting = match drafting {
            Drafting::Default => match (&self.draft_model, &self.options.lookup) {
                (Some((draft, options)), Some(_)) => {
                    Drafting::LookupThenDraftModel { options: options.clone(), min_confidence: draft.min_confidence }
                }
                (Some((draft, options)), None) => {
                    Drafting::DraftModel { options: options.clone(), min_confidence: draft.min_confidence }
                }
                (None, Some(options)) => Drafting::Lookup { reference: Vec::new(), options: options.clone() },
                (None, None) => Drafting::None,
            },
            other => other,
        };
        let (kind, speculative, min_confidence) = match drafting {
            Drafting::Default | Drafting::None => (None, SpeculativeOptions::default(), 0.0),
            Drafting::Lookup { ref options, .. } => (Some(DraftKind::Lookup), options.clone(), 0.0),
            Drafting::DraftModel { ref options, min_confidence } => {
                (Some(DraftKind::Model), options.clone(), min_confidence)
            }
            Drafting::LookupThenDraftModel { ref options, min_confidence } => {
                (Some(DraftKind::LookupThenModel), options.clone(), min_confidence)
            }
        };
        let grammar = match &options.grammar {
            Some(request) => {
                let started = Instant::now();
                let compiled = self.grammar_compiler()?.compile(request)?;
                Some(GrammarState::new(&compiled, (started.elapsed().as_secs_f64() * 1e6) as f32))
            }
            None => None,
        };
        let id = self.next_id;
        self.next_id += 1;
        let mut active = Active::new(id, prompt, options);
        active.grammar = grammar;
        let Some(kind) = kind else { return Ok(active) };
        let source = match drafting {
            Drafting::Lookup { reference, .. } => DraftSource::Lookup { lookup: Default::default(), reference },
            _ => {
                let Some((draft, _)) = self.draft_model.as_mut() else {
                    return Err(CoreError::InvalidArgument("drafting with a draft model needs one loaded".into()));
                };
                let mut sequence = draft.add_sequence(&active.options.sampling);
                sequence.min_confidence = min_confidence;
                DraftSource::Model(Box::new(sequence))
            }
        };
        let (policy, free_policy) = self.policies_for(kind, &speculative);
        let free = free_policy.map(|policy| FreeLookup::new(policy, active.prompt_len));
        let seed = active.options.sampling.seed;
        active.drafts = Some(Box::new(RequestDrafts::new(source, free, speculative, policy, seed)));
        Ok(active)
    }

    /// The grammar compiler of the scheduler's model, built on first use (it reads every token
    /// of the vocabulary once).
    pub fn grammar_compiler(&mut self) -> Result<&GrammarCompiler> {
        if self.grammars.is_none() {
            self.grammars = Some(GrammarCompiler::new(&self.tokenizer, self.runner.config().n_logits)?);
        }
        Ok(self.grammars.as_ref().expect("built above"))
    }

    /// The draft model back (its sequences stay with their requests: call this when idle), e.g.
    /// to lend it to a single-sequence generation; [`Self::set_draft_model`] returns it.
    pub fn take_draft_model(&mut self) -> Option<(BatchedDraftModel, SpeculativeOptions)> {
        self.draft_model.take()
    }

    fn queue(&mut self, active: Active) -> Result<RequestId> {
        let id = active.id;
        self.waiting.push_back(active);
        Ok(id)
    }

    /// Ends a request now, freeing its KV blocks. Returns its partial result, if it existed.
    pub fn cancel(&mut self, id: RequestId) -> Option<Generation> {
        let active = if let Some(i) = self.running.iter().position(|a| a.id == id) {
            self.running.remove(i)
        } else {
            let i = self.waiting.iter().position(|a| a.id == id)?;
            self.waiting.remove(i)?
        };
        let generation = self.retire(active, FinishReason::Cancelled).1;
        // (A client that stops an answer may send what it got back in its next prompt.)
        self.history.learn_answer(&self.tokenizer, &generation.prompt_tokens, &generation.tokens);
        Some(generation)
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    pub fn stats(&self) -> SchedulerStats {
        let pools = self.runner.kv().pool_stats();
        SchedulerStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_blocks_used: pools.iter().map(|p| p.used).sum(),
            kv_blocks_total: pools.iter().map(|p| p.total).sum(),
            prefix_hit_rate: self.runner.kv().prefix_hit_rate(),
            preemptions: self.preemptions,
            last_step: self.last_step,
            step_cost_ms: self.step_cost.fit(),
        }
    }

    fn retire(&mut self, mut active: Active, reason: FinishReason) -> (String, Generation) {
        if let Some(seq) = active.seq.take() {
            self.runner.kv_mut().remove_sequence(seq);
        }
        let drafts = active.drafts.take();
        let (tail, mut generation) = active.finish(reason);
        if let Some(drafts) = drafts {
            let kind = drafts.kind();
            // (A request that never decoded learnt nothing: it keeps no older snapshot.)
            if drafts.metrics.target_forward_passes > 0 {
                let (policy, free_policy) = drafts.policies();
                let learnt = LearntPolicy {
                    kind,
                    options: drafts.options.clone(),
                    policy: policy.for_next_request(),
                    free_policy: free_policy.map(DraftPolicy::for_next_request),
                };
                self.policies.retain(|l| !(l.kind == kind && l.options == drafts.options));
                self.policies.push(learnt);
            }
            generation.speculative = Some(drafts.metrics.clone());
            if let (DraftSource::Model(sequence), Some((draft, _))) = (drafts.source, &mut self.draft_model) {
                draft.remove_sequence(*sequence);
            }
        }
        (tail, generation)
    }

    /// Moves waiting requests into the batch while there is room and KV blocks for their prompt.
    fn admit(&mut self, events: &mut dyn FnMut(SchedulerEvent)) {
        while self.running.len() < self.options.max_batch {
            let Some(mut active) = self.waiting.pop_front() else { break };
            // A request scoring its prompt evaluates all of it: nothing comes from the cache.
            let scores_prompt = active.options.prompt_logprobs.is_some();
            let source = match active.shares_prompt_of.map(|first| self.prompt_holder(first)) {
                Some(PromptHolder::Evaluating) => {
                    self.waiting.push_front(active);
                    break;
                }
                Some(PromptHolder::Holds(seq)) => Some(seq),
                Some(PromptHolder::Gone) | None => None,
            };
            let kv = self.runner.kv_mut();
            let shared = match source {
                Some(source) => kv.share_prefix(source, &active.tokens),
                None if scores_prompt => Ok((kv.add_sequence(), 0)),
                None => {
                    let seq = kv.add_sequence();
                    kv.reuse_cached_prefix(seq, &active.tokens)
                        .map(|n| (seq, n))
                        .inspect_err(|_| kv.remove_sequence(seq))
                }
            };
            let (seq, cached) = match shared {
                Ok(shared) => shared,
                Err(error) => {
                    events(SchedulerEvent::Failed { id: active.id, error });
                    continue;
                }
            };
            // Blocks to hold the rest of the context it has now, plus one to decode into.
            let bs = kv.block_size();
            let needed = (active.tokens.len() + 1).div_ceil(bs) - cached / bs;
            let (available, total) = (0..kv.groups().len()).fold((usize::MAX, usize::MAX), |(a, t), g| {
                let group = &kv.groups()[g];
                (a.min(kv.available_blocks(g)), t.min(if group.window.is_some() { usize::MAX } else { group.n_blocks }))
            });
            if needed > total {
                kv.remove_sequence(seq);
                let error = CoreError::KvExhausted {
                    needed_blocks: needed,
                    available_blocks: available,
                    total_blocks: total,
                    block_size: bs,
                };
                events(SchedulerEvent::Failed { id: active.id, error });
                continue;
            }
            if needed > available && !self.running.is_empty() {
                // Wait for running requests to free blocks (first come, first served).
                kv.remove_sequence(seq);
                self.waiting.push_front(active);
                break;
            }
            active.seq = Some(seq);
            if active.cached_tokens.is_none() {
                active.cached_tokens = Some(cached.min(active.prompt_len));
                events(SchedulerEvent::Started {
                    id: active.id,
                    prompt_tokens: active.prompt_len,
                    cached_tokens: cached,
                });
            }
            active.admitted = Some(Instant::now());
            self.running.push(active);
        }
    }

    /// Where request `id`'s prompt is, for the other choices of it.
    fn prompt_holder(&self, id: RequestId) -> PromptHolder {
        if self.waiting.iter().any(|a| a.id == id) {
            return PromptHolder::Evaluating;
        }
        let Some(first) = self.running.iter().find(|a| a.id == id) else { return PromptHolder::Gone };
        match first.seq {
            Some(seq) if self.runner.kv().len(seq) >= first.prompt_len => PromptHolder::Holds(seq),
            _ => PromptHolder::Evaluating,
        }
    }

    /// Tokens request `i` has yet to feed: one to decode, or the rest of its prompt (+ output,
    /// after a preemption).
    fn pending(&self, i: usize) -> std::ops::Range<usize> {
        let a = &self.running[i];
        let len = a.seq.map_or(0, |s| self.runner.kv().len(s));
        len..a.tokens.len()
    }

    /// Which tokens each running request feeds in the next step: every decode, then prompt
    /// chunks first come first served within the step's prompt budget. Chunks end on multiples
    /// of [`PROMPT_GRANULE`] (or the prompt's end); the first always gets one granule at least.
    fn plan_step(&mut self) -> Vec<(usize, std::ops::Range<usize>)> {
        let pending: Vec<_> = (0..self.running.len()).map(|i| self.pending(i)).collect();
        let decode_rows = pending.iter().filter(|r| r.len() == 1).count();
        let budget = if decode_rows == 0 {
            self.options.prefill_chunk
        } else {
            self.step_cost.prompt_budget(decode_rows, self.options.max_stall, self.options.prefill_chunk)
        };
        let mut left = budget;
        let mut prompt_tokens = 0;
        let mut plan = Vec::new();
        for (i, range) in pending.into_iter().enumerate() {
            if range.len() == 1 {
                plan.push((i, range));
                continue;
            }
            let aligned = (range.start + left) / PROMPT_GRANULE * PROMPT_GRANULE;
            let end = if range.len() <= left {
                range.end
            } else if aligned > range.start {
                aligned
            } else if prompt_tokens == 0 {
                // The budget does not reach the next boundary: the first chunk goes anyway.
                ((range.start / PROMPT_GRANULE + 1) * PROMPT_GRANULE).min(range.end)
            } else {
                continue;
            };
            left = left.saturating_sub(end - range.start);
            prompt_tokens += end - range.start;
            plan.push((i, range.start..end));
        }
        self.last_step = StepPlanStats { decode_rows, prompt_tokens, draft_rows: 0, prompt_budget: budget };
        plan
    }

    /// The runner and tokenizer back (e.g. to drive the model through a single-sequence
    /// [`crate::engine::Session`] for a while). Requests still queued or running are dropped.
    pub fn into_parts(self) -> (Runner, Tokenizer) {
        let mut runner = self.runner;
        for seq in self.running.iter().chain(self.waiting.iter()).filter_map(|a| a.seq) {
            runner.kv_mut().remove_sequence(seq);
        }
        (runner, self.tokenizer)
    }

    /// One step: admit, run one batched forward pass, sample, stream. Returns false when idle.
    /// Synchronous: [`Scheduler::step_async`] polled once (see [`crate::block_on`]).
    pub fn step(&mut self, events: &mut dyn FnMut(SchedulerEvent)) -> Result<bool> {
        block_on(self.step_async(events))
    }

    /// [`Scheduler::step`] for backends whose logits arrive later (WebGPU in a browser): the
    /// batched forward pass is [`Runner::step_async`]. Do not drop the future before it finishes
    /// (the batch's reserved KV positions would stay reserved): cancel requests between steps.
    pub async fn step_async(&mut self, events: &mut dyn FnMut(SchedulerEvent)) -> Result<bool> {
        self.admit(events);
        if self.running.is_empty() {
            return Ok(false);
        }
        let mut drafts_allowed = true;
        loop {
            let plan = self.plan_step();
            let drafting = drafts_allowed && self.plan_drafts(&plan).await?;
            let entries: Vec<BatchEntry<'_>> = plan
                .iter()
                .map(|(i, r)| {
                    let active = &self.running[*i];
                    let tokens = match &active.drafts {
                        _ if drafting && active.forced.planned() => &active.forced.batch[..],
                        Some(drafts) if drafting && drafts.planned() => &drafts.batch[..],
                        _ => &active.tokens[r.clone()],
                    };
                    BatchEntry { seq: active.seq.expect("running requests have a sequence"), tokens }
                })
                .collect();
            let rows = entries.iter().map(|e| e.tokens.len()).sum();
            // With drafts, every row's logits: each draft's row is checked. A prompt scored
            // (echo) reads every row's whole logits.
            let scoring = plan.iter().any(|(i, range)| self.running[*i].scores_prompt(range));
            let (mode, readback) = if drafting {
                (LogitsMode::All, self.drafting_readback(&plan))
            } else if scoring {
                (LogitsMode::All, Readback::Logits)
            } else {
                (LogitsMode::Last, self.readback(&plan))
            };
            let all_rows = mode == LogitsMode::All;
            let started = Instant::now();
            let submitted = self.runner.begin_step(&entries, mode, readback);
            drop(entries);
            if submitted.is_ok() {
                self.prepare_masks(&plan);
            }
            let stepped = match submitted {
                Ok(step) => self.runner.finish_step(step).await.map(|_| ()),
                Err(error) => Err(error),
            };
            match stepped {
                Ok(_) => {
                    let step_ms = started.elapsed().as_secs_f64() * 1e3;
                    if !all_rows {
                        // (Only steps of one row per request: the prompt budget's model.)
                        self.step_cost.observe(rows, step_ms);
                    }
                    break self.after_step(&plan, all_rows, readback, (rows, step_ms), events);
                }
                Err(CoreError::KvExhausted { .. }) if drafting => {
                    // No room for the drafts: the step goes without them.
                    drafts_allowed = false;
                    for (i, _) in &plan {
                        let active = &mut self.running[*i];
                        active.forced.cancel();
                        if let Some(drafts) = active.drafts.as_mut().filter(|l| l.planned()) {
                            drafts.drop_drafts();
                        }
                    }
                }
                Err(CoreError::KvExhausted { .. }) if self.running.len() > 1 => self.preempt_newest(),
                Err(error) => {
                    // Nothing else is running: this request alone does not fit. (The last one
                    // gets the error itself: a request alone learns exactly what went wrong.)
                    let mut running = std::mem::take(&mut self.running);
                    let last = running.pop();
                    for active in running {
                        let id = active.id;
                        self.retire(active, FinishReason::Cancelled);
                        events(SchedulerEvent::Failed { id, error: clone_error(&error) });
                    }
                    if let Some(active) = last {
                        let id = active.id;
                        self.retire(active, FinishReason::Cancelled);
                        events(SchedulerEvent::Failed { id, error });
                    }
                    return Ok(true);
                }
            }
        }
        Ok(true)
    }

    /// Computes the grammar masks the step of `plan` will need for its requests' next tokens,
    /// while the device runs it (it is submitted: a GPU backend returns at once).
    fn prepare_masks(&mut self, plan: &[(usize, std::ops::Range<usize>)]) {
        for (i, range) in plan {
            if !self.samples_after(*i, range) {
                continue;
            }
            if let Some(grammar) = self.running[*i].grammar.as_mut().filter(|g| g.is_active()) {
                grammar.prepare_mask();
            }
        }
    }

    /// Drops the KV of the most recently admitted request and puts it back first in line; its
    /// context (prompt + output so far) is recomputed when it is readmitted.
    fn preempt_newest(&mut self) {
        let newest = (0..self.running.len()).max_by_key(|&i| self.running[i].admitted).expect("running is not empty");
        let mut active = self.running.remove(newest);
        if let Some(seq) = active.seq.take() {
            self.runner.kv_mut().remove_sequence(seq);
        }
        active.preemptions += 1;
        active.forced.cancel();
        if let Some(drafts) = active.drafts.as_mut() {
            drafts.cancel_plan();
        }
        self.preemptions += 1;
        self.waiting.push_front(active);
    }

    /// Whether `running[i]` samples a token after a step that runs `range` of its tokens.
    fn samples_after(&self, i: usize, range: &std::ops::Range<usize>) -> bool {
        let active = &self.running[i];
        range.end >= active.tokens.len() && active.options.max_tokens > 0
    }

    /// What the step of `plan` reads back: candidates when every row sampled after it can use
    /// them (as many as the most demanding row asks for, see [`crate::sampling::Sampler::readback`]),
    /// the whole logits rows otherwise; the top 1 when nothing is sampled (prompt chunks).
    fn readback(&self, plan: &[(usize, std::ops::Range<usize>)]) -> Readback {
        plan.iter()
            .filter(|(i, range)| self.samples_after(*i, range))
            .map(|(i, _)| self.running[*i].row_readback())
            .fold(Readback::TopK(1), Readback::union)
    }

    /// In a step of `plan` that only decodes, plans the tokens each constrained request's grammar
    /// forces ([`forced`]), proposes the drafts of every other drafting request (prompt lookup's
    /// at once, the draft model's in shared passes) and decides how many each verifies (alone:
    /// its policy's choice; with others: [`drafts::joint_lengths`]). Returns whether any
    /// verifies drafts.
    async fn plan_drafts(&mut self, plan: &[(usize, std::ops::Range<usize>)]) -> Result<bool> {
        if plan.iter().any(|(i, range)| range.len() != 1 || !self.samples_after(*i, range)) {
            return Ok(false);
        }
        let n_ctx = self.runner.n_ctx();
        // Forced tokens are verified whole (the model keeps them but where it spells the text
        // otherwise), ahead of any other drafts.
        let mut forced_rows = 0;
        for (i, _) in plan {
            let active = &mut self.running[*i];
            let room = draft_room(active, n_ctx);
            let (Some(grammar), Some(&pending)) = (active.grammar.as_mut(), active.tokens.last()) else { continue };
            forced_rows += active.forced.plan(pending, grammar, room);
            if let Some(drafts) = active.drafts.as_mut().filter(|_| active.forced.planned()) {
                drafts.cancel_plan();
            }
        }
        self.last_step.draft_rows += forced_rows;
        let mut proposing = Vec::new();
        // Requests whose draft model proposes this step, with their budgets.
        let mut from_model = Vec::new();
        for (i, _) in plan {
            let active = &mut self.running[*i];
            let generated = active.generated();
            // (A request that reports log-probabilities decodes plainly: verified drafts carry no
            // alternatives at their positions.)
            let plain = generated == 0 || active.options.logprobs.is_some() || active.forced.planned();
            let room = draft_room(active, n_ctx);
            let Some(drafts) = active.drafts.as_mut().filter(|_| !plain) else { continue };
            proposing.push(*i);
            if drafts.planned() {
                // A retry of this step (a request was preempted): the same proposal, decided anew.
                drafts.drop_drafts();
                continue;
            }
            if drafts.needs_prompt_read() {
                if let (DraftSource::Model(sequence), Some((draft, _))) =
                    (&mut drafts.source, self.draft_model.as_mut())
                {
                    let started = Instant::now();
                    draft.prepare(sequence, &active.tokens[..active.prompt_len]).await?;
                    drafts.prompt_was_read(crate::engine::ms(started));
                }
            }
            if let Some(FreeStep::Planned) = drafts.plan_free(&active.tokens, room, plan.len() - 1) {
                continue;
            }
            let budget = drafts.budget(room, plan.len() - 1);
            match drafts.lookup_proposal(&active.tokens, budget) {
                Some((proposal, drafting_ms)) => drafts.plan(&active.tokens, proposal, budget, drafting_ms),
                None => from_model.push((*i, budget)),
            }
        }
        if let (false, Some((draft, _))) = (from_model.is_empty(), self.draft_model.as_mut()) {
            let mut requests = Vec::with_capacity(from_model.len());
            let mut owners = Vec::with_capacity(from_model.len());
            for (i, active) in self.running.iter_mut().enumerate() {
                let Some(&(_, budget)) = from_model.iter().find(|(r, _)| *r == i) else { continue };
                if let Some(DraftSource::Model(sequence)) = active.drafts.as_deref_mut().map(|d| &mut d.source) {
                    requests.push(DraftRequest { sequence, context: &active.tokens, max_tokens: budget });
                    owners.push((i, budget));
                }
            }
            let started = Instant::now();
            let proposals = draft.propose(&mut requests).await?;
            let drafting_ms = crate::engine::ms(started);
            drop(requests);
            for ((i, budget), proposal) in owners.into_iter().zip(proposals) {
                let active = &mut self.running[i];
                if let Some(drafts) = active.drafts.as_mut() {
                    drafts.plan(&active.tokens, proposal, budget, drafting_ms);
                }
            }
        }
        // A constrained request verifies only the drafts its grammar allows.
        for &i in &proposing {
            let active = &mut self.running[i];
            if let (Some(grammar), Some(drafts)) = (active.grammar.as_mut(), active.drafts.as_mut()) {
                let valid = grammar.valid_prefix(drafts.proposal());
                drafts.keep_proposal(valid);
            }
        }
        let requests: Vec<&RequestDrafts> =
            proposing.iter().filter_map(|&i| self.running[i].drafts.as_deref()).collect();
        let lengths = match requests.as_slice() {
            [] => return Ok(self.last_step.draft_rows > 0),
            [alone] if plan.len() == 1 => vec![alone.solo_length()],
            [first, ..] => {
                let weighed: Vec<_> = requests.iter().map(|l| l.weighed(plan.len())).collect();
                let other_rows = plan.len() - requests.len() + forced_rows;
                drafts::joint_lengths(&weighed, other_rows, |rows| first.pass_ms(rows))
            }
        };
        for (&i, verify) in proposing.iter().zip(lengths) {
            if let Some(drafts) = self.running[i].drafts.as_mut() {
                drafts.commit(verify);
                self.last_step.draft_rows += drafts.batch.len() - 1;
            }
        }
        Ok(self.last_step.draft_rows > 0)
    }

    /// What a drafting step of `plan` reads back: enough candidates for every row, the whole rows
    /// when one needs them.
    fn drafting_readback(&self, plan: &[(usize, std::ops::Range<usize>)]) -> Readback {
        plan.iter()
            .map(|(i, _)| {
                let active = &self.running[*i];
                let constrained = active.grammar.as_ref().is_some_and(GrammarState::is_active);
                match &active.drafts {
                    // (A constrained request's drafts are verified on whole rows, masked after
                    // the drafts before them.)
                    _ if active.forced.planned() => Readback::Logits,
                    Some(drafts) if drafts.planned() && constrained => Readback::Logits,
                    Some(drafts) if drafts.planned() => drafts.readback(&active.sampler, &active.tokens),
                    _ => active.row_readback(),
                }
            })
            .fold(Readback::TopK(1), Readback::union)
    }

    /// After the step of `plan`: each request that finished its prompt or decoded gets its next
    /// tokens (sampled, or its drafts verified) and streams them. `all_rows`: the step computed
    /// every row's logits (a drafting step: an entry's rows are its pending token and drafts),
    /// else one per entry. `(step_rows, step_ms)`: the step's rows over all entries, its time.
    fn after_step(
        &mut self,
        plan: &[(usize, std::ops::Range<usize>)],
        all_rows: bool,
        readback: Readback,
        (step_rows, step_ms): (usize, f64),
        events: &mut dyn FnMut(SchedulerEvent),
    ) {
        let n_logits = self.runner.config().n_logits;
        let n_ctx = self.runner.n_ctx();
        let mut ended = Vec::new();
        let mut row_logits = Vec::new();
        let (mut allowed_ids, mut allowed_logits) = (Vec::new(), Vec::new());
        // Requests whose last row is evaluated again (for its whole logits).
        let mut evaluate_again = Vec::new();
        let mut next_row = 0;
        for (entry, (i, range)) in plan.iter().enumerate() {
            let samples = self.samples_after(*i, range);
            let active = &mut self.running[*i];
            let forced = all_rows && active.forced.planned();
            let drafted = match &active.drafts {
                _ if forced => Some(active.forced.batch.len()),
                Some(drafts) if all_rows && drafts.planned() => Some(drafts.batch.len()),
                _ => None,
            };
            let first_row = if all_rows { next_row } else { entry };
            // The entry's rows in the output: its drafts' or its tokens' (all rows), else one.
            let entry_rows = if all_rows { drafted.unwrap_or(range.len()) } else { 1 };
            next_row += drafted.unwrap_or(range.len());
            if all_rows && drafted.is_none() && active.scores_prompt(range) {
                let logits = self.runner.last_logits();
                active.score_prompt(range.clone(), &logits[first_row * n_logits..], n_logits);
            }
            if range.end < active.tokens.len() {
                continue; // more prompt to evaluate
            }
            if active.options.prompt_logprobs.is_some() && !active.prompt_scores_sent {
                active.prompt_scores_sent = true;
                events(SchedulerEvent::PromptScored { id: active.id, logprobs: active.prompt_logprobs.clone() });
            }
            if active.generated() == 0 && active.prompt_ms == 0.0 {
                active.prompt_ms = active.admitted.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
            }
            if !samples {
                ended.push((*i, Ok(FinishReason::Length)));
                continue;
            }
            let output = match readback {
                Readback::Logits => StepOutput::Logits(self.runner.last_logits()),
                Readback::TopK(_) | Readback::TopKAndLogSumExp(_) => StepOutput::TopK(self.runner.last_top_k()),
            };
            let rows = EntryRows { output, n_logits, first_row };
            // The tokens it keeps, with their log-probabilities when it reports them.
            let (tokens, logprobs): (Vec<u32>, Vec<Option<TokenLogprob>>) =
                match (drafted, active.drafts.as_mut(), active.grammar.as_mut(), active.seq) {
                    (Some(rows_planned), drafts, Some(grammar), Some(seq)) if forced && rows_planned > 1 => {
                        // The tokens its grammar forced: those the model keeps, then its own.
                        let top = active.options.logprobs;
                        let verified = active
                            .forced
                            .verify(&mut active.sampler, &active.tokens, rows, grammar, top)
                            .and_then(|kept| {
                                let stored = active.tokens.len() + kept.outcome.accepted;
                                self.runner.kv_mut().truncate(seq, stored)?;
                                Ok(kept)
                            });
                        match verified {
                            Ok(kept) => {
                                if let Some(drafts) = drafts {
                                    drafts.observe_tokens(&kept.tokens);
                                }
                                (kept.tokens, kept.logprobs)
                            }
                            Err(error) => {
                                ended.push((*i, Err(error)));
                                continue;
                            }
                        }
                    }
                    (Some(rows_planned), Some(drafts), grammar, Some(seq)) if rows_planned > 1 => {
                        // Its drafts: the longest prefix the target keeps, then the target's own token.
                        let verified =
                            drafts.verify(&mut active.sampler, &active.tokens, rows, grammar).and_then(|outcome| {
                                // The cache holds the context but the pending token, then the entry's rows.
                                self.runner.kv_mut().truncate(seq, active.tokens.len() + outcome.accepted)?;
                                Ok(outcome)
                            });
                        match verified {
                            Ok(outcome) => {
                                drafts.observe_step(&outcome, step_rows, step_ms);
                                let kept: Vec<u32> = drafts.batch[1..=outcome.accepted]
                                    .iter()
                                    .copied()
                                    .chain([outcome.continuation_token])
                                    .collect();
                                let logprobs = vec![None; kept.len()];
                                (kept, logprobs)
                            }
                            Err(error) => {
                                ended.push((*i, Err(error)));
                                continue;
                            }
                        }
                    }
                    (_, drafts, grammar, _) => {
                        // Borrowed, not copied (but for the one row the full-row sampler modifies):
                        // the step's outputs stay as they are until every row is read (truncating a
                        // request's KV leaves them). Every sampling row asked for at most the step's
                        // k candidates; more changes nothing.
                        let row = first_row + entry_rows - 1;
                        let top_logprobs = active.options.logprobs;
                        let grammar = grammar.filter(|g| g.is_active());
                        let (token, logprob) = match output {
                            StepOutput::TopK(top) => {
                                let (ids, logits) = top.row(row);
                                // (Structured output: the allowed candidates, when they hold the top
                                // allowed tokens the sampler needs; else the row again, whole.)
                                let (sampled_ids, sampled_logits) = match grammar {
                                    None => (ids, logits),
                                    Some(grammar) => {
                                        let allowed = (&mut allowed_ids, &mut allowed_logits);
                                        if let Err(error) =
                                            grammar.allowed_candidates((ids, logits), allowed.0, allowed.1)
                                        {
                                            ended.push((*i, Err(error)));
                                            continue;
                                        }
                                        let needed =
                                            active.sampler.readback(&active.tokens).top_k().unwrap_or(usize::MAX);
                                        if allowed_ids.len() < needed {
                                            grammar.count_full_logits_row();
                                            active.full_logits_next = true;
                                            evaluate_again.push(*i);
                                            continue;
                                        }
                                        (&allowed_ids[..], &allowed_logits[..])
                                    }
                                };
                                let token =
                                    active.sampler.sample_candidates(sampled_ids, sampled_logits, &active.tokens);
                                let logprob = top_logprobs.map(|n| {
                                    let log_sum_exp = top.log_sum_exp.get(row).copied().unwrap_or(f32::NAN);
                                    TokenLogprob::from_candidates(ids, logits, log_sum_exp, token, n)
                                });
                                (token, logprob)
                            }
                            StepOutput::Logits(logits) => {
                                active.full_logits_next = false;
                                let logits = &logits[row * n_logits..(row + 1) * n_logits];
                                row_logits.clear();
                                row_logits.extend_from_slice(logits);
                                // (Structured output: the grammar's mask comes before every filter.)
                                if let Some(Err(error)) = grammar.map(|g| g.mask_logits(&mut row_logits)) {
                                    ended.push((*i, Err(error)));
                                    continue;
                                }
                                let token = active.sampler.sample(&mut row_logits, &active.tokens);
                                (token, top_logprobs.map(|n| TokenLogprob::from_logits(logits, token, n)))
                            }
                        };
                        let decoding = active.tokens.len() > active.prompt_len;
                        if let Some(drafts) = drafts {
                            let outcome = VerificationOutcome { accepted: 0, proposed: 0, continuation_token: token };
                            // (The first token comes from the prompt's pass: not a decode step.)
                            if decoding {
                                drafts.observe_step(&outcome, step_rows, step_ms)
                            } else {
                                drafts.observe_tokens(&[token])
                            }
                        }
                        (vec![token], vec![logprob])
                    }
                };
            for (token, logprob) in tokens.into_iter().zip(logprobs) {
                let grammar = active.grammar.as_mut().filter(|_| !self.tokenizer.is_end_of_generation(token));
                if let Some(Err(error)) = grammar.map(|g| g.accept(token)) {
                    ended.push((*i, Err(error)));
                    break;
                }
                active.pending_logprob = logprob;
                let (emit, finish) = active.accept(&self.tokenizer, token, n_ctx);
                // A constrained answer ends where its grammar allows nothing more.
                let finish =
                    finish.or_else(|| active.grammar.as_ref().filter(|g| g.is_complete()).map(|_| FinishReason::Stop));
                if !emit.is_empty() {
                    let logprobs = active.unsent_logprobs();
                    events(SchedulerEvent::Text { id: active.id, delta: emit, logprobs });
                }
                if let Some(reason) = finish {
                    ended.push((*i, Ok(reason)));
                    break;
                }
            }
        }
        // Their KV gives back the last position: the next step evaluates its token again.
        for i in evaluate_again {
            let active = &self.running[i];
            if let Some(seq) = active.seq {
                if let Err(error) = self.runner.kv_mut().truncate(seq, active.tokens.len() - 1) {
                    ended.push((i, Err(error)));
                }
            }
        }
        self.finish_requests(ended, events);
    }

    /// Retires the requests at these `running` indices and reports how each ended.
    fn finish_requests(
        &mut self,
        mut ended: Vec<(usize, Result<FinishReason>)>,
        events: &mut dyn FnMut(SchedulerEvent),
    ) {
        // Remove from the back so indices stay valid.
        ended.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, end) in ended {
            let active = self.running.remove(i);
            let id = active.id;
            match end {
                Ok(reason) => {
                    let (tail, generation) = self.retire(active, reason);
                    self.history.learn_answer(&self.tokenizer, &generation.prompt_tokens, &generation.tokens);
                    if !tail.is_empty() {
                        // (The generation carries every log-probability; the tail's come with it.)
                        events(SchedulerEvent::Text { id, delta: tail, logprobs: Vec::new() });
                    }
                    events(SchedulerEvent::Finished { id, generation });
                }
                Err(error) => {
                    self.retire(active, FinishReason::Cancelled);
                    events(SchedulerEvent::Failed { id, error });
                }
            }
        }
    }
}

/// What the last request of a drafter and draft bounds ended with, for the next one.
struct LearntPolicy {
    kind: DraftKind,
    options: SpeculativeOptions,
    policy: DraftPolicy,
    /// The free drafts' policy ([`DraftKind::LookupThenModel`]).
    free_policy: Option<DraftPolicy>,
}

/// How many drafts a request may verify in its next step: each step yields accepted + 1 tokens
/// and stores 1 + verified drafts, within its token limit and the context; a rejected draft must
/// be rolled back (a sliding window keeps [`MAX_DRAFT_ROWS`] past it).
fn draft_room(active: &Active, n_ctx: usize) -> usize {
    let generated = active.generated();
    let room = active.options.max_tokens.saturating_sub(generated + 1).min(n_ctx.saturating_sub(active.tokens.len()));
    room.min(MAX_DRAFT_ROWS)
}

/// Errors are not Clone (they may hold io::Error); the scheduler reports one per request.
fn clone_error(e: &CoreError) -> CoreError {
    match e {
        CoreError::KvExhausted { needed_blocks, available_blocks, total_blocks, block_size } => {
            CoreError::KvExhausted {
                needed_blocks: *needed_blocks,
                available_blocks: *available_blocks,
                total_blocks: *total_blocks,
                block_size: *block_size,
            }
        }
        CoreError::ContextOverflow { needed, capacity } => {
            CoreError::ContextOverflow { needed: *needed, capacity: *capacity }
        }
        // Each request learns how the device failed, so the server and the browser can react.
        CoreError::Device { backend, kind, message } => {
            CoreError::Device { backend: backend.clone(), kind: *kind, message: message.clone() }
        }
        other => CoreError::Backend { backend: "scheduler".into(), message: other.to_string() },
    }
}
