//! Greedy generation of the three real models against llama.cpp (tests/fixtures/golden, produced
//! by llama.cpp at the commit named there), 4 prompts each (plain and chat), 48 tokens. The rules
//! and why they have tolerances: tests/support/golden.rs.

use hearth_tests::golden::{compare_with_llama_cpp, Tolerance};
use hearth_tests::*;

fn check(stem: &str, tol: Tolerance) {
    let golden = read_json(&format!("golden/{stem}.json"));
    let (_file, mut session) = cpu_session(stem, 512);
    let report = compare_with_llama_cpp(stem, &mut session, &golden, tol);
    assert!(report.top1_agree * 100 >= report.steps * 95, "{stem}: top-1 agrees on only {}/{} steps", report.top1_agree, report.steps);
}

#[test]
fn qwen_05b_matches_llama_cpp() {
    check(QWEN_05B, Tolerance { mean_logprob: 0.08, max_logprob: 0.6, decisive_margin: 0.25 });
}

#[test]
fn gemma_270m_matches_llama_cpp() {
    check(GEMMA_270M, Tolerance { mean_logprob: 0.15, max_logprob: 1.2, decisive_margin: 0.5 });
}

#[test]
fn qwen_15b_matches_llama_cpp() {
    check(QWEN_15B, Tolerance { mean_logprob: 0.08, max_logprob: 0.6, decisive_margin: 0.25 });
}
