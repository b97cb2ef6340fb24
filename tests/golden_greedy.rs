//! Greedy generation of the four real models on the CPU backend against llama.cpp
//! (tests/fixtures/golden, produced by llama.cpp at the commit named there), 4 prompts each (plain
//! and chat), 48 tokens, run as llama.cpp ran them: one token a step, teacher-forced and free
//! running. The rules and why they have tolerances: tests/support/golden.rs. The conformance suite
//! (crates/hearth-backend-tests, goldens.rs) holds every backend to the same references and bounds
//! with each case in one batch.

use hearth_core::graph::LogitsMode;
use hearth_tests::golden::{compare_with_llama_cpp, Tolerance};
use hearth_tests::*;

fn check(stem: &str, tol: Tolerance) {
    let golden = read_json(&format!("golden/{stem}.json"));
    let (_file, mut session) = cpu_session(stem, 512);
    let report = compare_with_llama_cpp(stem, &mut session, &golden, tol);
    assert!(
        report.top1_agree * 100 >= report.steps * 95,
        "{stem}: top-1 agrees on only {}/{} steps",
        report.top1_agree,
        report.steps
    );
}

#[test]
fn qwen_05b_matches_llama_cpp() {
    check(QWEN_05B, Tolerance::REAL_QWEN);
}

#[test]
fn gemma_270m_matches_llama_cpp() {
    check(GEMMA_270M, Tolerance::REAL_GEMMA);
}

#[test]
fn qwen_15b_matches_llama_cpp() {
    check(QWEN_15B, Tolerance::REAL_QWEN);
}

#[test]
fn smollm2_135m_matches_llama_cpp() {
    check(SMOLLM2_135M, Tolerance::REAL_SMOLLM2);
}

/// With the CPU backend in llama.cpp's numerics (hearth-cpu's compat.rs: its f16 flash attention,
/// its batch-dependent Q4_K/Q6_K mat-mul roundings; SmolLM2's Q4_1 mat-muls already round as
/// llama.cpp's do) our logits are llama.cpp's bit for bit on these prompts; what remains of
/// |Δ log-prob| (< 1e-3) is the fixture's own softmax (llama-server computes the log-probs in f32
/// over the sorted vocabulary). So every token must match, free
/// running and teacher-forced, and a near-tie may only be one below 1e-2.
fn check_exact(stem: &str) {
    let golden = read_json(&format!("golden/{stem}.json"));
    let (_file, mut session) = cpu_session_numerics(&model_path(stem), 512, Numerics::LlamaCpp);
    let tol = Tolerance { mean_logprob: 1e-3, max_logprob: 5e-3, decisive_margin: 1e-2 };
    let report = compare_with_llama_cpp(&format!("{stem} (llama.cpp numerics)"), &mut session, &golden, tol);
    assert_eq!(report.top1_agree, report.steps, "{stem}: teacher-forced top-1 differs from llama.cpp");
    assert_eq!(
        report.free_running_matched,
        4 * 32,
        "{stem}: free-running greedy parts from llama.cpp within 32 tokens"
    );
}

#[test]
fn qwen_05b_matches_llama_cpp_exactly_with_its_numerics() {
    check_exact(QWEN_05B);
}

#[test]
fn gemma_270m_matches_llama_cpp_exactly_with_its_numerics() {
    check_exact(GEMMA_270M);
}

#[test]
fn qwen_15b_matches_llama_cpp_exactly_with_its_numerics() {
    check_exact(QWEN_15B);
}

#[test]
fn smollm2_135m_matches_llama_cpp_exactly_with_its_numerics() {
    check_exact(SMOLLM2_135M);
}

/// Q4_K weights repacked into 16-row tiles (the CPU backend's default where the CPU has AVX-512
/// VNNI) give the logits of the rows as stored, bit for bit: a 40-token prompt read (a prefill
/// tile), single-token decode steps, and 5-token passes (speculative verification). Where the CPU
/// lacks the kernel nothing is repacked and both sessions run the same code.
#[test]
fn repacked_q4k_weights_keep_the_logits_bit_for_bit() {
    eprintln!("x16 kernel on this CPU: {}", hearth_cpu::kernels::q4k_x16_available());
    let (_f1, mut repacked) = cpu_session_repack(QWEN_05B, 256, true);
    let (_f2, mut rows) = cpu_session_repack(QWEN_05B, 256, false);
    let prompt: Vec<u32> = (0..40u32).map(|i| (i.wrapping_mul(2654435761) >> 8) % 30000 + 100).collect();
    let mut steps = vec![prompt];
    for i in 0..4u32 {
        steps.push(vec![1000 + i]);
        steps.push((0..5).map(|j| 2000 + 7 * i + j).collect());
    }
    for (n, ids) in steps.iter().enumerate() {
        let a = repacked.eval(ids, LogitsMode::All).expect("eval repacked").to_vec();
        let b = rows.eval(ids, LogitsMode::All).expect("eval rows").to_vec();
        assert_eq!(a.len(), b.len());
        let differing = a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        assert_eq!(differing, 0, "step {n} ({} tokens): {differing} logits differ", ids.len());
    }
}
