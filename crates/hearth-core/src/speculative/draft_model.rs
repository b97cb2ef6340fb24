//! A smaller model of the same family as the drafter (e.g. Qwen2.5-Coder-0.5B for the 1.5B): the
//! vocabulary check, the default shortlist, and how one draft row is read and drawn.

use super::verify::{sample_from, Distribution};
use crate::backend::Readback;
use crate::error::{CoreError, Result};
use crate::gguf::Metadata;
use crate::runner::StepOutput;
use crate::sampling::{Sampler, Xoshiro256StarStar};
use crate::tokenizer::Tokenizer;

/// Vocabulary sizes may differ by this many tokens (padding / added tokens at the end), as in
/// llama.cpp's `common_speculative_are_compatible`; the draft never proposes a token outside the
/// shared range.
pub const MAX_VOCAB_SIZE_DIFFERENCE: usize = 128;

/// Checks that token ids mean the same thing in both models: sizes within
/// [`MAX_VOCAB_SIZE_DIFFERENCE`] and identical pieces over the shared range. Returns the size of
/// the shared range; the error names the first mismatch.
pub fn check_vocab_compatible(target: &Tokenizer, draft: &Tokenizer) -> Result<usize> {
    let (n_target, n_draft) = (target.vocab_size(), draft.vocab_size());
    if n_target.abs_diff(n_draft) > MAX_VOCAB_SIZE_DIFFERENCE {
        return Err(CoreError::VocabMismatch(format!(
            "the target has {n_target} tokens and the draft {n_draft} (at most {MAX_VOCAB_SIZE_DIFFERENCE} may differ)"
        )));
    }
    let shared = n_target.min(n_draft);
    for id in 0..shared as u32 {
        let (t, d) = (target.piece(id), draft.piece(id));
        if t != d {
            return Err(CoreError::VocabMismatch(format!("token {id} is {t:?} in the target but {d:?} in the draft")));
        }
    }
    Ok(shared)
}

/// How many of the first token ids a draft model's head computes by default (its
/// `EngineOptions::logits_vocab`; `hearth run --draft-vocab`), for byte-level BPE vocabularies
/// only (see [`default_draft_vocab`]). Qwen2.5-Coder-0.5B drafting for the 1.5B on 2 CPU
/// threads: one draft token 10.4 -> 8.5 ms; 99.5% of the 1.5B's greedy tokens on the code edits
/// of `scripts/bench-speculative.sh` have smaller ids (94% are below 32,768), and their
/// acceptance did not move (docs/BENCHMARKS.md).
pub const DEFAULT_DRAFT_VOCAB: usize = 65_536;

/// The shortlist a draft model of this vocabulary gets by default: [`DEFAULT_DRAFT_VOCAB`] ids
/// for a byte-level BPE vocabulary larger than that (`tokenizer.ggml.model` "gpt2": its ids
/// follow merge order, so the first are the common pieces), the whole vocabulary otherwise.
/// SentencePiece vocabularies are not ordered that way: Gemma 3 repeats id 255,999 on a prompt
/// of repeated colour names. The control tokens at the end of a BPE vocabulary (Qwen's
/// `<|im_end|>` is 151,645) are never drafted: the target's own token ends the answer.
pub fn default_draft_vocab(metadata: &Metadata) -> Option<usize> {
    let bpe = matches!(metadata.opt_str("tokenizer.ggml.model"), Ok(Some("gpt2")));
    let n_vocab = metadata.array("tokenizer.ggml.tokens").map_or(0, |tokens| tokens.len());
    (bpe && n_vocab > DEFAULT_DRAFT_VOCAB).then_some(DEFAULT_DRAFT_VOCAB)
}

/// Default of [`BatchedDraftModel::min_confidence`](super::BatchedDraftModel::min_confidence) (llama.cpp's `--draft-p-min` default is 0.75). On
/// the code edit of `scripts/bench-speculative.sh` (5 drafts at most) it cut drafting time by a
/// quarter for 3 fewer accepted tokens out of 51; other thresholds were not measured.
pub const DEFAULT_MIN_CONFIDENCE: f32 = 0.6;

/// The draft's random stream for a request seeded `seed`, apart from the target's verification
/// stream.
pub(super) fn draft_rng(seed: u64) -> Xoshiro256StarStar {
    Xoshiro256StarStar::seed_from_u64(seed ^ 0x5EC0_D7AF_7D2A_F7ED)
}

