//! The acceptance rule of speculative sampling (Leviathan et al. 2023, "Fast Inference from
//! Transformers via Speculative Decoding", Algorithm 1; Chen et al. 2023, "Accelerating Large
//! Language Model Decoding with Speculative Sampling"): a draft token x drawn from q is kept with
//! probability min(1, p(x)/q(x)); otherwise the token is drawn from norm(max(0, p − q)). The
//! result is distributed exactly as p. Greedy decoding is the special case where p is one-hot.
//!
//! Distributions are sparse `(token, probability)` lists as returned by
//! [`Sampler::distribution`](crate::sampling::Sampler::distribution): tokens absent have probability 0.

use crate::backend::Readback;
use crate::error::Result;
use crate::sampling::{Sampler, Xoshiro256StarStar};
use std::collections::HashMap;

/// Sparse probability distribution over token ids: `(token, probability)`, probabilities sum to 1.
pub type Distribution = Vec<(u32, f32)>;

/// The result of checking one proposal against the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerificationOutcome {
    /// Length of the accepted prefix of the proposal.
    pub accepted: usize,
    /// Length of the proposal.
    pub proposed: usize,
    /// The target's own token after the accepted prefix: the replacement drawn at the first
    /// rejection, or the bonus token when every draft token was accepted.
    pub continuation_token: u32,
}

/// The decision for one draft token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenVerdict {
    Accepted,
    /// Rejected; the target's token drawn from norm(max(0, p − q)) takes its place.
    Rejected {
        replacement: u32,
    },
}

/// The generator of a generation's acceptance tests and replacements: a stream of its own. Seeded
/// like the sampler's, its draws would repeat the ones that chose the tokens before: the first
/// acceptance test reused the draw that picked the pending token, so after a likely token (drawn
/// low) a likely draft was always kept (Qwen2.5-0.5B at temperature 1.5: a draft the target gives
/// 0.69 kept in 149 runs of 149; tests/scheduler.rs, tests/speculative.rs).
pub fn verification_rng(seed: u64) -> Xoshiro256StarStar {
    Xoshiro256StarStar::seed_from_u64(seed ^ VERIFICATION_STREAM)
}

/// Sets the verification stream apart from the sampler's (and the draft model's) for one seed.
const VERIFICATION_STREAM: u64 = 0x7E51_F1CA_7104_5EED;

/// Probability of `token` in `distribution` (0 when absent).
pub fn probability_of(distribution: &[(u32, f32)], token: u32) -> f32 {
    distribution.iter().find(|(id, _)| *id == token).map_or(0.0, |&(_, p)| p)
}

/// Draws from a distribution (weights need not be normalised); `None` when it has no mass.
pub fn sample_from(distribution: &[(u32, f32)], rng: &mut Xoshiro256StarStar) -> Option<u32> {
    let total: f64 = distribution.iter().map(|&(_, w)| w.max(0.0) as f64).sum();
    // Also catches NaN totals.
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let target = rng.next_f64() * total;
    let mut cumulative = 0.0f64;
    for &(id, w) in distribution {
        cumulative += w.max(0.0) as f64;
        if cumulative > target {
            return Some(id);
        }
    }
    // Rounding at the very end of the walk: the last token with mass.
    distribution.iter().rev().find(|(_, w)| *w > 0.0).map(|&(id, _)| id)
}

/// One step of speculative sampling for draft token `x`. `p`: the target's distribution at this
/// position; `q`: the draft distribution x was drawn from, `None` for a deterministic drafter
/// (q one-hot on x: x is kept with probability p(x), otherwise replaced by a draw from p with x
/// removed). Returns `None` only when `p` has no mass at all.
pub fn verify_token(
    p: &[(u32, f32)],
    q: Option<&[(u32, f32)]>,
    x: u32,
    rng: &mut Xoshiro256StarStar,
) -> Option<TokenVerdict> {
    let p_x = probability_of(p, x) as f64;
    let q_x = match q {
        Some(q) => probability_of(q, x) as f64,
        None => 1.0,
    };
    // A drafter that proposes a token it gave no mass behaves as a deterministic one for it.
    let q_x = if q_x > 0.0 { q_x } else { 1.0 };
    // u < p(x)/q(x), written without the division; always true when p(x) >= q(x).
    if p_x > 0.0 && rng.next_f64() * q_x < p_x {
        return Some(TokenVerdict::Accepted);
    }
    let residual: Vec<(u32, f32)> = match q {
        Some(q) if q.len() > 1 => {
            let q_of: HashMap<u32, f32> = q.iter().copied().collect();
            p.iter().map(|&(id, p_t)| (id, (p_t - q_of.get(&id).copied().unwrap_or(0.0)).max(0.0))).collect()
        }
        // One-hot q (deterministic drafts, greedy drafts): the residual is p without x.
        _ => p.iter().map(|&(id, p_t)| (id, if id == x { 0.0 } else { p_t })).collect(),
    };
    // No residual mass means p <= q everywhere, i.e. p == q up to rounding: then rejection had
    // probability ~0, and p itself is the right distribution to draw from.
    let replacement = sample_from(&residual, rng).or_else(|| sample_from(p, rng))?;
    Some(TokenVerdict::Rejected { replacement })
}

