//! A draft model drafting for many sequences at once: the batching scheduler's drafter
//! (`hearth serve --draft-model`). Each request keeps a [`DraftSequence`] in the draft model's
//! own paged KV pool. A step's proposals are drafted in shared passes: the first reads every
//! request's new context tokens, each later one the last draft of every request still drafting,
//! so k draft tokens for n requests cost about k passes, not n·k. Each row is read and drawn the
//! same way for every request (shared vocabulary, confidence stop, the target's sampling), so a
//! request drafts the same tokens alone or in a batch.

use super::draft_model::{check_vocab_compatible, draft_readback, draft_rng, DraftRow, DEFAULT_MIN_CONFIDENCE};
use super::verify::Distribution;
use super::{DraftTiming, Proposal};
use crate::backend::Readback;
use crate::engine::{ms, Instant};
use crate::error::{CoreError, Result};
use crate::graph::LogitsMode;
use crate::kv::SeqId;
use crate::runner::{BatchEntry, Runner};
use crate::sampling::{Sampler, SamplingParams, Xoshiro256StarStar};
use crate::tokenizer::Tokenizer;

/// New context tokens a proposal reads in the steady state (the target's token, and possibly the
/// last draft, accepted but never evaluated): only such first passes measure drafting's cost.
const STEADY_CONTEXT_TOKENS: usize = 2;

pub struct BatchedDraftModel {
    runner: Runner,
    /// Tokens below this id exist in both vocabularies (and in the draft's head).
    shared_vocab: usize,
    /// Context tokens one catch-up pass reads at most (a prompt the draft has not seen).
    prefill_chunk: usize,
    /// Where new sequences stop drafting: where the draft's most likely next token has a
    /// probability below this (0 never stops). An unsure drafter is usually wrong, and each wrong
    /// draft costs a drafter pass and a row of verification. The output does not depend on it
    /// (greedy: same tokens; sampling: same distribution, since the stop is decided before the
    /// draw). Greedy: the plain softmax probability of the top token; sampling: the top
    /// probability after the filters.
    pub min_confidence: f32,
}

/// One request's state in the draft model: its sequence, sampler and random stream.
pub struct DraftSequence {
    pub(super) seq: SeqId,
    sampler: Sampler,
    rng: Xoshiro256StarStar,
    row: DraftRow,
    /// Where this request's drafting stops (see [`BatchedDraftModel::min_confidence`]).
    pub min_confidence: f32,
}

impl DraftSequence {
    /// Draws from `sampling`'s filtered distribution from now on (a fresh random stream when it
    /// changes).
    pub fn set_sampling(&mut self, sampling: &SamplingParams) {
        if self.sampler.params() != sampling {
            self.sampler = Sampler::new(sampling.clone());
            self.rng = draft_rng(sampling.seed);
        }
    }
}

/// What one request asks of a shared drafting step.
pub struct DraftRequest<'a> {
    pub sequence: &'a mut DraftSequence,
    /// Prompt and accepted output, oldest first.
    pub context: &'a [u32],
    pub max_tokens: usize,
}

/// A request drafting in the current step.
struct Drafting {
    request: usize,
    /// Context then drafts; `history[fed..]` is what the next pass reads.
    history: Vec<u32>,
    fed: usize,
    max_tokens: usize,
    steady: bool,
    tokens: Vec<u32>,
    distributions: Vec<Distribution>,
    timing: DraftTiming,
}

impl BatchedDraftModel {
    /// `runner`: the draft model loaded with a KV pool for as many sequences as the scheduler
    /// runs at once; the tokenizers of both models are compared first.
    pub fn new(
        runner: Runner,
        draft_tokenizer: &Tokenizer,
        target_tokenizer: &Tokenizer,
        prefill_chunk: usize,
    ) -> Result<Self> {
        let shared_vocab = check_vocab_compatible(target_tokenizer, draft_tokenizer)?.min(runner.config().n_logits);
        Ok(BatchedDraftModel {
            runner,
            shared_vocab,
            prefill_chunk: prefill_chunk.max(1),
            min_confidence: DEFAULT_MIN_CONFIDENCE,
        })
    }

    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    /// The milliseconds of one draft pass of one token on this machine (see
    /// [`Runner::time_passes`]); `None` where its context cannot hold the measurement.
    pub async fn time_pass(&mut self) -> Result<Option<f64>> {
        let costs = self.runner.time_passes(&[1], LogitsMode::Last).await?;
        Ok(costs.first().map(|&(_, ms)| ms))
    }

    /// A sequence for a request sampled with `sampling` (the draft draws from the same filtered
    /// distribution, from a random stream of its own), stopping at [`Self::min_confidence`].
    pub fn add_sequence(&mut self, sampling: &SamplingParams) -> DraftSequence {
        DraftSequence {
            seq: self.runner.kv_mut().add_sequence(),
            sampler: Sampler::new(sampling.clone()),
            rng: draft_rng(sampling.seed),
            row: DraftRow::default(),
            min_confidence: self.min_confidence,
        }
    }

    /// The tokens in `sequence`'s KV cache.
    pub fn tokens(&self, sequence: &DraftSequence) -> &[u32] {
        self.runner.kv().tokens(sequence.seq)
    }