/// What a draft step reads back for a row sampled after `history`: the candidates the sampler
/// asks for (a GPU then reads back a few bytes instead of the vocabulary; greedy also the row's
/// log-sum-exp for the confidence), or the logits when the sampler needs the whole row.
/// Candidates outside the shared vocabulary are dropped, so as many more as there are such
/// tokens (`outside_shared`) are asked for: the shared ones left are then the top of the row.
pub(super) fn draft_readback(sampler: &Sampler, history: &[u32], outside_shared: usize) -> Readback {
    let greedy = sampler.params().temperature <= 0.0;
    match sampler.readback(history).top_k() {
        Some(k) if greedy => Readback::TopKAndLogSumExp(k + outside_shared),
        Some(k) => Readback::TopK(k + outside_shared),
        None => Readback::Logits,
    }
}

/// What the last draft step read back for one sequence (buffers reused between steps).
#[derive(Default)]
pub(super) struct DraftRow {
    /// Whether `ids`/`logits` are candidates (best first, shared vocabulary only) or `logits` the
    /// shared part of the whole row.
    candidates: bool,
    ids: Vec<u32>,
    logits: Vec<f32>,
    /// Greedy: the softmax probability of the best token over the whole row, before penalties.
    top_probability: f32,
}

impl DraftRow {
    /// Keeps row `row` of a draft step's `output` (logits `[rows, n_logits]` or each row's
    /// candidates), restricted to the first `shared` token ids.
    pub fn keep(&mut self, output: StepOutput<'_>, row: usize, n_logits: usize, shared: usize, greedy: bool) {
        match output {
            StepOutput::Logits(logits) => {
                let start = (row * n_logits).min(logits.len());
                let end = (start + shared.min(n_logits)).min(logits.len());
                self.candidates = false;
                self.logits.clear();
                self.logits.extend_from_slice(&logits[start..end]);
                self.top_probability = if greedy { softmax_max(&self.logits) } else { 1.0 };
            }
            StepOutput::TopK(top) => {
                self.candidates = true;
                let (ids, logits) = if row < top.n_rows() { top.row(row) } else { (&[][..], &[][..]) };
                self.ids.clear();
                self.logits.clear();
                for (&id, &logit) in ids.iter().zip(logits).filter(|(&id, _)| (id as usize) < shared) {
                    self.ids.push(id);
                    self.logits.push(logit);
                }
                // The best shared candidate's probability under the whole row's softmax.
                self.top_probability = match (self.logits.first(), top.log_sum_exp.get(row)) {
                    (Some(&best), Some(&lse)) if best.is_finite() && lse.is_finite() => (best - lse).exp(),
                    _ => 0.0,
                };
            }
        }
    }

    /// The next draft token after `history` and the distribution it was drawn from, or `None`
    /// where drafting stops: the drafter is less sure than `min_confidence`, decided before the
    /// draw from the top candidate (a stop that depended on the drawn token would change the
    /// proposal distribution away from the q verification uses). Greedy: the top token, its
    /// confidence the plain softmax probability before penalties; sampling: a draw, its
    /// confidence the top probability after the filters.
    pub fn next_draft(
        &mut self,
        sampler: &mut Sampler,
        history: &[u32],
        min_confidence: f32,
        rng: &mut Xoshiro256StarStar,
    ) -> Option<(u32, Distribution)> {
        let greedy = sampler.params().temperature <= 0.0;
        let distribution = if self.candidates {
            sampler.distribution_candidates(&self.ids, &self.logits, history)
        } else {
            sampler.distribution(&mut self.logits, history)
        };
        let confidence = if greedy { self.top_probability } else { distribution.first().map_or(0.0, |&(_, p)| p) };
        // Also stops on a NaN row (NaN compares as unordered).
        if confidence.partial_cmp(&min_confidence).is_none_or(|o| o.is_lt()) {
            return None;
        }
        let token = if greedy { distribution.first().map(|&(id, _)| id) } else { sample_from(&distribution, rng) }?;
        Some((token, distribution))
    }
}

/// The largest softmax probability of `logits`: 1 / Σ exp(l − max). 0 for an empty row or one
/// without a finite maximum, NaN when some logit is NaN (either stops drafting).
fn softmax_max(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return 0.0;
    }
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    1.0 / sum
}
