//! Prompt lookup first, a draft model where nothing matches (`hearth run --lookup --draft-model`).
//!
//! An edit copies long runs of its input, which lookup drafts for free and many tokens at a
//! time; between them (new code, the explanation around it) only a model can guess. Each step
//! the loop verifies the lookup's proposal when one pays (the lookup has its own draft policy)
//! and asks the draft model otherwise; the draft model reads the tokens accepted meanwhile in
//! one pass when it is next asked.

use super::{Drafter, PrepareFuture, PromptLookup, Proposal, ProposalFuture, SpeculativeOptions};
use crate::error::Result;
use crate::sampling::SamplingParams;

pub struct LookupThen<D> {
    pub lookup: PromptLookup,
    /// Most tokens per lookup proposal.
    pub lookup_max_tokens: usize,
    pub drafter: D,
}

impl<D: Drafter> LookupThen<D> {
    /// The default lookup (at most [`SpeculativeOptions::lookup`]'s draft length) before
    /// `drafter`. Its one-token guesses give way to the drafter when it is ready to draft (see
    /// `generate.rs`).
    pub fn new(drafter: D) -> Self {
        LookupThen {
            lookup: PromptLookup::default(),
            lookup_max_tokens: SpeculativeOptions::lookup().max_draft_tokens,
            drafter,
        }
    }
}

impl<D: Drafter> Drafter for LookupThen<D> {
    fn propose(&mut self, context: &[u32], max_tokens: usize, sampling: &SamplingParams) -> Result<Proposal> {
        self.drafter.propose(context, max_tokens, sampling)
    }

    fn propose_async<'a>(
        &'a mut self,
        context: &'a [u32],
        max_tokens: usize,
        sampling: &'a SamplingParams,
    ) -> ProposalFuture<'a> {
        self.drafter.propose_async(context, max_tokens, sampling)
    }

    fn prepare_async<'a>(&'a mut self, context: &'a [u32]) -> PrepareFuture<'a> {
        self.drafter.prepare_async(context)
    }

    fn free_proposal_limit(&self) -> usize {
        self.lookup_max_tokens
    }

    fn propose_free(&mut self, context: &[u32], max_tokens: usize) -> Proposal {
        self.lookup.proposal(context, max_tokens.min(self.lookup_max_tokens))
    }
}
