//! Logits processing and sampling. Being written: see the sampling task.

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, seed: 0 }
    }
}

pub struct Sampler {
    params: SamplingParams,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        Sampler { params }
    }
    pub fn sample(&mut self, logits: &mut [f32], _history: &[u32]) -> u32 {
        let _ = &self.params;
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                best = i;
            }
        }
        best as u32
    }
}

/// Result of feeding text to [`StopStrings`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StopOutcome {
    pub emit: String,
    pub stopped: bool,
}

pub struct StopStrings {
    stops: Vec<String>,
    held: String,
}

impl StopStrings {
    pub fn new(stops: Vec<String>) -> Self {
        StopStrings { stops, held: String::new() }
    }
    pub fn push(&mut self, text: &str) -> StopOutcome {
        self.held.push_str(text);
        for s in &self.stops {
            if let Some(i) = self.held.find(s.as_str()) {
                let emit = self.held[..i].to_string();
                self.held.clear();
                return StopOutcome { emit, stopped: true };
            }
        }
        StopOutcome { emit: std::mem::take(&mut self.held), stopped: false }
    }
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}
