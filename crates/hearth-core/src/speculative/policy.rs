//! How many tokens to draft and verify per step: the number that maximises the expected tokens
//! per millisecond, from running estimates of what drafts are worth (how often they are kept) and
//! of what drafting and verifying cost on this machine (measured online, per verification width).
//!
//! Speculation only pays where a pass of `1 + k` rows costs little more than a pass of one: on a
//! GPU, nearly always; on a CPU with a few cores, only when most drafts are kept (on 2 cores a
//! 4-row pass of Qwen2.5-1.5B costs 2.2 single passes). A fixed rule is wrong on one of them, so
//! the policy measures both sides and falls back to plain decoding (k = 0) whenever speculation
//! would be slower, so turning it on never costs more than the probes that keep the estimates
//! fresh.
//!
//! Model: draft token i (1-based) of a proposal is kept with probability p^i (each is kept given
//! the previous one was, with probability p), so verifying k drafts yields on average
//! `E(k) = 1 + p + p² + … + p^k` tokens (the `1` is the target's own token), and costs
//! `draft(k) + pass(1 + k)` ms. p is estimated per proposal length (a drafter's length says how
//! sure it is: a draft model stops when unsure), pulled towards the overall rate where a length
//! has few observations.
//!
//! A copy of earlier context (prompt lookup) is judged per draft instead: draft i of a copy whose
//! source matched the last m context tokens extends a copied run of m + i - 1 tokens, and the
//! longer the run the likelier the copy goes on (a one-token match is a guess, the middle of a
//! copied function body nearly certain). p is estimated per run length, so the policy verifies
//! the prefix of the whole available continuation that pays best, wherever the copy is likely
//! to break.

/// Proposal lengths with an acceptance estimate of their own; longer ones share the last.
const LENGTH_CLASSES: usize = 16;
/// Copied-run lengths with an acceptance estimate of their own; longer runs share the last.
const RUN_CLASSES: usize = 32;
/// Weight of the newest observation of a copied-run length: every draft position of every copy
/// is one, many per step, so a longer memory than [`NEW_WEIGHT`]'s.
const RUN_NEW_WEIGHT: f64 = 0.1;
/// Copies scored at once at most (one is added per step; the oldest goes first).
const MAX_TRACKED_COPIES: usize = 32;
/// Verification widths whose cost is tracked (wider passes count as the widest).
const TRACKED_WIDTHS: usize = 65;
/// Weight of the newest observation in the running estimates.
const NEW_WEIGHT: f64 = 0.25;
/// Weight of the newest observation in the per-request acceptance, which decides whether an
/// expensive drafter drafts at all: a longer memory than [`NEW_WEIGHT`], because a drafter
/// paused by a few unlucky rejections learns nothing until the next probe.
const REQUEST_NEW_WEIGHT: f64 = 0.1;
/// Pseudo-observations that pull a proposal length's acceptance towards the overall rate.
const PRIOR_STRENGTH: f64 = 2.0;
/// Plain steps after which a drafter that costs time is tried again, at the soonest, so that a
/// change in acceptance (the output started copying the prompt) is noticed; expensive probes
/// wait longer (see [`PROBE_SHARE`]).
pub const PROBE_EVERY: usize = 16;
/// The share of decoding time that probes of an expensive drafter may take.
const PROBE_SHARE: f64 = 0.1;
/// A drafter counts as free when a full proposal costs less than this share of a single pass:
/// it is then asked every step, and its unverified proposals are scored against the output.
const FREE_DRAFT_SHARE: f64 = 0.02;

/// How much faster than plain decoding the expected rate of drafting with a drafter that costs
/// time must be before the policy drafts: the estimates carry noise (a shared machine's pass
/// times move ±10%), and near break-even a wrong "draft" costs more than a wrong "plain" (pauses
/// then resumes make a draft model re-read the skipped tokens).
const MIN_GAIN_TO_DRAFT: f64 = 1.05;

