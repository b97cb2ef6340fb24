//! Prompt lookup decoding (Saxena 2023; llama.cpp's `lookup`): no model, the draft is what
//! followed an earlier occurrence of the context's suffix in the prompt or the output. Strong on
//! edits and rewrites, where the output copies long runs of the input.
//!
//! The matcher looks for the longest suffix of the context (up to `max_ngram` tokens) that occurred
//! before, the most recent occurrence among equally long ones, and drafts more tokens the longer
//! the match: a one-token match is a guess, a six-token match inside a copied function body is
//! nearly certain to continue. Drafting costs nothing, so the length is set by what verification
//! costs: a pass of 1 + k tokens is cheapest per token when 1 + k is a multiple of `width_multiple`
//! (the CPU mat-muls unpack each weight block once per group of 4 activation rows; the rest of a
//! group costs a row each), so proposals are rounded up to fill that group when the copied run is
//! long enough.

use super::{Drafter, Proposal};
use crate::error::Result;
use crate::sampling::SamplingParams;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// Longest suffix compared; a longer match is not more informative for the draft length.
    pub max_ngram: usize,
    /// Shortest suffix that counts as a match.
    pub min_ngram: usize,
    /// Draft tokens per matched suffix token (the draft length is `match length × this`, capped
    /// by the caller's budget).
    pub tokens_per_matched: usize,
    /// Verification widths (1 + drafts) are rounded up to a multiple of this when the copied run
    /// has the tokens; 1 turns rounding off.
    pub width_multiple: usize,
}

/// Chosen by replaying the greedy outputs of `scripts/bench-speculative.sh` (qwen2.5-coder-1.5b,
/// code edits and prose, to the end of the answer) against measured CPU pass costs
/// (`tests/examples/spec_profile.rs`, `SIMULATE`): one draft token per matched token, one-token
/// matches included, the pass width rounded up to an even number of rows. On 2 cores a pass of 2
/// rows costs what a pass of 1 does (the weights are read once; one more row of arithmetic hides
/// behind the memory traffic), so a one-token guess is worth verifying even when it is usually
/// wrong; from 3 rows on each row adds ~20% of a pass. Against the earlier rule (2+ token
/// matches, widths rounded to 4 rows) the replay took 4-7% less time on each of four prompts.
/// Where 2-row passes cost more (see [`crate::speculative::DraftPolicy::verify_length`]) the
/// policy learns that short proposals do not pay and leaves them unverified.
impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup { max_ngram: 8, min_ngram: 1, tokens_per_matched: 1, width_multiple: 2 }
    }
}

/// Where the context's suffix matched before: `follow` is the index of the first token after the
/// earlier occurrence, `len` how many tokens matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuffixMatch {
    pub follow: usize,
    pub len: usize,
}

impl PromptLookup {
    /// The longest suffix of `context` (at most `max_ngram` tokens, at least `min_ngram`) that
    /// also ends at an earlier position, the latest such position among equally long matches.
    /// An occurrence may overlap the suffix itself, as long as one token follows it.
    pub fn longest_suffix_match(&self, context: &[u32]) -> Option<SuffixMatch> {
        let len = context.len();
        if len < 2 {
            return None;
        }
        let last = context[len - 1];
        let max_ngram = self.max_ngram.max(1);
        let mut best: Option<SuffixMatch> = None;
        // `end`: index of the token matched against the last one; latest first, so a strictly
        // longer match is needed to replace the current best.
        for end in (0..len - 1).rev() {
            if context[end] != last {
                continue;
            }
            let matched = (0..max_ngram.min(end + 1)).take_while(|&i| context[end - i] == context[len - 1 - i]).count();
            if best.is_none_or(|b| matched > b.len) {
                best = Some(SuffixMatch { follow: end + 1, len: matched });
                if matched == max_ngram {
                    break;
                }
            }
        }
        best.filter(|b| b.len >= self.min_ngram.max(1))
    }

