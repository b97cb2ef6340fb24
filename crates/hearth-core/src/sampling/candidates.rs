//! Sampling from a backend's top-k candidates ([`Readback::TopK`]) instead of the full logits
//! row: which candidates a sampler needs ([`Sampler::readback`], the one place that decides) and
//! the sampling chain over them, which picks exactly what the full-row chain picks.

use super::{
    by_logit_descending, fill_window, penalize, penalties_apply, Candidate, Sampler, SamplingParams, MAX_CANDIDATES,
};
use crate::backend::Readback;

/// The most candidates a sampler with penalties or a negative logit bias asks for: the top-k it
/// samples from plus one per token those lower. Matches the largest top-k the WebGPU backend
/// reduces on the device (`hearth-wgpu`'s `sample::MAX_K`); past it the whole row is read.
pub const MAX_ADJUSTED_CANDIDATES: usize = 256;

impl Sampler {
    /// What this sampler needs from a step whose token is sampled after `history`: see
    /// [`Sampler::readback_after`].
    pub fn readback(&self, history: &[u32]) -> Readback {
        self.readback_after(history, &[])
    }

    /// What this sampler needs from a step whose token is sampled after `history` followed by
    /// `appended` (e.g. the token the step evaluates): the top 1 for greedy decoding, the `top_k`
    /// candidates for top-k sampling (top-p and min-p then work within them), the whole row for
    /// a filter over the whole vocabulary (top-p or min-p without top-k, or top-k above
    /// [`MAX_CANDIDATES`]). [`Sampler::sample_candidates`] on the candidates picks exactly what
    /// [`Sampler::sample`] picks on the full row.
    ///
    /// Bias and penalties. Why candidates stay exact: llama.cpp's penalties only ever lower a
    /// logit when `repeat_penalty ≥ 1` (a logit ≤ 0 is multiplied by it, a positive one divided,
    /// both rounded monotonically, so never upwards) and presence/frequency penalties are ≥ 0
    /// (`count · frequency + presence ≥ 0` is subtracted); a logit bias ≤ 0 (or `-inf`) lowers
    /// too. Let P be the number of distinct tokens so lowered (the penalty window's tokens and
    /// the biased ones) and S the top `k + P` before any adjustment. At least k members of S are
    /// not adjusted; each ranks above every token outside S before adjustment (larger logit, or
    /// equal and lower id) and keeps its logit, while an outside token's logit only drops, so no
    /// outside token can enter the top k afterwards. Reading `k + P` candidates and adjusting
    /// only them (the same float operations as on the full row) is therefore exact. A penalty
    /// that may raise a logit (`repeat_penalty < 1`, negative presence/frequency, NaN or
    /// infinite parameters) or any positive or NaN bias reads the whole row, as does
    /// `k + P > MAX_ADJUSTED_CANDIDATES`.
    pub fn readback_after(&self, history: &[u32], appended: &[u32]) -> Readback {
        let p = &self.params;
        let needed = if p.temperature <= 0.0 {
            1
        } else if (1..=MAX_CANDIDATES).contains(&p.top_k) {
            p.top_k
        } else {
            return Readback::Logits;
        };
        match lowered_tokens(p, history, appended) {
            Some(0) => Readback::TopK(needed),
            Some(lowered) if needed + lowered <= MAX_ADJUSTED_CANDIDATES => Readback::TopK(needed + lowered),
            _ => Readback::Logits,
        }
    }

    /// Picks the next token after `history` from a row of [`crate::backend::TopK`] candidates
    /// (most likely first, ties by lowest id) obtained with [`Sampler::readback`] for the same
    /// history (more candidates are fine). Same token, same random stream as [`Sampler::sample`]
    /// on the full row. Falls back to the best candidate when every one is `-inf`; 0 when there
    /// are none.
    pub fn sample_candidates(&mut self, ids: &[u32], logits: &[f32], history: &[u32]) -> u32 {
        let fallback = self.prepare_candidates(ids, logits, history);
        if self.params.temperature <= 0.0 {
            return fallback;
        }
        let sorted = self.candidates.len();
        self.filter_candidates(sorted);
        if self.candidates.is_empty() {
            return fallback;
        }
        self.draw()
    }

