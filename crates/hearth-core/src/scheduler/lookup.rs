//! Prompt lookup speculation inside the batching scheduler (`hearth serve --lookup`): one
//! request's drafts, copied from its own prompt and output, verified in the pass that decodes it.
//!
//! A request drafts only in a step where it decodes alone (no other request decoding, no prompt
//! chunk). There the pass is the request's own and its cost is what [`DraftPolicy`] weighs the
//! drafts against, as in `Engine::generate_speculative`. With several requests in the step the
//! batch already fills the rows that verification would add, at a cost the policy does not
//! model; each token is still scored against the copies, so the estimates stay current.

use crate::backend::Readback;
use crate::engine::{ms, Instant};
use crate::error::{CoreError, Result};
use crate::runner::StepOutput;
use crate::sampling::{Sampler, Xoshiro256StarStar};
use crate::speculative::verify::{verification_rng, verify_proposal, Distribution, VerificationOutcome};
use crate::speculative::{verify_readback, DraftPolicy, PromptLookup, Proposal, SpeculativeMetrics};

pub(super) struct RequestLookup {
    lookup: PromptLookup,
    policy: DraftPolicy,
    pub metrics: SpeculativeMetrics,
    /// Accepts or rejects drafts when sampling (unused when greedy).
    rng: Xoshiro256StarStar,
    /// The step planned by [`Self::plan`]: the pending token, then the drafts to verify.
    pub batch: Vec<u32>,
    /// The rest of the proposal, left out of the pass (still scored as tokens come).
    unverified: Vec<u32>,
    matched: Option<usize>,
    budget: usize,
    planned: bool,
}

impl RequestLookup {
    pub fn new(policy: DraftPolicy, seed: u64) -> Self {
        RequestLookup {
            lookup: PromptLookup::default(),
            policy,
            metrics: SpeculativeMetrics::default(),
            rng: verification_rng(seed),
            batch: Vec::new(),
            unverified: Vec::new(),
            matched: None,
            budget: 0,
            planned: false,
        }
    }

    /// The policy, to start the next request from what this one learnt.
    pub fn policy(&self) -> &DraftPolicy {
        &self.policy
    }

    /// Proposes this step's drafts for `context` (prompt + output; its last token is the one
    /// pending), at most `room`. Returns whether the policy verifies any: then [`Self::batch`]
    /// holds the step's rows.
    pub fn plan(&mut self, context: &[u32], room: usize) -> bool {
        let Some(&pending) = context.last() else { return false };
        let budget = self.policy.request().min(room);
        let drafting = Instant::now();
        let mut proposal = if budget > 0 { self.lookup.proposal(context, budget) } else { Proposal::default() };
        self.policy.observe_draft(budget, ms(drafting));
        let verify = self.policy.verify_length(proposal.tokens.len(), proposal.matched);
        self.unverified = proposal.tokens.split_off(verify.min(proposal.tokens.len()));
        (self.matched, self.budget, self.planned) = (proposal.matched, budget, true);
        self.batch.clear();
        self.batch.push(pending);
        self.batch.extend_from_slice(&proposal.tokens);
        self.batch.len() > 1
    }

    /// The step goes without the planned drafts (the KV pool had no room for them).
    pub fn drop_drafts(&mut self) {
        let drafts: Vec<u32> = self.batch.drain(1..).chain(self.unverified.drain(..)).collect();
        self.unverified = drafts;
    }

    /// Checks the planned drafts against the step's output rows (`[batch.len(), n_logits]`
    /// logits or the rows' candidates); `context` as given to [`Self::plan`].
    pub fn verify(&mut self, sampler: &mut Sampler, context: &[u32], output: StepOutput<'_>, n_logits: usize) -> Result<VerificationOutcome> {
        let drafts = &self.batch[1..];
        let (mut history, mut row_scratch) = (Vec::new(), Vec::new());
        let missing = || CoreError::InvalidArgument(format!("the backend returned too few rows for {} tokens", drafts.len() + 1));
        let mut target = |i: usize| -> Result<Distribution> {
            history.clear();
            history.extend_from_slice(context);
            history.extend_from_slice(&drafts[..i]);
            match output {
                StepOutput::Logits(logits) => {
                    row_scratch.clear();
                    row_scratch.extend_from_slice(logits.get(i * n_logits..(i + 1) * n_logits).ok_or_else(missing)?);
                    Ok(sampler.distribution(&mut row_scratch, &history))
                }
                StepOutput::TopK(top) if i < top.n_rows() => {
                    let (ids, logits) = top.row(i);
                    Ok(sampler.distribution_candidates(ids, logits, &history))
                }
                StepOutput::TopK(_) => Err(missing()),
            }
        };
        verify_proposal(drafts, None, &mut target, &mut self.rng)
    }

    /// What the verification step reads back (see `Engine::generate_speculative`).
    pub fn readback(&self, sampler: &Sampler, context: &[u32]) -> Readback {
        verify_readback(sampler, context, &self.batch[1..])
    }

    /// The prompt's pass chose the first token.
    pub fn observe_first_token(&mut self, token: u32) {
        self.policy.observe_token(token);
    }

    /// A decode step of this request ended with `outcome`; `pass_ms`: the step's time when it was
    /// planned by [`Self::plan`] (else the request shared the step, and only the tokens count).
    pub fn observe_step(&mut self, outcome: &VerificationOutcome, pass_ms: f64) {
        self.metrics.record(outcome);
        if !std::mem::take(&mut self.planned) {
            self.policy.observe_token(outcome.continuation_token);
            return;
        }
        let verified = &self.batch[1..];
        self.policy.observe_pass(1 + verified.len(), pass_ms);
        self.policy.observe_step(outcome, verified, &self.unverified, self.matched, self.budget);
    }
}
