//! Sampling filters against hand-computed references on small vocabularies, the draw against
//! softmax probabilities (chi-square), seed determinism, and stop-string holdback.

use hearth_core::sampling::{
    argmax, log_softmax, splitmix64, top_logprobs, Sampler, SamplingParams, StopOutcome, StopStrings,
    Xoshiro256StarStar,
};

fn params() -> SamplingParams {
    SamplingParams::default()
}

fn sampled(p: SamplingParams, logits: &[f32]) -> Vec<(u32, f32)> {
    Sampler::new(p).distribution(&mut logits.to_vec(), &[])
}

fn assert_distribution(got: &[(u32, f32)], want: &[(u32, f64)]) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for ((id, p), (want_id, want_p)) in got.iter().zip(want) {
        assert_eq!(id, want_id, "got {got:?}, want {want:?}");
        assert!((*p as f64 - want_p).abs() < 1e-5, "token {id}: p = {p}, want {want_p}");
    }
}

#[test]
fn greedy_takes_argmax_and_lowest_index_on_ties() {
    let mut sampler = Sampler::new(params());
    assert_eq!(sampler.sample(&mut [1.0, 3.0, 3.0, 2.0], &[]), 1);
    assert_eq!(sampler.sample(&mut [f32::NAN, -1.0, 5.0, f32::NAN], &[]), 2);
    assert_eq!(sampler.sample(&mut [f32::NEG_INFINITY; 3], &[]), 0);
    assert_eq!(argmax(&[0.5, 0.5]), 0);
    // Greedy ignores the filters and the random generator.
    let p = SamplingParams { top_k: 1, top_p: 0.1, min_p: 0.9, seed: 7, ..params() };
    assert_eq!(Sampler::new(p).sample(&mut [0.0, 0.1, -0.2], &[]), 1);
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative() {
    let p = SamplingParams { repeat_penalty: 2.0, ..params() };
    let mut logits = [2.0, -1.0, 0.5, 1.0];
    // Token 1 occurs twice: the repetition penalty still applies once (llama.cpp).
    let token = Sampler::new(p).sample(&mut logits, &[0, 1, 1]);
    assert_eq!(logits, [1.0, -2.0, 0.5, 1.0]);
    assert_eq!(token, 0); // 1.0 ties 1.0 at index 3: lowest index wins
}

#[test]
fn penalties_only_look_at_the_last_n_tokens() {
    let p = SamplingParams { repeat_penalty: 2.0, repeat_last_n: 2, ..params() };
    let mut logits = [2.0, 2.0, 2.0, 2.0];
    Sampler::new(p).sample(&mut logits, &[0, 1, 3, 3]);
    assert_eq!(logits, [2.0, 2.0, 2.0, 1.0]);
    let p = SamplingParams { repeat_penalty: 2.0, repeat_last_n: 0, ..params() };
    let mut logits = [2.0, 2.0];
    Sampler::new(p).sample(&mut logits, &[0, 1]);
    assert_eq!(logits, [2.0, 2.0]);
    // Out-of-vocabulary history entries are ignored, not a panic.
    let p = SamplingParams { repeat_penalty: 2.0, repeat_last_n: usize::MAX, ..params() };
    let mut logits = [2.0, 2.0];
    Sampler::new(p).sample(&mut logits, &[0, 99]);
    assert_eq!(logits, [1.0, 2.0]);
}

#[test]
fn presence_and_frequency_penalties_follow_openai() {
    // logit -= count * frequency + (count > 0) * presence
    let p = SamplingParams { presence_penalty: 0.5, frequency_penalty: 0.25, ..params() };
    let mut logits = [1.0, 1.0, 1.0];
    Sampler::new(p).sample(&mut logits, &[0, 0, 2]);
    assert_eq!(logits, [0.0, 1.0, 0.25]);
}

#[test]
fn logit_bias_adds_and_bans() {
    let mut p = params();
    p.logit_bias.insert(2, f32::NEG_INFINITY);
    p.logit_bias.insert(0, 1.5);
    p.logit_bias.insert(1000, 3.0); // out of vocabulary: ignored
    let mut logits = [1.0, 2.0, 9.0];
    assert_eq!(Sampler::new(p.clone()).sample(&mut logits, &[]), 0);
    assert_eq!(logits, [2.5, 2.0, f32::NEG_INFINITY]);
    // A banned token is never drawn, whatever the temperature.
    p.temperature = 5.0;
    let mut sampler = Sampler::new(p);
    for _ in 0..2000 {
        assert_ne!(sampler.sample(&mut [1.0, 2.0, 9.0], &[]), 2);
    }
}

#[test]
fn temperature_scales_logits() {
    // logits [0, ln 2] at T = 0.5 -> weights [1, 4] -> [0.2, 0.8]
    let p = SamplingParams { temperature: 0.5, ..params() };
    assert_distribution(&sampled(p, &[0.0, 2f32.ln()]), &[(1, 0.8), (0, 0.2)]);
    let p = SamplingParams { temperature: 1.0, ..params() };
    assert_distribution(&sampled(p, &[0.0, 2f32.ln()]), &[(1, 2.0 / 3.0), (0, 1.0 / 3.0)]);
}

#[test]
fn top_k_keeps_the_k_most_likely() {
    // logits [1, 4, 2, 3], k = 2 -> tokens 1 and 3 with softmax([4, 3])
    let p = SamplingParams { temperature: 1.0, top_k: 2, ..params() };
    let e = std::f64::consts::E;
    assert_distribution(&sampled(p, &[1.0, 4.0, 2.0, 3.0]), &[(1, e / (e + 1.0)), (3, 1.0 / (e + 1.0))]);
    let p = SamplingParams { temperature: 1.0, top_k: 10, ..params() }; // k > vocab: no-op
    assert_eq!(sampled(p, &[1.0, 4.0, 2.0, 3.0]).len(), 4);
}

fn ln_probs(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

#[test]
fn top_p_keeps_the_smallest_nucleus() {
    let logits = ln_probs(&[0.05, 0.5, 0.15, 0.3]);
    // cumulative 0.5, 0.8 >= 0.75: tokens 1, 3 renormalised
    let p = SamplingParams { temperature: 1.0, top_p: 0.75, ..params() };
    assert_distribution(&sampled(p, &logits), &[(1, 0.5 / 0.8), (3, 0.3 / 0.8)]);
    // 0.85 needs the third token too
    let p = SamplingParams { temperature: 1.0, top_p: 0.85, ..params() };
    assert_distribution(&sampled(p, &logits), &[(1, 0.5 / 0.95), (3, 0.3 / 0.95), (2, 0.15 / 0.95)]);
    // top_p is applied to temperature-1 probabilities, before the temperature (llama.cpp order)
    let p = SamplingParams { temperature: 2.0, top_p: 0.75, ..params() };
    let (a, b) = (0.5f64.sqrt(), 0.3f64.sqrt());
    assert_distribution(&sampled(p, &logits), &[(1, a / (a + b)), (3, b / (a + b))]);
}

#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_best() {
    let logits = ln_probs(&[0.05, 0.5, 0.15, 0.3]);
    // threshold 0.25 * 0.5 = 0.125: 0.05 goes
    let p = SamplingParams { temperature: 1.0, min_p: 0.25, ..params() };
    assert_distribution(&sampled(p, &logits), &[(1, 0.5 / 0.95), (3, 0.3 / 0.95), (2, 0.15 / 0.95)]);
    // threshold 0.175: 0.15 goes too
    let p = SamplingParams { temperature: 1.0, min_p: 0.35, ..params() };
    assert_distribution(&sampled(p, &logits), &[(1, 0.5 / 0.8), (3, 0.3 / 0.8)]);
}

#[test]
fn filters_chain_in_llama_cpp_order() {
    // bias first (token 0 becomes the favourite), then repetition penalty on token 0
    // (positive logit divided by 2), then top-k 3, top-p, min-p, temperature.
    let mut p = SamplingParams { temperature: 1.0, top_k: 3, top_p: 0.9, min_p: 0.05, repeat_penalty: 2.0, ..params() };
    p.logit_bias.insert(0, 4.0);
    // after bias: [6, 1, 3, 2.5, -1]; after penalty on 0: [3, 1, 3, 2.5, -1]
    // top-3: tokens 0, 2 (logit 3), 3 (2.5); probs ∝ [1, 1, e^-0.5]
    let w = (-0.5f64).exp();
    let total = 2.0 + w;
    // top-p 0.9: cumulative 1/total = 0.398, 2/total = 0.797, 1.0 -> all three stay
    // min-p 0.05: threshold 0.05 * 1/total, all stay
    let got = sampled_with_history(p, &[2.0, 1.0, 3.0, 2.5, -1.0], &[0]);
    assert_distribution(&got, &[(0, 1.0 / total), (2, 1.0 / total), (3, w / total)]);
}

fn sampled_with_history(p: SamplingParams, logits: &[f32], history: &[u32]) -> Vec<(u32, f32)> {
    Sampler::new(p).distribution(&mut logits.to_vec(), history)
}

/// Straightforward top-p by full sort, to check the incremental prefix sort on a big vocabulary.
fn reference_top_p(logits: &[f32], top_p: f64) -> Vec<u32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap().then(a.cmp(&b)));
    let total: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let mut cumulative = 0.0;
    let mut kept = Vec::new();
    for i in order {
        cumulative += ((logits[i] - max) as f64).exp() / total;
        kept.push(i as u32);
        if cumulative >= top_p {
            break;
        }
    }
    kept.sort();
    kept
}

