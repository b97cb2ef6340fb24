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
