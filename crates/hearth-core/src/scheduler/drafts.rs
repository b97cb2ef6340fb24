//! Speculative decoding inside the batching scheduler: each decoding request's drafts, verified
//! in the pass that decodes it. The drafts come from prompt lookup (`--lookup`, or a request with
//! a predicted output: copied from the request's own prompt and output, and its prediction), from
//! a draft model (`--draft-model`: every request's drafts made in shared passes of the draft
//! model, [`BatchedDraftModel`](crate::speculative::BatchedDraftModel)), or from both (`--lookup
//! --draft-model`: lookup's free drafts where the output copies, the draft model elsewhere).
//!
//! Requests draft in steps that only decode (no prompt chunk). A request alone in the step
//! verifies the prefix its [`DraftPolicy`] chooses. With several, [`joint_lengths`] weighs every
//! request's drafts against the whole step's cost: a row that verifies a draft costs the same
//! whichever request it serves, and the pass is shared.

use crate::backend::Readback;
use crate::constraint::GrammarState;
use crate::engine::{ms, Instant};
use crate::error::{CoreError, Result};
use crate::runner::StepOutput;
use crate::sampling::{Sampler, Xoshiro256StarStar};
use crate::speculative::verify::{verification_rng, verify_proposal, Distribution, VerificationOutcome};
use crate::speculative::{
    verify_readback, CatchUp, DraftPolicy, DraftSequence, PromptLookup, Proposal, SpeculativeMetrics,
    SpeculativeOptions,
};

/// Free proposals from matches shorter than this give way to a draft model that is ready to
/// draft: a prompt lookup's guess after a one-token match is kept ~30% of the time, a draft
/// model's drafts ~95%. (With the draft model waiting to repay its catch-up, the guesses keep
/// the steps in between from being plain: a 2-row pass costs about a 1-row one on a CPU.)
const FREE_OVER_COSTLY_MIN_MATCH: usize = 2;

/// Where a request's drafts come from.
pub(super) enum DraftSource {
    /// Copies from its context and `reference`, text the client expects the answer to repeat
    /// (OpenAI's predicted output).
    Lookup { lookup: PromptLookup, reference: Vec<u32> },
    /// Its sequence in the scheduler's draft model.
    Model(Box<DraftSequence>),
}

/// Which drafter: the scheduler keeps what each kind's last request learnt for the next one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DraftKind {
    Lookup,
    Model,
    LookupThenModel,
}

/// Prompt lookup's drafts ahead of a draft model's: they cost nothing to make, so they are judged
/// by a policy of their own (the draft model's pauses never stop them), and the draft model
/// drafts again only once the gain forgone since they stopped pays for reading what they copied
/// ([`CatchUp`]).
pub(super) struct FreeLookup {
    lookup: PromptLookup,
    policy: DraftPolicy,
    catch_up: CatchUp,
    /// Whether the planned step verifies the free drafts (else the draft model's, or none).
    planned_free: bool,
}

impl FreeLookup {
    /// For a request whose prompt has `prompt_len` tokens, with lookup's own `policy`.
    pub fn new(policy: DraftPolicy, prompt_len: usize) -> Self {
        FreeLookup { lookup: PromptLookup::default(), policy, catch_up: CatchUp::new(prompt_len), planned_free: false }
    }
}

/// How a request with free drafts ([`FreeLookup`]) drafts this step.
pub(super) enum FreeStep {
    /// The step is planned: it verifies free drafts, or none while the draft model waits.
    Planned,
    /// The draft model drafts.
    Costly,
}

pub(super) struct RequestDrafts {
    pub source: DraftSource,
    /// Prompt lookup's free drafts ahead of the draft model's (`None`: one drafter).
    pub free: Option<FreeLookup>,
    /// The draft bounds the request asked for (its policy's, which the next request with the
    /// same bounds starts from).
    pub options: SpeculativeOptions,
    policy: DraftPolicy,
    /// Whether the draft model has read the prompt ([`Self::needs_prompt_read`]).
    prompt_read: bool,
    pub metrics: SpeculativeMetrics,
    /// Accepts or rejects drafts when sampling (unused when greedy).
    rng: Xoshiro256StarStar,
    /// The step planned by [`Self::plan`] and [`Self::commit`]: the pending token, then the
    /// drafts to verify.
    pub batch: Vec<u32>,
    /// The whole proposal until [`Self::commit`], then the rest of it, left out of the pass (still
    /// scored as tokens come).
    unverified: Vec<u32>,
    /// The draft distribution of each token of the whole proposal (a sampling draft model's);
    /// `None`: one-hot (prompt lookup, greedy drafts).
    distributions: Option<Vec<Distribution>>,
    matched: Option<usize>,
    budget: usize,
    planned: bool,
}

