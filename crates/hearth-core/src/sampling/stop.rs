//! Stop strings for streamed text: text that might be the start of a stop string is held back,
//! so a streaming client never sees a partial (or complete) stop string.

/// What [`StopStrings::push`] releases.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StopOutcome {
    /// Text that is safe to show now (never contains any part of a matched stop string).
    pub emit: String,
    /// A stop string was found: generation should end. `emit` holds the text before it.
    pub stopped: bool,
}

#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not yet emitted: always shorter than the longest stop string.
    pending: String,
    stopped: bool,
}

impl StopStrings {
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new(stops: Vec<String>) -> Self {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
            stopped: false,
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Adds the next chunk of generated text. After a stop string matched, everything is swallowed.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome { emit: String::new(), stopped: true };
        }
        self.pending.push_str(text);
        let earliest_match = self.stops.iter().filter_map(|stop| self.pending.find(stop.as_str())).min();
        if let Some(position) = earliest_match {
            self.pending.truncate(position);
            self.stopped = true;
            return StopOutcome { emit: std::mem::take(&mut self.pending), stopped: true };
        }
        let held = self.held_back_len();
        let emit_len = self.pending.len() - held;
        let emit = self.pending[..emit_len].to_string();
        self.pending.drain(..emit_len);
        StopOutcome { emit, stopped: false }
    }

    /// The held-back remainder at the end of generation (empty after a stop).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length in bytes of the longest suffix of `pending` that is a proper prefix of a stop string.
    fn held_back_len(&self) -> usize {
        let pending = self.pending.as_bytes();
        let mut longest = 0;
        for stop in &self.stops {
            let stop = stop.as_bytes();
            // A complete match was ruled out by the caller, so only proper prefixes remain.
            let max = (stop.len() - 1).min(pending.len());
            for len in (longest + 1..=max).rev() {
                if pending[pending.len() - len..] == stop[..len]
                    && self.pending.is_char_boundary(self.pending.len() - len)
                {
                    longest = len;
                    break;
                }
            }
        }
        longest
    }
}