/// A drafter that costs time is judged by its running acceptance only once this many of its
/// requested positions have been (kept, rejected or stopped short of); before that it drafts
/// as if [`EXPLORATION_ACCEPTANCE`] were its rate when its estimate says pause, so that one
/// rejected first draft does not pause a drafter that would keep most of the rest.
const MIN_JUDGED_POSITIONS: usize = 4;
/// The acceptance a costly drafter is credited with until [`MIN_JUDGED_POSITIONS`]: the rule of
/// succession's prior for a drafter sure of one token, (1 + 1) / (1 + 2).
const EXPLORATION_ACCEPTANCE: f64 = 2.0 / 3.0;

/// Running estimate of a number: exponentially forgetting, `None` before the first observation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Running(Option<f64>);

impl Running {
    fn observe(&mut self, value: f64) {
        if value.is_finite() && value >= 0.0 {
            self.0 = Some(self.0.map_or(value, |old| old * (1.0 - NEW_WEIGHT) + value * NEW_WEIGHT));
        }
    }
}

/// Exponentially forgetting counts of kept and rejected draft tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Counts {
    kept: f64,
    rejected: f64,
}

impl Counts {
    fn add(&mut self, kept: f64, rejected: f64) {
        self.add_weighted(kept, rejected, NEW_WEIGHT);
    }

    fn add_weighted(&mut self, kept: f64, rejected: f64, new_weight: f64) {
        let keep = 1.0 - new_weight;
        self.kept = self.kept * keep + kept;
        self.rejected = self.rejected * keep + rejected;
    }

    fn total(&self) -> f64 {
        self.kept + self.rejected
    }
}

/// Running cost of a verification pass by its width (rows).
#[derive(Clone, Debug)]
struct PassCosts {
    by_width: Vec<Option<f64>>,
}

impl PassCosts {
    fn new() -> Self {
        PassCosts { by_width: vec![None; TRACKED_WIDTHS] }
    }

    fn observe(&mut self, width: usize, ms: f64) {
        if !ms.is_finite() || ms < 0.0 {
            return;
        }
        if let Some(slot) = self.by_width.get_mut(width.min(TRACKED_WIDTHS - 1)) {
            *slot = Some(slot.map_or(ms, |old| old * (1.0 - NEW_WEIGHT) + ms * NEW_WEIGHT));
        }
    }

    fn measured(&self, width: usize) -> Option<f64> {
        self.by_width.get(width).copied().flatten()
    }

    /// The estimated cost of a pass of `width` rows: measured, or interpolated linearly between
    /// the nearest measured widths (a CPU's cost is not linear over all widths: its mat-muls
    /// work in groups of rows), or extrapolated with the mean slope from the narrowest measured
    /// width to the widest. With nothing measured on one side the nearest measured cost stands
    /// in. Both err on the cheap side, so that wider passes get tried and measured: the slope
    /// between the two widest measured widths alone can be the jump at a group's boundary (on a
    /// CPU, far steeper than the mean slope), and would keep wider passes from being tried.
    fn estimate(&self, width: usize) -> f64 {
        let width = width.min(TRACKED_WIDTHS - 1);
        if let Some(ms) = self.measured(width) {
            return ms;
        }
        let below = (1..width).rev().find_map(|w| self.measured(w).map(|ms| (w, ms)));
        let above = (width + 1..TRACKED_WIDTHS).find_map(|w| self.measured(w).map(|ms| (w, ms)));
        let line = |(w0, c0): (usize, f64), (w1, c1): (usize, f64)| {
            c0 + (c1 - c0) * (width as f64 - w0 as f64) / (w1 as f64 - w0 as f64)
        };
        match (below, above) {
            (Some(b), Some(a)) => line(b, a),
            (Some(b), None) => {
                // The mean slope from the narrowest measured width, never negative.
                let narrowest = (1..b.0).find_map(|w| self.measured(w).map(|ms| (w, ms)));
                narrowest.map_or(b.1, |n| line(n, b).max(b.1))
            }
            (None, Some(a)) => a.1,
            (None, None) => 1.0,
        }
    }
}