impl RequestDrafts {
    pub fn new(
        source: DraftSource,
        free: Option<FreeLookup>,
        options: SpeculativeOptions,
        policy: DraftPolicy,
        seed: u64,
    ) -> Self {
        RequestDrafts {
            source,
            free,
            options,
            policy,
            prompt_read: false,
            metrics: SpeculativeMetrics::default(),
            rng: verification_rng(seed),
            batch: Vec::new(),
            unverified: Vec::new(),
            distributions: None,
            matched: None,
            budget: 0,
            planned: false,
        }
    }

    pub fn kind(&self) -> DraftKind {
        match (&self.source, &self.free) {
            (DraftSource::Lookup { .. }, _) => DraftKind::Lookup,
            (DraftSource::Model(_), None) => DraftKind::Model,
            (DraftSource::Model(_), Some(_)) => DraftKind::LookupThenModel,
        }
    }

    /// The policies (the drafter's, and the free drafts' when there are any), to start the next
    /// request from what this one learnt.
    pub fn policies(&self) -> (&DraftPolicy, Option<&DraftPolicy>) {
        (&self.policy, self.free.as_ref().map(|f| &f.policy))
    }

    /// The policy that judges the planned step's drafts.
    fn planned_policy(&self) -> &DraftPolicy {
        match &self.free {
            Some(free) if free.planned_free => &free.policy,
            _ => &self.policy,
        }
    }

    /// Whether its draft model still has to read the prompt before it drafts: it reads it after
    /// the first token (which streams first), before the first decode step, which the policy
    /// then times without it.
    pub fn needs_prompt_read(&self) -> bool {
        matches!(self.source, DraftSource::Model(_)) && !self.prompt_read
    }

    /// The draft model read the prompt in `read_ms`.
    pub fn prompt_was_read(&mut self, read_ms: f64) {
        self.prompt_read = true;
        self.metrics.drafter_prepare_ms += read_ms;
    }

    /// With free drafts: prompt lookup's proposal for `context` verified when it pays (at most
    /// `room`, beside `other_rows` rows of other requests), else the draft model's turn if it is
    /// ready to draft, else a plain step. `None`: no free drafts.
    pub fn plan_free(&mut self, context: &[u32], room: usize, other_rows: usize) -> Option<FreeStep> {
        let free = self.free.as_mut()?;
        // (A fixed draft length keeps the fixed wait: nothing there is judged by its cost.)
        let gain_ms = if self.options.adaptive { self.policy.drafting_gain_ms() } else { f64::INFINITY };
        let costly_ready = free.catch_up.costly_ready(context.len(), gain_ms);
        let budget = free.policy.request_beside(other_rows).min(room);
        let drafting = Instant::now();
        let mut proposal = if budget > 0 { free.lookup.proposal(context, budget) } else { Proposal::default() };
        free.policy.observe_draft(budget, ms(drafting));
        proposal.tokens.truncate(budget);
        let (length, matched) = (proposal.tokens.len(), proposal.matched);
        // A guess from a one-token match gives way to a draft model ready to draft.
        let yields = costly_ready && matched.unwrap_or(0) < FREE_OVER_COSTLY_MIN_MATCH;
        let from_free = free.policy.verify_length(length, matched) > 0 && !yields;
        if !from_free {
            free.policy.track_unverified(length, matched, 0, &proposal.tokens);
        }
        free.catch_up.start_step(from_free, context.len());
        free.planned_free = from_free;
        if from_free {
            self.set_plan(context, proposal, budget);
        } else if costly_ready {
            return Some(FreeStep::Costly);
        } else {
            self.set_plan(context, Proposal::default(), 0);
        }
        Some(FreeStep::Planned)
    }

    /// How many drafts to ask for this step, at most `room` (the policy's choice for a pass
    /// that also carries `other_rows` rows of other requests; 0: none).
    pub fn budget(&mut self, room: usize, other_rows: usize) -> usize {
        self.policy.request_beside(other_rows).min(room)
    }