#[test]
fn top_p_on_a_large_flat_vocabulary_needs_many_candidates() {
    // 50k tokens with nearly equal logits: the nucleus holds thousands (beyond the first prefix).
    let mut state = 99u64;
    let logits: Vec<f32> = (0..50_000).map(|_| (splitmix64(&mut state) >> 40) as f32 / (1u64 << 24) as f32).collect();
    for top_p in [0.05, 0.5, 0.95] {
        let p = SamplingParams { temperature: 1.0, top_p, ..params() };
        let mut got: Vec<u32> = sampled(p, &logits).into_iter().map(|(id, _)| id).collect();
        got.sort();
        let want = reference_top_p(&logits, top_p as f64);
        assert!(want.len() > 256, "test should exceed the first prefix, nucleus is {}", want.len());
        assert_eq!(got, want, "top_p {top_p}");
    }
}

#[test]
fn draws_match_softmax_probabilities() {
    let logits = [1.0f32, 0.0, 2.5, -1.0, 1.7, 0.3];
    let temperature = 0.8f32;
    let p = SamplingParams { temperature, seed: 1234, ..params() };
    let weights: Vec<f64> = logits.iter().map(|&l| (l as f64 / temperature as f64).exp()).collect();
    let total: f64 = weights.iter().sum();
    let n = 60_000;
    let mut counts = [0usize; 6];
    let mut sampler = Sampler::new(p);
    for _ in 0..n {
        counts[sampler.sample(&mut logits.clone(), &[]) as usize] += 1;
    }
    let chi_square: f64 = counts
        .iter()
        .zip(&weights)
        .map(|(&observed, w)| {
            let expected = n as f64 * w / total;
            (observed as f64 - expected).powi(2) / expected
        })
        .sum();
    // 5 degrees of freedom: P(chi² > 30) ≈ 1.5e-5; a wrong distribution lands in the thousands.
    assert!(chi_square < 30.0, "chi² = {chi_square}, counts {counts:?}");
}

