//! Shared helpers for the end-to-end tests: where the real models are, the llama.cpp reference
//! fixtures, and small numeric utilities.

pub mod golden;

use hearth_core::engine::{EngineOptions, Session};
use hearth_core::gguf::GgufFile;
use hearth_core::runner::Runner;
use hearth_core::speculative::BatchedDraftModel;
use hearth_core::tokenizer::Tokenizer;
pub use hearth_cpu::Numerics;
use hearth_cpu::{CpuBackend, CpuOptions};
use std::path::PathBuf;

pub const QWEN_05B: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";
pub const QWEN_15B: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m";
pub const GEMMA_270M: &str = "gemma-3-270m-q4_k_m";
pub const SMOLLM2_135M: &str = "smollm2-135m-instruct-q4_1";

/// Directory holding the real GGUF models: `$HEARTH_MODELS_DIR`, else `$HEARTH_CACHE_DIR/models`,
/// else the user cache dir (`hearth models fetch` puts them there).
pub fn models_dir() -> PathBuf {
    if let Ok(d) = std::env::var("HEARTH_MODELS_DIR") {
        return PathBuf::from(d);
    }
    if let Ok(d) = std::env::var("HEARTH_CACHE_DIR") {
        return PathBuf::from(d).join("models");
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(home).join(".cache"))
        .join("hearth/models")
}

/// Path of a real model; fails the test with instructions when it is missing (never skips).
pub fn model_path(stem: &str) -> PathBuf {
    let p = models_dir().join(format!("{stem}.gguf"));
    assert!(
        p.exists(),
        "model {} is missing: run `cargo run --release -p hearth -- models fetch <name>` (or set HEARTH_MODELS_DIR)",
        p.display()
    );
    p
}

pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

pub fn read_json(rel: &str) -> serde_json::Value {
    let p = fixtures_dir().join(rel);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", p.display()))
}

/// Opens a model on the CPU backend with the given context size.
pub fn cpu_session(stem: &str, n_ctx: usize) -> (GgufFile, Session) {
    cpu_session_at(&model_path(stem), n_ctx)
}

/// Opens the model file at `path` on the CPU backend with the given context size.
pub fn cpu_session_at(path: &std::path::Path, n_ctx: usize) -> (GgufFile, Session) {
    cpu_session_numerics(path, n_ctx, Numerics::Hearth)
}

/// [`cpu_session_at`] with the CPU backend computing in `numerics`.
pub fn cpu_session_numerics(path: &std::path::Path, n_ctx: usize, numerics: Numerics) -> (GgufFile, Session) {
    let file = GgufFile::open(path).unwrap_or_else(|e| panic!("open model {}: {e}", path.display()));
    let backend = CpuBackend::with_options(CpuOptions { numerics, ..CpuOptions::from_env() }).expect("cpu backend");
    let options = EngineOptions { n_ctx, ..EngineOptions::default() };
    let session = Session::load(&file, Box::new(backend), &options, &mut |_, _| {}).expect("load model");
    (file, session)
}

/// [`cpu_session`] with the CPU backend's Q4_K repacking on or off (`CpuOptions::repack`).
pub fn cpu_session_repack(stem: &str, n_ctx: usize, repack: bool) -> (GgufFile, Session) {
    let path = model_path(stem);
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("open model {}: {e}", path.display()));
    let backend = CpuBackend::with_options(CpuOptions { repack, ..CpuOptions::from_env() }).expect("cpu backend");
    let options = EngineOptions { n_ctx, ..EngineOptions::default() };
    let session = Session::load(&file, Box::new(backend), &options, &mut |_, _| {}).expect("load model");
    (file, session)
}

/// Opens a model on the CPU backend as a session with the given options.
pub fn cpu_session_with(stem: &str, options: &EngineOptions) -> (GgufFile, Session) {
    let path = model_path(stem);
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("open model {}: {e}", path.display()));
    let backend = CpuBackend::with_options(CpuOptions::from_env()).expect("cpu backend");
    let session = Session::load(&file, Box::new(backend), options, &mut |_, _| {}).expect("load model");
    (file, session)
}

