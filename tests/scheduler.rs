//! Continuous batching on a real model (Qwen 0.5B, CPU): many concurrent requests produce exactly
//! the tokens each produces alone, with or without speculative decoding (prompt lookup, a draft
//! model); mixed sampling settings read from candidates give the tokens of the full-logits path;
//! cancellation and preemption leak no KV blocks; a chat's next round keeps the ids the model wrote
//! and resumes from their KV blocks.

use hearth_core::engine::{EngineOptions, FinishReason, GenerateOptions, Generation};
use hearth_core::gguf::GgufFile;
use hearth_core::graph::LogitsMode;
use hearth_core::runner::BatchEntry;
use hearth_core::sampling::{Sampler, SamplingParams, TokenLogprob};
use hearth_core::scheduler::step_budget::PROMPT_GRANULE;
use hearth_core::scheduler::{Drafting, RequestId, Scheduler, SchedulerEvent, SchedulerOptions};
use hearth_core::speculative::{BatchedDraftModel, SpeculativeOptions, DEFAULT_MIN_CONFIDENCE};
use hearth_core::tokenizer::Tokenizer;
use hearth_tests::*;
use std::collections::{BTreeMap, HashMap};

const PREFILL_CHUNK: usize = 32;

fn scheduler(max_batch: usize, kv_memory: Option<u64>) -> Scheduler {
    scheduler_with(max_batch, kv_memory, SchedulerOptions::default().max_stall)
}

fn scheduler_with(max_batch: usize, kv_memory: Option<u64>, max_stall: f64) -> Scheduler {
    let options = EngineOptions {
        n_ctx: 512,
        prefill_chunk: PREFILL_CHUNK,
        max_sequences: max_batch,
        kv_memory,
        ..EngineOptions::default()
    };
    let (file, runner) = cpu_runner(QWEN_05B, &options);
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    Scheduler::new(
        runner,
        tokenizer,
        SchedulerOptions { max_batch, prefill_chunk: PREFILL_CHUNK, max_stall, lookup: None },
    )
}

fn prompts(tokenizer: &Tokenizer, n: usize) -> Vec<Vec<u32>> {
    let subjects = [
        "a linked list",
        "binary search",
        "a web server",
        "quicksort",
        "a hash map",
        "JSON parsing",
        "a trie",
        "matrix multiplication",
    ];
    (0..n)
        .map(|i| {
            // Different lengths: some prompts span several prefill chunks.
            let text =
                format!("# Python: {}{}\ndef ", subjects[i % subjects.len()], " with comments".repeat(i % 4 * 5));
            tokenizer.encode(&text, false, false).expect("encode")
        })
        .collect()
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, ignore_eos: true, ..GenerateOptions::default() }
}

/// Steps until idle; the finished generations and the text streamed per request.
fn run(
    s: &mut Scheduler,
    mut each_step: impl FnMut(&mut Scheduler, usize),
) -> (HashMap<RequestId, Generation>, HashMap<RequestId, String>) {
    let mut done = HashMap::new();
    let mut streamed: HashMap<RequestId, String> = HashMap::new();
    let mut prompt_scores: HashMap<RequestId, Vec<TokenLogprob>> = HashMap::new();
    let mut steps = 0;
    loop {
        let mut events = Vec::new();
        let busy = s.step(&mut |e| events.push(e)).expect("step");
        for e in events {
            match e {
                SchedulerEvent::Text { id, delta, .. } => streamed.entry(id).or_default().push_str(&delta),
                SchedulerEvent::PromptScored { id, logprobs } => {
                    assert!(!streamed.contains_key(&id), "request {id}: its prompt's scores come before its text");
                    assert!(prompt_scores.insert(id, logprobs).is_none(), "request {id}: prompt scored twice");
                }
                SchedulerEvent::Finished { id, generation } => {
                    assert_eq!(
                        prompt_scores.remove(&id),
                        generation.prompt_logprobs,
                        "request {id}: the streamed prompt scores are the generation's"
                    );
                    done.insert(id, generation);
                }
                SchedulerEvent::Failed { id, error } => panic!("request {id} failed: {error}"),
                SchedulerEvent::Started { .. } => {}
            }
        }
        if !busy {
            break;
        }
        steps += 1;
        each_step(s, steps);
    }
    (done, streamed)
}