    /// [`Sampler::distribution`] from a row of candidates obtained with [`Sampler::readback`]
    /// for `history`: the same (token, probability) pairs. Does not advance the random generator.
    pub fn distribution_candidates(&mut self, ids: &[u32], logits: &[f32], history: &[u32]) -> Vec<(u32, f32)> {
        let best = self.prepare_candidates(ids, logits, history);
        if self.params.temperature <= 0.0 {
            return if ids.is_empty() { Vec::new() } else { vec![(best, 1.0)] };
        }
        let sorted = self.candidates.len();
        self.filter_candidates(sorted);
        self.candidate_probabilities()
    }

    /// Fills `candidates` with the row after bias and penalties, sorted, without `-inf`/NaN, cut
    /// to `top_k`; returns the greedy choice (what `argmax` gives on the adjusted full row).
    fn prepare_candidates(&mut self, ids: &[u32], logits: &[f32], history: &[u32]) -> u32 {
        self.candidates.clear();
        self.candidates.extend(ids.iter().zip(logits).map(|(&id, &logit)| Candidate { id, logit }));
        let adjusted = self.adjust_candidates(history);
        // Also drops NaN.
        self.candidates.retain(|c| c.logit > f32::NEG_INFINITY);
        if adjusted {
            self.candidates.sort_unstable_by(by_logit_descending);
        }
        // With no candidate above -inf the full row has none either (some candidates are never
        // adjusted and rank above every other token), and both fall back to the first id: 0.
        let best = self.candidates.first().map_or(ids.first().copied().unwrap_or(0), |c| c.id);
        if self.params.top_k > 0 {
            self.candidates.truncate(self.params.top_k);
        }
        best
    }

    /// The bias and penalties on `candidates`, with exactly the float operations the full row
    /// gets. Returns whether anything may have changed.
    fn adjust_candidates(&mut self, history: &[u32]) -> bool {
        let Sampler { params, candidates, window, .. } = self;
        let penalties = penalties_apply(params, history);
        if params.logit_bias.is_empty() && !penalties {
            return false;
        }
        if penalties {
            fill_window(window, history, &[], params.repeat_last_n);
        }
        for c in candidates.iter_mut() {
            if let Some(&bias) = params.logit_bias.get(&c.id) {
                c.logit += bias;
            }
            if penalties {
                let count = window.partition_point(|&t| t <= c.id) - window.partition_point(|&t| t < c.id);
                if count > 0 {
                    penalize(&mut c.logit, count, params);
                }
            }
        }
        true
    }
}

/// How many distinct tokens the bias and penalties lower after `history` + `appended`; `None`
/// when one of them may raise a logit (see [`Sampler::readback_after`]).
fn lowered_tokens(p: &SamplingParams, history: &[u32], appended: &[u32]) -> Option<usize> {
    // A positive or NaN bias may raise a logit (-inf, a ban, only lowers).
    if p.logit_bias.values().any(|&bias| bias.is_nan() || bias > 0.0) {
        return None;
    }
    let penalties = penalties_apply(p, history) || penalties_apply(p, appended);
    let only_lower = |x: f32| x.is_finite() && x >= 0.0;
    if penalties
        && !(p.repeat_penalty.is_finite()
            && p.repeat_penalty >= 1.0
            && only_lower(p.presence_penalty)
            && only_lower(p.frequency_penalty))
    {
        return None;
    }
    let mut tokens: Vec<u32> = p.logit_bias.keys().copied().collect();
    if penalties {
        let mut window = Vec::new();
        fill_window(&mut window, history, appended, p.repeat_last_n);
        tokens.extend_from_slice(&window);
    }
    tokens.sort_unstable();
    tokens.dedup();
    Some(tokens.len())
}