/// Chooses the draft length of each speculative step (see the module documentation).
#[derive(Clone, Debug)]
pub struct DraftPolicy {
    max: usize,
    adaptive: bool,
    overall: Counts,
    /// As `overall`, per requested position: a drafter that stopped short of the request (a
    /// draft model unsure of the next token) missed there, like a rejected draft.
    requested: Counts,
    by_length: [Counts; LENGTH_CLASSES],
    /// Per copied-run length, the drafts of copies that extended a run that long.
    by_run: [Counts; RUN_CLASSES],
    pass: PassCosts,
    /// Running ms of drafting per requested token (drafters that report no [`DraftTiming`]).
    draft_ms_per_token: Running,
    /// A draft model's cost per proposal: its first pass (which also reads the target's new
    /// token) and each further pass, one per further draft token.
    draft_first_pass_ms: Running,
    draft_next_pass_ms: Running,
    steps: usize,
    plain_steps: usize,
    probing: bool,
    /// Requested positions judged so far (see [`MIN_JUDGED_POSITIONS`]).
    judged: usize,
    /// The unverified rest of the last proposal judged by its length (its length class, the
    /// drafts not yet compared, last first), scored against the target's tokens while steps
    /// are plain.
    unverified: Option<(usize, Vec<u32>)>,
    /// Copies being scored against the target's tokens as they come, every draft of each,
    /// verified or not (the run length of its next draft, the drafts not yet compared, last
    /// first): drafting them was free, and what the copies that overlap say is how the policy
    /// learns how far copies go on.
    copies: Vec<(usize, Vec<u32>)>,
}

impl DraftPolicy {
    pub fn new(options: &super::SpeculativeOptions) -> Self {
        DraftPolicy {
            max: options.max_draft_tokens.max(1),
            adaptive: options.adaptive,
            overall: Counts::default(),
            requested: Counts::default(),
            by_length: [Counts::default(); LENGTH_CLASSES],
            by_run: [Counts::default(); RUN_CLASSES],
            pass: PassCosts::new(),
            draft_ms_per_token: Running::default(),
            draft_first_pass_ms: Running::default(),
            draft_next_pass_ms: Running::default(),
            steps: 0,
            plain_steps: 0,
            probing: false,
            judged: 0,
            unverified: None,
            copies: Vec::new(),
        }
    }

    /// This policy for the next request of the same engine (the scheduler of `hearth serve`):
    /// what it measured and learnt carries over (pass costs, drafting costs, acceptance per
    /// proposal length and per copied run), so the next request neither re-measures the costs
    /// nor starts from the priors; the drafts it was still scoring, which belong to this
    /// request's text, are dropped.
    pub fn for_next_request(&self) -> Self {
        DraftPolicy { probing: false, plain_steps: 0, unverified: None, copies: Vec::new(), ..self.clone() }
    }

    /// The overall acceptance estimate: the share of draft tokens kept given the previous one
    /// was. Starts at 2/3 (one rejection and two kept pseudo-observations): optimistic enough to
    /// try drafting, weak enough to be overruled by the first few steps.
    pub fn acceptance(&self) -> f64 {
        (self.overall.kept + 2.0) / (self.overall.total() + 3.0)
    }

    /// [`Self::acceptance`] per requested position (stops count as misses): what a request of k
    /// tokens yields, which decides how many to request. A draft model stops where it is
    /// unsure, so its proposals are kept often but are short: judged by `acceptance`, drafting
    /// would look worth it where it is slower than plain decoding.
    fn acceptance_per_request(&self) -> f64 {
        (self.requested.kept + 2.0) / (self.requested.total() + 3.0)
    }

    /// The acceptance estimate for drafts of a proposal of `length` tokens: that length's own
    /// record, pulled towards (L + 1) / (L + 2) where it has few observations: Laplace's rule of
    /// succession for a drafter that was sure of L tokens in a row (a draft model stops where it
    /// is unsure).
    fn acceptance_for(&self, length: usize) -> f64 {
        let c = self.by_length[length.clamp(1, LENGTH_CLASSES) - 1];
        let prior = (length as f64 + 1.0) / (length as f64 + 2.0);
        (c.kept + PRIOR_STRENGTH * prior) / (c.total() + PRIOR_STRENGTH)
    }