    /// The tokens that followed the best suffix match (see [`Self::longest_suffix_match`]), at
    /// most `max_tokens` and at most `match length × tokens_per_matched` (rounded up to fill a
    /// verification group); empty when nothing matches.
    pub fn lookup(&self, context: &[u32], max_tokens: usize) -> Vec<u32> {
        if max_tokens == 0 {
            return Vec::new();
        }
        let Some(found) = self.longest_suffix_match(context) else { return Vec::new() };
        let available = context.len() - found.follow;
        let wanted = found.len * self.tokens_per_matched.max(1);
        // 1 + k rounded up to a multiple of the group: e.g. 2 wanted → 3 (a 4-token pass).
        let group = self.width_multiple.max(1);
        let wanted = (1 + wanted).div_ceil(group) * group - 1;
        let n = wanted.min(max_tokens).min(available);
        context[found.follow..found.follow + n].to_vec()
    }
}

impl Drafter for PromptLookup {
    fn propose(&mut self, context: &[u32], max_tokens: usize, _sampling: &SamplingParams) -> Result<Proposal> {
        Ok(Proposal { tokens: self.lookup(context, max_tokens), distributions: None, timing: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No length policy: as many tokens as asked for (to test the matcher alone).
    fn matcher() -> PromptLookup {
        PromptLookup { max_ngram: 3, min_ngram: 1, tokens_per_matched: 100, width_multiple: 1 }
    }

    #[test]
    fn prefers_the_longest_ngram_and_the_latest_occurrence() {
        let lookup = matcher();
        // Suffix [1, 2, 3] occurs at 0 → continuation 4, 5; the 1-gram [3] alone occurs later (→ 9).
        let context = [1, 2, 3, 4, 5, 3, 9, 1, 2, 3];
        assert_eq!(lookup.lookup(&context, 2), vec![4, 5]);
        // Only the 1-gram [3] matches; its latest earlier occurrence is followed by 9.
        let context = [1, 2, 3, 4, 5, 3, 9, 7, 3];
        assert_eq!(lookup.lookup(&context, 3), vec![9, 7, 3]);
        // Two occurrences of [7, 8]: the latest wins.
        let context = [7, 8, 1, 7, 8, 2, 7, 8];
        assert_eq!(lookup.lookup(&context, 1), vec![2]);
        // Matches longer than max_ngram are equal: the latest 3-token match wins.
        let context = [5, 1, 2, 3, 4, 6, 1, 2, 3, 7, 5, 1, 2, 3];
        assert_eq!(lookup.longest_suffix_match(&context), Some(SuffixMatch { follow: 9, len: 3 }));
        let longer = PromptLookup { max_ngram: 8, ..matcher() };
        assert_eq!(longer.longest_suffix_match(&context), Some(SuffixMatch { follow: 4, len: 4 }));
    }

    #[test]
    fn draft_length_follows_the_match_length_and_fills_the_group() {
        let lookup = PromptLookup { max_ngram: 8, min_ngram: 1, tokens_per_matched: 2, width_multiple: 4 };
        let run: Vec<u32> = (100..140).collect();
        // A 1-token match wants 2 drafts, rounded to 3 (a 4-token verification pass).
        let mut context = run.clone();
        context.extend([7, 100]);
        assert_eq!(lookup.lookup(&context, 16), vec![101, 102, 103]);
        // A 5-token match wants 10, rounded to 11 (12-token pass), then capped by the budget.
        let mut context = run.clone();
        context.extend([7, 100, 101, 102, 103, 104]);
        assert_eq!(lookup.lookup(&context, 16), (105..116).collect::<Vec<u32>>());
        assert_eq!(lookup.lookup(&context, 5), (105..110).collect::<Vec<u32>>());
        // The continuation ends at the end of the context.
        let context = [1, 2, 3, 1, 2];
        assert_eq!(lookup.lookup(&context, 16), vec![3, 1, 2]);
    }

    #[test]
    fn nothing_to_propose_without_a_match() {
        let lookup = matcher();
        assert!(lookup.lookup(&[1, 2, 3, 4], 5).is_empty());
        assert!(lookup.lookup(&[1], 5).is_empty());
        assert!(lookup.lookup(&[1, 1], 0).is_empty());
        // Overlapping self-match: [1, 1, 1] → the 2-gram [1, 1] at 0 is followed by 1.
        assert_eq!(lookup.lookup(&[1, 1, 1], 4), vec![1]);
        let strict = PromptLookup { min_ngram: 2, ..matcher() };
        assert!(strict.lookup(&[1, 2, 3, 9, 3], 4).is_empty(), "a 1-token match is below min_ngram");
    }
}