fn solo_outputs(prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Vec<u32>> {
    let mut s = scheduler(1, None);
    prompts
        .iter()
        .map(|p| {
            let id = s.submit(p.clone(), greedy(max_tokens)).expect("submit");
            let (mut done, _) = run(&mut s, |_, _| {});
            done.remove(&id).expect("finished").tokens
        })
        .collect()
}

#[test]
fn concurrent_requests_produce_the_tokens_of_solo_runs() {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let prompts = prompts(&tokenizer, 8);
    let max_tokens = 10;
    let want = solo_outputs(&prompts, max_tokens);

    let mut s = scheduler(8, None);
    let ids: Vec<RequestId> =
        prompts.iter().map(|p| s.submit(p.clone(), greedy(max_tokens)).expect("submit")).collect();
    // Two more arrive while the first ones run: they join the running batch.
    let late = prompts[..2].to_vec();
    let mut late_ids = Vec::new();
    let (done, streamed) = run(&mut s, |s, step| {
        if step == 3 {
            late_ids = late.iter().map(|p| s.submit(p.clone(), greedy(max_tokens)).expect("submit")).collect();
        }
    });
    for (i, id) in ids.iter().enumerate() {
        let g = &done[id];
        assert_eq!(g.tokens, want[i], "request {i}: batched tokens differ from the solo run");
        assert_eq!(
            streamed.get(id).map(String::as_str).unwrap_or(""),
            g.text,
            "request {i}: streamed text differs from the result"
        );
    }
    assert_eq!(s.stats().running + s.stats().waiting, 0);
    assert_eq!(s.stats().kv_blocks_used, 0, "KV blocks leaked");
    assert!(s.stats().prefix_hit_rate > 0.0, "the late duplicates should hit the prefix cache");
}

/// A prompt whose greedy continuation copies the function before it (from `tail` on): prompt
/// lookup drafts it.
fn copying_prompt(tokenizer: &Tokenizer, tail: &str) -> Vec<u32> {
    let text = format!(
        "def merge_counts(first, second):\n    result = dict(first)\n    for key, value in second.items():\n        \
         result[key] = result.get(key, 0) + value\n    return result\n\n\n# The same function, unchanged:\n{tail}"
    );
    tokenizer.encode(&text, false, false).expect("encode")
}

#[test]
fn lookup_keeps_the_greedy_tokens_alone_and_in_a_batch() {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let copying = copying_prompt(&tokenizer, "def merge_counts(");
    let others = prompts(&tokenizer, 2);
    let (copy_tokens, other_tokens) = (40, 12);
    let want_copy = solo_outputs(std::slice::from_ref(&copying), copy_tokens).remove(0);
    let want_others = solo_outputs(&others, other_tokens);

    // A fixed draft length: every proposal is verified, whatever this machine's (or a loaded CI
    // runner's) pass costs say (the adaptive rule's greedy tokens: the tight-pool test below).
    let fixed = SpeculativeOptions { max_draft_tokens: 8, adaptive: false };
    let mut s = lookup_scheduler_with(4, None, fixed.clone());

    // Alone: the copy is drafted and verified, with the tokens of plain decoding.
    assert_drafted_alone(&mut s, &copying, copy_tokens, &want_copy);

    // In a batch: two copies and two other requests decode together, drafts verified in the
    // shared steps (how many is the joint rule's: unit tests in scheduler/lookup.rs and
    // policy_tests.rs).
    let mut s = lookup_scheduler_with(4, None, fixed);
    let copy_ids: Vec<RequestId> =
        (0..2).map(|_| s.submit(copying.clone(), greedy(copy_tokens)).expect("submit")).collect();
    let other_ids: Vec<RequestId> =
        others.iter().map(|p| s.submit(p.clone(), greedy(other_tokens)).expect("submit")).collect();
    let mut shared_steps_with_drafts = 0;
    let (done, streamed) = run(&mut s, |s, _| {
        let last = s.stats().last_step;
        if last.decode_rows > 1 && last.draft_rows > 0 {
            shared_steps_with_drafts += 1;
        }
    });
    for id in &copy_ids {
        assert_eq!(done[id].tokens, want_copy, "lookup in a batch changed the greedy tokens");
        assert_eq!(streamed[id], done[id].text);
        assert!(done[id].speculative.as_ref().is_some_and(|m| m.accepted > 0), "a copy in the batch drafted nothing");
    }
    for (i, id) in other_ids.iter().enumerate() {
        assert_eq!(done[id].tokens, want_others[i], "request {i}: tokens differ from the solo run");
    }
    eprintln!("steps with drafts and 2+ requests decoding: {shared_steps_with_drafts}");
    assert!(
        shared_steps_with_drafts >= 3,
        "drafts were verified in {shared_steps_with_drafts} steps of requests decoding together"
    );
    assert_eq!(s.stats().kv_blocks_used, 0, "KV blocks leaked");
}

/// One request alone on a drafting scheduler: the tokens of plain decoding (`want`), streamed
/// whole, with drafts accepted and fewer target passes than tokens.
fn assert_drafted_alone(s: &mut Scheduler, prompt: &[u32], max_tokens: usize, want: &[u32]) {
    let id = s.submit(prompt.to_vec(), greedy(max_tokens)).expect("submit");
    let (done, streamed) = run(s, |_, _| {});
    let g = &done[&id];
    assert_eq!(g.tokens, want, "drafting changed the greedy tokens");
    assert_eq!(streamed[&id], g.text);
    let speculative = g.speculative.as_ref().expect("draft metrics");
    eprintln!("alone: {} tokens, {speculative:?}", g.tokens.len());
    assert!(speculative.accepted > 0, "no draft was accepted: {speculative:?}");
    assert!(speculative.target_forward_passes < max_tokens - 1, "every token took its own pass: {speculative:?}");
}

/// A scheduler whose requests all use prompt lookup (its default draft bounds).
fn lookup_scheduler(max_batch: usize, kv_memory: Option<u64>) -> Scheduler {
    lookup_scheduler_with(max_batch, kv_memory, SpeculativeOptions::lookup())
}

fn lookup_scheduler_with(max_batch: usize, kv_memory: Option<u64>, lookup: SpeculativeOptions) -> Scheduler {
    let options = EngineOptions {
        n_ctx: 512,
        prefill_chunk: PREFILL_CHUNK,
        max_sequences: max_batch,
        kv_memory,
        ..EngineOptions::default()
    };
    let (file, runner) = cpu_runner(QWEN_05B, &options);
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let lookup = Some(lookup);
    Scheduler::new(
        runner,
        tokenizer,
        SchedulerOptions { max_batch, prefill_chunk: PREFILL_CHUNK, lookup, ..SchedulerOptions::default() },
    )
}

/// A scheduler whose requests draft with a draft model, here the 0.5B itself (most of its
/// drafts are kept, so verification is exercised on every step; the tokens must still be those
/// of plain decoding). `min_confidence`: where the draft model stops drafting.
fn draft_model_scheduler(max_batch: usize, bounds: SpeculativeOptions, min_confidence: f32) -> Scheduler {
    let mut s = scheduler(max_batch, None);
    let options = EngineOptions {
        n_ctx: 512,
        prefill_chunk: PREFILL_CHUNK,
        max_sequences: max_batch,
        ..EngineOptions::default()
    };
    let (file, runner) = cpu_runner(QWEN_05B, &options);
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let mut draft =
        BatchedDraftModel::new(runner, &tokenizer, s.tokenizer(), PREFILL_CHUNK).expect("compatible vocabularies");
    draft.min_confidence = min_confidence;
    s.set_draft_model(draft, bounds);
    s
}

#[test]
fn a_draft_model_keeps_the_greedy_tokens_alone_and_in_a_batch() {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let mut all = vec![copying_prompt(&tokenizer, "def merge_counts(")];
    all.extend(prompts(&tokenizer, 3));
    let max_tokens = 16;
    let want = solo_outputs(&all, max_tokens);
    // A fixed draft length: every proposal is verified, whatever the pass costs say.
    let fixed = SpeculativeOptions { max_draft_tokens: 4, adaptive: false };

    // Alone: the drafts are verified, with the tokens of plain decoding.
    let mut s = draft_model_scheduler(4, fixed.clone(), DEFAULT_MIN_CONFIDENCE);
    assert_drafted_alone(&mut s, &all[0], max_tokens, &want[0]);

    // In a batch: every request drafts in the shared draft passes and verifies in the shared
    // target steps.
    let mut s = draft_model_scheduler(4, fixed, DEFAULT_MIN_CONFIDENCE);
    let ids: Vec<RequestId> = all.iter().map(|p| s.submit(p.clone(), greedy(max_tokens)).expect("submit")).collect();
    let mut shared_steps_with_drafts = 0;
    let (done, streamed) = run(&mut s, |s, _| {
        let last = s.stats().last_step;
        if last.decode_rows > 1 && last.draft_rows > 0 {
            shared_steps_with_drafts += 1;
        }
    });
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(done[id].tokens, want[i], "request {i}: the draft model in a batch changed the greedy tokens");
        assert_eq!(streamed[id], done[id].text);
        assert!(done[id].speculative.as_ref().is_some_and(|m| m.accepted > 0), "request {i} drafted nothing");
    }
    eprintln!("steps with drafts and 2+ requests decoding: {shared_steps_with_drafts}");
    assert!(shared_steps_with_drafts >= 3, "drafts were verified in {shared_steps_with_drafts} shared steps");
    assert_eq!(s.stats().kv_blocks_used, 0, "KV blocks leaked");
    let draft_pools = s.draft_model().expect("draft model").runner().kv().pool_stats();
    assert_eq!(draft_pools.iter().map(|p| p.used).sum::<usize>(), 0, "the draft model's KV blocks leaked");
}

