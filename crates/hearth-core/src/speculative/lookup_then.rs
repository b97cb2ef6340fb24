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
    /// Most tokens per lookup proposal (its match length also caps each).
    pub lookup_max_tokens: usize,
    pub drafter: D,
}

impl<D: Drafter> LookupThen<D> {
    /// The lookup (at most [`SpeculativeOptions::lookup`]'s draft length) before `drafter`. The
    /// lookup proposes only from matches of 2+ tokens here: alone, its one-token guesses pay (a
    /// 2-row pass costs about a plain one), but they are kept ~30% of the time, and each one
    /// would take the step from a draft model that keeps ~95% of its drafts.
    pub fn new(drafter: D) -> Self {
        let lookup = PromptLookup { min_ngram: 2, ..PromptLookup::default() };
        LookupThen { lookup, lookup_max_tokens: SpeculativeOptions::lookup().max_draft_tokens, drafter }
    }
}

impl<D: Drafter> Drafter for LookupThen<D> {
    fn propose(&mut self, context: &[u32], max_tokens: usize, sampling: &SamplingParams) -> Result<Proposal> {
        self.drafter.propose(context, max_tokens, sampling)
    }

    fn propose_async<'a>(&'a mut self, context: &'a [u32], max_tokens: usize, sampling: &'a SamplingParams) -> ProposalFuture<'a> {
        self.drafter.propose_async(context, max_tokens, sampling)
    }

    fn prepare_async<'a>(&'a mut self, context: &'a [u32]) -> PrepareFuture<'a> {
        self.drafter.prepare_async(context)
    }

    fn free_proposal_limit(&self) -> usize {
        self.lookup_max_tokens
    }

    fn propose_free(&mut self, context: &[u32], max_tokens: usize) -> Vec<u32> {
        self.lookup.lookup(context, max_tokens.min(self.lookup_max_tokens))
    }
}
