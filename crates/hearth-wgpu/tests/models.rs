//! Whole models on wgpu against the CPU backend: the greedy continuation of a short prompt must be
//! the same tokens, and a warmed-up decode step must not build pipelines or bind groups.

mod common;

use hearth_core::backend::Backend;
use hearth_core::engine::{EngineOptions, Session};
use hearth_core::gguf::GgufFile;
use hearth_core::graph::LogitsMode;
use hearth_core::tokenizer::Tokenizer;
use hearth_tests::{argmax, cpu_session, model_path, GEMMA_270M, QWEN_05B};
use hearth_wgpu::{WgpuBackend, WgpuOptions};

const N_CTX: usize = 96;
const N_GENERATE: usize = 16;

fn wgpu_session(stem: &str) -> Option<(GgufFile, Session)> {
    let backend: WgpuBackend = common::open(WgpuOptions::from_env())?;
    let file = GgufFile::open(&model_path(stem)).expect("open model");
    let options = EngineOptions { n_ctx: N_CTX, ..EngineOptions::default() };
    let session = Session::load(&file, Box::new(backend), &options, &mut |_, _| {}).expect("load on wgpu");
    Some((file, session))
}

/// Prompt, then `N_GENERATE` greedy tokens (one decode step each).
fn greedy(session: &mut Session, prompt: &[u32]) -> Vec<u32> {
    let mut next = argmax(session.eval(prompt, LogitsMode::Last).expect("prefill")) as u32;
    let mut out = vec![next];
    while out.len() < N_GENERATE {
        next = argmax(session.eval(&[next], LogitsMode::Last).expect("decode")) as u32;
        out.push(next);
    }
    out
}

fn same_greedy_tokens(stem: &str, prompt: &str) {
    let Some((file, mut gpu)) = wgpu_session(stem) else { return };
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let tokens = tokenizer.encode(prompt, true, false).expect("encode");
    let (_, mut cpu) = cpu_session(stem, N_CTX);
    let want = greedy(&mut cpu, &tokens);
    let got = greedy(&mut gpu, &tokens);
    eprintln!("{stem}: cpu {want:?}\n{stem}: gpu {got:?}");
    assert_eq!(got, want, "{stem}: greedy tokens differ from the CPU backend");

    // Counters: decode steps after warm-up build nothing and submit at most twice.
    let before = gpu.backend().counters();
    let next = argmax(gpu.eval(&[*got.last().unwrap_or(&0)], LogitsMode::Last).expect("decode")) as u32;
    let after = gpu.backend().counters();
    eprintln!("{stem}: counters {after:?} (next {next})");
    assert_eq!(after.pipelines_created, before.pipelines_created, "a decode step created pipelines");
    assert_eq!(after.bind_groups_created, before.bind_groups_created, "a decode step created bind groups");
    assert!(after.submits - before.submits <= 2, "a decode step submitted {} times", after.submits - before.submits);
    assert_eq!(after.steps_executed, before.steps_executed + 1);
}

#[test]
fn gemma_270m_greedy_matches_cpu() {
    same_greedy_tokens(GEMMA_270M, "The capital of France is");
}

#[test]
fn qwen_05b_greedy_matches_cpu() {
    same_greedy_tokens(QWEN_05B, "def fibonacci(n):");
}