/// Drafts need KV blocks too: in a pool too small for every request at full length, steps whose
/// drafts do not fit go without them, requests are preempted with drafts planned, and the tokens
/// are still those of the solo runs, with no block leaked.
#[test]
fn lookup_in_a_tight_pool_keeps_the_tokens_and_leaks_nothing() {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let copying = copying_prompt(&tokenizer, "def merge_counts(");
    let max_tokens = 48;
    let want = solo_outputs(std::slice::from_ref(&copying), max_tokens).remove(0);
    let probe = scheduler(1, None);
    let per_token = probe.runner().kv_layout().bytes_per_token() as u64;
    drop(probe);
    let full = (copying.len() + max_tokens) as u64;
    // Room for one request at full length and a half: the second waits or is preempted.
    let mut s = lookup_scheduler(3, Some(per_token * (3 * full / 2)));
    let ids: Vec<RequestId> = (0..3).map(|_| s.submit(copying.clone(), greedy(max_tokens)).expect("submit")).collect();
    let (done, _) = run(&mut s, |_, _| {});
    for id in &ids {
        assert_eq!(done[id].tokens, want, "request {id}: tokens differ from the solo run");
    }
    let stats = s.stats();
    assert_eq!(stats.kv_blocks_used, 0, "KV blocks leaked");
    eprintln!(
        "preemptions: {}, drafts: {:?}",
        stats.preemptions,
        ids.iter().map(|id| done[id].speculative.as_ref().map(|m| m.accepted)).collect::<Vec<_>>()
    );
}

