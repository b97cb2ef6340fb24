//! The paged KV cache on a real model (CPU backend, the oracle): batching several sequences in
//! one step, reusing a cached prefix, copy-on-write and rollback give exactly the logits of the
//! plain single-sequence computation, and the pool returns to its baseline afterwards.

use hearth_core::engine::EngineOptions;
use hearth_core::graph::LogitsMode;
use hearth_core::kv::SeqId;
use hearth_core::runner::{BatchEntry, Runner};
use hearth_tests::*;

fn options(max_sequences: usize) -> EngineOptions {
    EngineOptions { n_ctx: 512, max_sequences, ..EngineOptions::default() }
}

/// Prompts of different lengths (some crossing block boundaries).
fn prompts() -> Vec<Vec<u32>> {
    vec![(100..137).collect(), (2000..2005).collect(), (300..340).rev().collect()]
}

/// Prefill + `n_decode` greedy steps of one sequence alone; the logits of every step.
fn alone(runner: &mut Runner, prompt: &[u32], n_decode: usize) -> Vec<Vec<f32>> {
    let seq = runner.kv_mut().add_sequence();
    let mut out = vec![runner.step(&[BatchEntry { seq, tokens: prompt }], LogitsMode::Last).expect("prefill").to_vec()];
    for _ in 0..n_decode {
        let next = argmax(out.last().expect("logits")) as u32;
        out.push(runner.step(&[BatchEntry { seq, tokens: &[next] }], LogitsMode::Last).expect("decode").to_vec());
    }
    runner.kv_mut().remove_sequence(seq);
    out
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn batched_steps_give_the_logits_of_single_sequence_steps() {
    let (_file, mut runner) = cpu_runner(QWEN_05B, &options(4));
    runner.kv_mut().clear_cache();
    let n_vocab = runner.config().n_vocab;
    let prompts = prompts();
    let n_decode = 3;
    let want: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| alone(&mut runner, p, n_decode)).collect();
    runner.kv_mut().clear_cache();

    // All prompts in one step, then batched decode steps.
    let seqs: Vec<SeqId> = prompts.iter().map(|_| runner.kv_mut().add_sequence()).collect();
    let batch: Vec<BatchEntry<'_>> = seqs.iter().zip(&prompts).map(|(&seq, p)| BatchEntry { seq, tokens: p }).collect();
    let mut logits = runner.step(&batch, LogitsMode::Last).expect("batched prefill").to_vec();
    for step in 0..=n_decode {
        for (i, want) in want.iter().enumerate() {
            let got = &logits[i * n_vocab..(i + 1) * n_vocab];
            assert_eq!(max_abs_diff(got, &want[step]), 0.0, "sequence {i}, step {step}: batched logits differ");
        }
        if step == n_decode {
            break;
        }
        let next: Vec<[u32; 1]> =
            (0..seqs.len()).map(|i| [argmax(&logits[i * n_vocab..(i + 1) * n_vocab]) as u32]).collect();
        let batch: Vec<BatchEntry<'_>> =
            seqs.iter().zip(&next).map(|(&seq, t)| BatchEntry { seq, tokens: t }).collect();
        logits = runner.step(&batch, LogitsMode::Last).expect("batched decode").to_vec();
    }
    for seq in seqs {
        runner.kv_mut().remove_sequence(seq);
    }
    assert_eq!(runner.kv().used_blocks(), 0, "blocks leaked");
}

#[test]
fn a_cached_prefix_gives_the_logits_of_a_full_recompute() {
    let (_file, mut runner) = cpu_runner(QWEN_05B, &options(2));
    let prompt: Vec<u32> = (500..600).collect();
    let first = runner.kv_mut().add_sequence();
    assert_eq!(runner.kv_mut().reuse_cached_prefix(first, &prompt).expect("lookup"), 0);
    let want = runner.step(&[BatchEntry { seq: first, tokens: &prompt }], LogitsMode::Last).expect("full").to_vec();
    runner.kv_mut().remove_sequence(first);

    // A new sequence finds the first 99 positions cached (6 full blocks, then 3 of the 4 that
    // the first one's partial last block holds: one token is left to evaluate) and evaluates
    // the rest, writing into a copy of that partial block.
    let second = runner.kv_mut().add_sequence();
    let reused = runner.kv_mut().reuse_cached_prefix(second, &prompt).expect("lookup");
    assert_eq!(reused, 99);
    let got =
        runner.step(&[BatchEntry { seq: second, tokens: &prompt[reused..] }], LogitsMode::Last).expect("rest").to_vec();
    assert_eq!(max_abs_diff(&got, &want), 0.0, "logits after prefix reuse differ from a full recompute");

    // Roll back into a cached (shared) block and continue differently: copy-on-write keeps the
    // cached block intact, so a third sequence still gets the original prefix.
    runner.kv_mut().truncate(second, 90).expect("rollback");
    runner.step(&[BatchEntry { seq: second, tokens: &[7, 8, 9] }], LogitsMode::Last).expect("diverge");
    let third = runner.kv_mut().add_sequence();
    assert_eq!(runner.kv_mut().reuse_cached_prefix(third, &prompt).expect("lookup"), 99);
    let again =
        runner.step(&[BatchEntry { seq: third, tokens: &prompt[99..] }], LogitsMode::Last).expect("rest").to_vec();
    assert_eq!(max_abs_diff(&again, &want), 0.0, "a cached block was overwritten");
    runner.kv_mut().remove_sequence(second);
    runner.kv_mut().remove_sequence(third);
    assert_eq!(runner.kv().used_blocks(), 0, "blocks leaked");
}

