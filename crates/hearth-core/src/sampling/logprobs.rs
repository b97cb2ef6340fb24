//! Log-probabilities of chosen tokens for `logprobs` / `top_logprobs`: the model's distribution,
//! the softmax of the raw logits, before logit bias, penalties, temperature and the filters (what
//! llama.cpp reports as `completion_probabilities` with `post_sampling_probs` off and vLLM by
//! default). So they do not depend on the sampling settings, and an evaluation harness reads the
//! model's own likelihoods.

use super::{log_softmax, top_logprobs};
use serde::Serialize;

/// Most alternatives a request may ask for at each position (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A chosen token, its log-probability, and the most likely tokens at its position.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: u32,
    /// Natural log of its probability; `-inf` where the row gave it none.
    pub logprob: f32,
    /// The most likely tokens at this position with their log-probabilities, most likely first
    /// (as many as the request asked for).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// From a whole `[n_vocab]` row of logits.
    pub fn from_logits(row: &[f32], token: u32, top: usize) -> Self {
        let log_probs = log_softmax(row);
        let logprob = log_probs.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY);
        TokenLogprob { token, logprob, top: top_logprobs(row, top) }
    }

    /// From a row's candidates (best first, as a backend's top-k reduction returns them) and the
    /// log-sum-exp of the whole row. The chosen token is among the candidates whenever the
    /// sampler drew from them; otherwise its log-probability is unknown here and reads `-inf`.
    pub fn from_candidates(ids: &[u32], logits: &[f32], log_sum_exp: f32, token: u32, top: usize) -> Self {
        let logprob = ids.iter().position(|&id| id == token).map_or(f32::NEG_INFINITY, |i| logits[i] - log_sum_exp);
        let top = ids.iter().zip(logits).take(top).map(|(&id, &logit)| (id, logit - log_sum_exp)).collect();
        TokenLogprob { token, logprob, top }
    }
}