    /// Reads `context` (a prompt) into `sequence` ahead of its first proposal, which then reads
    /// only what came after. Full blocks the draft's prefix cache holds (an earlier turn of the
    /// conversation, a shared system prompt) are not read again. A context the draft cannot hold
    /// is left to the proposal (which then proposes nothing).
    pub async fn prepare(&mut self, sequence: &mut DraftSequence, context: &[u32]) -> Result<()> {
        let seq = sequence.seq;
        let n_ctx = self.runner.n_ctx();
        let kv = self.runner.kv_mut();
        let mut common = kv.tokens(seq).iter().zip(context).take_while(|(a, b)| a == b).count();
        if !kv.can_truncate(seq, common) {
            common = 0;
        }
        kv.truncate(seq, common)?;
        if context.len() > common && n_ctx >= context.len() {
            common += kv.reuse_cached_prefix(seq, context)?;
        }
        if context.len() == common || self.runner.n_ctx() < context.len() {
            return Ok(());
        }
        // Only the KV matters here: read back one candidate, not the vocabulary.
        for chunk in context[common..].chunks(self.prefill_chunk) {
            self.runner
                .step_for_async(&[BatchEntry { seq, tokens: chunk }], LogitsMode::Last, Readback::TopK(1))
                .await?;
        }
        Ok(())
    }

    /// Frees a request's sequence (its full blocks stay in the draft's prefix cache).
    pub fn remove_sequence(&mut self, sequence: DraftSequence) {
        self.runner.kv_mut().remove_sequence(sequence.seq);
    }

    /// Each request's proposal, in order: at most `max_tokens` tokens likely to follow its
    /// context. Each sequence is first rolled back to what it shares with its context. A pool
    /// with no room for the drafts ends the proposals where they are.
    pub async fn propose(&mut self, requests: &mut [DraftRequest<'_>]) -> Result<Vec<Proposal>> {
        let mut proposals = vec![Proposal::default(); requests.len()];
        let mut drafting = Vec::new();
        let n_ctx = self.runner.n_ctx();
        for (i, request) in requests.iter_mut().enumerate() {
            let context = request.context;
            if context.is_empty() || request.max_tokens == 0 {
                continue;
            }
            let seq = request.sequence.seq;
            let kv = self.runner.kv_mut();
            let mut common = kv.tokens(seq).iter().zip(context).take_while(|(a, b)| a == b).count();
            common = common.min(context.len() - 1);
            if !kv.can_truncate(seq, common) {
                common = 0;
            }
            kv.truncate(seq, common)?;
            // Room for the new context tokens plus all drafts but the last (never evaluated).
            let new_tokens = context.len() - common;
            let room = n_ctx.saturating_sub(common);
            if room < new_tokens {
                continue; // the draft's context is full: no drafts
            }
            // A long backlog (the prompt, at the first proposal) is read in chunks first.
            let mut fed = common;
            while context.len() - fed > self.prefill_chunk {
                let entry = BatchEntry { seq, tokens: &context[fed..fed + self.prefill_chunk] };
                match self.runner.step_for_async(&[entry], LogitsMode::Last, Readback::TopK(1)).await {
                    Ok(_) => fed += self.prefill_chunk,
                    Err(CoreError::KvExhausted { .. }) => break,
                    Err(error) => return Err(error),
                }
            }
            if context.len() - fed > self.prefill_chunk {
                continue;
            }
            drafting.push(Drafting {
                request: i,
                history: context.to_vec(),
                fed,
                max_tokens: request.max_tokens.min(room - new_tokens + 1),
                steady: new_tokens <= STEADY_CONTEXT_TOKENS,
                tokens: Vec::new(),
                distributions: Vec::new(),
                timing: DraftTiming::default(),
            });
        }
        let n_logits = self.runner.config().n_logits;
        let outside_shared = n_logits.saturating_sub(self.shared_vocab);
        let mut first = true;
        let mut done = Vec::new();
        while !drafting.is_empty() {
            let readback = drafting
                .iter()
                .map(|d| draft_readback(&requests[d.request].sequence.sampler, &d.history, outside_shared))
                .fold(Readback::TopK(1), Readback::union);
            let entries: Vec<BatchEntry<'_>> = drafting
                .iter()
                .map(|d| BatchEntry { seq: requests[d.request].sequence.seq, tokens: &d.history[d.fed..] })
                .collect();
            let started = Instant::now();
            let output = match self.runner.step_for_async(&entries, LogitsMode::Last, readback).await {
                Ok(output) => output,
                // No room for more drafts: the proposals end here (what they hold is evaluated).
                Err(CoreError::KvExhausted { .. }) => break,
                Err(error) => return Err(error),
            };
            let pass_ms = ms(started);
            drop(entries);
            let mut still = Vec::with_capacity(drafting.len());
            for (row, mut d) in drafting.into_iter().enumerate() {
                if first {
                    d.timing.first_pass_ms = d.steady.then_some(pass_ms);
                } else {
                    d.timing.later_passes += 1;
                    d.timing.later_ms += pass_ms;
                }
                d.fed = d.history.len();
                let sequence = &mut *requests[d.request].sequence;
                let greedy = sequence.sampler.params().temperature <= 0.0;
                sequence.row.keep(output, row, n_logits, self.shared_vocab, greedy);
                let next = sequence.row.next_draft(
                    &mut sequence.sampler,
                    &d.history,
                    sequence.min_confidence,
                    &mut sequence.rng,
                );
                match next {
                    Some((token, distribution)) => {
                        d.tokens.push(token);
                        d.distributions.push(distribution);
                        d.history.push(token);
                        // The last draft of a full proposal is never evaluated.
                        if d.tokens.len() < d.max_tokens {
                            still.push(d);
                        } else {
                            done.push(d);
                        }
                    }
                    None => done.push(d),
                }
            }
            drafting = still;
            first = false;
        }
        for d in done.into_iter().chain(drafting) {
            let greedy = requests[d.request].sequence.sampler.params().temperature <= 0.0;
            // Greedy drafts are one-hot: the verifier needs no distributions for them.
            let distributions = (!greedy).then_some(d.distributions);
            proposals[d.request] = Proposal { tokens: d.tokens, distributions, timing: Some(d.timing), matched: None };
        }
        Ok(proposals)
    }
}