/// With sampling, drafts go through rejection sampling: the tokens decided by a verification
/// pass follow the distribution of plain sampling, whether the drafts are lookup's copies
/// (one-hot) or a draft model's draws (with their distribution q). Many seeded runs of the
/// copying prompt, each verifying its first decode step's draft (a fixed draft length verifies
/// every proposal), against as many plain runs: a chi-square test of homogeneity of the second
/// token (the draft's position). Temperature 1.5 flattens the copy's odds so that a rule that
/// kept drafts too often would show.
#[test]
fn sampled_drafts_follow_the_distribution_of_plain_sampling() {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    // The first token (`def`, most likely) is followed by ` merge` in the prompt: the draft.
    let prompt = copying_prompt(&tokenizer, "");
    let runs = 160;
    // A fixed draft length: every run verifies its first proposal (the second token's draft).
    let one_draft = SpeculativeOptions { max_draft_tokens: 1, adaptive: false };
    let second_tokens = |drafter: Drafter| -> (BTreeMap<u32, u64>, usize) {
        let options =
            EngineOptions { n_ctx: 512, prefill_chunk: PREFILL_CHUNK, max_sequences: 1, ..EngineOptions::default() };
        let lookup = (drafter == Drafter::Lookup).then(|| one_draft.clone());
        let mut s = if drafter == Drafter::DraftModel {
            // Drafting never stops on confidence: every run verifies a draft drawn from q.
            draft_model_scheduler(1, one_draft.clone(), 0.0)
        } else {
            let (_, runner) = cpu_runner(QWEN_05B, &options);
            let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
            Scheduler::new(
                runner,
                tokenizer,
                SchedulerOptions { max_batch: 1, prefill_chunk: PREFILL_CHUNK, lookup, ..SchedulerOptions::default() },
            )
        };
        let (mut counts, mut verified) = (BTreeMap::new(), 0);
        for seed in 0..runs {
            let sampling = SamplingParams { temperature: 1.5, top_k: 8, seed, ..SamplingParams::default() };
            let id = s
                .submit(
                    prompt.clone(),
                    GenerateOptions { max_tokens: 3, sampling, ignore_eos: true, ..GenerateOptions::default() },
                )
                .expect("submit");
            let (done, _) = run(&mut s, |_, _| {});
            let g = &done[&id];
            *counts.entry(g.tokens[1]).or_insert(0) += 1;
            verified += g.speculative.as_ref().map_or(0, |m| m.proposed);
        }
        (counts, verified)
    };
    let (plain, _) = second_tokens(Drafter::None);
    for drafter in [Drafter::Lookup, Drafter::DraftModel] {
        let (drafted, verified) = second_tokens(drafter);
        assert!(verified >= runs as usize / 2, "{drafter:?}: only {verified} drafts verified in {runs} runs");
        assert_same_distribution(&plain, &drafted, runs, &format!("{drafter:?}"));
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Drafter {
    None,
    Lookup,
    DraftModel,
}

/// A chi-square test of homogeneity of two samples of `runs` tokens each, at significance 0.001.
fn assert_same_distribution(plain: &BTreeMap<u32, u64>, drafted: &BTreeMap<u32, u64>, runs: u64, what: &str) {
    // Tokens seen at least 5 times in all, the rest pooled.
    let mut categories: BTreeMap<Option<u32>, [f64; 2]> = BTreeMap::new();
    for (i, counts) in [plain, drafted].into_iter().enumerate() {
        for (&token, &n) in counts.iter() {
            let seen = plain.get(&token).unwrap_or(&0) + drafted.get(&token).unwrap_or(&0);
            categories.entry((seen >= 5).then_some(token)).or_insert([0.0; 2])[i] += n as f64;
        }
    }
    let statistic: f64 = categories
        .values()
        .map(|[a, b]| {
            let expected = (a + b) / 2.0;
            (a - expected).powi(2) / expected + (b - expected).powi(2) / expected
        })
        .sum();
    // Chi-square critical values at significance 0.001 by degrees of freedom.
    let critical = [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12];
    let dof = categories.len().saturating_sub(1).clamp(1, critical.len());
    eprintln!("plain {plain:?}, {what} {drafted:?} ({runs} runs each): chi-square {statistic:.1}, {dof} dof");
    assert!(categories.len() >= 2, "a single outcome tests nothing: {categories:?}");
    assert!(
        statistic < critical[dof - 1],
        "{what}'s sampled tokens differ from plain sampling's: chi-square {statistic:.1}"
    );
}

#[test]
fn cancelled_and_preempted_requests_leak_no_blocks_and_others_are_unaffected() {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let prompts = prompts(&tokenizer, 6);
    let max_tokens = 24;
    let want = solo_outputs(&prompts, max_tokens);

    // A pool too small for all six at full length: admission waits and decoding preempts.
    let probe = scheduler(1, None);
    let per_token = probe.runner().kv_layout().bytes_per_token() as u64;
    drop(probe);
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + max_tokens;
    let mut s = scheduler(6, Some(per_token * (2 * longest as u64 + 64)));
    let ids: Vec<RequestId> =
        prompts.iter().map(|p| s.submit(p.clone(), greedy(max_tokens)).expect("submit")).collect();
    let cancelled = [ids[1], ids[4]];
    let (done, _) = run(&mut s, |s, step| {
        if step == 6 {
            for id in cancelled {
                s.cancel(id);
            }
        }
    });
    for (i, id) in ids.iter().enumerate() {
        if cancelled.contains(id) {
            assert!(!done.contains_key(id) || done[id].tokens.len() == max_tokens, "request {i} ran on after cancel");
            continue;
        }
        assert_eq!(done[id].tokens, want[i], "request {i}: tokens differ from the solo run");
    }
    let stats = s.stats();
    assert_eq!(stats.kv_blocks_used, 0, "KV blocks leaked");
    eprintln!("preemptions: {}", stats.preemptions);
}

#[test]
fn a_long_prompt_arriving_mid_stream_is_fed_in_granules_without_stalling_the_stream() {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let streaming = tokenizer.encode("# Python: a trie\ndef ", false, false).expect("encode");
    let long = tokenizer
        .encode(&format!("# Python: a web server{}\ndef ", " with comments".repeat(40)), false, false)
        .expect("encode");
    assert!(long.len() > 5 * PROMPT_GRANULE, "the long prompt has {} tokens", long.len());
    let max_tokens = 40;
    let want = solo_outputs(&[streaming.clone(), long.clone()], max_tokens);

    // A stall factor of 1: while anything decodes, a step carries one granule of prompt at most.
    let mut s = scheduler_with(2, None, 1.0);
    let first = s.submit(streaming, greedy(max_tokens)).expect("submit");
    let mut second = None;
    let mut steps_sharing_the_stream = 0;
    let (done, _) = run(&mut s, |s, step| {
        let last = s.stats().last_step;
        if step == 3 {
            second = Some(s.submit(long.clone(), greedy(max_tokens)).expect("submit"));
        } else if step > 3 && last.prompt_tokens > 0 && last.decode_rows > 0 {
            // The long prompt shares the step with the stream: the stream still advances.
            steps_sharing_the_stream += 1;
            assert_eq!(last.prompt_budget, PROMPT_GRANULE, "step {step}: {last:?}");
            assert!(last.prompt_tokens <= PROMPT_GRANULE, "step {step}: {last:?}");
        } else if last.decode_rows == 0 {
            // Nothing decoding: the whole prefill chunk is available.
            assert_eq!(last.prompt_budget, PREFILL_CHUNK, "step {step}: {last:?}");
        }
    });
    assert!(
        steps_sharing_the_stream >= long.len() / PROMPT_GRANULE,
        "only {steps_sharing_the_stream} steps fed the long prompt"
    );
    assert_eq!(done[&first].tokens, want[0], "the stream's tokens changed");
    assert_eq!(
        done[&second.expect("submitted")].tokens,
        want[1],
        "the granule-fed prompt's tokens differ from the solo run"
    );
    assert_eq!(s.stats().kv_blocks_used, 0, "KV blocks leaked");
}

/// The full-logits oracle: `prompt` then `max_tokens` tokens on a runner of its own, reading
/// every step's whole logits row and sampling with `Sampler::sample` (prompt chunks of
/// PREFILL_CHUNK, one sequence per step: chunking does not change results).
fn full_logits_tokens(prompt: &[u32], options: &GenerateOptions) -> Vec<u32> {
    full_logits_run(prompt, options).0
}

/// The tokens sampled from whole logits rows, one request alone, and the `[n_vocab]` row each was
/// sampled from.
fn full_logits_run(prompt: &[u32], options: &GenerateOptions) -> (Vec<u32>, Vec<Vec<f32>>) {
    let engine_options = EngineOptions { n_ctx: 512, prefill_chunk: PREFILL_CHUNK, ..EngineOptions::default() };
    let (_, mut runner) = cpu_runner(QWEN_05B, &engine_options);
    let seq = runner.kv_mut().add_sequence();
    let mut history = prompt.to_vec();
    let mut logits = Vec::new();
    for chunk in prompt.chunks(PREFILL_CHUNK) {
        logits = runner.step(&[BatchEntry { seq, tokens: chunk }], LogitsMode::Last).expect("prefill").to_vec();
    }
    let mut sampler = Sampler::new(options.sampling.clone());
    let (mut tokens, mut rows) = (Vec::new(), Vec::new());
    while tokens.len() < options.max_tokens {
        rows.push(logits.clone());
        let token = sampler.sample(&mut logits, &history);
        tokens.push(token);
        history.push(token);
        logits = runner.step(&[BatchEntry { seq, tokens: &[token] }], LogitsMode::Last).expect("decode").to_vec();
    }
    (tokens, rows)
}

/// Log-probabilities read from candidates and the row's log-sum-exp (a request alone), or from
/// whole rows (in a batch with a request that needs them), equal those of the full-logits path,
/// whatever the request's sampling: the model's distribution, before the sampling filters.
#[test]
fn logprobs_equal_those_of_the_full_logits_alone_and_in_a_batch() {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let prompts = prompts(&tokenizer, 2);
    let max_tokens = 10;
    let sampled =
        SamplingParams { temperature: 0.8, top_k: 20, repeat_penalty: 1.2, seed: 3, ..SamplingParams::default() };
    let with_logprobs = GenerateOptions { logprobs: Some(5), sampling: sampled, ..greedy(max_tokens) };
    let (want_tokens, rows) = full_logits_run(&prompts[0], &with_logprobs);
    let want: Vec<TokenLogprob> =
        want_tokens.iter().zip(&rows).map(|(&t, row)| TokenLogprob::from_logits(row, t, 5)).collect();
    let check = |got: &[TokenLogprob], how: &str| {
        assert_eq!(got.len(), want.len(), "{how}: one per token");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.token, w.token, "{how}: token {i}");
            assert!((g.logprob - w.logprob).abs() < 1e-4, "{how}: token {i}: {g:?} vs {w:?}");
            assert_eq!(g.top.iter().map(|t| t.0).collect::<Vec<_>>(), w.top.iter().map(|t| t.0).collect::<Vec<_>>());
            for (a, b) in g.top.iter().zip(&w.top) {
                assert!((a.1 - b.1).abs() < 1e-4, "{how}: token {i}: {g:?} vs {w:?}");
            }
        }
    };
    let mut s = scheduler(4, None);
    let id = s.submit(prompts[0].clone(), with_logprobs.clone()).expect("submit");
    let (done, streamed_logprobs) = run_with_logprobs(&mut s);
    let all = done[&id].logprobs.as_deref().expect("logprobs");
    check(all, "alone");
    let streamed = &streamed_logprobs[&id];
    assert!(!streamed.is_empty() && all.starts_with(streamed), "text events carry the first ones, in order");
    assert_eq!(done[&id].tokens, want_tokens);

    // Beside a request with a positive logit bias, whose rows are read back whole.
    let biased = GenerateOptions {
        sampling: SamplingParams { logit_bias: BTreeMap::from([(want_tokens[0], 2.0)]), ..SamplingParams::default() },
        ..greedy(max_tokens)
    };
    let mut s = scheduler(4, None);
    let id = s.submit(prompts[0].clone(), with_logprobs).expect("submit");
    let other = s.submit(prompts[1].clone(), biased).expect("submit");
    let (done, _) = run_with_logprobs(&mut s);
    check(done[&id].logprobs.as_deref().expect("logprobs"), "in a batch");
    assert!(done[&other].logprobs.is_none(), "no logprobs unless asked");
}