    /// The acceptance estimates for drafts that extend copied runs of 1, 2, … tokens (index:
    /// run - 1; longer runs share the last): each run length's record, pulled where it has few
    /// observations towards a prior that says a copy that has run longer is at least as likely
    /// to go on: the estimate for one run shorter, or run / (run + 2) when that is higher (the
    /// rule of succession after `run` copied tokens with one miss counted). A one-token match
    /// starts at 1/3: kept about a third of the time in code, rarely in prose.
    fn run_acceptances(&self) -> [f64; RUN_CLASSES] {
        let mut estimates = [0.0; RUN_CLASSES];
        let mut shorter: f64 = 1.0 / 3.0;
        for (i, c) in self.by_run.iter().enumerate() {
            let run = (i + 1) as f64;
            let prior = if i == 0 { shorter } else { shorter.max(run / (run + 2.0)) };
            estimates[i] = (c.kept + PRIOR_STRENGTH * prior) / (c.total() + PRIOR_STRENGTH);
            shorter = estimates[i];
        }
        estimates
    }

    /// Expected tokens from verifying k drafts kept with probability p each (given the
    /// previous): 1 + p + … + p^k.
    fn expected_tokens(p: f64, k: usize) -> f64 {
        let (mut sum, mut term) = (1.0, 1.0);
        for _ in 0..k {
            term *= p;
            sum += term;
        }
        sum
    }

    /// The expected ms of drafting k tokens: the first pass plus k - 1 further ones where the
    /// drafter reports its passes (a proposal's first pass costs more: it reads one or two
    /// context tokens, and a short proposal pays it all the same), else k times the running
    /// cost per token.
    fn draft_ms(&self, k: usize) -> f64 {
        if k == 0 {
            return 0.0;
        }
        match (self.draft_first_pass_ms.0, self.draft_next_pass_ms.0) {
            (Some(first), next) => first + next.unwrap_or(first) * (k - 1) as f64,
            (None, Some(next)) => next * k as f64,
            (None, None) => self.draft_ms_per_token.0.unwrap_or(0.0) * k as f64,
        }
    }

    fn draft_cost_known(&self) -> bool {
        self.draft_ms_per_token.0.is_some()
            || self.draft_first_pass_ms.0.is_some()
            || self.draft_next_pass_ms.0.is_some()
    }

    /// Whether drafting is known to cost next to nothing (prompt lookup), so that the drafter
    /// is asked every step and its unverified proposals still teach the acceptance estimate.
    pub fn drafting_is_free(&self) -> bool {
        self.draft_cost_known() && self.draft_ms(self.max) < FREE_DRAFT_SHARE * self.pass.estimate(1)
    }

    /// The k in `0..=limit` with the most expected tokens per ms, drafts kept with probability
    /// p and `draft_ms(k)` spent proposing them (ties go to the shorter draft); drafting must
    /// beat plain decoding by `min_gain`. `other_rows`: rows of other requests in the same pass
    /// (a token each), whose tokens the pass yields too and whose time the drafts add to.
    fn best_length(
        &self,
        p: f64,
        limit: usize,
        min_gain: f64,
        other_rows: usize,
        draft_ms: impl Fn(usize) -> f64,
    ) -> usize {
        let rate = |k: usize| {
            (other_rows as f64 + Self::expected_tokens(p, k))
                / (draft_ms(k) + self.pass.estimate(other_rows + 1 + k)).max(1e-9)
        };
        let mut best = 0;
        for k in 1..=limit {
            let needed = if best == 0 { min_gain } else { 1.0 + 1e-9 };
            if rate(k) > rate(best) * needed {
                best = k;
            }
        }
        best
    }

