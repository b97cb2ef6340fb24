//! What only a backend that samples on the device has, on a real model: its top-k candidates give
//! the tokens of the full-logits path. The whole-model checks every backend runs (greedy tokens,
//! quantized KV, batches, speculative decoding against the CPU) are the conformance suite's
//! (tests/conformance.rs with `--features real-models`).

mod common;

use hearth_core::engine::{EngineOptions, Session};
use hearth_core::gguf::GgufFile;
use hearth_core::graph::LogitsMode;
use hearth_tests::{model_path, GEMMA_270M};
use hearth_wgpu::WgpuOptions;

const N_CTX: usize = 96;

/// Sampling on the device: the engine's greedy decoding reads back the top 1 (GPU argmax)
/// and seeded top-k sampling the top-k candidates; both must give exactly the tokens of the
/// full-logits path on the same backend (host argmax / host sampler over the whole row). A
/// warmed-up candidate step builds nothing, submits once and reads back 8 bytes per candidate.
#[test]
fn gemma_270m_device_sampling_equals_full_logits_path() {
    use hearth_core::backend::Readback;
    use hearth_core::engine::{Engine, GenerateOptions};
    use hearth_core::sampling::{Sampler, SamplingParams};
    let Some(gpu) = common::open(WgpuOptions::from_env()) else { return };
    let file = GgufFile::open(&model_path(GEMMA_270M)).expect("open model");
    let options = EngineOptions { n_ctx: N_CTX, ..EngineOptions::default() };
    let engine = Engine::load(&file, Box::new(gpu), &options, &mut |_, _| {}).expect("load on wgpu");
    let prompt = engine.tokenizer().encode("Once upon a time, in a small village,", true, false).expect("encode");
    let n = 12;
    let greedy = SamplingParams::default();
    let top_k = SamplingParams { temperature: 0.9, top_k: 40, top_p: 0.95, seed: 1234, ..SamplingParams::default() };
    // The same runner serves both paths: a session that evaluates directly, then an engine.
    let (mut runner, mut tokenizer, _) = engine.into_parts();
    for params in [greedy, top_k] {
        let mut sampler = Sampler::new(params.clone());
        assert!(matches!(sampler.readback(&prompt), Readback::TopK(_)), "{params:?} should use device candidates");
        // The full-logits path: every step reads back the whole row.
        let mut session = Session::from_runner(runner, options.prefill_chunk);
        session.clear_prefix_cache();
        let mut logits = session.eval(&prompt, LogitsMode::Last).expect("eval").to_vec();
        let mut want = Vec::new();
        for _ in 0..n {
            let token = sampler.sample(&mut logits, session.history());
            want.push(token);
            logits = session.eval(&[token], LogitsMode::Last).expect("eval").to_vec();
        }
        // The engine's loop: candidates from the device.
        let mut engine = Engine::from_parts(session.into_runner(), tokenizer, None, &options);
        engine.clear_prefix_cache();
        let before = engine.backend().counters();
        let gen =
            GenerateOptions { max_tokens: n, sampling: params.clone(), ignore_eos: true, ..GenerateOptions::default() };
        let got = engine.generate(&prompt, &gen, &mut |_| true).expect("generate");
        let after = engine.backend().counters();
        eprintln!("{params:?}\nfull logits: {want:?}\ncandidates:  {:?}\n{:?}", got.tokens, after);
        assert_eq!(got.tokens, want, "device candidates and full logits give different tokens");
        // Prompt + n - 1 decode steps, each reading back k (id, logit) pairs.
        let Readback::TopK(k) = sampler.readback(&prompt) else { unreachable!() };
        assert_eq!(after.bytes_read_back - before.bytes_read_back, (n * k * 8) as u64);
        (runner, tokenizer, _) = engine.into_parts();
    }
    // A warmed-up candidate step creates nothing and submits once.
    let mut session = Session::from_runner(runner, options.prefill_chunk);
    session.eval(&prompt, LogitsMode::Last).expect("eval");
    let token = *session.history().last().expect("history");
    session.eval_for(&[token], Readback::TopK(40)).expect("warm-up decode");
    let before = session.backend().counters();
    session.eval_for(&[token], Readback::TopK(40)).expect("decode");
    let after = session.backend().counters();
    assert_eq!(after.pipelines_created, before.pipelines_created, "a decode step created pipelines");
    assert_eq!(after.bind_groups_created, before.bind_groups_created, "a decode step created bind groups");
    assert_eq!(after.submits, before.submits + 1);
}