/// [`run`], also collecting the log-probabilities that text events carried.
fn run_with_logprobs(s: &mut Scheduler) -> (HashMap<RequestId, Generation>, HashMap<RequestId, Vec<TokenLogprob>>) {
    let (mut done, mut streamed) = (HashMap::new(), HashMap::<RequestId, Vec<TokenLogprob>>::new());
    loop {
        let busy = s
            .step(&mut |e| match e {
                SchedulerEvent::Text { id, logprobs, .. } => streamed.entry(id).or_default().extend(logprobs),
                SchedulerEvent::Finished { id, generation } => {
                    done.insert(id, generation);
                }
                SchedulerEvent::Failed { id, error } => panic!("request {id} failed: {error}"),
                SchedulerEvent::Started { .. } | SchedulerEvent::PromptScored { .. } => {}
            })
            .expect("step");
        if !busy {
            return (done, streamed);
        }
    }
}

/// Mixed requests in one batch: greedy, seeded top-k, penalties, a negative logit bias (all read
/// back candidates) and a positive bias (forces whole rows while it runs). Each must give the
/// tokens of the full-logits path.
#[test]
fn mixed_sampling_from_candidates_equals_full_logits() {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let prompts = prompts(&tokenizer, 6);
    let max_tokens = 12;
    let plain = greedy(max_tokens);
    let plain_tokens = full_logits_tokens(&prompts[4], &plain);
    // Ban the first tokens greedy decoding picks for prompt 4, so the bias changes the output.
    let bans: BTreeMap<u32, f32> =
        plain_tokens[..3].iter().map(|&t| (t, f32::NEG_INFINITY)).chain([(plain_tokens[3], -3.0)]).collect();
    let sampling = |s: SamplingParams| GenerateOptions { sampling: s, ..plain.clone() };
    let top_k = SamplingParams { temperature: 0.9, top_k: 20, top_p: 0.9, seed: 11, ..SamplingParams::default() };
    let requests = [
        plain.clone(),
        sampling(top_k.clone()),
        sampling(SamplingParams { repeat_penalty: 1.5, repeat_last_n: 16, ..SamplingParams::default() }),
        sampling(SamplingParams { presence_penalty: 1.0, frequency_penalty: 0.5, seed: 12, ..top_k.clone() }),
        sampling(SamplingParams { logit_bias: bans, ..SamplingParams::default() }),
        // A positive bias reads whole rows for the steps it runs in; it finishes early.
        GenerateOptions {
            max_tokens: 4,
            ..sampling(SamplingParams { logit_bias: BTreeMap::from([(plain_tokens[0], 2.0)]), ..top_k })
        },
    ];
    let want: Vec<Vec<u32>> = prompts.iter().zip(&requests).map(|(p, o)| full_logits_tokens(p, o)).collect();
    assert_ne!(want[4], plain_tokens, "the bias should change the output");

    let mut s = scheduler(8, None);
    let ids: Vec<RequestId> =
        prompts.iter().zip(&requests).map(|(p, o)| s.submit(p.clone(), o.clone()).expect("submit")).collect();
    let (done, _) = run(&mut s, |_, _| {});
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            done[id].tokens, want[i],
            "request {i} ({:?}): the scheduler differs from the full-logits path",
            requests[i].sampling
        );
    }
}

#[test]
fn the_choices_of_one_prompt_share_its_blocks_and_sample_as_requests_seeded_in_turn() {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    // Several prompt chunks, ending inside a KV block.
    let prompt = prompts(&tokenizer, 8)[7].clone();
    let sampled = |seed| GenerateOptions {
        max_tokens: 12,
        ignore_eos: true,
        sampling: SamplingParams { temperature: 0.9, top_k: 40, seed, ..SamplingParams::default() },
        ..GenerateOptions::default()
    };
    let n = 4;
    let want: Vec<Vec<u32>> = (0..n as u64).map(|i| full_logits_tokens(&prompt, &sampled(5 + i))).collect();
    assert!(want.windows(2).any(|w| w[0] != w[1]), "the seeds should give different choices");

    let mut s = scheduler(8, None);
    let ids = s.submit_choices(prompt.clone(), sampled(5), Drafting::None, n).expect("submit");
    let mut cached = HashMap::new();
    let mut most_blocks = 0;
    loop {
        let mut events = Vec::new();
        let busy = s.step(&mut |e| events.push(e)).expect("step");
        most_blocks = most_blocks.max(s.stats().kv_blocks_used);
        for e in events {
            match e {
                SchedulerEvent::Started { id, cached_tokens, .. } => {
                    cached.insert(id, cached_tokens);
                }
                SchedulerEvent::Finished { id, generation } => {
                    let i = ids.iter().position(|&c| c == id).expect("a choice");
                    assert_eq!(generation.tokens, want[i], "choice {i} differs from a request seeded {}", 5 + i);
                }
                SchedulerEvent::Failed { id, error } => panic!("choice {id} failed: {error}"),
                SchedulerEvent::Text { .. } | SchedulerEvent::PromptScored { .. } => {}
            }
        }
        if !busy {
            break;
        }
    }
    // The first choice evaluates the prompt; the others only its last token.
    assert_eq!(cached[&ids[0]], 0);
    for id in &ids[1..] {
        assert_eq!(cached[id], prompt.len() - 1, "choice {id} should share the prompt's blocks");
    }
    // The prompt's full blocks are held once: each choice adds at most its own tail.
    let block = s.runner().kv().block_size();
    let prompt_blocks = prompt.len() / block;
    let per_choice = (prompt.len() % block + 12).div_ceil(block) + 1;
    assert!(
        most_blocks <= prompt_blocks + n * per_choice,
        "{most_blocks} blocks at most for {n} choices of a {prompt_blocks}-block prompt"
    );
    assert_eq!(s.stats().kv_blocks_used, 0, "KV blocks leaked");
}

