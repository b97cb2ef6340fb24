//! Continuous batching over a [`Runner`]: requests join and leave the running batch at every step;
//! long prompts are prefilled in chunks interleaved with the decode steps of running requests;
//! admission waits for free KV blocks; when the pool runs out mid-generation the newest request is
//! preempted (its KV dropped, recomputed later, its output kept); cancellation frees blocks at once.
//!
//! Results do not depend on batching: every op is row-independent on the backends (tested in
//! tests/kv_paging.rs) and prompt chunks end at fixed multiples of `prefill_chunk`.

mod request;

pub use request::RequestId;

use crate::backend::Readback;
use crate::block_on::block_on;
use crate::engine::{FinishReason, GenerateOptions, Generation, Instant};
use crate::error::{CoreError, Result};
use crate::graph::LogitsMode;
use crate::runner::{BatchEntry, Runner};
use crate::tokenizer::Tokenizer;
use request::Active;
use std::collections::VecDeque;

#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    /// Requests running at once.
    pub max_batch: usize,
    /// Prompt tokens per step, over all prefilling requests; also the chunk grid.
    pub prefill_chunk: usize,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions { max_batch: 8, prefill_chunk: 256 }
    }
}

/// What happened to a request during a step.
#[derive(Debug)]
pub enum SchedulerEvent {
    /// Admitted: its prompt starts evaluating (`cached_tokens` of it were already in KV).
    Started { id: RequestId, prompt_tokens: usize, cached_tokens: usize },
    Text { id: RequestId, delta: String },
    Finished { id: RequestId, generation: Generation },
    Failed { id: RequestId, error: CoreError },
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct SchedulerStats {
    pub running: usize,
    pub waiting: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    pub prefix_hit_rate: f64,
    pub preemptions: u64,
}

pub struct Scheduler {
    runner: Runner,
    tokenizer: Tokenizer,
    options: SchedulerOptions,
    waiting: VecDeque<Active>,
    running: Vec<Active>,
    next_id: RequestId,
    preemptions: u64,
}

impl Scheduler {
    pub fn new(runner: Runner, tokenizer: Tokenizer, options: SchedulerOptions) -> Self {
        let options = SchedulerOptions { max_batch: options.max_batch.max(1), prefill_chunk: options.prefill_chunk.max(1) };
        Scheduler { runner, tokenizer, options, waiting: VecDeque::new(), running: Vec::new(), next_id: 1, preemptions: 0 }
    }

    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Queues a request. Errors at once for what can never run (empty or too long prompt).
    pub fn submit(&mut self, prompt: Vec<u32>, options: GenerateOptions) -> Result<RequestId> {
        if prompt.is_empty() {
            return Err(CoreError::InvalidArgument("the prompt is empty".into()));
        }
        let n_ctx = self.runner.n_ctx();
        if prompt.len() >= n_ctx {
            return Err(CoreError::ContextOverflow { needed: prompt.len() + 1, capacity: n_ctx });
        }
        let n_vocab = self.runner.config().n_vocab;
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(CoreError::InvalidArgument(format!("token id {bad} is outside the vocabulary of {n_vocab}")));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back(Active::new(id, prompt, options));
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
        Some(self.retire(active, FinishReason::Cancelled).1)
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
        }
    }

    fn retire(&mut self, mut active: Active, reason: FinishReason) -> (String, Generation) {
        if let Some(seq) = active.seq.take() {
            self.runner.kv_mut().remove_sequence(seq);
        }
        active.finish(reason)
    }

