//! Prompt lookup decoding (Saxena 2023; llama.cpp's `lookup`): no model, the draft is what
//! followed an earlier occurrence of the context's suffix in the prompt or the output. Strong on
//! edits and rewrites, where the output copies long runs of the input.
//!
//! The matcher looks for the longest suffix of the context (up to `max_ngram` tokens) that occurred
//! before, the most recent occurrence among equally long ones, and proposes everything that
//! followed it, up to the caller's budget. It reports the match length with the proposal: the
//! draft policy judges each draft by the copied run it would extend (a one-token match is a
//! guess, six tokens into a copied function body the copy nearly always goes on) and verifies
//! the prefix that pays at this machine's pass costs.

use super::Proposal;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// Longest suffix compared: the match length is how far the copy has run, which the draft
    /// policy reads as how likely it is to go on.
    pub max_ngram: usize,
    /// Shortest suffix that counts as a match.
    pub min_ngram: usize,
}

/// Chosen by replaying the greedy outputs of `scripts/bench-speculative.sh` (qwen2.5-coder-1.5b,
/// code edits answered with code only, to the end of the answer) against measured CPU pass
/// costs (`tests/examples/spec_profile.rs`, `REPLAY_DIR`): one-token matches included (on 2
/// cores a pass of 2 rows costs little more than a pass of 1, so a guess kept a third of the
/// time can pay), suffixes of up to 32 tokens compared (the longer a copy has run, the further
/// the policy verifies it; with at most 8 the replay took 1% more time).
impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup { max_ngram: 32, min_ngram: 1 }
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
    /// most `max_tokens`, with the match's length; empty when nothing matches.
    pub fn proposal(&self, context: &[u32], max_tokens: usize) -> Proposal {
        let Some(found) = self.longest_suffix_match(context).filter(|_| max_tokens > 0) else {
            return Proposal::default();
        };
        let end = context.len().min(found.follow + max_tokens);
        Proposal { tokens: context[found.follow..end].to_vec(), matched: Some(found.len), ..Proposal::default() }
    }
}

impl PromptLookup {
    /// The longest suffix of `context` (as [`Self::longest_suffix_match`]) that also occurs in
    /// `reference`, with at least one reference token after it; `follow` indexes `reference`.
    pub fn longest_match_in(&self, context: &[u32], reference: &[u32]) -> Option<SuffixMatch> {
        let &last = context.last()?;
        let max_ngram = self.max_ngram.max(1);
        let mut best: Option<SuffixMatch> = None;
        for end in (0..reference.len().saturating_sub(1)).rev() {
            if reference[end] != last {
                continue;
            }
            let matched = (0..max_ngram.min(end + 1).min(context.len()))
                .take_while(|&i| reference[end - i] == context[context.len() - 1 - i])
                .count();
            if best.is_none_or(|b| matched > b.len) {
                best = Some(SuffixMatch { follow: end + 1, len: matched });
                if matched == max_ngram {
                    break;
                }
            }
        }
        best.filter(|b| b.len >= self.min_ngram.max(1))
    }