/// Prompt scoring (completions' `echo` with `logprobs`): each prompt token's log-probability from
/// the row before it equals the whole-logits path's, in a batch with another request whose tokens
/// do not change; the prompt is scored again when its blocks are already cached. (`run` checks
/// that the scores are also streamed once, before the answer's text.)
#[test]
fn prompt_logprobs_equal_those_of_every_row_and_change_no_tokens() {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let prompts = prompts(&tokenizer, 8);
    // Longer than a prefill chunk: scored over several steps.
    let (scored, other) = (prompts[7].clone(), prompts[2].clone());
    assert!(scored.len() > PREFILL_CHUNK);
    let engine_options = EngineOptions { n_ctx: 512, prefill_chunk: PREFILL_CHUNK, ..EngineOptions::default() };
    let (_, mut runner) = cpu_runner(QWEN_05B, &engine_options);
    let seq = runner.kv_mut().add_sequence();
    let mut rows: Vec<f32> = Vec::new();
    for chunk in scored.chunks(PREFILL_CHUNK) {
        rows.extend_from_slice(runner.step(&[BatchEntry { seq, tokens: chunk }], LogitsMode::All).expect("prefill"));
    }
    let n_vocab = rows.len() / scored.len();
    let want: Vec<TokenLogprob> = (0..scored.len() - 1)
        .map(|k| TokenLogprob::from_logits(&rows[k * n_vocab..(k + 1) * n_vocab], scored[k + 1], 3))
        .collect();
    let solo = solo_outputs(&[scored.clone(), other.clone()], 6);

    let mut s = scheduler(4, None);
    let echo = GenerateOptions { prompt_logprobs: Some(3), ..greedy(6) };
    for round in 0..2 {
        let ids = [
            s.submit(scored.clone(), echo.clone()).expect("submit"),
            s.submit(other.clone(), greedy(6)).expect("submit"),
        ];
        let (done, _) = run(&mut s, |_, _| {});
        assert_eq!(done[&ids[0]].tokens, solo[0], "round {round}: scoring changed the tokens");
        assert_eq!(done[&ids[1]].tokens, solo[1], "round {round}: the other request's tokens changed");
        assert!(done[&ids[1]].prompt_logprobs.is_none());
        let got = done[&ids[0]].prompt_logprobs.as_ref().expect("prompt logprobs");
        assert_eq!(got.len(), want.len(), "round {round}: one per prompt token after the first");
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.token, w.token);
            assert!((g.logprob - w.logprob).abs() < 1e-3, "round {round}, token {k}: {g:?} vs {w:?}");
            assert_eq!(g.top.len(), 3);
            assert!((g.top[0].1 - w.top[0].1).abs() < 1e-3, "round {round}, token {k}: {g:?} vs {w:?}");
        }
    }
}

/// Structured output in the batch: forced tokens (verified as drafts in the pass of the token
/// before them) give the greedy answer masked decoding gives token by token, with each token's
/// log-probability from the row that predicted it; a lazy grammar before its trigger changes
/// nothing, and free requests batched with constrained ones keep their solo tokens.
#[test]
fn constrained_requests_batch_with_free_ones_and_forced_tokens_keep_greedy_answers() {
    use hearth_core::constraint::{Activation, Grammar, GrammarRequest, Trigger};
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let prompts = prompts(&tokenizer, 3);
    let max_tokens = 40;
    let free = solo_outputs(&prompts, max_tokens);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"language": {"enum": ["python", "rust"]}, "lines": {"type": "integer"}, "summary": {"type": "string", "maxLength": 60}},
        "required": ["language", "lines", "summary"], "additionalProperties": false
    });
    let grammar = GrammarRequest {
        grammar: Grammar::JsonSchema { schema, strict: true },
        param: "response_format",
        activation: Activation::Always,
    };
    let (oracle, oracle_logprobs) = masked_full_logits_decode(&prompts[0], &grammar, max_tokens);
    let constrained = GenerateOptions { max_tokens, grammar: Some(grammar), ..GenerateOptions::default() };
    let reporting = GenerateOptions { logprobs: Some(2), ..constrained.clone() };
    // A lazy grammar whose trigger never comes: the free answer.
    let lazy = GrammarRequest {
        grammar: Grammar::Regex("x".into()),
        param: "tools",
        activation: Activation::Lazy(vec![Trigger::Token("<tool_call>".into())]),
    };
    let waiting = GenerateOptions { grammar: Some(lazy), ..greedy(max_tokens) };

    let mut s = scheduler(8, None);
    let free_ids: Vec<RequestId> =
        prompts.iter().map(|p| s.submit(p.clone(), greedy(max_tokens)).expect("submit")).collect();
    let constrained_id = s.submit(prompts[0].clone(), constrained).expect("submit");
    let reporting_id = s.submit(prompts[0].clone(), reporting).expect("submit");
    let waiting_id = s.submit(prompts[1].clone(), waiting).expect("submit");
    let (done, streamed) = run(&mut s, |_, _| {});
    for (i, id) in free_ids.iter().enumerate() {
        assert_eq!(done[id].tokens, free[i], "free request {i} beside constrained ones");
    }
    for id in [constrained_id, reporting_id] {
        let generation = &done[&id];
        assert_eq!(generation.tokens, oracle, "{:?}", generation.text);
        assert_eq!(streamed[&id], generation.text);
        let stats = generation.constraint.as_ref().expect("constraint stats");
        assert!(stats.forced_tokens > 0, "{stats:?}");
        // Every kept token's row was masked, the forced ones' too.
        assert!(stats.masks() >= generation.tokens.len(), "{stats:?}");
        let value: serde_json::Value =
            serde_json::from_str(&generation.text).unwrap_or_else(|e| panic!("{e}: {}", generation.text));
        assert!(["python", "rust"].contains(&value["language"].as_str().unwrap_or_default()), "{}", generation.text);
    }
    let logprobs = done[&reporting_id].logprobs.as_ref().expect("log-probabilities");
    assert_eq!(logprobs.len(), oracle_logprobs.len(), "one per token, forced ones included");
    for (k, (got, want)) in logprobs.iter().zip(&oracle_logprobs).enumerate() {
        assert_eq!(got.token, want.token);
        assert!((got.logprob - want.logprob).abs() < 1e-3, "token {k}: {got:?} vs {want:?}");
        assert_eq!(got.top.len(), 2);
        assert_eq!(got.top[0].0, want.top[0].0, "token {k}: {got:?} vs {want:?}");
    }
    assert_eq!(done[&waiting_id].tokens, free[1], "a lazy grammar before its trigger");
}

