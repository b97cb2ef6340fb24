//! Batched and speculative decode steps on wgpu read back candidates, not logits rows
//! (`Readback::TopK`, reduced on the device): the scheduler's steps read 8 bytes (id, logit) per
//! candidate per row, a greedy verification step 8 bytes per verified row, and both give the
//! tokens of the full-logits path on the same backend. Gemma 270M, few tokens (lavapipe is slow).

mod common;

use hearth_core::engine::{Engine, EngineOptions, GenerateOptions, Session};
use hearth_core::gguf::GgufFile;
use hearth_core::graph::LogitsMode;
use hearth_core::runner::{BatchEntry, Runner};
use hearth_core::sampling::{argmax, Sampler, SamplingParams};
use hearth_core::scheduler::{Drafting, RequestId, Scheduler, SchedulerEvent, SchedulerOptions};
use hearth_core::speculative::SpeculativeOptions;
use hearth_core::tokenizer::Tokenizer;
use hearth_tests::{model_path, GEMMA_270M};
use hearth_wgpu::WgpuOptions;
use std::collections::{BTreeMap, HashMap};

const N_CTX: usize = 128;
const PREFILL_CHUNK: usize = 64;

fn wgpu_runner(file: &GgufFile, max_sequences: usize) -> Option<Runner> {
    let gpu = common::open(WgpuOptions::from_env())?;
    let options =
        EngineOptions { n_ctx: N_CTX, prefill_chunk: PREFILL_CHUNK, max_sequences, ..EngineOptions::default() };
    Some(Runner::load(file, Box::new(gpu), &options, &mut |_, _| {}).expect("load on wgpu"))
}

/// The full-logits path: one sequence, every step reads its whole logits row back and
/// `Sampler::sample` picks from it.
fn full_logits_tokens(runner: &mut Runner, prompt: &[u32], options: &GenerateOptions) -> Vec<u32> {
    let seq = runner.kv_mut().add_sequence();
    let mut logits = runner.step(&[BatchEntry { seq, tokens: prompt }], LogitsMode::Last).expect("prefill").to_vec();
    let mut history = prompt.to_vec();
    let mut sampler = Sampler::new(options.sampling.clone());
    let mut tokens = Vec::new();
    while tokens.len() < options.max_tokens {
        let token = sampler.sample(&mut logits, &history);
        tokens.push(token);
        history.push(token);
        if tokens.len() < options.max_tokens {
            logits = runner.step(&[BatchEntry { seq, tokens: &[token] }], LogitsMode::Last).expect("decode").to_vec();
        }
    }
    runner.kv_mut().remove_sequence(seq);
    tokens
}

/// Runs every request to the end, one scheduler step at a time; the tokens of each and the bytes
/// each step read back.
fn run_scheduler(s: &mut Scheduler, ids: &[RequestId]) -> (Vec<Vec<u32>>, Vec<u64>) {
    let mut done = HashMap::new();
    let mut step_bytes = Vec::new();
    loop {
        let before = s.runner().backend().counters().bytes_read_back;
        let mut events = Vec::new();
        if !s.step(&mut |e| events.push(e)).expect("step") {
            break;
        }
        step_bytes.push(s.runner().backend().counters().bytes_read_back - before);
        for e in events {
            match e {
                SchedulerEvent::Finished { id, generation } => {
                    done.insert(id, generation.tokens);
                }
                SchedulerEvent::Failed { id, error } => panic!("request {id} failed: {error}"),
                _ => {}
            }
        }
    }
    (ids.iter().map(|id| done.remove(id).expect("finished")).collect(), step_bytes)
}