    /// Moves waiting requests into the batch while there is room and KV blocks for their prompt.
    fn admit(&mut self, events: &mut dyn FnMut(SchedulerEvent)) {
        while self.running.len() < self.options.max_batch {
            let Some(mut active) = self.waiting.pop_front() else { break };
            let kv = self.runner.kv_mut();
            let seq = kv.add_sequence();
            let cached = match kv.reuse_cached_prefix(seq, &active.tokens) {
                Ok(n) => n,
                Err(error) => {
                    kv.remove_sequence(seq);
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
                let error = CoreError::KvExhausted { needed_blocks: needed, available_blocks: available, total_blocks: total, block_size: bs };
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
                events(SchedulerEvent::Started { id: active.id, prompt_tokens: active.prompt_len, cached_tokens: cached });
            }
            active.admitted = Some(Instant::now());
            self.running.push(active);
        }
    }

    /// Tokens request `i` feeds in the next step: one to decode, or its next prompt chunk (ending
    /// on the fixed chunk grid, so results do not depend on what else runs).
    fn feed_range(&self, i: usize) -> std::ops::Range<usize> {
        let a = &self.running[i];
        let len = a.seq.map_or(0, |s| self.runner.kv().len(s));
        let grid_end = (len / self.options.prefill_chunk + 1) * self.options.prefill_chunk;
        len..a.tokens.len().min(grid_end)
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
        loop {
            // Decodes first (they keep streams flowing), then prompt chunks within the budget;
            // at least one chunk per step so prompts always progress.
            let mut plan: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
            let mut prefill_budget = self.options.prefill_chunk;
            let mut order: Vec<usize> = (0..self.running.len()).collect();
            order.sort_by_key(|&i| self.feed_range(i).len() > 1);
            for i in order {
                let range = self.feed_range(i);
                let decoding = self.running[i].tokens.len() - range.start == 1;
                if decoding {
                    plan.push((i, range));
                } else if range.len() <= prefill_budget {
                    // Chunks never exceed prefill_chunk, so the first one always fits.
                    prefill_budget = prefill_budget.saturating_sub(range.len());
                    plan.push((i, range));
                }
            }
            plan.sort_by_key(|(i, _)| *i);
            let entries: Vec<BatchEntry<'_>> = plan
                .iter()
                .map(|(i, r)| BatchEntry { seq: self.running[*i].seq.expect("running requests have a sequence"), tokens: &self.running[*i].tokens[r.clone()] })
                .collect();
            let readback = self.readback(&plan);
            match self.runner.step_for_async(&entries, LogitsMode::Last, readback).await {
                Ok(_) => break self.after_step(&plan, readback, events),
                Err(CoreError::KvExhausted { .. }) if self.running.len() > 1 => self.preempt_newest(),
                Err(error) => {
                    // Nothing else is running: this request alone does not fit.
                    for active in std::mem::take(&mut self.running) {
                        let id = active.id;
                        self.retire(active, FinishReason::Cancelled);
                        events(SchedulerEvent::Failed { id, error: clone_error(&error) });
                    }
                    return Ok(true);
                }
            }
        }
        Ok(true)
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
        let mut k = 1;
        for (i, range) in plan {
            if !self.samples_after(*i, range) {
                continue;
            }
            let active = &self.running[*i];
            match active.sampler.readback(&active.tokens) {
                Readback::TopK(row_k) => k = k.max(row_k),
                Readback::Logits => return Readback::Logits,
            }
        }
        Readback::TopK(k)
    }

    fn after_step(&mut self, plan: &[(usize, std::ops::Range<usize>)], readback: Readback, events: &mut dyn FnMut(SchedulerEvent)) {
        let n_vocab = self.runner.config().n_vocab;
        let n_ctx = self.runner.n_ctx();
        let mut finished = Vec::new();
        let mut row_logits = Vec::new();
        for (row, (i, range)) in plan.iter().enumerate() {
            if range.end < self.running[*i].tokens.len() {
                continue; // more prompt to evaluate
            }
            let samples = self.samples_after(*i, range);
            let active = &mut self.running[*i];
            if active.generated() == 0 && active.prompt_ms == 0.0 {
                active.prompt_ms = active.admitted.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
            }
            if !samples {
                finished.push((*i, FinishReason::Length));
                continue;
            }
            // Borrowed, not copied (but for the one row the full-row sampler modifies): the runner
            // is not touched until every row is sampled. Every sampling row asked for at most the
            // step's k candidates; more than it asked for changes nothing.
            let token = match readback {
                Readback::TopK(_) => {
                    let (ids, logits) = self.runner.last_top_k().row(row);
                    active.sampler.sample_candidates(ids, logits, &active.tokens)
                }
                Readback::Logits => {
                    row_logits.clear();
                    row_logits.extend_from_slice(&self.runner.last_logits()[row * n_vocab..(row + 1) * n_vocab]);
                    active.sampler.sample(&mut row_logits, &active.tokens)
                }
            };
            let (emit, finish) = active.accept(&self.tokenizer, token, n_ctx);
            if !emit.is_empty() {
                events(SchedulerEvent::Text { id: active.id, delta: emit });
            }
            if let Some(reason) = finish {
                finished.push((*i, reason));
            }
        }
        // Remove from the back so indices stay valid.
        finished.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, reason) in finished {
            let active = self.running.remove(i);
            let id = active.id;
            let (tail, generation) = self.retire(active, reason);
            if !tail.is_empty() {
                events(SchedulerEvent::Text { id, delta: tail });
            }
            events(SchedulerEvent::Finished { id, generation });
        }
    }
}

/// Errors are not Clone (they may hold io::Error); the scheduler reports one per request.
fn clone_error(e: &CoreError) -> CoreError {
    match e {
        CoreError::KvExhausted { needed_blocks, available_blocks, total_blocks, block_size } => CoreError::KvExhausted {
            needed_blocks: *needed_blocks,
            available_blocks: *available_blocks,
            total_blocks: *total_blocks,
            block_size: *block_size,
        },
        CoreError::ContextOverflow { needed, capacity } => CoreError::ContextOverflow { needed: *needed, capacity: *capacity },
        other => CoreError::Backend { backend: "scheduler".into(), message: other.to_string() },
    }
}