/// Llama 3.x tool calls (recognised by the template's `ipython` role) on a real model: under
/// `required` the whole answer is one `{"name", "parameters"}` call whose parameters match the
/// tool's schema, and it reads back as that call; under `auto` an answer that begins with `{` is
/// such a call and any other is text. (Qwen's turn markers with Llama 3's tool instructions: the
/// format's grammar and parser are what is tested, not Llama's weights.)
#[test]
fn llama3_tool_calls_are_whole_answer_calls_under_their_grammar() {
    use hearth_core::chat::{ChatTemplate, ToolCallFormat};
    use hearth_core::request::{Function, Prompt, ToolChoice, ToolRequest};
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let template = ChatTemplate::new(
        r#"{%- for m in messages -%}
{%- if m.role == 'tool' -%}<|im_start|>user
<|start_header_id|>ipython<|end_header_id|>{{ m.content }}<|im_end|>
{% else -%}<|im_start|>{{ m.role }}
{% if loop.first and tools -%}
Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.
Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.
{% for t in tools %}{{ t | tojson }}
{% endfor %}{% endif %}{{ m.content }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"#,
        None,
        Some("<|im_end|>".into()),
    )
    .expect("template");
    assert_eq!(ToolCallFormat::of_template(&template), Some(ToolCallFormat::Llama3));
    let parameters = serde_json::json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": false
    });
    let tools = |choice| ToolRequest {
        tools: vec![
            serde_json::json!({"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": parameters}}),
        ],
        functions: vec![Function { name: "get_weather".into(), parameters: parameters.clone(), strict: true }],
        choice,
        parallel: true,
    };
    let messages = vec![serde_json::json!({"role": "user", "content": "What is the weather in Paris, in celsius?"})];
    let mut s = scheduler(4, None);
    let mut submitted = Vec::new();
    for choice in [ToolChoice::Required, ToolChoice::Auto] {
        let request = tools(choice);
        let prompt = Prompt::Chat(messages.clone())
            .tokenize_with_tools(&tokenizer, Some(&template), None, Some(&request), None)
            .expect("prompt");
        let mut options = GenerateOptions { max_tokens: 60, ..GenerateOptions::default() };
        let format = request.apply(Some(&template), &tokenizer, &mut options).expect("tools").expect("a format");
        assert_eq!(format, ToolCallFormat::Llama3);
        submitted.push(s.submit(prompt, options).expect("submit"));
    }
    let (done, _) = run(&mut s, |_, _| {});
    for (i, id) in submitted.iter().enumerate() {
        let text = &done[id].text;
        let (content, calls) = ToolCallFormat::Llama3.parser().parse(text);
        if i == 0 || text.trim_start().starts_with('{') {
            assert_eq!((content, calls.len()), (None, 1), "{text}");
            assert_eq!(calls[0].name, "get_weather");
            let arguments: serde_json::Value = serde_json::from_str(&calls[0].arguments).expect("arguments are JSON");
            assert!(arguments["city"].as_str().is_some_and(|c| c.len() <= 30), "{text}");
            assert!(["celsius", "fahrenheit"].contains(&arguments["unit"].as_str().unwrap_or_default()), "{text}");
        } else {
            assert_eq!((content.as_deref(), calls.len()), (Some(text.as_str()), 0));
        }
        eprintln!("llama3 format, {}: {text}", ["required", "auto"][i]);
    }
}

/// The full-logits oracle of a constrained greedy answer: every row masked whole by the grammar,
/// then its argmax, until end-of-generation or the grammar's end, token by token (no forced
/// tokens). With each token's log-probability (2 alternatives) in its unmasked row.
fn masked_full_logits_decode(
    prompt: &[u32],
    grammar: &hearth_core::constraint::GrammarRequest,
    max_tokens: usize,
) -> (Vec<u32>, Vec<TokenLogprob>) {
    use hearth_core::constraint::{GrammarCompiler, GrammarState};
    let engine_options = EngineOptions { n_ctx: 512, prefill_chunk: PREFILL_CHUNK, ..EngineOptions::default() };
    let (file, mut runner) = cpu_runner(QWEN_05B, &engine_options);
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let compiler = GrammarCompiler::new(&tokenizer, runner.config().n_logits).expect("compiler");
    let mut state = GrammarState::new(&compiler.compile(grammar).expect("compile"), 0.0);
    let seq = runner.kv_mut().add_sequence();
    let mut logits = Vec::new();
    for chunk in prompt.chunks(PREFILL_CHUNK) {
        logits = runner.step(&[BatchEntry { seq, tokens: chunk }], LogitsMode::Last).expect("prefill").to_vec();
    }
    let mut sampler = Sampler::new(SamplingParams { temperature: 0.0, ..SamplingParams::default() });
    let mut history = prompt.to_vec();
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    while tokens.len() < max_tokens {
        let unmasked = logits.clone();
        state.mask_logits(&mut logits).expect("mask");
        let token = sampler.sample(&mut logits, &history);
        if tokenizer.is_end_of_generation(token) {
            break;
        }
        state.accept(token).expect("accept");
        tokens.push(token);
        logprobs.push(TokenLogprob::from_logits(&unmasked, token, 2));
        history.push(token);
        if state.is_complete() {
            break;
        }
        logits = runner.step(&[BatchEntry { seq, tokens: &[token] }], LogitsMode::Last).expect("decode").to_vec();
    }
    (tokens, logprobs)
}

/// Constrained greedy answers sampled from candidates (the allowed ones among a row's top
/// candidates; the row evaluated again for its whole logits when none is allowed) equal the
/// answers of rows masked whole, alone and in a batch, for a schema the model follows and for a
/// regex it would never write (whose rows need their whole logits).
#[test]
fn constrained_answers_from_candidates_equal_those_of_rows_masked_whole() {
    use hearth_core::constraint::{Activation, Grammar, GrammarRequest};
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let prompts = prompts(&tokenizer, 2);
    let max_tokens = 40;
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"language": {"enum": ["python", "rust"]}, "lines": {"type": "integer"}, "summary": {"type": "string", "maxLength": 40}},
        "required": ["language", "lines", "summary"], "additionalProperties": false
    });
    let grammars = [
        GrammarRequest {
            grammar: Grammar::JsonSchema { schema, strict: true },
            param: "response_format",
            activation: Activation::Always,
        },
        GrammarRequest {
            grammar: Grammar::Regex("zq[0-9]{3} (yes|no) #[a-f]{4}".into()),
            param: "structured_outputs",
            activation: Activation::Always,
        },
    ];
    let oracle: Vec<Vec<u32>> =
        grammars.iter().zip(&prompts).map(|(g, p)| masked_full_logits_decode(p, g, max_tokens).0).collect();
    for batched in [false, true] {
        let mut s = scheduler(4, None);
        let mut generations: Vec<Generation> = Vec::new();
        let mut ids = Vec::new();
        for (grammar, prompt) in grammars.iter().zip(&prompts) {
            let options = GenerateOptions { max_tokens, grammar: Some(grammar.clone()), ..GenerateOptions::default() };
            ids.push(s.submit(prompt.clone(), options).expect("submit"));
            if !batched {
                let (mut done, _) = run(&mut s, |_, _| {});
                generations.push(done.remove(ids.last().expect("submitted")).expect("finished"));
            }
        }
        if batched {
            let (mut done, _) = run(&mut s, |_, _| {});
            generations = ids.iter().map(|id| done.remove(id).expect("finished")).collect();
        }
        for (k, generation) in generations.iter().enumerate() {
            let want = tokenizer.decode(&oracle[k], false).unwrap_or_default();
            assert_eq!(
                generation.tokens, oracle[k],
                "grammar {k}, batched {batched}: {:?} vs {want:?}",
                generation.text
            );
            let stats = generation.constraint.as_ref().expect("constraint stats");
            if k == 1 {
                assert!(stats.full_logits_rows > 0, "the regex's rows needed their whole logits: {stats:?}");
            }
            eprintln!(
                "grammar {k}, batched {batched}: {:?}, {} rows again whole",
                generation.text, stats.full_logits_rows
            );
        }
    }
}

/// The conversation of a chat's next round: the first round's messages, `answer` as the
/// assistant's, and a new question.
fn next_round(first: &[serde_json::Value], answer: &str) -> Vec<serde_json::Value> {
    let mut messages = first.to_vec();
    messages.push(serde_json::json!({"role": "assistant", "content": answer}));
    messages.push(serde_json::json!({"role": "user", "content": "And in Rust?"}));
    messages
}

