//! Logits processing and sampling with llama.cpp semantics, plus stop-string handling for
//! streamed text.
//!
//! Chain (llama.cpp's `common_sampler` default): logit bias → repetition/presence/frequency
//! penalties → top-k → top-p → min-p → temperature → draw. Temperature ≤ 0 is greedy: argmax
//! after bias and penalties, the lowest token id winning ties.
//!
//! Per call the sampler touches the vocabulary O(n) times and allocates nothing once warm:
//! candidates live in a reused buffer, top-k uses `select_nth_unstable_by`, and top-p sorts only
//! a growing prefix of the candidates until it holds the requested probability mass.

mod candidates;
mod logprobs;
mod rng;
mod stop;
mod top_k;

pub use candidates::MAX_ADJUSTED_CANDIDATES;
pub use logprobs::{TokenLogprob, MAX_TOP_LOGPROBS};
pub use rng::{splitmix64, Xoshiro256StarStar};
pub use stop::{StopOutcome, StopStrings};
pub use top_k::{log_sum_exp_rows, reduce_rows, top_k_rows, MAX_CANDIDATES};

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// How the next token is chosen. The default is greedy decoding with every filter disabled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` selects the most likely token (greedy).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability sums to at least `top_p`
    /// (nucleus sampling); `>= 1` disables.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the most likely one's; `<= 0` disables.
    pub min_p: f32,
    /// llama.cpp repetition penalty over the last `repeat_last_n` tokens: positive logits are
    /// divided by it, negative ones multiplied; `1` disables.
    pub repeat_penalty: f32,
    /// How many of the most recent tokens all penalties look at; `0` disables penalties,
    /// `usize::MAX` means the whole history.
    pub repeat_last_n: usize,
    /// OpenAI presence penalty: subtracted once from the logit of every token in the window.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty: subtracted once per occurrence of a token in the window.
    pub frequency_penalty: f32,
    /// Added to the logit of the given token ids; `f32::NEG_INFINITY` bans a token. (JSON has no
    /// infinity: from JSON, a large negative bias such as -1e30 bans in practice.)
    pub logit_bias: BTreeMap<u32, f32>,
    /// Seed of the random generator (xoshiro256**): the same seed gives the same tokens.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: BTreeMap::new(),
            seed: 0,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Candidate {
    id: u32,
    logit: f32,
}

/// Most likely first; equal logits ordered by token id so results never depend on input order.
fn by_logit_descending(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit.partial_cmp(&a.logit).unwrap_or(Ordering::Equal).then(a.id.cmp(&b.id))
}

