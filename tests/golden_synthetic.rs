//! Tiny synthetic models (tests/fixtures/synthetic/make_models.py: random weights, fixed seeds)
//! against llama.cpp's llama-server (make_reference.py). They cover what the real models do not:
//! llama (MHA), qwen2 with MQA and biases, and gemma3 (F32)
//! with an 8-token sliding window that 45-64-token sequences cross. Models and references are in
//! the repository, so this runs with no download.
//!
//! Per prompt, as tests/golden_greedy.rs does:
//! 1. teacher-forced (prompt in one batch, then one token per step): our top-1 must be llama.cpp's
//!    token unless llama.cpp's own top-1/top-2 margin there is below NEAR_TIE_MARGIN; our log-probs
//!    of llama.cpp's top-5 must be within LOGPROB_TOLERANCE;
//! 2. free-running greedy decode must reproduce llama.cpp's tokens up to the first step where its
//!    margin is below NEAR_TIE_MARGIN (after that the sequences may legitimately diverge).

use hearth_core::graph::LogitsMode;
use hearth_tests::*;

/// llama.cpp top-1/top-2 log-prob margins below this count as ties that rounding may flip.
const NEAR_TIE_MARGIN: f32 = 0.02;
/// For F32/F16 models: measured worst 0.0056 (gemma3), 0.005 (llama), 0.0015 (qwen2).
const LOGPROB_TOLERANCE: f32 = 0.02;
// Not tested here yet: llama-gqa-q8_0, qwen3-gqa-q4_k and gemma3-swa-q8_0 (fixtures committed).
// They match llama.cpp to ~1e-4 on most steps but then drift by 0.05-0.18 nats and pick other
// tokens at non-tie steps (gemma3 from step 0, although its F32 twin below matches to 0.0056):
// a quantized-path difference still to be found.

fn check_model(stem: &str, logprob_tolerance: f32) {
    let golden = read_json(&format!("synthetic/{stem}.json"));
    let path = fixtures_dir().join("synthetic").join(format!("{stem}.gguf"));
    let (_file, mut session) = cpu_session_at(&path, 256);
    let n_vocab = session.config().n_vocab;
    let debug = std::env::var("HEARTH_DEBUG_GOLDEN").is_ok();
    let mut worst_logprob_err = 0f32;
    let cases = golden["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 4, "{stem}: expected 4 cases");
    for case in cases {
        let id = case["id"].as_str().unwrap_or("?");
        let prompt = as_ids(&case["prompt_token_ids"]);
        let expected = as_ids(&case["generated_token_ids"]);
        let steps = case["top5_logprobs_per_step"].as_array().expect("top5");
        assert_eq!(expected.len(), 24, "{stem} case {id}: llama.cpp stopped early");
        let margin = |step: usize| {
            let top = steps[step]["top"].as_array().expect("top");
            let lp = |i: usize| top[i]["logprob"].as_f64().expect("logprob") as f32;
            lp(0) - lp(1)
        };

        // 1. Teacher-forced.
        session.reset();
        let mut logits = session.eval(&prompt, LogitsMode::Last).expect("prefill").to_vec();
        for (step, &want) in expected.iter().enumerate() {
            if step > 0 {
                logits = session.eval(&[expected[step - 1]], LogitsMode::Last).expect("decode").to_vec();
            }
            let row = &logits[..n_vocab];
            let got = argmax(row) as u32;
            let lp = log_softmax(row);
            if got != want && !debug {
                assert!(
                    margin(step) < NEAR_TIE_MARGIN,
                    "{stem} case {id} step {step}: we pick {got} (log-prob {}), llama.cpp {want} (ours {}, theirs {}); \
                     llama.cpp's margin {} is not a near-tie",
                    lp[got as usize],
                    lp[want as usize],
                    steps[step]["logprob"],
                    margin(step)
                );
            }
            for top in steps[step]["top"].as_array().expect("top") {
                let tid = top["id"].as_u64().expect("id") as usize;
                let want_lp = top["logprob"].as_f64().expect("logprob") as f32;
                let err = (lp[tid] - want_lp).abs();
                worst_logprob_err = worst_logprob_err.max(err);
                if debug {
                    eprintln!("{stem} {id} step {step} token {tid}: ours {:.4} llama.cpp {want_lp:.4}", lp[tid]);
                    continue;
                }
                assert!(
                    err < logprob_tolerance,
                    "{stem} case {id} step {step}: log-prob of token {tid} is {} here, {want_lp} in llama.cpp",
                    lp[tid]
                );
            }
        }

        // 2. Free-running greedy decode, one token per step, up to the first llama.cpp near-tie.
        session.reset();
        let mut next = argmax(session.eval(&prompt, LogitsMode::Last).expect("prefill")) as u32;
        for (step, &want) in expected.iter().enumerate() {
            if margin(step) < NEAR_TIE_MARGIN {
                break;
            }
            assert!(debug || next == want, "{stem} case {id}: free-running greedy differs at step {step}: {next} vs llama.cpp {want}");
            if step + 1 == expected.len() {
                break;
            }
            next = argmax(session.eval(&[next], LogitsMode::Last).expect("decode")) as u32;
        }
    }
    eprintln!("{stem}: worst |log-prob - llama.cpp| over top-5 = {worst_logprob_err:.5}");
}

#[test]
fn llama_mha_f16_matches_llama_cpp() {
    check_model("llama-mha-f16", LOGPROB_TOLERANCE);
}

#[test]
fn qwen2_mqa_biases_matches_llama_cpp() {
    check_model("qwen2-mqa-f32", LOGPROB_TOLERANCE);
}

#[test]
fn gemma3_sliding_window_f32_matches_llama_cpp() {
    check_model("gemma3-swa-f32", LOGPROB_TOLERANCE);
}
