//! What a generation's draft policies learnt, kept for the next generation with the same drafter
//! (a chat's next turn): its pass costs, drafting costs and acceptance per copied run. Without it
//! every turn re-measures the costs (a full-width first step, then a plain pass) and starts its
//! copies from the priors.

use super::{DraftPolicy, SpeculativeOptions};

#[derive(Clone, Debug, Default)]
pub struct PolicyMemory {
    learnt: Option<Learnt>,
}

#[derive(Clone, Debug)]
struct Learnt {
    options: SpeculativeOptions,
    /// The drafter's free-proposal limit (a `LookupThen`'s lookup): which policies it had.
    free_limit: usize,
    policy: DraftPolicy,
    free_policy: Option<DraftPolicy>,
}

impl PolicyMemory {
    /// The policies a generation with `options` and a drafter of `free_limit` starts from: what
    /// the last one with the same settings learnt, else fresh ones.
    pub(super) fn policies(
        &self,
        options: &SpeculativeOptions,
        free_limit: usize,
    ) -> (DraftPolicy, Option<DraftPolicy>) {
        match &self.learnt {
            Some(l) if l.options == *options && l.free_limit == free_limit => {
                (l.policy.for_next_request(), l.free_policy.as_ref().map(DraftPolicy::for_next_request))
            }
            _ => {
                let free = SpeculativeOptions { max_draft_tokens: free_limit, adaptive: options.adaptive };
                (DraftPolicy::new(options), (free_limit > 0).then(|| DraftPolicy::new(&free)))
            }
        }
    }

    /// Keeps what a generation's policies learnt.
    pub(super) fn remember(
        &mut self,
        options: &SpeculativeOptions,
        free_limit: usize,
        policy: &DraftPolicy,
        free_policy: Option<&DraftPolicy>,
    ) {
        self.learnt = Some(Learnt {
            options: options.clone(),
            free_limit,
            policy: policy.clone(),
            free_policy: free_policy.cloned(),
        });
    }

    /// Whether a generation has left something to start from.
    pub fn is_empty(&self) -> bool {
        self.learnt.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_with_the_same_settings_starts_from_what_the_last_one_learnt() {
        let options = SpeculativeOptions { max_draft_tokens: 15, adaptive: true };
        let mut memory = PolicyMemory::default();
        let (mut policy, free) = memory.policies(&options, 0);
        assert!(free.is_none() && memory.is_empty());
        // A first generation: its 15 drafts were all rejected, in a pass that cost 15 plain ones.
        assert_eq!(policy.request(), 15);
        policy.observe_pass(16, 300.0);
        policy.observe_outcome(15, None, 15, 0);
        policy.request();
        policy.observe_pass(1, 20.0);
        memory.remember(&options, 0, &policy, None);

        let (mut carried, _) = memory.policies(&options, 0);
        carried.request();
        assert_eq!(carried.verify_length(15, None), 0, "the next generation knows the costs");
        // Other settings (another draft length, another drafter) start afresh: a full first step.
        let (mut fresh, _) = memory.policies(&SpeculativeOptions { max_draft_tokens: 8, ..options.clone() }, 0);
        assert_eq!(fresh.request(), 8);
        assert_eq!(fresh.verify_length(8, None), 8);
        let (mut fresh, free) = memory.policies(&options, 15);
        assert!(free.is_some());
        fresh.request();
        assert_eq!(fresh.verify_length(15, None), 15);
    }
}