/// A stateful sampler: owns the random generator and scratch buffers reused across calls.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: Xoshiro256StarStar,
    /// Tokens still eligible, shape [n ≤ vocab].
    candidates: Vec<Candidate>,
    /// Sorted copy of the penalty window, for counting occurrences without a hash map.
    window: Vec<u32>,
    /// Unnormalised probabilities of `candidates`, same order.
    weights: Vec<f32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = Xoshiro256StarStar::seed_from_u64(params.seed);
        Sampler { params, rng, candidates: Vec::new(), window: Vec::new(), weights: Vec::new() }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Restarts the random stream as if freshly built with `seed`.
    pub fn reseed(&mut self, seed: u64) {
        self.params.seed = seed;
        self.rng = Xoshiro256StarStar::seed_from_u64(seed);
    }

    /// Picks the next token. `logits`: one per vocabulary entry, modified in place by the bias
    /// and penalties. `history`: the tokens so far (prompt and generated), oldest first.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.apply_bias_and_penalties(logits, history);
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        self.filter(logits);
        if self.candidates.is_empty() {
            // Every token is banned or NaN: fall back to a deterministic choice rather than fail.
            return argmax(logits);
        }
        self.draw()
    }

    /// The distribution [`sample`](Self::sample) draws from: (token, probability) pairs after every
    /// filter and the temperature, most likely first. Does not advance the random generator.
    pub fn distribution(&mut self, logits: &mut [f32], history: &[u32]) -> Vec<(u32, f32)> {
        self.apply_bias_and_penalties(logits, history);
        if self.params.temperature <= 0.0 {
            return if logits.is_empty() { Vec::new() } else { vec![(argmax(logits), 1.0)] };
        }
        self.filter(logits);
        self.candidate_probabilities()
    }

    /// Softmax of `candidates` (already filtered, divided by the temperature) as (token,
    /// probability), most likely first.
    fn candidate_probabilities(&self) -> Vec<(u32, f32)> {
        let max = self.candidates.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = self.candidates.iter().map(|c| ((c.logit - max) as f64).exp()).sum();
        let mut out: Vec<(u32, f32)> =
            self.candidates.iter().map(|c| (c.id, (((c.logit - max) as f64).exp() / sum) as f32)).collect();
        out.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(Ordering::Equal).then(a.0.cmp(&b.0)));
        out
    }

    fn apply_bias_and_penalties(&mut self, logits: &mut [f32], history: &[u32]) {
        for (&token, &bias) in &self.params.logit_bias {
            if let Some(logit) = logits.get_mut(token as usize) {
                *logit += bias;
            }
        }

        if !penalties_apply(&self.params, history) {
            return;
        }
        fill_window(&mut self.window, history, &[], self.params.repeat_last_n);
        for run in self.window.chunk_by(|a, b| a == b) {
            let Some(logit) = logits.get_mut(run[0] as usize) else { continue };
            penalize(logit, run.len(), &self.params);
        }
    }

    /// Fills `candidates` with the tokens that survive top-k, top-p and min-p, logits divided by
    /// the temperature.
    fn filter(&mut self, logits: &[f32]) {
        self.candidates.clear();
        self.candidates.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| **l > f32::NEG_INFINITY) // also drops NaN
                .map(|(id, &logit)| Candidate { id: id as u32, logit }),
        );
        // How many leading candidates are known to be sorted, most likely first.
        let mut sorted_prefix = 0;
        let top_k = self.params.top_k;
        if top_k > 0 {
            // Sorted, so the draw walks them in the order a backend's top-k returns them
            // (sample_candidates gives the same tokens).
            let kept = top_k.min(self.candidates.len());
            sort_prefix(&mut self.candidates, kept);
            self.candidates.truncate(top_k);
            sorted_prefix = self.candidates.len();
        }
        self.filter_candidates(sorted_prefix);
    }

    /// Top-p, min-p and temperature over `candidates`, whose first `sorted_prefix` are sorted.
    fn filter_candidates(&mut self, mut sorted_prefix: usize) {
        let p = &self.params;

        if p.top_p < 1.0 && !self.candidates.is_empty() {
            let max = self.candidates.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
            let total: f64 = self.candidates.iter().map(|c| ((c.logit - max) as f64).exp()).sum();
            let target = p.top_p as f64 * total;
            // Sort a prefix big enough to hold the mass; grow it only when it does not.
            let mut prefix = self.candidates.len().min(256);
            loop {
                sort_prefix(&mut self.candidates, prefix);
                sorted_prefix = prefix;
                let mut cumulative = 0.0f64;
                let kept = self.candidates[..prefix].iter().position(|c| {
                    cumulative += ((c.logit - max) as f64).exp();
                    cumulative >= target
                });
                if let Some(last) = kept {
                    self.candidates.truncate(last + 1);
                    sorted_prefix = last + 1;
                    break;
                }
                if prefix == self.candidates.len() {
                    break; // rounding: the whole set is needed
                }
                prefix = self.candidates.len().min(prefix * 8);
            }
        }

        if p.min_p > 0.0 && !self.candidates.is_empty() {
            let max = if sorted_prefix > 0 {
                self.candidates[0].logit
            } else {
                self.candidates.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max)
            };
            // p_i >= min_p * p_max  <=>  logit_i >= max + ln(min_p), as llama.cpp computes it.
            let threshold = max + p.min_p.ln();
            self.candidates.retain(|c| c.logit >= threshold);
        }

        let inverse_temperature = 1.0 / p.temperature;
        for c in &mut self.candidates {
            c.logit *= inverse_temperature;
        }
    }

    /// Draws from the softmax of the candidates' logits (one `exp` per candidate, f64 sums).
    fn draw(&mut self) -> u32 {
        let max = self.candidates.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
        self.weights.clear();
        self.weights.extend(self.candidates.iter().map(|c| (c.logit - max).exp()));
        let total: f64 = self.weights.iter().map(|&w| w as f64).sum();
        let target = self.rng.next_f64() * total;
        let mut cumulative = 0.0f64;
        for (c, &w) in self.candidates.iter().zip(&self.weights) {
            cumulative += w as f64;
            if cumulative > target {
                return c.id;
            }
        }
        // Only reachable through rounding at the very end of the walk.
        self.candidates.last().map_or(0, |c| c.id)
    }
}