/// An answer the model wrote in other tokens than the text's canonical ones ("Hello" as "H",
/// "e", "l", "l", "o") comes back inside the next round's conversation as text: through the
/// history, the prompt keeps the answer's ids up to the template's end-of-turn token, and the rest
/// is tokenized as the whole text would be; both spell the same text. A conversation that departs
/// from the answer inside it, and a text prompt, are tokenized as without a history.
#[test]
fn a_conversation_sent_back_keeps_the_ids_the_model_wrote() {
    use hearth_core::chat::ChatTemplate;
    use hearth_core::request::{Prompt, TokenHistory};
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let template = ChatTemplate::from_gguf(&file.metadata).expect("template").expect("a chat template");
    let first = vec![serde_json::json!({"role": "user", "content": "Say hello in Python."})];
    let tokenize = |messages: &[serde_json::Value], history| {
        Prompt::Chat(messages.to_vec()).tokenize_with_tools(&tokenizer, Some(&template), None, None, history)
    };
    let history = TokenHistory::new();
    let prompt = tokenize(&first, Some(&history)).expect("prompt");
    assert_eq!(prompt, tokenize(&first, None).expect("prompt"), "a new conversation is tokenized as text");

    let text = "print(\"Hello\")";
    let canonical = tokenizer.encode(text, false, false).expect("encode");
    let mut answer: Vec<u32> =
        text.bytes().map(|b| tokenizer.encode(&(b as char).to_string(), false, false).unwrap()[0]).collect();
    assert_ne!(answer, canonical, "the answer should be spelled in other tokens than the canonical ones");
    assert_eq!(tokenizer.decode(&answer, false).expect("decode"), text);
    history.learn_answer(&tokenizer, &prompt, &answer);

    let second = next_round(&first, text);
    let plain = tokenize(&second, None).expect("prompt");
    let continued = tokenize(&second, Some(&history)).expect("prompt");
    let model_wrote = [prompt.clone(), answer.clone()].concat();
    assert!(!plain.starts_with(&model_wrote), "without the history the answer is re-tokenized");
    assert_eq!(&continued[..model_wrote.len()], &model_wrote[..], "the prompt and answer keep their ids");
    let end_of_turn = tokenizer.token_id("<|im_end|>").expect("<|im_end|>");
    assert_eq!(continued[model_wrote.len()], end_of_turn, "the cut is at the end-of-turn token");
    // (The first end-of-turn after the first prompt closes the answer.)
    let answer_end =
        prompt.len() + plain[prompt.len()..].iter().position(|&id| id == end_of_turn).expect("end of turn");
    assert_eq!(&continued[model_wrote.len()..], &plain[answer_end..], "after the cut, the canonical ids");
    let spelled = |ids: &[u32]| tokenizer.decode(ids, false).expect("decode");
    assert_eq!(spelled(&continued), spelled(&plain), "the same text");

    // A third round builds on the second's prompt (remembered when it was tokenized).
    answer.truncate(6);
    history.learn_answer(&tokenizer, &continued, &answer);
    let third = next_round(&second, "print(");
    let continued_again = tokenize(&third, Some(&history)).expect("prompt");
    assert!(continued_again.starts_with(&[continued.clone(), answer.clone()].concat()));
    assert_eq!(spelled(&continued_again), spelled(&tokenize(&third, None).expect("prompt")));

    // A client that edits the answer gets the text's canonical ids.
    let edited = next_round(&first, "print(\"Hi\")");
    assert_eq!(tokenize(&edited, Some(&history)).expect("prompt"), tokenize(&edited, None).expect("prompt"));
    // A text that goes on from a remembered one without a special token is tokenized whole.
    let completion = Prompt::Text(format!("{}{text} # greets", spelled(&prompt)));
    let with = completion.tokenize_with_tools(&tokenizer, None, None, None, Some(&history)).expect("prompt");
    assert_eq!(with, completion.tokenize(&tokenizer, None, None).expect("prompt"));
}

/// A chat's second round sent through the scheduler's history resumes from the first round's
/// KV blocks: the prompt starts with the first prompt and answer's ids, and the prefix cache
/// serves all of them but a last answer token that was sampled and never evaluated. The first
/// answer is one whose ids are not its text's canonical tokenization (the first seed that samples
/// one), the case a second tokenization would not reuse.
#[test]
fn a_chats_next_round_reuses_the_answers_kv_blocks() {
    use hearth_core::chat::ChatTemplate;
    use hearth_core::request::Prompt;
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let template = ChatTemplate::from_gguf(&file.metadata).expect("template").expect("a chat template");
    let mut s = scheduler(2, None);
    let history = s.token_history().clone();
    let first = vec![serde_json::json!({"role": "user", "content": "Write a haiku about caching."})];
    let tokenize = |s: &Scheduler, messages: &[serde_json::Value]| {
        Prompt::Chat(messages.to_vec())
            .tokenize_with_tools(s.tokenizer(), Some(&template), None, None, Some(&history))
            .expect("prompt")
    };
    let round = |s: &mut Scheduler, prompt: Vec<u32>, seed| {
        let sampled = GenerateOptions {
            max_tokens: 24,
            sampling: SamplingParams { temperature: 1.0, seed, ..SamplingParams::default() },
            ..GenerateOptions::default()
        };
        s.submit(prompt, sampled).expect("submit");
        let mut cached = None;
        let mut generation = None;
        loop {
            let mut events = Vec::new();
            let busy = s.step(&mut |e| events.push(e)).expect("step");
            for e in events {
                match e {
                    SchedulerEvent::Started { cached_tokens, .. } => cached = Some(cached_tokens),
                    SchedulerEvent::Finished { generation: g, .. } => generation = Some(g),
                    SchedulerEvent::Failed { error, .. } => panic!("failed: {error}"),
                    SchedulerEvent::Text { .. } | SchedulerEvent::PromptScored { .. } => {}
                }
            }
            if !busy {
                break;
            }
        }
        (cached.expect("started"), generation.expect("finished"))
    };
    let prompt = tokenize(&s, &first);
    let (seed, answer) = (1..=60)
        .find_map(|seed| {
            let (_, answer) = round(&mut s, prompt.clone(), seed);
            let canonical = s.tokenizer().encode(&answer.text, false, false).expect("encode");
            (canonical != answer.tokens).then_some((seed, answer))
        })
        .expect("one of 60 seeds samples an answer in non-canonical tokens");
    let second = tokenize(&s, &next_round(&first, &answer.text));
    let model_wrote = [prompt.clone(), answer.tokens.clone()].concat();
    assert!(
        second.starts_with(&model_wrote),
        "seed {seed}: the second prompt starts with the first prompt and answer's ids"
    );
    let (cached, _) = round(&mut s, second, 0);
    let evaluated = match answer.finish_reason {
        // (The end-of-generation token was sampled after the last answer token was evaluated.)
        FinishReason::Stop => model_wrote.len(),
        _ => model_wrote.len() - 1,
    };
    assert_eq!(cached, evaluated, "seed {seed}: the prefix cache serves the first round's evaluated tokens");
}
