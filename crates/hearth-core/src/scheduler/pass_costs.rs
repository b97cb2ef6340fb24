//! What a verification pass and a draft model's pass cost on this machine, measured once at load
//! (or read back from where a binary keeps them), so that a speculating request's draft policy
//! starts from the machine's costs. Without them a policy learns the costs from its own first
//! steps, guessing meanwhile; on a short answer that is most of it.

use super::Scheduler;
use crate::block_on::block_on;
use crate::error::Result;
use crate::graph::LogitsMode;
use crate::speculative::{DraftPolicy, DraftTiming};

/// Verification widths measured (1 + draft tokens); a policy interpolates between them.
const MEASURED_WIDTHS: [usize; 8] = [1, 2, 3, 4, 6, 8, 12, 16];

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PassCosts {
    /// `(rows, ms)`: the target model's pass over `rows` tokens of one sequence, every row's
    /// logits computed (a verification pass).
    pub target: Vec<(usize, f64)>,
    /// The draft model's pass over one token, when the scheduler has one.
    pub draft: Option<f64>,
}

impl PassCosts {
    /// Starts `policy` from these costs (`with_draft`: a draft model's policy).
    pub(super) fn seed(&self, policy: &mut DraftPolicy, with_draft: bool) {
        for &(width, ms) in &self.target {
            policy.observe_pass(width, ms);
        }
        if let Some(ms) = self.draft.filter(|_| with_draft) {
            policy.observe_draft_timing(&DraftTiming { first_pass_ms: Some(ms), later_passes: 1, later_ms: ms });
        }
    }
}

impl Scheduler {
    /// Measures what verification passes cost here, up to the widest its drafting verifies, and
    /// the draft model's pass (see [`PassCosts`]); the policies of requests submitted after start
    /// from them. Call when idle (it runs passes of its own); a second or two on a CPU.
    pub fn measure_pass_costs(&mut self) -> Result<PassCosts> {
        block_on(self.measure_pass_costs_async())
    }

    /// [`Self::measure_pass_costs`] for backends whose results arrive later (WebGPU in a browser).
    pub async fn measure_pass_costs_async(&mut self) -> Result<PassCosts> {
        let widest = 1 + self.widest_drafts();
        let widths: Vec<usize> = MEASURED_WIDTHS.iter().copied().filter(|&w| w <= widest).collect();
        let target = self.runner.time_passes(&widths, LogitsMode::All).await?;
        let draft = match self.draft_model.as_mut() {
            Some((draft, _)) => draft.time_pass().await?,
            None => None,
        };
        let costs = PassCosts { target, draft };
        self.pass_costs = Some(costs.clone());
        Ok(costs)
    }

    /// Costs measured earlier on this machine with these models and settings (kept by the
    /// caller), for the policies of requests submitted after.
    pub fn set_pass_costs(&mut self, costs: PassCosts) {
        self.pass_costs = Some(costs);
    }

    /// The most drafts a request of this scheduler verifies in one pass.
    fn widest_drafts(&self) -> usize {
        let lookup = self.options.lookup.as_ref().map_or(0, |o| o.max_draft_tokens);
        let model = self.draft_model.as_ref().map_or(0, |(_, o)| o.max_draft_tokens);
        lookup.max(model).max(crate::speculative::SpeculativeOptions::lookup().max_draft_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculative::SpeculativeOptions;

    #[test]
    fn a_seeded_policy_starts_from_the_measured_costs() {
        let costs = PassCosts { target: vec![(1, 10.0), (2, 14.0), (4, 30.0)], draft: Some(3.0) };
        let mut policy = DraftPolicy::new(&SpeculativeOptions::default());
        let unseeded = policy.pass_ms(4);
        costs.seed(&mut policy, true);
        assert_eq!((policy.pass_ms(1), policy.pass_ms(2), policy.pass_ms(4)), (10.0, 14.0, 30.0));
        assert_eq!(policy.pass_ms(3), 22.0, "between measured widths: the line between them");
        assert_ne!(unseeded, 30.0);
        assert!(!policy.drafting_is_free(), "a draft model's passes cost");
    }
}