/// Whether the repetition/presence/frequency penalties change anything after `history`.
fn penalties_apply(p: &SamplingParams, history: &[u32]) -> bool {
    let disabled =
        p.repeat_last_n == 0 || (p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0);
    !disabled && !history.is_empty()
}

/// Fills `window` with the last `repeat_last_n` tokens of `history` followed by `appended`, sorted.
fn fill_window(window: &mut Vec<u32>, history: &[u32], appended: &[u32], repeat_last_n: usize) {
    window.clear();
    let from_appended = appended.len().min(repeat_last_n);
    let from_history = (repeat_last_n - from_appended).min(history.len());
    window.extend_from_slice(&history[history.len() - from_history..]);
    window.extend_from_slice(&appended[appended.len() - from_appended..]);
    window.sort_unstable();
}

/// The llama.cpp penalties on one logit of a token seen `count` (≥ 1) times in the window.
fn penalize(logit: &mut f32, count: usize, p: &SamplingParams) {
    if *logit <= 0.0 {
        *logit *= p.repeat_penalty;
    } else {
        *logit /= p.repeat_penalty;
    }
    *logit -= count as f32 * p.frequency_penalty + p.presence_penalty;
}

/// Sorts the `len` most likely candidates to the front, most likely first.
fn sort_prefix(candidates: &mut [Candidate], len: usize) {
    if len == 0 {
        return;
    }
    if len < candidates.len() {
        candidates.select_nth_unstable_by(len - 1, by_logit_descending);
    }
    candidates[..len].sort_unstable_by(by_logit_descending);
}

/// Index of the largest logit, the lowest index winning ties; NaNs are ignored; 0 when empty
/// or when no logit is above `-inf`.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_logit = f32::NEG_INFINITY;
    for (i, &logit) in logits.iter().enumerate() {
        if logit > best_logit {
            best = i;
            best_logit = logit;
        }
    }
    best as u32
}

/// `log(softmax(logits))`, computed in f64 for accuracy; `-inf` logits stay `-inf`.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().filter(|l| !l.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return vec![f32::NEG_INFINITY; logits.len()];
    }
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).filter(|e| !e.is_nan()).sum();
    let log_sum = sum.ln();
    logits.iter().map(|&l| ((l - max) as f64 - log_sum) as f32).collect()
}

/// The `n` most likely tokens with their log-probabilities, most likely first (for `logprobs`).
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let log_probs = log_softmax(logits);
    let mut candidates: Vec<Candidate> = log_probs
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_nan())
        .map(|(id, &logit)| Candidate { id: id as u32, logit })
        .collect();
    let n = n.min(candidates.len());
    sort_prefix(&mut candidates, n);
    candidates[..n].iter().map(|c| (c.id, c.logit)).collect()
}