    /// How many tokens to ask the drafter for this step (0: a plain step without drafting).
    pub fn request(&mut self) -> usize {
        self.request_beside(0)
    }

    /// [`Self::request`] for a step that also carries `other_rows` rows of other requests (the
    /// batching scheduler): drafting then pays only if the whole pass yields more tokens per ms
    /// with the drafts than without (on a few CPU cores every row costs, and a draft model that
    /// pays alone can slow a batch down).
    pub fn request_beside(&mut self, other_rows: usize) -> usize {
        self.steps += 1;
        self.probing = false;
        if !self.adaptive || self.steps == 1 {
            // The first step drafts in full, so that the costs and the acceptance get measured.
            return self.max;
        }
        let free = self.drafting_is_free();
        if self.pass.measured(other_rows + 1).is_none() {
            // The second step measures a plain pass: every other cost is judged against it.
            // A free drafter still proposes, to be scored against the target's token.
            return if free { self.max } else { 0 };
        }
        let min_gain = if free { 1.0 + 1e-9 } else { MIN_GAIN_TO_DRAFT };
        let p = self.acceptance_per_request();
        let mut best = self.best_length(p, self.max, min_gain, other_rows, |k| self.draft_ms(k));
        if best == 0 && !free && self.judged < MIN_JUDGED_POSITIONS {
            let p = p.max(EXPLORATION_ACCEPTANCE);
            best = self.best_length(p, self.max, min_gain, other_rows, |k| self.draft_ms(k));
        }
        if best > 0 || free {
            self.plain_steps = 0;
            return if free { self.max } else { best };
        }
        self.plain_steps += 1;
        if self.plain_steps >= self.probe_interval() {
            self.plain_steps = 0;
            self.probing = true;
            return self.max;
        }
        0
    }

    /// The ms a drafting step is expected to save over plain decoding of the same tokens, at the
    /// best draft length for the running estimates (0 when drafting does not pay).
    pub fn drafting_gain_ms(&self) -> f64 {
        let p = self.acceptance_per_request();
        let k = self.best_length(p, self.max, 1.0 + 1e-9, 0, |k| self.draft_ms(k));
        if k == 0 {
            return 0.0;
        }
        let plain = Self::expected_tokens(p, k) * self.pass.estimate(1);
        (plain - self.draft_ms(k) - self.pass.estimate(1 + k)).max(0.0)
    }

    /// Plain steps between probes of a drafter that costs time: at least [`PROBE_EVERY`], and
    /// enough that a probe (drafting in full, then a full-width pass instead of a plain one)
    /// costs at most [`PROBE_SHARE`] of the time in between.
    fn probe_interval(&self) -> usize {
        let plain = self.pass.estimate(1).max(1e-9);
        let probe_cost = self.draft_ms(self.max) + (self.pass.estimate(1 + self.max) - plain).max(0.0);
        let interval = (probe_cost / (PROBE_SHARE * plain)).ceil();
        if interval.is_finite() {
            (interval as usize).clamp(PROBE_EVERY, 1 << 20)
        } else {
            PROBE_EVERY
        }
    }

    /// Of a proposal of `available` tokens, how many to verify: drafting is paid for by now, so
    /// only the pass costs and the acceptance count. `matched`: for a copy (prompt lookup), the
    /// context tokens its source matched; the best prefix is verified, each draft judged by the
    /// copied run it extends. Other proposals are verified all or none.
    pub fn verify_length(&self, available: usize, matched: Option<usize>) -> usize {
        if let Some(forced) = self.forced_length(available, 1) {
            return forced;
        }
        let plain = 1.0 / self.pass.estimate(1).max(1e-9);
        let rate = |tokens: f64, k: usize| tokens / self.pass.estimate(1 + k).max(1e-9);
        let Some(matched) = matched else {
            // All or nothing: the drafter sized the proposal from its own confidence (a draft
            // model's stop), which says more about this proposal than the running estimates;
            // they decide whether verifying it pays at all.
            let p = self.acceptance_for(available);
            return if rate(Self::expected_tokens(p, available), available) > plain * (1.0 + 1e-9) {
                available
            } else {
                0
            };
        };
        // The prefix with the most expected tokens per ms (ties to the shorter): draft i is kept,
        // given the ones before it were, with the acceptance for a run of matched + i - 1.
        let (mut best, mut best_rate) = (0, plain);
        let mut expected = 1.0;
        for (k, reach) in (1..).zip(self.draft_reach(available, Some(matched))) {
            expected += reach;
            if rate(expected, k) > best_rate * (1.0 + 1e-9) {
                (best, best_rate) = (k, rate(expected, k));
            }
        }
        best
    }

