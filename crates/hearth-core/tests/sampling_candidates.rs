//! Sampling from a backend's top-k candidates (`Readback::TopK`) instead of the full logits row:
//! the sampler asks for candidates only when they are all it needs, and then picks exactly the
//! tokens, with the same random stream, that it picks from the full row.

use hearth_core::backend::{Readback, TopK};
use hearth_core::sampling::{argmax, top_k_rows, Sampler, SamplingParams, MAX_ADJUSTED_CANDIDATES, MAX_CANDIDATES};
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
    let readback = |p: SamplingParams, history: &[u32]| Sampler::new(p).readback(history);
    assert_eq!(readback(greedy.clone(), &[]), Readback::TopK(1));
    assert_eq!(readback(top_k.clone(), &[]), Readback::TopK(40));
    assert_eq!(
        readback(SamplingParams { top_k: MAX_CANDIDATES, ..top_k.clone() }, &[]),
        Readback::TopK(MAX_CANDIDATES)
    );
    // The whole row: no top-k (top-p over the whole vocabulary), too many candidates.
    assert_eq!(readback(SamplingParams { top_k: 0, ..top_k.clone() }, &[]), Readback::Logits);
    assert_eq!(readback(SamplingParams { top_k: MAX_CANDIDATES + 1, ..top_k.clone() }, &[]), Readback::Logits);
    // Penalties that only lower logits: one more candidate per distinct token of the window.
    let history = [5, 9, 9, 2, 5, 7, 7];
    let repeat = SamplingParams { repeat_penalty: 1.1, repeat_last_n: 4, ..greedy.clone() };
    assert_eq!(readback(repeat.clone(), &history), Readback::TopK(1 + 3), "window 2, 5, 7, 7");
    assert_eq!(Sampler::new(repeat.clone()).readback_after(&history, &[3]), Readback::TopK(1 + 3), "window 5, 7, 7, 3");
    assert_eq!(
        readback(SamplingParams { presence_penalty: 0.5, frequency_penalty: 0.1, ..top_k.clone() }, &history),
        Readback::TopK(40 + 4)
    );
    // Penalties over an empty window are no penalties.
    assert_eq!(readback(SamplingParams { repeat_last_n: 0, ..repeat.clone() }, &history), Readback::TopK(1));
    assert_eq!(readback(repeat.clone(), &[]), Readback::TopK(1));
    // A negative bias (a ban included) lowers like a penalty; the biased tokens count once.
    let bias = BTreeMap::from([(3, -1.0), (7, f32::NEG_INFINITY)]);
    assert_eq!(
        readback(SamplingParams { logit_bias: bias.clone(), ..greedy.clone() }, &history),
        Readback::TopK(1 + 2)
    );
    assert_eq!(
        readback(SamplingParams { logit_bias: bias, ..repeat.clone() }, &history),
        Readback::TopK(1 + 4),
        "bias 3, 7; window 2, 5, 7: 7 counts once"
    );
    // What may raise a logit reads the whole row: a penalty below 1, negative presence or
    // frequency penalties, a positive or NaN bias, NaN or infinite parameters.
    for params in [
        SamplingParams { repeat_penalty: 0.9, ..repeat.clone() },
        SamplingParams { presence_penalty: -0.5, ..repeat.clone() },
        SamplingParams { frequency_penalty: -0.1, ..repeat.clone() },
        SamplingParams { repeat_penalty: f32::NAN, ..repeat.clone() },
        SamplingParams { repeat_penalty: f32::INFINITY, ..repeat.clone() },
        SamplingParams { logit_bias: BTreeMap::from([(3, 0.5)]), ..greedy.clone() },
        SamplingParams { logit_bias: BTreeMap::from([(3, f32::NAN)]), ..greedy.clone() },
    ] {
        assert_eq!(readback(params.clone(), &history), Readback::Logits, "{params:?}");
    }
    // More lowered tokens than the device reduces: the whole row.
    let long: Vec<u32> = (0..MAX_ADJUSTED_CANDIDATES as u32).collect();
    let whole_history = SamplingParams { repeat_last_n: usize::MAX, ..repeat };
    assert_eq!(
        readback(whole_history.clone(), &long[..MAX_ADJUSTED_CANDIDATES - 1]),
        Readback::TopK(MAX_ADJUSTED_CANDIDATES)
    );
    assert_eq!(readback(whole_history, &long), Readback::Logits);
}

