//! Prompt lookup decoding (Saxena 2023; llama.cpp's `lookup`): no model, the draft is what
//! followed the last time the most recent n-gram appeared in the prompt or the output. Strong on
//! edits and rewrites, where the output copies long runs of the input.

use super::{Drafter, Proposal};
use crate::error::Result;
use crate::sampling::SamplingParams;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// Longest suffix n-gram to match; tried from this length down to `min_ngram`.
    pub max_ngram: usize,
    pub min_ngram: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup { max_ngram: 3, min_ngram: 1 }
    }
}

impl PromptLookup {
    /// The tokens that followed the most recent earlier occurrence of the longest matching suffix
    /// n-gram of `context`, at most `max_tokens` of them; empty when nothing matches.
    pub fn lookup(&self, context: &[u32], max_tokens: usize) -> Vec<u32> {
        let len = context.len();
        if max_tokens == 0 || len < 2 {
            return Vec::new();
        }
        for n in (self.min_ngram.max(1)..=self.max_ngram.min(len - 1)).rev() {
            let suffix = &context[len - n..];
            // Start positions whose n-gram ends before the suffix starts... or overlaps it, as
            // long as at least one token follows it.
            if let Some(start) = (0..len - n).rev().find(|&s| &context[s..s + n] == suffix) {
                let follow = start + n;
                return context[follow..(follow + max_tokens).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

impl Drafter for PromptLookup {
    fn propose(&mut self, context: &[u32], max_tokens: usize, _sampling: &SamplingParams) -> Result<Proposal> {
        Ok(Proposal { tokens: self.lookup(context, max_tokens), distributions: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefers_the_longest_ngram_and_the_latest_occurrence() {
        let lookup = PromptLookup::default();
        // Suffix [1, 2, 3] occurs at 0 → continuation 4, 5; the 1-gram [3] alone occurs later (→ 9).
        let context = [1, 2, 3, 4, 5, 3, 9, 1, 2, 3];
        assert_eq!(lookup.lookup(&context, 2), vec![4, 5]);
        // Only the 1-gram [3] matches; its latest earlier occurrence is followed by 9.
        let context = [1, 2, 3, 4, 5, 3, 9, 7, 3];
        assert_eq!(lookup.lookup(&context, 3), vec![9, 7, 3]);
        // Two occurrences of [7, 8]: the latest wins.
        let context = [7, 8, 1, 7, 8, 2, 7, 8];
        assert_eq!(lookup.lookup(&context, 1), vec![2]);
    }

    #[test]
    fn nothing_to_propose_without_a_match() {
        let lookup = PromptLookup::default();
        assert!(lookup.lookup(&[1, 2, 3, 4], 5).is_empty());
        assert!(lookup.lookup(&[1], 5).is_empty());
        assert!(lookup.lookup(&[1, 1], 0).is_empty());
        // Overlapping self-match: [1, 1, 1] → the 2-gram [1, 1] at 0 is followed by 1.
        assert_eq!(lookup.lookup(&[1, 1, 1], 4), vec![1]);
    }
}