    /// The verified length when the costs do not decide it: the whole proposal with a fixed
    /// length, while probing and on the first step (to measure); none while the pass without
    /// drafts (`plain_width` rows: 1 alone, more in a batch) is still unmeasured. `None`: the
    /// costs decide ([`Self::verify_length`], [`Self::draft_reach`]).
    pub fn forced_length(&self, available: usize, plain_width: usize) -> Option<usize> {
        if !self.adaptive || self.probing || self.steps == 1 {
            return Some(available);
        }
        self.pass.measured(plain_width).is_none().then_some(0)
    }

    /// For each draft i of a proposal of `available` (`matched` as in [`Self::verify_length`]),
    /// the estimated probability that drafts 0..=i are all kept: what verifying i + 1 of them
    /// adds to the expected tokens of a pass. For a scheduler weighing several requests' drafts
    /// in one pass.
    pub fn draft_reach(&self, available: usize, matched: Option<usize>) -> Vec<f64> {
        let mut reach = 1.0;
        match matched {
            Some(matched) => {
                let runs = self.run_acceptances();
                (1..=available)
                    .map(|k| {
                        reach *= runs[(matched.max(1) + k - 1).min(RUN_CLASSES) - 1];
                        reach
                    })
                    .collect()
            }
            None => {
                let p = self.acceptance_for(available);
                (0..available)
                    .map(|_| {
                        reach *= p;
                        reach
                    })
                    .collect()
            }
        }
    }

    /// The estimated ms of a pass of `width` rows (measured, or from the measured widths).
    pub fn pass_ms(&self, width: usize) -> f64 {
        self.pass.estimate(width)
    }

    /// Drafting `requested` tokens took `ms`.
    pub fn observe_draft(&mut self, requested: usize, ms: f64) {
        if requested == 0 || !ms.is_finite() || ms < 0.0 {
            return;
        }
        self.draft_ms_per_token.observe(ms / requested as f64);
    }

    /// A drafter that reports its passes (a draft model) drafted with these timings.
    pub fn observe_draft_timing(&mut self, timing: &super::DraftTiming) {
        if let Some(first) = timing.first_pass_ms {
            self.draft_first_pass_ms.observe(first);
        }
        if timing.later_passes > 0 {
            self.draft_next_pass_ms.observe(timing.later_ms / timing.later_passes as f64);
        }
    }

    /// A verification pass of `width` rows (1 + verified drafts) took `ms`.
    pub fn observe_pass(&mut self, width: usize, ms: f64) {
        self.pass.observe(width, ms);
    }

    /// `accepted` of the `verified` drafts (the first ones of a proposal of `length`; `matched`
    /// as in [`Self::verify_length`]) were kept. A copy's drafts teach the run lengths through
    /// its tracker ([`Self::track_unverified`]), not here.
    pub fn observe_outcome(&mut self, length: usize, matched: Option<usize>, verified: usize, accepted: usize) {
        if verified == 0 {
            return;
        }
        self.drop_unverified();
        let accepted = accepted.min(verified);
        let rejected = if accepted < verified { 1.0 } else { 0.0 };
        self.record(length, matched.is_none(), accepted as f64, rejected);
    }