/// Runs `steps` draws with `params` on fresh random rows, once from the full row and once from
/// the candidates `readback` asks for; returns both token streams.
fn both_paths(params: &SamplingParams, n_vocab: usize, steps: usize, rng: &mut Rng) -> (Vec<u32>, Vec<u32>) {
    let mut full = Sampler::new(params.clone());
    let mut from_candidates = Sampler::new(params.clone());
    let Readback::TopK(k) = from_candidates.readback(&[]) else { panic!("{params:?} should read back candidates") };
    let mut top = TopK::default();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let mut logits = rng.logits(n_vocab);
        top_k_rows(&logits, n_vocab, k, &mut top);
        let (ids, values) = top.row(0);
        b.push(from_candidates.sample_candidates(ids, values, &[]));
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
                configs.push(SamplingParams {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    seed: configs.len() as u64,
                    ..SamplingParams::default()
                });
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
            assert_eq!(sampler.sample_candidates(&top.ids, &top.logits, &[]), argmax(&logits));
        }
    }
    // Every logit -inf or NaN: both fall back to token 0.
    let dead = [f32::NAN, f32::NEG_INFINITY, f32::NAN];
    top_k_rows(&dead, 3, 1, &mut top);
    assert_eq!(top.ids, [0]);
    assert_eq!(argmax(&dead), 0);
}

/// Generation-like runs with penalties and a negative bias: each step's history is the previous
/// one plus the token drawn (so the tokens most likely to win are the ones penalised), the
/// candidates are read as `readback` asks for that history, and the tokens, the random stream and
/// the verification distributions must equal those of the full row.
fn both_paths_with_history(
    params: &SamplingParams,
    n_vocab: usize,
    steps: usize,
    rng: &mut Rng,
) -> (Vec<u32>, Vec<u32>) {
    let mut full = Sampler::new(params.clone());
    let mut from_candidates = Sampler::new(params.clone());
    let mut history: Vec<u32> = (0..8).map(|_| (rng.next() % n_vocab as u64) as u32).collect();
    let mut top = TopK::default();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let Readback::TopK(k) = from_candidates.readback(&history) else {
            panic!("{params:?} should read back candidates")
        };
        let logits = rng.logits(n_vocab);
        top_k_rows(&logits, n_vocab, k, &mut top);
        let (ids, values) = top.row(0);
        let want = full.distribution(&mut logits.clone(), &history);
        assert_eq!(
            from_candidates.distribution_candidates(ids, values, &history),
            want,
            "{params:?}, history {history:?}"
        );
        let token = from_candidates.sample_candidates(ids, values, &history);
        b.push(token);
        a.push(full.sample(&mut logits.clone(), &history));
        history.push(token);
    }
    (a, b)
}

#[test]
fn penalties_and_negative_bias_on_candidates_equal_the_full_row() {
    let mut rng = Rng(0xbeef);
    let mut configs = Vec::new();
    for (temperature, top_k) in [(0.0, 0), (0.7, 1), (1.0, 5), (1.3, 40)] {
        for (repeat_penalty, presence_penalty, frequency_penalty) in
            [(1.0, 0.0, 0.0), (1.3, 0.0, 0.0), (1.0, 0.75, 0.5), (2.0, 1.5, 0.25)]
        {
            for repeat_last_n in [1, 16, usize::MAX] {
                for bias in [BTreeMap::new(), BTreeMap::from([(1, -2.0), (4, f32::NEG_INFINITY), (17, -0.25)])] {
                    configs.push(SamplingParams {
                        temperature,
                        top_k,
                        top_p: 0.9,
                        min_p: 0.02,
                        repeat_penalty,
                        presence_penalty,
                        frequency_penalty,
                        repeat_last_n,
                        logit_bias: bias,
                        seed: configs.len() as u64,
                    });
                }
            }
        }
    }
    let mut penalised_choices_differ = 0;
    for n_vocab in [6, 40, 1001] {
        for params in &configs {
            let (full, candidates) = both_paths_with_history(params, n_vocab, 30, &mut rng);
            assert_eq!(full, candidates, "n_vocab {n_vocab}, {params:?}");
            // The penalties change choices (so the comparison above covers them): the same run
            // without them picks other tokens.
            let plain = SamplingParams {
                repeat_penalty: 1.0,
                presence_penalty: 0.0,
                frequency_penalty: 0.0,
                logit_bias: BTreeMap::new(),
                ..params.clone()
            };
            let mut replay = Rng(rng.0);
            let (with, _) = both_paths_with_history(params, n_vocab, 30, &mut Rng(rng.0));
            let (without, _) = both_paths_with_history(&plain, n_vocab, 30, &mut replay);
            penalised_choices_differ += usize::from(with != without);
        }
    }
    assert!(penalised_choices_differ > configs.len(), "penalties changed only {penalised_choices_differ} runs");
}