    /// Prompt lookup's proposal of at most `budget` drafts for `context`, and the ms it took
    /// (nothing for a draft model: [`BatchedDraftModel`](crate::speculative::BatchedDraftModel)
    /// proposes for every request at once).
    pub fn lookup_proposal(&mut self, context: &[u32], budget: usize) -> Option<(Proposal, f64)> {
        let DraftSource::Lookup { lookup, reference } = &mut self.source else { return None };
        let drafting = Instant::now();
        let proposal = if budget > 0 { lookup.proposal_with(context, reference, budget) } else { Proposal::default() };
        Some((proposal, ms(drafting)))
    }

    /// This step's proposal for `context` (prompt + output; its last token is the one pending),
    /// asked with `budget` and made in `drafting_ms`; [`Self::commit`] then says how many the
    /// pass verifies.
    pub fn plan(&mut self, context: &[u32], proposal: Proposal, budget: usize, drafting_ms: f64) {
        match &proposal.timing {
            Some(timing) => {
                self.policy.observe_draft_timing(timing);
                if let Some(free) = self.free.as_mut() {
                    // The first pass read what the free drafts copied since the model last drafted.
                    free.catch_up.observe_catch_up(context.len(), drafting_ms - timing.later_ms);
                }
            }
            None => self.policy.observe_draft(budget, drafting_ms),
        }
        self.set_plan(context, proposal, budget);
    }

    fn set_plan(&mut self, context: &[u32], proposal: Proposal, budget: usize) {
        let Some(&pending) = context.last() else { return };
        (self.unverified, self.distributions, self.matched, self.budget, self.planned) =
            (proposal.tokens, proposal.distributions, proposal.matched, budget, true);
        self.batch.clear();
        self.batch.push(pending);
    }

    /// How many of the proposal a pass of this request alone verifies (the policy's choice).
    pub fn solo_length(&self) -> usize {
        self.planned_policy().verify_length(self.unverified.len(), self.matched)
    }

    /// The proposal as [`joint_lengths`] weighs it in a step of `plain_width` rows without
    /// drafts: the length the policy forces, if any, and each draft's estimated reach.
    pub fn weighed(&self, plain_width: usize) -> (Option<usize>, Vec<f64>) {
        let available = self.unverified.len();
        let policy = self.planned_policy();
        (policy.forced_length(available, plain_width), policy.draft_reach(available, self.matched))
    }

    /// The estimated ms of a pass of `width` rows, as this request's policy measured them.
    pub fn pass_ms(&self, width: usize) -> f64 {
        self.planned_policy().pass_ms(width)
    }

    /// The pass verifies the first `verify` drafts of the proposal: [`Self::batch`] holds the
    /// request's rows (the pending token, then those drafts). Returns whether there are drafts.
    /// Keeps the planned proposal's first `valid` tokens (structured output: the prefix its
    /// grammar allows, [`GrammarState::valid_prefix`]).
    pub fn keep_proposal(&mut self, valid: usize) {
        self.unverified.truncate(valid);
        if let Some(distributions) = self.distributions.as_mut() {
            distributions.truncate(valid);
        }
    }

    /// The planned proposal (before [`Self::commit`]).
    pub fn proposal(&self) -> &[u32] {
        &self.unverified
    }

    pub fn commit(&mut self, verify: usize) -> bool {
        let rest = self.unverified.split_off(verify.min(self.unverified.len()));
        self.batch.append(&mut self.unverified);
        self.unverified = rest;
        self.batch.len() > 1
    }

    /// The request left the batch (preempted) before its planned step ran.
    pub fn cancel_plan(&mut self) {
        self.drop_drafts();
        self.planned = false;
    }

    /// The step goes without the planned drafts (the KV pool had no room for them).
    pub fn drop_drafts(&mut self) {
        if self.batch.len() > 1 {
            let drafts: Vec<u32> = self.batch.drain(1..).chain(self.unverified.drain(..)).collect();
            self.unverified = drafts;
        }
    }

    /// Checks the planned drafts against the step's output rows from `first_row` on
    /// ([`verify_rows`]); `context` as given to [`Self::plan`].
    pub fn verify(
        &mut self,
        sampler: &mut Sampler,
        context: &[u32],
        rows: EntryRows<'_>,
        grammar: Option<&mut GrammarState>,
    ) -> Result<VerificationOutcome> {
        let drafts = &self.batch[1..];
        let distributions = self.distributions.as_deref().map(|d| &d[..drafts.len().min(d.len())]);
        verify_rows(drafts, distributions, sampler, context, rows, grammar, &mut self.rng)
    }