    /// Scores `drafts` against the target's next tokens ([`Self::observe_token`]): the
    /// unverified rest of a proposal of `length` tokens after its `verified` drafts, all kept,
    /// or for a copy (`matched` as in [`Self::verify_length`]) any of its drafts from the
    /// `verified`-th on. Free information about drafts that were not worth a wider pass. An
    /// empty `drafts` keeps the drafts tracked before (a plain step without a proposal).
    pub fn track_unverified(&mut self, length: usize, matched: Option<usize>, verified: usize, drafts: &[u32]) {
        if drafts.is_empty() {
            return;
        }
        let rest = drafts.iter().rev().copied().collect();
        match matched {
            Some(matched) => {
                if self.copies.len() == MAX_TRACKED_COPIES {
                    self.copies.remove(0);
                }
                self.copies.push((matched.max(1) + verified, rest));
            }
            None => self.unverified = Some((length, rest)),
        }
    }

    /// The target chose `token` at the next position: scores the tracked drafts there (kept,
    /// or rejected and the rest dropped, as verification would have).
    pub fn observe_token(&mut self, token: u32) {
        if let Some((length, mut rest)) = self.unverified.take() {
            if let Some(draft) = rest.pop() {
                let kept = draft == token;
                self.record(length, true, if kept { 1.0 } else { 0.0 }, if kept { 0.0 } else { 1.0 });
                if kept && !rest.is_empty() {
                    self.unverified = Some((length, rest));
                }
            }
        }
        let mut copies = std::mem::take(&mut self.copies);
        copies.retain_mut(|(run, rest)| {
            let Some(draft) = rest.pop() else { return false };
            let kept = draft == token;
            let counts = &mut self.by_run[(*run).clamp(1, RUN_CLASSES) - 1];
            counts.add_weighted(if kept { 1.0 } else { 0.0 }, if kept { 0.0 } else { 1.0 }, RUN_NEW_WEIGHT);
            *run += 1;
            kept && !rest.is_empty()
        });
        self.copies = copies;
    }

    /// A verification step of this policy's proposal ended: `outcome` of the `verified` drafts
    /// (the first ones of the proposal) followed by `unverified`, the rest left out of the pass;
    /// `budget` drafts were requested, `matched` as in [`Self::verify_length`].
    pub fn observe_step(
        &mut self,
        outcome: &super::VerificationOutcome,
        verified: &[u32],
        unverified: &[u32],
        matched: Option<usize>,
        budget: usize,
    ) {
        let proposed_len = verified.len() + unverified.len();
        self.observe_outcome(proposed_len, matched, outcome.proposed, outcome.accepted);
        if proposed_len < budget && outcome.accepted == proposed_len {
            self.observe_stop();
        }
        if matched.is_some() {
            // The copy's tracker scores it whole, from its first draft on.
            let drafts: Vec<u32> = verified.iter().chain(unverified).copied().collect();
            self.track_unverified(proposed_len, matched, 0, &drafts);
            verified[..outcome.accepted.min(verified.len())].iter().for_each(|&t| self.observe_token(t));
        } else if outcome.accepted == outcome.proposed {
            self.track_unverified(proposed_len, matched, outcome.proposed, unverified);
        }
        self.observe_token(outcome.continuation_token);
    }

    /// A new proposal is being verified: its outcome covers the positions still tracked.
    fn drop_unverified(&mut self) {
        self.unverified = None;
    }

    /// The drafter proposed fewer tokens than requested and every one of them was kept: the
    /// position after them counts as a miss of the request.
    pub fn observe_stop(&mut self) {
        self.requested.add_weighted(0.0, 1.0, REQUEST_NEW_WEIGHT);
        self.judged += 1;
    }

    /// Drafts of a proposal of `length` tokens were kept or rejected; `by_length`: it is judged
    /// by its length (not a copy).
    fn record(&mut self, length: usize, by_length: bool, kept: f64, rejected: f64) {
        self.judged += (kept + rejected).round() as usize;
        self.overall.add(kept, rejected);
        self.requested.add_weighted(kept, rejected, REQUEST_NEW_WEIGHT);
        if by_length {
            self.by_length[length.clamp(1, LENGTH_CLASSES) - 1].add(kept, rejected);
        }
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
