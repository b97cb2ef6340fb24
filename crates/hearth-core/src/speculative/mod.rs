//! Speculative decoding on any backend: a cheap drafter proposes a few tokens, the target model
//! scores the last accepted token plus all of them in one forward pass (`LogitsMode::All`), the
//! longest valid prefix is kept and the target's KV cache is rolled back past the rest.
//!
//! - Who proposes: [`BatchedDraftModel`] (a second, smaller model with the same vocabulary,
//!   drafting for every request of the batch in shared passes), [`PromptLookup`] (n-gram copy
//!   from the prompt and output), or both: the free lookup where the output copies, the draft
//!   model elsewhere ([`CatchUp`] decides when the draft model drafts again).
//! - [`verify`]: who decides. Greedy keeps exactly the target's greedy output; with sampling it
//!   is the rejection sampling of Leviathan et al. 2023 / Chen et al. 2023, so the output follows
//!   the target's (post-filter) distribution whatever the drafter proposes.
//! - [`DraftPolicy`]: how many tokens to draft and verify each step, from the running acceptance
//!   rate and the measured costs of drafting and of verification passes by width (none, where
//!   speculation would be slower than plain decoding).
//! - The loop is the batching scheduler's (`scheduler/drafts.rs`): a request drafts and verifies
//!   in the steps that decode it, alone (`Engine::generate_with`) or batched.

mod batched_draft;
mod catch_up;
mod draft_model;
mod policy;
mod prompt_lookup;
pub mod verify;
pub(crate) use catch_up::CatchUp;
pub(crate) use verify::verify_readback;

pub use batched_draft::{BatchedDraftModel, DraftRequest, DraftSequence};
pub use draft_model::{
    check_vocab_compatible, default_draft_vocab, DEFAULT_DRAFT_VOCAB, DEFAULT_MIN_CONFIDENCE, MAX_VOCAB_SIZE_DIFFERENCE,
};
pub use policy::{DraftPolicy, PROBE_EVERY};
pub use prompt_lookup::PromptLookup;
pub use verify::{Distribution, VerificationOutcome};

use serde::Serialize;

/// Tokens a drafter guesses will follow the context.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// The draft distribution q each token was drawn from, one per token; `None` when the
    /// drafter is deterministic (q is one-hot on the proposed token).
    pub distributions: Option<Vec<Distribution>>,
    /// How long its passes took, for a drafter that runs passes (a draft model): the draft
    /// policy's cost model. `None`: the policy times the whole proposal per token.
    pub timing: Option<DraftTiming>,
    /// For a copy of earlier context ([`PromptLookup`]): how many of the context's last tokens
    /// matched where the copy comes from. The draft policy then judges each draft by the copied
    /// run it extends and verifies the prefix that pays; `None`: the proposal is judged by its
    /// length, verified whole or not at all.
    pub matched: Option<usize>,
}

/// The passes of one proposal of a draft model.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DraftTiming {
    /// The first pass (it reads the target's new token, or two: a last accepted draft the
    /// drafter never evaluated); `None` when it also read tokens left by plain steps while
    /// drafting was paused: that catch-up is not a cost of drafting at this length, and
    /// counted in, it made drafting look dearer the longer it had been paused.
    pub first_pass_ms: Option<f64>,
    /// Passes after the first, one token each, and their total ms.
    pub later_passes: usize,
    pub later_ms: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SpeculativeOptions {
    /// Upper bound of the draft length (the adaptive length moves within 0..=this).
    pub max_draft_tokens: usize,
    /// Choose each step's draft length with [`DraftPolicy`] (0 where speculation would not pay);
    /// false drafts and verifies up to `max_draft_tokens` every step.
    pub adaptive: bool,
}

/// For a draft model: up to 5 tokens, adapted to the acceptance rate and the measured costs (each
/// draft token costs a draft-model pass).
impl Default for SpeculativeOptions {
    fn default() -> Self {
        SpeculativeOptions { max_draft_tokens: 5, adaptive: true }
    }
}

impl SpeculativeOptions {
    /// For [`PromptLookup`]: drafting is free, so the ceiling is high (a 16-token verification
    /// pass); the policy verifies as much of each proposal as pays on this machine.
    pub fn lookup() -> Self {
        SpeculativeOptions { max_draft_tokens: 15, adaptive: true }
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
    /// Of `proposed`, `accepted` and `target_forward_passes`: the free drafts' (prompt lookup's,
    /// drafting ahead of a draft model; 0 for one drafter).
    pub free_proposed: usize,
    pub free_accepted: usize,
    pub free_passes: usize,
    /// ms the draft model took to read the prompt (0 for prompt lookup). It comes after the
    /// first token, so it is part of the first inter-token gap and of the decode time, not of
    /// TTFT.
    pub drafter_prepare_ms: f64,
}

impl SpeculativeMetrics {
    pub fn record(&mut self, outcome: &VerificationOutcome) {
        self.proposed += outcome.proposed;
        self.accepted += outcome.accepted;
        self.target_forward_passes += 1;
        self.acceptance_rate = ratio(self.accepted, self.proposed);
        self.mean_accepted_per_step = ratio(self.accepted, self.target_forward_passes);
    }

    /// `outcome` (already [`record`](Self::record)ed) verified free drafts.
    pub fn record_free(&mut self, outcome: &VerificationOutcome) {
        self.free_proposed += outcome.proposed;
        self.free_accepted += outcome.accepted;
        self.free_passes += 1;
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}