    /// What the verification step reads back: candidates where the sampler allows them.
    pub fn readback(&self, sampler: &Sampler, context: &[u32]) -> Readback {
        verify_readback(sampler, context, &self.batch[1..])
    }

    /// Tokens kept without its drafts: the first (the prompt's pass chose it), or those of a
    /// step that verified its grammar's forced tokens instead.
    pub fn observe_tokens(&mut self, tokens: &[u32]) {
        for &token in tokens {
            self.policy.observe_token(token);
            if let Some(free) = self.free.as_mut() {
                free.policy.observe_token(token);
            }
        }
    }

    /// A decode step of this request ended with `outcome`; the step had `step_rows` rows over
    /// all requests and took `step_ms`, which the policy learns from when it planned the step
    /// ([`Self::plan`]; else the request shared a step with prompt chunks, and only the
    /// tokens count).
    pub fn observe_step(&mut self, outcome: &VerificationOutcome, step_rows: usize, step_ms: f64) {
        self.metrics.record(outcome);
        let planned = std::mem::take(&mut self.planned);
        let drafts = &self.batch[1.min(self.batch.len())..];
        // The step's tokens, which the policy that did not judge it scores its model by.
        let step_tokens =
            drafts[..outcome.accepted.min(drafts.len())].iter().copied().chain([outcome.continuation_token]);
        let Some(free) = self.free.as_mut() else {
            if planned {
                self.policy.observe_pass(step_rows, step_ms);
                self.policy.observe_step(outcome, drafts, &self.unverified, self.matched, self.budget);
            } else {
                self.policy.observe_token(outcome.continuation_token);
            }
            return;
        };
        if !planned {
            self.policy.observe_token(outcome.continuation_token);
            free.policy.observe_token(outcome.continuation_token);
            return;
        }
        self.policy.observe_pass(step_rows, step_ms);
        free.policy.observe_pass(step_rows, step_ms);
        if std::mem::take(&mut free.planned_free) {
            self.metrics.record_free(outcome);
            free.policy.observe_step(outcome, drafts, &self.unverified, self.matched, self.budget);
            step_tokens.for_each(|t| self.policy.observe_token(t));
        } else {
            free.catch_up.observe_accepted(outcome.accepted);
            self.policy.observe_step(outcome, drafts, &self.unverified, self.matched, self.budget);
            step_tokens.for_each(|t| free.policy.observe_token(t));
        }
    }

    /// Whether [`Self::plan`] planned this step for the request.
    pub fn planned(&self) -> bool {
        self.planned
    }
}

/// Where one request's rows are in a step's output: the output (logits `[rows, n_logits]` or each
/// row's candidates), `n_logits`, and the request's first row.
#[derive(Clone, Copy)]
pub(super) struct EntryRows<'a> {
    pub output: StepOutput<'a>,
    pub n_logits: usize,
    pub first_row: usize,
}

impl<'a> EntryRows<'a> {
    /// Row `i` of the request's whole logits (`None`: candidates only, or too few rows).
    pub fn logits(&self, i: usize) -> Option<&'a [f32]> {
        let row = self.first_row + i;
        match self.output {
            StepOutput::Logits(logits) => logits.get(row * self.n_logits..(row + 1) * self.n_logits),
            StepOutput::TopK(_) => None,
        }
    }
}

/// Checks `drafts` (after `context`, whose last token is the pending one) against the request's
/// rows: row i is the target's distribution after `context` + `drafts[..i]`, drawn from with
/// `rng` where it is not greedy ([`verify_proposal`]). A constrained request's `grammar` masks
/// each row after the drafts before it (its drafts are a prefix the grammar allows; the whole
/// rows are read back), and is rolled back after.
pub(super) fn verify_rows(
    drafts: &[u32],
    distributions: Option<&[Distribution]>,
    sampler: &mut Sampler,
    context: &[u32],
    rows: EntryRows<'_>,
    mut grammar: Option<&mut GrammarState>,
    rng: &mut Xoshiro256StarStar,
) -> Result<VerificationOutcome> {
    let (mut history, mut row_scratch) = (Vec::new(), Vec::new());
    let missing =
        || CoreError::InvalidArgument(format!("the backend returned too few rows for {} tokens", drafts.len() + 1));
    let mut target = |i: usize| -> Result<Distribution> {
        history.clear();
        history.extend_from_slice(context);
        history.extend_from_slice(&drafts[..i]);
        let row = rows.first_row + i;
        match rows.output {
            StepOutput::Logits(_) => {
                row_scratch.clear();
                row_scratch.extend_from_slice(rows.logits(i).ok_or_else(missing)?);
                if let Some(grammar) = grammar.as_deref_mut() {
                    grammar.mask_logits_after(&drafts[..i], &mut row_scratch)?;
                }
                Ok(sampler.distribution(&mut row_scratch, &history))
            }
            StepOutput::TopK(top) if row < top.n_rows() => {
                let (ids, logits) = top.row(row);
                Ok(sampler.distribution_candidates(ids, logits, &history))
            }
            StepOutput::TopK(_) => Err(missing()),
        }
    };
    let outcome = verify_proposal(drafts, distributions, &mut target, rng);
    if let Some(grammar) = grammar {
        grammar.end_speculation()?;
    }
    outcome
}

