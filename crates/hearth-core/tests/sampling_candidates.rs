//! Sampling from a backend's top-k candidates (`Readback::TopK`) instead of the full logits row:
//! the sampler asks for candidates only when they are all it needs, and then picks exactly the
//! tokens, with the same random stream, that it picks from the full row.

use hearth_core::backend::{Readback, TopK};
use hearth_core::sampling::{argmax, top_k_rows, Sampler, SamplingParams, MAX_CANDIDATES};
use std::collections::BTreeMap;

/// xorshift64*: reproducible logits.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Logits on a coarse grid (many exact ties), with some `-inf` and NaN.
    fn logits(&mut self, n_vocab: usize) -> Vec<f32> {
        (0..n_vocab)
            .map(|_| match self.next() % 200 {
                0 | 1 => f32::NEG_INFINITY,
                2 => f32::NAN,
                r => ((r % 33) as f32 - 16.0) * 0.25,
            })
            .collect()
    }
}

#[test]
fn readback_asks_for_candidates_only_when_they_suffice() {
    let greedy = SamplingParams::default();
    let top_k = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, ..SamplingParams::default() };
    let readback = |p: SamplingParams| Sampler::new(p).readback();
    assert_eq!(readback(greedy.clone()), Readback::TopK(1));
    assert_eq!(readback(top_k.clone()), Readback::TopK(40));
    assert_eq!(readback(SamplingParams { top_k: MAX_CANDIDATES, ..top_k.clone() }), Readback::TopK(MAX_CANDIDATES));
    // The whole row: no top-k (top-p over the whole vocabulary), too many candidates, penalties,
    // a logit bias.
    assert_eq!(readback(SamplingParams { top_k: 0, ..top_k.clone() }), Readback::Logits);
    assert_eq!(readback(SamplingParams { top_k: MAX_CANDIDATES + 1, ..top_k.clone() }), Readback::Logits);
    assert_eq!(readback(SamplingParams { repeat_penalty: 1.1, ..greedy.clone() }), Readback::Logits);
    assert_eq!(readback(SamplingParams { presence_penalty: 0.5, ..top_k.clone() }), Readback::Logits);
    assert_eq!(readback(SamplingParams { logit_bias: BTreeMap::from([(3, -1.0)]), ..greedy.clone() }), Readback::Logits);
    // Penalties over an empty window are no penalties.
    assert_eq!(readback(SamplingParams { repeat_penalty: 1.1, repeat_last_n: 0, ..greedy }), Readback::TopK(1));
}

/// Runs `steps` draws with `params` on fresh random rows, once from the full row and once from
/// the candidates `readback` asks for; returns both token streams.
fn both_paths(params: &SamplingParams, n_vocab: usize, steps: usize, rng: &mut Rng) -> (Vec<u32>, Vec<u32>) {
    let mut full = Sampler::new(params.clone());
    let mut from_candidates = Sampler::new(params.clone());
    let Readback::TopK(k) = from_candidates.readback() else { panic!("{params:?} should read back candidates") };
    let mut top = TopK::default();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let mut logits = rng.logits(n_vocab);
        top_k_rows(&logits, n_vocab, k, &mut top);
        let (ids, values) = top.row(0);
        b.push(from_candidates.sample_candidates(ids, values));
        a.push(full.sample(&mut logits, &[]));
    }
    (a, b)
}

#[test]
fn seeded_sampling_from_candidates_equals_sampling_from_full_logits() {
    let mut rng = Rng(0x5eed);
    let mut configs = Vec::new();
    for top_k in [1, 2, 7, 40, MAX_CANDIDATES] {
        for (top_p, min_p) in [(1.0, 0.0), (0.9, 0.0), (1.0, 0.1), (0.5, 0.05)] {
            for temperature in [0.3, 1.0, 1.7] {
                configs.push(SamplingParams { temperature, top_k, top_p, min_p, seed: configs.len() as u64, ..SamplingParams::default() });
            }
        }
    }
    // Vocabularies smaller than, near and far above k.
    for n_vocab in [5, 63, 1001] {
        for params in &configs {
            let (full, candidates) = both_paths(params, n_vocab, 40, &mut rng);
            assert_eq!(full, candidates, "n_vocab {n_vocab}, {params:?}");
        }
    }
    // The draws are not all the same token (the comparison above means something).
    let p = SamplingParams { temperature: 1.0, top_k: 40, seed: 3, ..SamplingParams::default() };
    let (tokens, _) = both_paths(&p, 1001, 50, &mut rng);
    let mut distinct = tokens.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 10, "{tokens:?}");
}

#[test]
fn greedy_top_one_is_argmax() {
    let mut rng = Rng(7);
    let mut top = TopK::default();
    for n_vocab in [1, 2, 31, 4097] {
        for _ in 0..50 {
            let logits = rng.logits(n_vocab);
            top_k_rows(&logits, n_vocab, 1, &mut top);
            let mut sampler = Sampler::new(SamplingParams::default());
            assert_eq!(sampler.sample_candidates(&top.ids, &top.logits), argmax(&logits));
        }
    }
    // Every logit -inf or NaN: both fall back to token 0.
    let dead = [f32::NAN, f32::NEG_INFINITY, f32::NAN];
    top_k_rows(&dead, 3, 1, &mut top);
    assert_eq!(top.ids, [0]);
    assert_eq!(argmax(&dead), 0);
}