#[test]
fn sliding_window_layers_release_old_blocks_without_changing_logits() {
    // Gemma 3 270M: 512-token window on 15 of 18 layers.
    let (_file, mut runner) = cpu_runner(GEMMA_270M, &EngineOptions { n_ctx: 1024, ..EngineOptions::default() });
    let groups = runner.kv_layout().groups.clone();
    let local = groups.iter().position(|g| g.window.is_some()).expect("a windowed group");
    let global = 1 - local;
    let window = groups[local].window.expect("window");
    let prompt: Vec<u32> = (0..800u32).map(|i| 1000 + (i * 7919) % 20000).collect();
    let seq = runner.kv_mut().add_sequence();
    // In chunks of the engine's prefill size, for which windowed groups are sized.
    for chunk in prompt.chunks(EngineOptions::default().prefill_chunk) {
        runner.step(&[BatchEntry { seq, tokens: chunk }], LogitsMode::Last).expect("prefill");
    }
    let stats = runner.kv().pool_stats();
    let bs = runner.kv().block_size();
    assert_eq!(stats[global].used, prompt.len().div_ceil(bs));
    assert!(stats[local].used * bs <= window + 64 + 2 * bs, "windowed group holds {} blocks", stats[local].used);
    // The next token's logits do not depend on when blocks were released: compare with the same
    // prompt evaluated in two other chunks.
    let next = runner.step(&[BatchEntry { seq, tokens: &[42] }], LogitsMode::Last).expect("decode").to_vec();
    let (_f, mut fresh) = cpu_runner(GEMMA_270M, &EngineOptions { n_ctx: 1024, ..EngineOptions::default() });
    let other = fresh.kv_mut().add_sequence();
    fresh.step(&[BatchEntry { seq: other, tokens: &prompt[..400] }], LogitsMode::Last).expect("first half");
    fresh.step(&[BatchEntry { seq: other, tokens: &prompt[400..] }], LogitsMode::Last).expect("second half");
    let want = fresh.step(&[BatchEntry { seq: other, tokens: &[42] }], LogitsMode::Last).expect("decode").to_vec();
    assert_eq!(max_abs_diff(&next, &want), 0.0);
    runner.kv_mut().remove_sequence(seq);
    assert_eq!(runner.kv().used_blocks(), 0, "blocks leaked");
}

#[test]
fn a_request_beyond_the_kv_budget_gets_a_typed_error_and_changes_nothing() {
    // Room for 64 positions (4 blocks of 16) per the budget.
    let probe = cpu_runner(QWEN_05B, &options(1)).1;
    let per_token = probe.kv_layout().bytes_per_token() as u64;
    drop(probe);
    let (_file, mut runner) = cpu_runner(QWEN_05B, &EngineOptions { kv_memory: Some(64 * per_token), ..options(2) });
    assert_eq!(runner.kv_layout().groups[0].n_blocks, 4);
    // One sequence can never exceed the pool: the context is capped to it.
    assert_eq!(runner.n_ctx(), 64);
    let first = runner.kv_mut().add_sequence();
    let prompt: Vec<u32> = (0..70).collect();
    match runner.step(&[BatchEntry { seq: first, tokens: &prompt }], LogitsMode::Last) {
        Err(hearth_core::CoreError::ContextOverflow { needed: 70, capacity: 64 }) => {}
        other => panic!("expected ContextOverflow, got {:?}", other.map(|l| l.len())),
    }
    // Two sequences compete for the pool: the second finds 1 of the 4 blocks left.
    runner.step(&[BatchEntry { seq: first, tokens: &prompt[..40] }], LogitsMode::Last).expect("fits");
    let second = runner.kv_mut().add_sequence();
    let before = runner.kv().pool_stats();
    match runner.step(&[BatchEntry { seq: second, tokens: &prompt[..20] }], LogitsMode::Last) {
        Err(hearth_core::CoreError::KvExhausted { needed_blocks: 2, available_blocks: 1, total_blocks: 4, .. }) => {}
        other => panic!("expected KvExhausted, got {:?}", other.map(|l| l.len())),
    }
    assert_eq!(runner.kv().pool_stats(), before, "a failed step must not change the pool");
    assert_eq!(runner.kv().len(second), 0);
    runner.kv_mut().remove_sequence(first);
    runner
        .step(&[BatchEntry { seq: second, tokens: &prompt[..20] }], LogitsMode::Last)
        .expect("fits once the first ended");
}