#[test]
fn same_seed_same_tokens() {
    let logits: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32) / 20.0).collect();
    let p = SamplingParams { temperature: 1.0, top_k: 50, top_p: 0.9, seed: 42, ..params() };
    let run = |p: SamplingParams| {
        let mut sampler = Sampler::new(p);
        (0..200).map(|_| sampler.sample(&mut logits.clone(), &[])).collect::<Vec<u32>>()
    };
    let first = run(p.clone());
    assert_eq!(first, run(p.clone()));
    assert_ne!(first, run(SamplingParams { seed: 43, ..p.clone() }));
    let mut sampler = Sampler::new(p);
    sampler.sample(&mut logits.clone(), &[]);
    sampler.reseed(42);
    assert_eq!(sampler.sample(&mut logits.clone(), &[]), first[0]);
}

#[test]
fn generator_matches_published_algorithm() {
    // From tests/fixtures/sampling/xoshiro_reference.py (a transcription of the reference C code).
    let mut state = 0u64;
    assert_eq!(splitmix64(&mut state), 0xe220a8397b1dcdaf);
    let mut rng = Xoshiro256StarStar::seed_from_u64(0);
    let got: Vec<u64> = (0..4).map(|_| rng.next_u64()).collect();
    assert_eq!(got, [0x99ec5f36cb75f2b4, 0xbf6e1f784956452a, 0x1a5f849d4933e6e0, 0x6aa594f1262d2d2c]);
    let mut rng = Xoshiro256StarStar::seed_from_u64(42);
    let got: Vec<u64> = (0..4).map(|_| rng.next_u64()).collect();
    assert_eq!(got, [0x15780b2e0c2ec716, 0x6104d9866d113a7e, 0xae17533239e499a1, 0xecb8ad4703b360a1]);
    let mut rng = Xoshiro256StarStar::seed_from_u64(7);
    assert!((0..10_000).map(|_| rng.next_f64()).all(|u| (0.0..1.0).contains(&u)));
}

