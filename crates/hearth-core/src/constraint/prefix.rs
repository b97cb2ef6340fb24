//! Prefix patterns: whether a text (an answer as it streams) begins with a match of a regular
//! expression, cannot, or may once more of it comes. Lazy grammars start on them (a tool call
//! fenced as a JSON code block), and the tool-call parser holds text back while one is undecided.

use crate::error::CoreError;
use regex_automata::hybrid::dfa::DFA;
use regex_automata::{Anchored, Input};

/// How a text's beginning stands against a [`PrefixPattern`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefixMatch {
    /// The text begins with a match.
    Matched,
    /// No continuation of the text begins with a match.
    Impossible,
    /// A continuation may.
    Undecided,
}

/// A regular expression matched at the beginning of a text (a lazy DFA: built as it is used).
#[derive(Clone, Debug)]
pub struct PrefixPattern {
    pattern: String,
    dfa: DFA,
}

impl PartialEq for PrefixPattern {
    fn eq(&self, other: &Self) -> bool {
        self.pattern == other.pattern
    }
}

impl PrefixPattern {
    pub fn new(pattern: &str) -> Result<Self, CoreError> {
        let dfa = DFA::new(pattern)
            .map_err(|e| CoreError::InvalidArgument(format!("prefix pattern {pattern:?} does not compile: {e}")))?;
        Ok(PrefixPattern { pattern: pattern.to_string(), dfa })
    }

    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whether `text` begins with a match, cannot, or may yet.
    pub fn check(&self, text: &[u8]) -> PrefixMatch {
        let mut cache = self.dfa.create_cache();
        let input = Input::new(text).anchored(Anchored::Yes);
        let Ok(mut state) = self.dfa.start_state_forward(&mut cache, &input) else { return PrefixMatch::Impossible };
        // (Match states come one byte late: a match that ends at byte i shows after byte i + 1,
        // or after the end of the input.)
        for &byte in text {
            state = match self.dfa.next_state(&mut cache, state, byte) {
                Ok(state) => state,
                Err(_) => return PrefixMatch::Impossible,
            };
            if state.is_match() {
                return PrefixMatch::Matched;
            }
            if state.is_dead() {
                return PrefixMatch::Impossible;
            }
        }
        match self.dfa.next_eoi_state(&mut cache, state) {
            Ok(state) if state.is_match() => PrefixMatch::Matched,
            Ok(_) => PrefixMatch::Undecided,
            Err(_) => PrefixMatch::Impossible,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_matches_cannot_or_may_yet() {
        let fence = PrefixPattern::new(r#"\s*```(?:json)?[ \t]*\n\s*\{\s*"name"\s*:"#).expect("compiles");
        assert_eq!(fence.check(b""), PrefixMatch::Undecided);
        assert_eq!(fence.check(b"\n``"), PrefixMatch::Undecided);
        assert_eq!(fence.check(b"```json\n{\"na"), PrefixMatch::Undecided);
        assert_eq!(fence.check(b"```json\n{\"name\":"), PrefixMatch::Matched);
        assert_eq!(fence.check(b"```\n{ \"name\" : \"f\", \"arguments\": {}}"), PrefixMatch::Matched);
        assert_eq!(fence.check(b"```python\n"), PrefixMatch::Impossible);
        assert_eq!(fence.check(b"Sure"), PrefixMatch::Impossible);
        assert!(PrefixPattern::new("(").is_err());
    }
}
