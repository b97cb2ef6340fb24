//! Speculative decoding on any backend: a cheap drafter proposes a few tokens, the target model
//! scores the last accepted token plus all of them in one forward pass (`LogitsMode::All`), the
//! longest valid prefix is kept and the target's KV cache is rolled back past the rest.
//!
//! - [`Drafter`]: who proposes. [`DraftModel`] (a second, smaller [`Session`](crate::engine::Session)
//!   with the same vocabulary) or [`PromptLookup`] (n-gram copy from the prompt and output).
//! - [`verify`]: who decides. Greedy keeps exactly the target's greedy output; with sampling it
//!   is the rejection sampling of Leviathan et al. 2023 / Chen et al. 2023, so the output follows
//!   the target's (post-filter) distribution whatever the drafter proposes.
//! - [`AdaptiveDraftLength`]: how many tokens to ask for, from the running acceptance rate.
//! - `Engine::generate_speculative` (in `generate.rs`): the loop, with the streaming, stop-string
//!   and timing behaviour of `Engine::generate`.

mod draft_model;
mod generate;
mod prompt_lookup;
pub mod verify;

pub use draft_model::{check_vocab_compatible, DraftModel, DEFAULT_MIN_CONFIDENCE, MAX_VOCAB_SIZE_DIFFERENCE};
pub use prompt_lookup::PromptLookup;
pub use verify::{Distribution, VerificationOutcome};

use crate::error::Result;
use crate::sampling::SamplingParams;
use serde::Serialize;
use std::future::Future;
use std::pin::Pin;

/// Tokens a drafter guesses will follow the context.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// The draft distribution q each token was drawn from, one per token; `None` when the
    /// drafter is deterministic (q is one-hot on the proposed token).
    pub distributions: Option<Vec<Distribution>>,
}

/// The future of [`Drafter::propose_async`]: boxed so that the trait stays object-safe (the
/// generation loop takes `&mut dyn Drafter`); not `Send` (a WebGPU drafter in a browser is not).
pub type ProposalFuture<'a> = Pin<Box<dyn Future<Output = Result<Proposal>> + 'a>>;

/// Proposes continuations. Called once per verification step with everything accepted so far,
/// so a stateful drafter can resynchronise itself (e.g. roll its KV cache back to the common prefix).
pub trait Drafter {
    /// At most `max_tokens` tokens likely to follow `context` (prompt and accepted output, oldest
    /// first). `sampling` is the target's sampling configuration: a model drafter draws from the
    /// same filtered distribution so its proposals are accepted as often as possible.
    fn propose(&mut self, context: &[u32], max_tokens: usize, sampling: &SamplingParams) -> Result<Proposal>;

    /// [`Drafter::propose`] for drafters whose work completes later (a [`DraftModel`] on WebGPU
    /// in a browser awaits its forward passes); what `Engine::generate_speculative_async` awaits.
    /// The default is the synchronous `propose`, ready at once (prompt lookup computes nothing).
    fn propose_async<'a>(&'a mut self, context: &'a [u32], max_tokens: usize, sampling: &'a SamplingParams) -> ProposalFuture<'a> {
        Box::pin(std::future::ready(self.propose(context, max_tokens, sampling)))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct SpeculativeOptions {
    /// Upper bound of the draft length (the adaptive length moves within 1..=this).
    pub max_draft_tokens: usize,
    /// Adapt the draft length to the acceptance rate; false keeps it at `max_draft_tokens`.
    pub adaptive: bool,
}

/// For a draft model: up to 5 tokens, adapted to the acceptance rate (each draft token costs a
/// draft-model pass, so the length follows how many are kept).
impl Default for SpeculativeOptions {
    fn default() -> Self {
        SpeculativeOptions { max_draft_tokens: 5, adaptive: true }
    }
}

impl SpeculativeOptions {
    /// For [`PromptLookup`]: drafting is free and the drafter sizes each proposal from its match
    /// length, so the ceiling is high (a 16-token verification pass) and not adapted.
    pub fn lookup() -> Self {
        SpeculativeOptions { max_draft_tokens: 15, adaptive: false }
    }
}

/// What speculation did during one generation.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SpeculativeMetrics {
    /// Draft tokens proposed and checked by the target.
    pub proposed: usize,
    /// Draft tokens the target accepted.
    pub accepted: usize,
    /// Forward passes of the target model during decoding (one per verification step).
    pub target_forward_passes: usize,
    /// `accepted / proposed` (0 when nothing was proposed).
    pub acceptance_rate: f64,
    /// Accepted draft tokens per target pass; each pass also yields one token of the target's own.
    pub mean_accepted_per_step: f64,
}

impl SpeculativeMetrics {
    pub fn record(&mut self, outcome: &VerificationOutcome) {
        self.proposed += outcome.proposed;
        self.accepted += outcome.accepted;
        self.target_forward_passes += 1;
        self.acceptance_rate = ratio(self.accepted, self.proposed);
        self.mean_accepted_per_step = ratio(self.accepted, self.target_forward_passes);
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Draft length driven by an exponential moving average of the per-step acceptance rate: long
/// drafts pay off only when most of them are kept, and every rejected token costs target compute.
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptiveDraftLength {
    current: usize,
    max: usize,
    adaptive: bool,
    /// Running acceptance rate in [0, 1].
    rate: f64,
}

impl AdaptiveDraftLength {
    /// Weight of the newest step in the running rate.
    const SMOOTHING: f64 = 0.3;
    /// Above this running rate the draft grows by one token...
    const GROW_ABOVE: f64 = 0.7;
    /// ...below this one it shrinks by one.
    const SHRINK_BELOW: f64 = 0.35;

    pub fn new(options: &SpeculativeOptions) -> Self {
        let max = options.max_draft_tokens.max(1);
        AdaptiveDraftLength { current: max, max, adaptive: options.adaptive, rate: 0.5 }
    }

    pub fn current(&self) -> usize {
        self.current
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Feeds one verification step. Steps with nothing proposed carry no information.
    pub fn update(&mut self, accepted: usize, proposed: usize) {
        if proposed == 0 {
            return;
        }
        let step_rate = accepted.min(proposed) as f64 / proposed as f64;
        self.rate = (1.0 - Self::SMOOTHING) * self.rate + Self::SMOOTHING * step_rate;
        if !self.adaptive {
            return;
        }
        if self.rate > Self::GROW_ABOVE {
            self.current = (self.current + 1).min(self.max);
        } else if self.rate < Self::SHRINK_BELOW {
            self.current = self.current.saturating_sub(1).max(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_length_grows_and_shrinks_within_bounds() {
        let mut length = AdaptiveDraftLength::new(&SpeculativeOptions { max_draft_tokens: 4, adaptive: true });
        assert_eq!(length.current(), 4);
        for _ in 0..10 {
            length.update(0, length.current());
        }
        assert_eq!(length.current(), 1, "all rejected: shrinks to the minimum");
        for _ in 0..10 {
            length.update(length.current(), length.current());
        }
        assert_eq!(length.current(), 4, "all accepted: grows back to the maximum");
        length.update(0, 0);
        assert_eq!(length.current(), 4, "an empty proposal changes nothing");
    }

    #[test]
    fn fixed_length_when_not_adaptive() {
        let mut length = AdaptiveDraftLength::new(&SpeculativeOptions { max_draft_tokens: 3, adaptive: false });
        for _ in 0..10 {
            length.update(0, 3);
        }
        assert_eq!(length.current(), 3);
    }
}