    /// [`Self::proposal`] that also copies from `reference`, text the caller expects the output
    /// to repeat (OpenAI's predicted output): the longer match wins, the reference's on a tie.
    pub fn proposal_with(&self, context: &[u32], reference: &[u32], max_tokens: usize) -> Proposal {
        let in_reference = self.longest_match_in(context, reference).filter(|_| max_tokens > 0);
        let in_context = self.longest_suffix_match(context);
        match in_reference {
            Some(found) if in_context.is_none_or(|c| found.len >= c.len) => {
                let end = reference.len().min(found.follow + max_tokens);
                Proposal {
                    tokens: reference[found.follow..end].to_vec(),
                    matched: Some(found.len),
                    ..Proposal::default()
                }
            }
            _ => self.proposal(context, max_tokens),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher() -> PromptLookup {
        PromptLookup { max_ngram: 3, min_ngram: 1 }
    }

    /// The proposal's tokens (empty without a match).
    fn drafts(lookup: &PromptLookup, context: &[u32], max_tokens: usize) -> Vec<u32> {
        lookup.proposal(context, max_tokens).tokens
    }

    #[test]
    fn prefers_the_longest_ngram_and_the_latest_occurrence() {
        let lookup = matcher();
        // Suffix [1, 2, 3] occurs at 0 → continuation 4, 5; the 1-gram [3] alone occurs later (→ 9).
        let context = [1, 2, 3, 4, 5, 3, 9, 1, 2, 3];
        assert_eq!(drafts(&lookup, &context, 2), vec![4, 5]);
        // Only the 1-gram [3] matches; its latest earlier occurrence is followed by 9.
        let context = [1, 2, 3, 4, 5, 3, 9, 7, 3];
        assert_eq!(drafts(&lookup, &context, 3), vec![9, 7, 3]);
        // Two occurrences of [7, 8]: the latest wins.
        let context = [7, 8, 1, 7, 8, 2, 7, 8];
        assert_eq!(drafts(&lookup, &context, 1), vec![2]);
        // Matches longer than max_ngram are equal: the latest 3-token match wins.
        let context = [5, 1, 2, 3, 4, 6, 1, 2, 3, 7, 5, 1, 2, 3];
        assert_eq!(lookup.longest_suffix_match(&context), Some(SuffixMatch { follow: 9, len: 3 }));
        let longer = PromptLookup { max_ngram: 8, ..matcher() };
        assert_eq!(longer.longest_suffix_match(&context), Some(SuffixMatch { follow: 4, len: 4 }));
    }

    #[test]
    fn proposes_the_whole_continuation_with_the_match_length() {
        let lookup = PromptLookup::default();
        let run: Vec<u32> = (100..140).collect();
        // A 1-token match: everything after it, up to the budget, for the policy to cut.
        let mut context = run.clone();
        context.extend([7, 100]);
        let proposal = lookup.proposal(&context, 16);
        assert_eq!(proposal.tokens, (101..117).collect::<Vec<u32>>());
        assert_eq!(proposal.matched, Some(1));
        // A 5-token match says so.
        let mut context = run.clone();
        context.extend([7, 100, 101, 102, 103, 104]);
        let proposal = lookup.proposal(&context, 5);
        assert_eq!(proposal.tokens, (105..110).collect::<Vec<u32>>());
        assert_eq!(proposal.matched, Some(5));
        // The continuation ends at the end of the context.
        let context = [1, 2, 3, 1, 2];
        assert_eq!(drafts(&lookup, &context, 16), vec![3, 1, 2]);
    }

    #[test]
    fn a_reference_is_copied_where_it_matches_longer() {
        let lookup = PromptLookup::default();
        // The context's suffix [5, 6] is in the reference, followed by 7, 8; in the context
        // itself only [6] matched before (followed by 9).
        let context = [6, 9, 1, 5, 6];
        let reference = [4, 5, 6, 7, 8];
        let proposal = lookup.proposal_with(&context, &reference, 4);
        assert_eq!((proposal.tokens, proposal.matched), (vec![7, 8], Some(2)));
        // A longer match in the context wins.
        let context = [1, 2, 3, 9, 1, 2, 3];
        let proposal = lookup.proposal_with(&context, &[3, 4], 4);
        assert_eq!((proposal.tokens, proposal.matched), (vec![9, 1, 2, 3], Some(3)));
        // Nothing in the reference: the context's own proposal; an empty reference changes nothing.
        assert_eq!(lookup.proposal_with(&[1, 2, 1], &[7, 8], 3), lookup.proposal(&[1, 2, 1], 3));
        assert_eq!(lookup.proposal_with(&[1, 2, 1], &[], 3), lookup.proposal(&[1, 2, 1], 3));
        // The reference's last token has nothing after it.
        assert!(lookup.proposal_with(&[9, 8], &[8], 3).tokens.is_empty());
    }

    #[test]
    fn nothing_to_propose_without_a_match() {
        let lookup = matcher();
        assert_eq!(lookup.proposal(&[1, 2, 3, 4], 5), Proposal::default());
        assert!(drafts(&lookup, &[1], 5).is_empty());
        assert!(drafts(&lookup, &[1, 1], 0).is_empty());
        // Overlapping self-match: [1, 1, 1] → the 2-gram [1, 1] at 0 is followed by 1.
        assert_eq!(drafts(&lookup, &[1, 1, 1], 4), vec![1]);
        let strict = PromptLookup { min_ngram: 2, ..matcher() };
        assert!(drafts(&strict, &[1, 2, 3, 9, 3], 4).is_empty(), "a 1-token match is below min_ngram");
    }
}