/// Checks `drafts` left to right. `target(i)` gives the target's distribution after the context
/// plus `drafts[..i]` (i in 0..=drafts.len(); computed lazily, only as far as needed);
/// `draft_distributions[i]` is q for `drafts[i]` (`None`: deterministic drafter).
pub fn verify_proposal(
    drafts: &[u32],
    draft_distributions: Option<&[Distribution]>,
    target: &mut dyn FnMut(usize) -> Result<Distribution>,
    rng: &mut Xoshiro256StarStar,
) -> Result<VerificationOutcome> {
    for (i, &x) in drafts.iter().enumerate() {
        let p = target(i)?;
        let q = draft_distributions.and_then(|d| d.get(i)).map(|d| d.as_slice());
        match verify_token(&p, q, x, rng) {
            Some(TokenVerdict::Accepted) => continue,
            Some(TokenVerdict::Rejected { replacement }) => {
                return Ok(VerificationOutcome { accepted: i, proposed: drafts.len(), continuation_token: replacement })
            }
            // The target gives no token any mass (everything banned): fall back like the sampler does.
            None => return Ok(VerificationOutcome { accepted: i, proposed: drafts.len(), continuation_token: x }),
        }
    }
    let p = target(drafts.len())?;
    let bonus = sample_from(&p, rng).or_else(|| drafts.last().copied()).unwrap_or(0);
    Ok(VerificationOutcome { accepted: drafts.len(), proposed: drafts.len(), continuation_token: bonus })
}

/// What a verification step over `drafts` reads back: the candidates of the most demanding row
/// (row i is sampled after `context` + `drafts[..i]`), or the whole rows when one needs them.
pub(crate) fn verify_readback(sampler: &Sampler, context: &[u32], drafts: &[u32]) -> Readback {
    let mut k = 1;
    for i in 0..=drafts.len() {
        match sampler.readback_after(context, &drafts[..i]) {
            Readback::TopK(row_k) | Readback::TopKAndLogSumExp(row_k) => k = k.max(row_k),
            Readback::Logits => return Readback::Logits,
        }
    }
    Readback::TopK(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_keeps_the_matching_prefix_and_substitutes_the_argmax() {
        let mut rng = Xoshiro256StarStar::seed_from_u64(1);
        // Target argmax per position: 5, 6, 9, 2.
        let argmax = [5u32, 6, 9, 2];
        let mut target = |i: usize| Ok(vec![(argmax[i], 1.0)]);
        let outcome = verify_proposal(&[5, 6, 7], None, &mut target, &mut rng).unwrap();
        assert_eq!(outcome, VerificationOutcome { accepted: 2, proposed: 3, continuation_token: 9 });
        let outcome = verify_proposal(&[5, 6, 9], None, &mut target, &mut rng).unwrap();
        assert_eq!(outcome, VerificationOutcome { accepted: 3, proposed: 3, continuation_token: 2 });
    }

    #[test]
    fn a_token_the_target_excludes_is_never_accepted() {
        let mut rng = Xoshiro256StarStar::seed_from_u64(7);
        let p = vec![(1u32, 0.5f32), (2, 0.5)];
        let q = vec![(3u32, 1.0f32)];
        for _ in 0..100 {
            match verify_token(&p, Some(&q), 3, &mut rng) {
                Some(TokenVerdict::Rejected { replacement }) => assert!(replacement == 1 || replacement == 2),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}
