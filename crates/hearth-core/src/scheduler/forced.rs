//! Structured output's forced tokens (the grammar allows exactly one continuation) as free
//! drafts: proposed after a constrained request's last token and verified in the next step that
//! only decodes, through the verification speculative decoding uses, each row masked by the
//! grammar after the drafts before it. A forced token costs one row and no step of its own; the
//! model still chooses at every position (where the grammar's forced text could be spelled with
//! other tokens, its own spelling wins: token healing at each boundary), so the answer is the one
//! masked decoding gives token by token, and each token's log-probability comes from the row that
//! predicted it.

use super::drafts::{verify_rows, EntryRows};
use crate::constraint::GrammarState;
use crate::error::Result;
use crate::sampling::{Sampler, TokenLogprob, Xoshiro256StarStar};
use crate::speculative::verify::{verification_rng, VerificationOutcome};

pub(super) struct ForcedDrafts {
    /// The planned step's rows: the pending token, then the forced tokens; empty when none is
    /// planned.
    pub batch: Vec<u32>,
    /// Accepts or replaces drafts when sampling (unused when greedy).
    rng: Xoshiro256StarStar,
}

/// The tokens a verification step kept, and their log-probabilities when the request reports
/// them.
pub(super) struct ForcedOutcome {
    pub outcome: VerificationOutcome,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<Option<TokenLogprob>>,
}

impl ForcedDrafts {
    pub fn new(seed: u64) -> Self {
        ForcedDrafts { batch: Vec::new(), rng: verification_rng(seed) }
    }

    pub fn planned(&self) -> bool {
        self.batch.len() > 1
    }

    /// Plans the next step of the request whose context ends with `pending` to verify the first
    /// `room` tokens `grammar` forces after it; returns how many (0: none forced, or no room).
    pub fn plan(&mut self, pending: u32, grammar: &mut GrammarState, room: usize) -> usize {
        self.batch.clear();
        let mut forced = grammar.forced_tokens();
        forced.truncate(room);
        if !forced.is_empty() {
            self.batch.push(pending);
            self.batch.extend(forced);
        }
        self.batch.len().saturating_sub(1)
    }

    /// The step goes without them.
    pub fn cancel(&mut self) {
        self.batch.clear();
    }

    /// Checks the planned forced tokens against the request's rows (the whole logits: each is
    /// masked by `grammar`), and reports each kept token's log-probability (`top` alternatives)
    /// from the row that predicted it when `top` is given. Clears the plan.
    pub fn verify(
        &mut self,
        sampler: &mut Sampler,
        context: &[u32],
        rows: EntryRows<'_>,
        grammar: &mut GrammarState,
        top: Option<usize>,
    ) -> Result<ForcedOutcome> {
        let batch = std::mem::take(&mut self.batch);
        let drafts = &batch[1..];
        let outcome = verify_rows(drafts, None, sampler, context, rows, Some(&mut *grammar), &mut self.rng)?;
        grammar.count_forced(outcome.accepted);
        let tokens: Vec<u32> = drafts[..outcome.accepted].iter().copied().chain([outcome.continuation_token]).collect();
        let logprobs = tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| Some(TokenLogprob::from_logits(rows.logits(i)?, token, top?)))
            .collect();
        Ok(ForcedOutcome { outcome, tokens, logprobs })
    }
}