/// How many drafts each of several requests verifies in one decode step: each request's best
/// prefix given the others' (two rounds of coordinate ascent from none), for the most expected
/// tokens per ms of the whole step. `weighed[r]`: request r's forced length, if any, and each
/// draft's reach ([`RequestDrafts::weighed`]); `other_rows`: the step's rows that verify nothing
/// (a token each); `pass_ms(rows)`: the step's cost. Ties go to fewer drafts.
pub(super) fn joint_lengths(
    weighed: &[(Option<usize>, Vec<f64>)],
    other_rows: usize,
    pass_ms: impl Fn(usize) -> f64,
) -> Vec<usize> {
    let mut lengths: Vec<usize> = weighed.iter().map(|(forced, _)| forced.unwrap_or(0)).collect();
    let expected = |r: usize, k: usize| 1.0 + weighed[r].1[..k].iter().sum::<f64>();
    for _ in 0..2 {
        for r in 0..weighed.len() {
            if weighed[r].0.is_some() {
                continue;
            }
            let others = |lengths: &[usize]| {
                let rows: usize = (0..weighed.len()).filter(|&o| o != r).map(|o| 1 + lengths[o]).sum();
                let tokens: f64 = (0..weighed.len()).filter(|&o| o != r).map(|o| expected(o, lengths[o])).sum();
                (other_rows + rows, other_rows as f64 + tokens)
            };
            let (rows, tokens) = others(&lengths);
            let rate = |k: usize| (tokens + expected(r, k)) / pass_ms(rows + 1 + k).max(1e-9);
            let mut best = 0;
            for k in 1..=weighed[r].1.len() {
                if rate(k) > rate(best) * (1.0 + 1e-9) {
                    best = k;
                }
            }
            lengths[r] = best;
        }
    }
    lengths
}

#[cfg(test)]
mod tests {
    use super::joint_lengths;

    /// A copy whose drafts are each kept with probability `p` given the last.
    fn copy(p: f64, len: usize) -> (Option<usize>, Vec<f64>) {
        (None, (1..=len as i32).map(|k| p.powi(k)).collect())
    }

    #[test]
    fn on_a_gpu_every_request_verifies_its_copy() {
        let gpu = |rows: usize| 6.0 + 0.05 * rows as f64;
        let lengths = joint_lengths(&[copy(0.9, 8), copy(0.8, 8), copy(0.7, 4)], 2, gpu);
        assert_eq!(lengths, vec![8, 8, 4]);
        // Not a draft whose expected share of a token is below its share of the step's cost.
        let lengths = joint_lengths(&[copy(0.9, 8), copy(0.8, 8), copy(0.5, 4)], 2, gpu);
        assert_eq!(lengths, vec![8, 8, 3]);
    }

    #[test]
    fn on_a_cpu_rows_go_to_the_likeliest_drafts() {
        // 2 cores: rows up to 2 cost little more than one, then ~7 ms each.
        let cpu = |rows: usize| if rows <= 2 { 24.8 } else { 24.8 + 7.0 * (rows - 2) as f64 };
        let lengths = joint_lengths(&[copy(0.95, 8), copy(0.2, 8)], 0, cpu);
        assert!(lengths[0] >= 1 && lengths[1] == 0, "{lengths:?}");
        // Many other rows in the step already: a draft kept 60% of the time does not pay a row.
        let lengths = joint_lengths(&[copy(0.6, 8)], 6, cpu);
        assert_eq!(lengths, vec![0]);
    }

    #[test]
    fn a_forced_length_stands() {
        let cpu = |rows: usize| 20.0 + 7.0 * rows as f64;
        assert_eq!(joint_lengths(&[(Some(5), vec![0.1; 5]), copy(0.1, 3)], 0, cpu), vec![5, 0]);
    }
}