/// Opens a model on the CPU backend as a multi-sequence [`Runner`] with the given options.
pub fn cpu_runner(stem: &str, options: &EngineOptions) -> (GgufFile, Runner) {
    let path = model_path(stem);
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("open model {}: {e}", path.display()));
    let backend = CpuBackend::with_options(CpuOptions::from_env()).expect("cpu backend");
    let runner = Runner::load(&file, Box::new(backend), options, &mut |_, _| {}).expect("load model");
    (file, runner)
}

pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// log-softmax of one row.
pub fn log_softmax(v: &[f32]) -> Vec<f32> {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = v.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    v.iter().map(|&x| (x as f64 - lse) as f32).collect()
}

pub fn as_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("array of ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// Perplexity on tests/fixtures/golden/ppl_gpl3_4k.txt computed as `llama-perplexity -c 512`
/// does (chunks of 512, the second half of each scored), over the first `max_chunks` chunks,
/// with K/V stored as `kv_type`. Returns (perplexity, tokens in the text).
pub fn perplexity_with(stem: &str, kv_type: hearth_core::kv::KvType, max_chunks: usize) -> (f64, usize) {
    let (chunks, n_tokens) = chunk_nlls(stem, kv_type, max_chunks);
    (perplexity_of(&chunks), n_tokens)
}

/// The perplexity of scored chunks given as (Σ negative log-likelihood, tokens scored).
pub fn perplexity_of(chunks: &[(f64, usize)]) -> f64 {
    let (nll, count) = chunks.iter().fold((0f64, 0usize), |(n, c), &(cn, cc)| (n + cn, c + cc));
    (nll / count as f64).exp()
}

/// [`perplexity_with`]'s chunks one by one: per chunk (Σ negative log-likelihood, tokens
/// scored), and the tokens in the text.
pub fn chunk_nlls(stem: &str, kv_type: hearth_core::kv::KvType, max_chunks: usize) -> (Vec<(f64, usize)>, usize) {
    use hearth_core::graph::LogitsMode;
    const N_CTX: usize = 512;
    let text = std::fs::read_to_string(fixtures_dir().join("golden/ppl_gpl3_4k.txt")).expect("text");
    let file = GgufFile::open(&model_path(stem)).expect("open");
    let tokenizer = hearth_core::tokenizer::Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let add_bos = tokenizer.add_bos_default();
    let tokens = tokenizer.encode(&text, add_bos, false).expect("tokenize");
    let options = EngineOptions { n_ctx: N_CTX, kv_type, ..EngineOptions::default() };
    let (_file, mut session) = cpu_session_with(stem, &options);
    let n_vocab = session.config().n_vocab;
    let mut chunks = Vec::new();
    for chunk in tokens.chunks_exact(N_CTX).take(max_chunks) {
        let mut input = chunk.to_vec();
        if add_bos {
            input[0] = tokenizer.bos().expect("bos");
        }
        session.reset();
        let logits = session.eval(&input, LogitsMode::All).expect("eval");
        // Only the second half of each chunk is scored: positions 256..511 predict 257..512.
        let mut nll = 0f64;
        for pos in N_CTX / 2..N_CTX - 1 {
            let lp = log_softmax(&logits[pos * n_vocab..(pos + 1) * n_vocab]);
            nll -= lp[input[pos + 1] as usize] as f64;
        }
        chunks.push((nll, N_CTX / 2 - 1));
    }
    (chunks, tokens.len())
}

/// `file` loaded onto `backend` with `options` as a draft model for `target` (whose vocabulary
/// it must share).
pub fn draft_model(
    file: &GgufFile,
    backend: Box<dyn hearth_core::backend::Backend>,
    options: &EngineOptions,
    target: &Tokenizer,
) -> BatchedDraftModel {
    let runner = Runner::load(file, backend, options, &mut |_, _| {}).expect("load draft model");
    let draft_tokenizer = Tokenizer::from_gguf(&file.metadata).expect("draft tokenizer");
    BatchedDraftModel::new(runner, &draft_tokenizer, target, options.prefill_chunk).expect("same vocabulary")
}