#[test]
fn log_softmax_and_top_logprobs() {
    let logits = [1.0f32, 2.0, 3.0, f32::NEG_INFINITY];
    // log-sum-exp(1, 2, 3) = 3 + ln(1 + e^-1 + e^-2) = 3.40760596
    let want = [1.0 - 3.40760596, 2.0 - 3.40760596, 3.0 - 3.40760596];
    let got = log_softmax(&logits);
    for (g, w) in got.iter().zip(want) {
        assert!((*g as f64 - w).abs() < 1e-6, "{got:?}");
    }
    assert_eq!(got[3], f32::NEG_INFINITY);
    let top = top_logprobs(&logits, 2);
    assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [2, 1]);
    assert!((top[0].1 as f64 - want[2]).abs() < 1e-6);
}

#[test]
fn sampling_params_round_trip_through_json() {
    let mut p = SamplingParams { temperature: 0.7, top_k: 40, top_p: 0.95, min_p: 0.05, seed: 9, ..params() };
    p.logit_bias.insert(13, -5.0);
    let json = serde_json::to_string(&p).expect("serialize");
    assert_eq!(serde_json::from_str::<SamplingParams>(&json).expect("deserialize"), p);
    // Missing fields take their defaults.
    let partial: SamplingParams = serde_json::from_str(r#"{"temperature": 0.5}"#).expect("deserialize");
    assert_eq!(partial, SamplingParams { temperature: 0.5, ..params() });
}

fn emitted(stops: &[&str], chunks: &[&str]) -> (Vec<StopOutcome>, String) {
    let mut stop = StopStrings::new(stops.iter().map(|s| s.to_string()).collect());
    let outcomes = chunks.iter().map(|c| stop.push(c)).collect();
    (outcomes, stop.finish())
}

fn out(emit: &str, stopped: bool) -> StopOutcome {
    StopOutcome { emit: emit.to_string(), stopped }
}

#[test]
fn stop_string_split_across_chunks_is_never_shown() {
    let (outcomes, rest) = emitted(&["</stop>"], &["Hello <", "/st", "op> world", "more"]);
    assert_eq!(outcomes, [out("Hello ", false), out("", false), out("", true), out("", true)]);
    assert_eq!(rest, "");
}

#[test]
fn false_starts_are_released_when_they_stop_matching() {
    let (outcomes, rest) = emitted(&["abc"], &["xab", "d", "a", "b"]);
    assert_eq!(outcomes, [out("x", false), out("abd", false), out("", false), out("", false)]);
    assert_eq!(rest, "ab"); // held back to the end, handed over by finish
                            // "aab!": the first "a" is released once "aa" arrived; the stop "ab" swallows the rest
    let (outcomes, _) = emitted(&["ab"], &["a", "a", "b!"]);
    assert_eq!(outcomes, [out("", false), out("a", false), out("", true)]);
}

#[test]
fn earliest_of_several_stop_strings_wins() {
    let (outcomes, _) = emitted(&["END", "\n\n"], &["one\n", "\ntwo END"]);
    assert_eq!(outcomes, [out("one", false), out("", true)]);
    let (outcomes, _) = emitted(&["\n\n", "END"], &["a EN", "D b\n\n"]);
    assert_eq!(outcomes, [out("a ", false), out("", true)]);
}

#[test]
fn multibyte_text_and_stop_strings() {
    // "→" is 3 bytes; a stop string starting with it is held back whole, never split.
    let (outcomes, rest) = emitted(&["→end"], &["a→", "e", "x→en", "d tail"]);
    assert_eq!(outcomes, [out("a", false), out("", false), out("→ex", false), out("", true)]);
    assert_eq!(rest, "");
    let (outcomes, rest) = emitted(&["é!"], &["café", " ok"]);
    assert_eq!(outcomes, [out("caf", false), out("é ok", false)]);
    assert_eq!(rest, "");
    // No stop strings (or only empty ones): everything passes straight through.
    let (outcomes, rest) = emitted(&[""], &["abc"]);
    assert_eq!(outcomes, [out("abc", false)]);
    assert_eq!(rest, "");
}
