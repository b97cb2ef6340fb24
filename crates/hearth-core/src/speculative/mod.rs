//! Speculative decoding on any backend: a cheap drafter proposes a few tokens, the target model
//! scores the last accepted token plus all of them in one forward pass (`LogitsMode::All`), the
//! longest valid prefix is kept and the target's KV cache is rolled back past the rest.
//!
//! - [`BatchedDraftModel`]: a draft model drafting for every request of the batching scheduler
//!   in shared passes.
//! - [`Drafter`]: who proposes. [`DraftModel`] (a second, smaller [`Session`](crate::engine::Session)
//!   with the same vocabulary), [`PromptLookup`] (n-gram copy from the prompt and output), or
//!   [`LookupThen`] both: the free lookup where the output copies, the draft model elsewhere.
//! - [`verify`]: who decides. Greedy keeps exactly the target's greedy output; with sampling it
//!   is the rejection sampling of Leviathan et al. 2023 / Chen et al. 2023, so the output follows
//!   the target's (post-filter) distribution whatever the drafter proposes.
//! - [`DraftPolicy`]: how many tokens to draft and verify each step, from the running acceptance
//!   rate and the measured costs of drafting and of verification passes by width (none, where
//!   speculation would be slower than plain decoding).
//! - `Engine::generate_speculative` (in `generate.rs`): the loop, with the streaming, stop-string
//!   and timing behaviour of `Engine::generate`.

mod batched_draft;
mod catch_up;
mod draft_model;
mod generate;
mod lookup_then;
mod memory;
mod policy;
mod prompt_lookup;
pub mod verify;
pub(crate) use generate::verify_readback;

pub use batched_draft::{BatchedDraftModel, DraftRequest, DraftSequence};
pub use draft_model::{
    check_vocab_compatible, default_draft_vocab, DraftModel, DEFAULT_DRAFT_VOCAB, DEFAULT_MIN_CONFIDENCE,
    MAX_VOCAB_SIZE_DIFFERENCE,
};
pub use lookup_then::LookupThen;
pub use memory::PolicyMemory;
pub use policy::{DraftPolicy, PROBE_EVERY};
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
    fn propose_async<'a>(
        &'a mut self,
        context: &'a [u32],
        max_tokens: usize,
        sampling: &'a SamplingParams,
    ) -> ProposalFuture<'a> {
        Box::pin(std::future::ready(self.propose(context, max_tokens, sampling)))
    }

    /// Reads `context` (the prompt) ahead of the first proposal, during the prompt phase: a
    /// draft model evaluates it into its own KV cache here, so that the first decode step does
    /// not pay for it. The default does nothing (prompt lookup keeps no state).
    fn prepare_async<'a>(&'a mut self, context: &'a [u32]) -> PrepareFuture<'a> {
        let _ = context;
        Box::pin(std::future::ready(Ok(())))
    }

    /// The most tokens [`Drafter::propose_free`] may offer per step; 0 (the default): the
    /// drafter has nothing free to offer.
    fn free_proposal_limit(&self) -> usize {
        0
    }

    /// Drafts that cost nothing to make (a [`LookupThen`] drafter's prompt lookup), at most
    /// `max_tokens`, offered every step before [`Drafter::propose`]: the loop verifies them when
    /// that pays and then skips `propose` for the step. Judged apart from the costly proposals
    /// (a draft policy of their own), so that the costly drafter's pauses never stop them.
    fn propose_free(&mut self, context: &[u32], max_tokens: usize) -> Proposal {
        let _ = (context, max_tokens);
        Proposal::default()
    }
}

/// A borrowed drafter drafts as the drafter it borrows (so a [`LookupThen`] can wrap a draft
/// model that its owner keeps).
impl<T: Drafter + ?Sized> Drafter for &mut T {
    fn propose(&mut self, context: &[u32], max_tokens: usize, sampling: &SamplingParams) -> Result<Proposal> {
        (**self).propose(context, max_tokens, sampling)
    }

    fn propose_async<'a>(
        &'a mut self,
        context: &'a [u32],
        max_tokens: usize,
        sampling: &'a SamplingParams,
    ) -> ProposalFuture<'a> {
        (**self).propose_async(context, max_tokens, sampling)
    }

    fn prepare_async<'a>(&'a mut self, context: &'a [u32]) -> PrepareFuture<'a> {
        (**self).prepare_async(context)
    }

    fn free_proposal_limit(&self) -> usize {
        (**self).free_proposal_limit()
    }

    fn propose_free(&mut self, context: &[u32], max_tokens: usize) -> Proposal {
        (**self).propose_free(context, max_tokens)
    }
}

/// The future of [`Drafter::prepare_async`] (boxed, not `Send`, as [`ProposalFuture`]).
pub type PrepareFuture<'a> = Pin<Box<dyn Future<Output = Result<()>> + 'a>>;

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
    /// Of `proposed`, `accepted` and `target_forward_passes`: the free drafts'
    /// ([`Drafter::propose_free`]: the prompt lookup of a [`LookupThen`]; 0 for other drafters).
    pub free_proposed: usize,
    pub free_accepted: usize,
    pub free_passes: usize,
    /// ms the drafter took to read the prompt ([`Drafter::prepare_async`]: a draft model's
    /// prefill; about 0 for prompt lookup). It comes after the first token, so it is part of
    /// the first inter-token gap and of the decode time, not of TTFT.
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