#[test]
fn gemma_270m_scheduler_steps_read_back_candidates_and_match_full_logits() {
    let file = GgufFile::open(&model_path(GEMMA_270M)).expect("open model");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let Some(mut oracle) = wgpu_runner(&file, 1) else { return };
    let Some(runner) = wgpu_runner(&file, 4) else { return };
    let n_vocab = runner.config().n_vocab;
    let texts = ["Once upon a time, in a small village,", "The capital of France is", "def fibonacci(n):"];
    let prompts: Vec<Vec<u32>> = texts.iter().map(|t| tokenizer.encode(t, true, false).expect("encode")).collect();
    let max_tokens = 5;
    let top_k = SamplingParams { temperature: 0.9, top_k: 40, top_p: 0.95, seed: 7, ..SamplingParams::default() };
    let candidates_only = [
        SamplingParams::default(),
        top_k.clone(),
        // At most 1 + 16 candidates: fewer than the top-k row's 40.
        SamplingParams {
            repeat_penalty: 1.5,
            repeat_last_n: 16,
            logit_bias: BTreeMap::from([(108, f32::NEG_INFINITY)]),
            ..SamplingParams::default()
        },
    ];
    let requests: Vec<GenerateOptions> = candidates_only
        .iter()
        .map(|s| GenerateOptions { max_tokens, ignore_eos: true, sampling: s.clone(), ..GenerateOptions::default() })
        .collect();
    let want: Vec<Vec<u32>> =
        prompts.iter().zip(&requests).map(|(p, o)| full_logits_tokens(&mut oracle, p, o)).collect();

    let mut s = Scheduler::new(
        runner,
        tokenizer,
        SchedulerOptions { max_batch: 4, prefill_chunk: PREFILL_CHUNK, ..SchedulerOptions::default() },
    );
    let ids: Vec<RequestId> =
        prompts.iter().zip(&requests).map(|(p, o)| s.submit(p.clone(), o.clone()).expect("submit")).collect();
    let (got, step_bytes) = run_scheduler(&mut s, &ids);
    eprintln!("candidate steps read back {step_bytes:?} bytes (3 rows, full logits would be {})", 3 * n_vocab * 4);
    assert_eq!(got, want, "scheduler candidates differ from the full-logits path");
    // Every step (the prompts fit one chunk together) samples all 3 rows, 40 (id, logit) pairs each.
    assert_eq!(step_bytes, vec![3 * 40 * 8; max_tokens], "bytes read back per step");

    // A positive bias may raise a logit: the steps it samples in read whole rows, and the tokens
    // still match.
    let mut with_bias = requests.clone();
    with_bias[0].sampling.logit_bias = BTreeMap::from([(want[0][1], 1.5)]);
    let want_bias = full_logits_tokens(&mut oracle, &prompts[0], &with_bias[0]);
    let ids: Vec<RequestId> =
        prompts.iter().zip(&with_bias).map(|(p, o)| s.submit(p.clone(), o.clone()).expect("submit")).collect();
    let (got, step_bytes) = run_scheduler(&mut s, &ids);
    eprintln!("with a positive bias: {step_bytes:?} bytes");
    assert_eq!(got[0], want_bias);
    assert_eq!(got[1..], want[1..]);
    assert_eq!(step_bytes, vec![(3 * n_vocab * 4) as u64; max_tokens], "whole rows while the positive bias runs");
}

#[test]
fn gemma_270m_greedy_verification_reads_back_the_argmax_per_row() {
    let Some(gpu) = common::open(WgpuOptions::from_env()) else { return };
    let file = GgufFile::open(&model_path(GEMMA_270M)).expect("open model");
    let options = EngineOptions { n_ctx: N_CTX, prefill_chunk: PREFILL_CHUNK, ..EngineOptions::default() };
    let engine = Engine::load(&file, Box::new(gpu), &options, &mut |_, _| {}).expect("load on wgpu");
    let text = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,";
    let prompt = engine.tokenizer().encode(text, true, false).expect("encode");
    let max_tokens = 10;

    // Full logits: whole rows, host argmax.
    let (runner, tokenizer, _) = engine.into_parts();
    let mut session = Session::from_runner(runner, options.prefill_chunk);
    let mut logits = session.eval(&prompt, LogitsMode::Last).expect("eval").to_vec();
    let mut want = Vec::new();
    while want.len() < max_tokens {
        let token = argmax(&logits);
        want.push(token);
        logits = session.eval(&[token], LogitsMode::Last).expect("eval").to_vec();
    }

    let mut engine = Engine::from_parts(session.into_runner(), tokenizer, None, &options);
    engine.clear_prefix_cache();
    let greedy = GenerateOptions { max_tokens, ignore_eos: true, ..GenerateOptions::default() };
    let before = engine.backend().counters().bytes_read_back;
    let lookup = Drafting::Lookup {
        reference: Vec::new(),
        options: SpeculativeOptions { max_draft_tokens: 15, adaptive: false },
    };
    let spec = engine.generate_with(&prompt, &greedy, lookup, &mut |_| true).expect("speculative generate");
    let bytes = engine.backend().counters().bytes_read_back - before;
    let metrics = spec.speculative.clone().expect("metrics");
    eprintln!("{metrics:?}: {bytes} bytes read back\nfull logits: {want:?}\nspeculative: {:?}", spec.tokens);
    assert_eq!(spec.tokens, want, "greedy verification from the device argmax differs from the full-logits path");
    assert!(metrics.accepted > 0, "no draft was accepted, so no multi-row verification happened: {metrics:?}");
    // Each prompt chunk's step (its last row: nothing samples before the prompt's end) and each
    // verification step (1 + proposed rows) read one (id, logit) pair per row.
    let prompt_steps = prompt.len().div_ceil(PREFILL_CHUNK);
    let rows = prompt_steps + metrics.target_forward_passes + metrics.proposed;
    assert_eq!(bytes, (rows * 8) as u64);
}
