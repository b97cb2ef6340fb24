//! Tiny synthetic models (tests/fixtures/synthetic/make_models.py: random weights, fixed seeds)
//! against llama.cpp's llama-server (make_reference.py): the architectures and shapes the real
//! models do not cover — llama (MHA, GQA with Q8_0, YaRN context extension), qwen3 (q/k norm, GQA, Q4_K/Q6_K), qwen2
//! with MQA and biases, granite (its four multipliers, an attention output bias), gemma3 with an
//! 8-token sliding window that the 45-64-token sequences cross, the mixtures of experts qwen3moe,
//! olmoe (8 experts, 2 per token), Mixtral (llama with 4 experts, 2 per token), qwen2moe (a
//! sigmoid-gated shared expert), granitemoe (Mixtral's shapes with Granite's multipliers and an
//! ungated shared expert) and gpt-oss (attention sinks, YaRN, a sliding window on every other
//! layer, biased experts with the clamped SwiGLU, weighed by a softmax over the chosen) and
//! deepseek2 in V2-Lite's form (multi-head latent attention, YaRN, a leading dense layer, a
//! shared expert) and V3's (compressed queries, sigmoid routing with a selection bias and expert
//! groups); seeds whose routing has a
//! near-tie are not used, since either expert is right there and the two pick differently by
//! whole nats.
//! Models and references are in the repository, so this runs with no download. Rules:
//! tests/support/golden.rs. Unquantized models must agree to 0.03 nats at worst (0.005 on
//! average): llama.cpp's decode attention rounds its V accumulator to f16 at every key, ours
//! stays in f32 (one batch-invariant path, see crates/hearth-cpu/src/attention/mod.rs), which
//! moves the worst log-prob by ~0.02. Quantized ones carry llama.cpp's activation-quantization
//! noise and get the real models' bounds.

use hearth_tests::golden::{check_synthetic, SYNTHETIC_MODELS};
use hearth_tests::*;

fn check(stem: &str) {
    let tol = SYNTHETIC_MODELS.iter().find(|(s, _)| *s == stem).map(|(_, tol)| *tol).expect("a synthetic model");
    let path = fixtures_dir().join("synthetic").join(format!("{stem}.gguf"));
    let (_file, mut session) = cpu_session_at(&path, 256);
    check_synthetic(stem, &mut session, tol);
}

#[test]
fn llama_mha_f16_matches_llama_cpp() {
    check("llama-mha-f16");
}

#[test]
fn qwen2_mqa_biases_matches_llama_cpp() {
    check("qwen2-mqa-f32");
}

#[test]
fn gemma3_sliding_window_f32_matches_llama_cpp() {
    check("gemma3-swa-f32");
}

#[test]
fn llama_gqa_q8_0_matches_llama_cpp() {
    check("llama-gqa-q8_0");
}

#[test]
fn qwen3_gqa_q4_k_matches_llama_cpp() {
    check("qwen3-gqa-q4_k");
}

#[test]
fn gemma3_sliding_window_q8_0_matches_llama_cpp() {
    check("gemma3-swa-q8_0");
}

#[test]
fn qwen3moe_f32_matches_llama_cpp() {
    check("qwen3moe-f32");
}

#[test]
fn qwen3moe_q8_0_matches_llama_cpp() {
    check("qwen3moe-q8_0");
}

#[test]
fn olmoe_f32_matches_llama_cpp() {
    check("olmoe-f32");
}

#[test]
fn mixtral_f32_matches_llama_cpp() {
    check("mixtral-f32");
}

#[test]
fn mixtral_q8_0_matches_llama_cpp() {
    check("mixtral-q8_0");
}

#[test]
fn qwen2moe_f32_matches_llama_cpp() {
    check("qwen2moe-f32");
}

#[test]
fn gpt_oss_f32_matches_llama_cpp() {
    check("gpt-oss-f32");
}

#[test]
fn gpt_oss_mxfp4_matches_llama_cpp() {
    check("gpt-oss-mxfp4");
}

#[test]
fn deepseek2_f32_matches_llama_cpp() {
    check("deepseek2-f32");
}

#[test]
fn deepseek3_f32_matches_llama_cpp() {
    check("deepseek3-f32");
}

#[test]
fn granite_f16_matches_llama_cpp() {
    check("granite-f16");
}

#[test]
fn granitemoe_f32_matches_llama_cpp() {
    check("granitemoe-f32");
}

#[test]
fn llama_yarn_f32_matches_llama_cpp() {
    check("llama-yarn-f32");
}
