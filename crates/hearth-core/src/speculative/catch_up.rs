//! When a draft model drafting after prompt lookup (`--lookup --draft-model`) drafts again.
//!
//! A draft model has not read the tokens the lookup copied: before it drafts again it reads all
//! of them in one pass (~3 ms a token for Qwen2.5-Coder-0.5B on 2 CPU cores, ~30 ms after a
//! copied line). Whether that pays depends on what comes next, which is unknown: a one-token gap
//! in a copied run (a renamed variable) never repays it, a new paragraph does many times over.
//! This is the ski-rental problem, and its 2-competitive answer is the rule here: after the free
//! drafts stop, decode plainly until the drafting gain forgone in those plain steps
//! ([`super::DraftPolicy::drafting_gain_ms`] each) reaches what reading the backlog costs, then
//! let the drafter catch up. Before the cost of reading is measured, the drafter waits
//! [`COSTLY_AFTER_FREE_STEPS`] steps.

/// After free drafts were verified, the costly drafter is asked from this many steps without
/// them on at the soonest (the first such step is plain: a single token between two copied runs
/// is common, and reading the backlog for it never pays).
pub const COSTLY_AFTER_FREE_STEPS: usize = 2;
/// Backlogs shorter than this do not update the cost of reading a token: the pass's fixed cost
/// would dominate the per-token figure.
const MIN_MEASURED_BACKLOG: usize = 8;
/// Weight of the newest observation of the cost per token.
const NEW_WEIGHT: f64 = 0.25;

#[derive(Clone, Debug)]
pub(crate) struct CatchUp {
    /// Context tokens the costly drafter has read (or proposed and seen accepted).
    read: usize,
    /// Steps since free drafts were last verified (`usize::MAX`: never).
    steps_without_free: usize,
    /// The costly drafter's backlog when the free drafts last stopped.
    debt_tokens: usize,
    /// Running ms per backlog token of the drafter's catch-up pass.
    ms_per_token: Option<f64>,
}

impl CatchUp {
    /// The costly drafter has read the prompt.
    pub fn new(prompt_len: usize) -> Self {
        CatchUp { read: prompt_len, steps_without_free: usize::MAX, debt_tokens: 0, ms_per_token: None }
    }

    /// A step that begins with `context_len` accepted tokens verifies free drafts (`from_free`)
    /// or not.
    pub fn start_step(&mut self, from_free: bool, context_len: usize) {
        self.steps_without_free = if from_free { 0 } else { self.steps_without_free.saturating_add(1) };
        if self.steps_without_free == 1 {
            self.debt_tokens = context_len.saturating_sub(self.read);
        }
    }

    /// Whether the costly drafter may be asked at a step that begins with `context_len` accepted
    /// tokens, if that step verifies no free drafts; a drafting step is expected to save
    /// `gain_ms` over plain decoding.
    pub fn costly_ready(&self, context_len: usize, gain_ms: f64) -> bool {
        let steps = self.steps_without_free.saturating_add(1);
        if steps < COSTLY_AFTER_FREE_STEPS {
            return false;
        }
        let Some(per_token) = self.ms_per_token else { return true };
        if steps == usize::MAX || gain_ms <= 0.0 {
            // Never free drafts, or a drafter that does not pay: its own policy decides.
            return true;
        }
        let debt = if steps == 1 { context_len.saturating_sub(self.read) } else { self.debt_tokens };
        (steps - 1) as f64 * gain_ms >= debt as f64 * per_token
    }

    /// The costly drafter was asked with `context_len` accepted tokens; its first pass, which
    /// read the backlog, took `first_pass_ms`.
    pub fn observe_catch_up(&mut self, context_len: usize, first_pass_ms: f64) {
        let backlog = context_len.saturating_sub(self.read);
        if backlog >= MIN_MEASURED_BACKLOG && first_pass_ms.is_finite() && first_pass_ms >= 0.0 {
            let per_token = first_pass_ms / backlog as f64;
            self.ms_per_token = Some(self.ms_per_token.map_or(per_token, |old| old + NEW_WEIGHT * (per_token - old)));
        }
        self.read = context_len;
    }

    /// `accepted` of the costly drafter's drafts were kept: it has read them too.
    pub fn observe_accepted(&mut self, accepted: usize) {
        self.read += accepted;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_until_the_forgone_gain_pays_for_the_backlog() {
        let mut catch_up = CatchUp::new(100);
        // Never free drafts: the drafter drafts from the first step.
        assert!(catch_up.costly_ready(101, 10.0));
        catch_up.start_step(false, 101);
        // First read of a 20-token backlog: 60 ms, 3 ms a token.
        catch_up.observe_catch_up(120, 60.0);
        catch_up.observe_accepted(2);
        // 10 tokens copied by free drafts, then none: the first step without them is plain.
        catch_up.start_step(true, 122);
        assert!(!catch_up.costly_ready(132, 100.0), "the first step after free drafts is plain");
        catch_up.start_step(false, 132);
        // A backlog of 10 tokens costs 30 ms: at 10 ms of gain a step, after 3 plain steps.
        for context_len in [133, 134] {
            assert!(!catch_up.costly_ready(context_len, 10.0));
            catch_up.start_step(false, context_len);
        }
        assert!(catch_up.costly_ready(135, 10.0));
        // A large gain a step pays for it sooner (28 tokens unread since 122: 84 ms); a drafter
        // that does not pay is left to its policy.
        catch_up.start_step(true, 140);
        catch_up.start_step(false, 150);
        assert!(catch_up.costly_ready(151, 90.0));
        assert!(catch_up.costly_ready(151, 0.0));
        assert!(!catch_up.costly_ready(151, 10.0));
    }

    #[test]
    fn before_the_cost_is_measured_the_drafter_waits_the_fixed_steps() {
        let mut catch_up = CatchUp::new(10);
        catch_up.start_step(true, 11);
        assert!(!catch_up.costly_ready(15, 1.0));
        catch_up.start_step(false, 15);
        assert!(catch_up.costly_ready(16, 1.0));
        // A short backlog does not set the cost per token.
        catch_up.observe_catch_up(16, 30.0);
        assert_eq!(catch_up.ms_per_token, None);
    }
}
