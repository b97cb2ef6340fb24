//! Speculative decoding end to end on the real models (CPU backend), plus a statistical check of
//! the rejection-sampling rule.
//!
//! The reference for greedy speculation is plain greedy decoding (`Engine::generate`), itself
//! checked against llama.cpp in golden_greedy.rs: speculation must not change a single token.

use hearth_core::block_on::block_on;
use hearth_core::chat::ChatMessage;
use hearth_core::engine::{Engine, EngineOptions, GenerateOptions, Generation, Session};
use hearth_core::gguf::GgufFile;
use hearth_core::graph::LogitsMode;
use hearth_core::sampling::{SamplingParams, Xoshiro256StarStar};
use hearth_core::scheduler::{Drafting, Scheduler, SchedulerEvent, SchedulerOptions};
use hearth_core::speculative::verify::{sample_from, verify_token, TokenVerdict};
use hearth_core::speculative::{
    default_draft_vocab, BatchedDraftModel, DraftRequest, SpeculativeOptions, DEFAULT_DRAFT_VOCAB,
    DEFAULT_MIN_CONFIDENCE,
};
use hearth_core::tokenizer::Tokenizer;
use hearth_core::CoreError;
use hearth_tests::*;

const CODE_EDIT: &str = "Rewrite this function with type hints:\n\
def merge_counts(first, second):\n    result = dict(first)\n    for key, value in second.items():\n        \
result[key] = result.get(key, 0) + value\n    return result\n";
const PROSE: &str = "Write a short paragraph about why lighthouses were important for sailors.";
const N_TOKENS: usize = 48;

fn cpu_engine(stem: &str) -> Engine {
    let path = model_path(stem);
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let backend = hearth_cpu::CpuBackend::new(None).expect("cpu backend");
    let options = EngineOptions { n_ctx: 1024, ..EngineOptions::default() };
    Engine::load(&file, Box::new(backend), &options, &mut |_, _| {}).expect("load model")
}

/// `stem` on the CPU as the draft model of `target`, its head computing the first
/// `logits_vocab` ids' logits (all of them: `None`).
fn set_cpu_draft(target: &mut Engine, stem: &str, logits_vocab: Option<usize>, options: SpeculativeOptions) {
    let file = GgufFile::open(&model_path(stem)).expect("open draft model");
    let load = EngineOptions { n_ctx: 1024, logits_vocab, ..EngineOptions::default() };
    let backend = hearth_cpu::CpuBackend::new(None).expect("cpu backend");
    let draft = hearth_tests::draft_model(&file, Box::new(backend), &load, target.tokenizer());
    target.set_draft_model(draft, options);
}

/// A CPU session whose head computes the logits of the first `logits_vocab` ids only.
fn shortlisted_session(stem: &str, logits_vocab: usize) -> (GgufFile, Session) {
    let file = GgufFile::open(&model_path(stem)).expect("open");
    let options = EngineOptions { n_ctx: 1024, logits_vocab: Some(logits_vocab), ..EngineOptions::default() };
    let backend = hearth_cpu::CpuBackend::new(None).expect("cpu backend");
    let mut last_progress = (0, 1);
    let session = Session::load(&file, Box::new(backend), &options, &mut |done, total| last_progress = (done, total))
        .expect("load shortlisted");
    // The progress total counts the shortlist's bytes instead of the whole head's (an untied
    // head is uploaded only as its shortlist), and the last report reaches it.
    let (done, total) = last_progress;
    assert_eq!(done, total, "{stem}: load progress ended at {done} of {total} bytes");
    let untied = file.tensor("output.weight");
    let head = untied.or(file.tensor("token_embd.weight")).expect("an output head");
    let shortlist_bytes = logits_vocab as u64 * head.ty.row_bytes(head.dims[0] as usize).expect("row bytes") as u64;
    let file_bytes: u64 = file.tensors.iter().map(|t| t.n_bytes).sum();
    let left_out = untied.map_or(0, |t| t.n_bytes);
    assert_eq!(total, file_bytes - left_out + shortlist_bytes, "{stem}: progress total");
    (file, session)
}

/// The user message in the model's chat template (as `hearth run --chat` does), BOS once; the
/// plain text for a model without a template.
fn chat_prompt(engine: &Engine, user: &str) -> Vec<u32> {
    let text = match engine.chat_template() {
        Some(template) => {
            template.render(&[ChatMessage { role: "user".into(), content: user.into() }], true).expect("render")
        }
        None => user.to_string(),
    };
    let tok = engine.tokenizer();
    let bos_in_text = tok.bos().is_some_and(|b| text.starts_with(&*String::from_utf8_lossy(&tok.token_bytes(b))));
    tok.encode(&text, tok.add_bos_default() && !bos_in_text, true).expect("encode")
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    // ignore_eos: every comparison covers the full N_TOKENS even if a model ends its turn early.
    GenerateOptions {
        max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        ignore_eos: true,
        ..GenerateOptions::default()
    }
}

/// Plain greedy vs speculative greedy on the same engine; returns the speculative generation.
fn assert_same_as_greedy(engine: &mut Engine, drafting: Drafting, prompt: &[u32], label: &str) -> Generation {
    let options = greedy(N_TOKENS);
    // From an empty cache both times, so both evaluate the prompt the same way.
    engine.clear_prefix_cache();
    let plain = engine.generate_with(prompt, &options, Drafting::None, &mut |_| true).expect("generate");
    engine.clear_prefix_cache();
    let mut streamed = String::new();
    let spec = engine
        .generate_with(prompt, &options, drafting, &mut |d| {
            streamed.push_str(d);
            true
        })
        .expect("speculative generate");
    assert_eq!(plain.tokens.len(), N_TOKENS, "{label}: plain generation length");
    assert_eq!(
        spec.tokens, plain.tokens,
        "{label}: speculative greedy differs from greedy\nplain: {:?}\nspec:  {:?}",
        plain.text, spec.text
    );
    assert_eq!(spec.text, plain.text, "{label}");
    assert_eq!(streamed, spec.text, "{label}: streamed text");
    assert_eq!(spec.finish_reason, plain.finish_reason, "{label}");
    let m = spec.speculative.clone().expect("metrics");
    assert!(m.accepted <= m.proposed, "{label}: {m:?}");
    // The first token comes from the prompt pass; every later pass yields its accepted drafts
    // plus one token of the target.
    assert_eq!(1 + m.accepted + m.target_forward_passes, N_TOKENS, "{label}: {m:?}");
    eprintln!("{label}: {m:?}");
    spec
}

#[test]
fn draft_model_greedy_equals_greedy_on_qwen_15b() {
    let mut engine = cpu_engine(QWEN_15B);
    // A fixed draft length, so that drafts are verified whatever this machine's costs.
    set_cpu_draft(&mut engine, QWEN_05B, None, fixed_length(5));
    let code = chat_prompt(&engine, CODE_EDIT);
    // As the engine is set up (the default confidence stop) on the code edit...
    let spec = assert_same_as_greedy(&mut engine, Drafting::Default, &code, "1.5B + 0.5B draft, code edit");
    assert!(spec.speculative.unwrap().acceptance_rate > 0.0);
    // ...full-length drafts (more rejections, wider passes) on prose...
    let full_length = Drafting::DraftModel { options: fixed_length(5), min_confidence: 0.0 };
    let prose = chat_prompt(&engine, PROSE);
    assert_same_as_greedy(&mut engine, full_length, &prose, "1.5B + 0.5B draft, prose");
    // ...and the default, cost-driven lengths (on a CPU mostly plain steps and probes).
    let adaptive =
        Drafting::DraftModel { options: SpeculativeOptions::default(), min_confidence: DEFAULT_MIN_CONFIDENCE };
    assert_same_as_greedy(&mut engine, adaptive, &prose, "1.5B + 0.5B draft, prose, adaptive");
}

/// Prompt lookup first, the draft model (with a shortlisted head) where nothing matches: the
/// same tokens as plain greedy decoding, with both kinds of drafts verified on the code edit.
#[test]
fn lookup_then_draft_model_greedy_equals_greedy_on_qwen_15b() {
    let mut engine = cpu_engine(QWEN_15B);
    set_cpu_draft(&mut engine, QWEN_05B, Some(65_536), SpeculativeOptions::default());
    let code = chat_prompt(&engine, CODE_EDIT);
    let drafting = Drafting::LookupThenDraftModel { options: fixed_length(3), min_confidence: DEFAULT_MIN_CONFIDENCE };
    let spec = assert_same_as_greedy(&mut engine, drafting, &code, "1.5B + lookup then 0.5B draft, code edit");
    let m = spec.speculative.expect("metrics");
    assert!(m.free_passes > 0 && m.free_accepted > 0, "the lookup never drafted the copied body: {m:?}");
    assert!(m.proposed > m.free_proposed && m.accepted > m.free_accepted, "the draft model never drafted: {m:?}");
    assert!(m.free_proposed <= m.proposed && m.free_passes <= m.target_forward_passes, "{m:?}");
    // As `hearth serve --lookup --draft-model` sets every request up: the default policies.
    let prose = chat_prompt(&engine, PROSE);
    assert_same_as_greedy(
        &mut engine,
        Drafting::LookupThenDraftModel {
            options: SpeculativeOptions::default(),
            min_confidence: DEFAULT_MIN_CONFIDENCE,
        },
        &prose,
        "1.5B + lookup then 0.5B draft, prose, adaptive",
    );
}

/// A shortlisted head computes exactly the first logits of the whole head (the same rows of the
/// same weights), and a draft model built on it never proposes an id past the shortlist.
#[test]
fn shortlisted_head_gives_the_first_logits_of_the_whole_head() {
    const SHORTLIST: usize = 32_768;
    let (_, mut whole) = cpu_session(QWEN_05B, 1024);
    let (_, mut short) = shortlisted_session(QWEN_05B, SHORTLIST);
    let n_vocab = whole.config().n_vocab;
    assert_eq!(
        (whole.config().n_logits, short.config().n_logits, short.config().n_vocab),
        (n_vocab, SHORTLIST, n_vocab)
    );
    let prompt = chat_prompt(&cpu_engine(QWEN_05B), CODE_EDIT);
    let full = whole.eval(&prompt, LogitsMode::All).expect("eval whole").to_vec();
    let part = short.eval(&prompt, LogitsMode::All).expect("eval shortlisted").to_vec();
    assert_eq!(full.len(), prompt.len() * n_vocab);
    assert_eq!(part.len(), prompt.len() * SHORTLIST);
    for (row, (f, p)) in full.chunks_exact(n_vocab).zip(part.chunks_exact(SHORTLIST)).enumerate() {
        assert!(f[..SHORTLIST].iter().zip(p).all(|(a, b)| a.to_bits() == b.to_bits()), "row {row} differs");
    }
    // Tokens past the shortlist are still read (the prompt has some: the chat template's).
    assert!(prompt.iter().any(|&t| t as usize >= SHORTLIST), "the test prompt should hold a token past the shortlist");
    // An empty shortlist is refused with a clear error.
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let options = EngineOptions { logits_vocab: Some(0), ..EngineOptions::default() };
    let backend = hearth_cpu::CpuBackend::new(None).expect("cpu backend");
    let err = Session::load(&file, Box::new(backend), &options, &mut |_, _| {})
        .err()
        .expect("a logits vocabulary of 0 must fail");
    assert!(matches!(err, CoreError::InvalidArgument(_)), "{err:?}");
    // The default shortlist: byte-level BPE vocabularies only (their ids follow merge order).
    assert_eq!(default_draft_vocab(&file.metadata), Some(DEFAULT_DRAFT_VOCAB));
    let gemma = GgufFile::open(&model_path(GEMMA_270M)).expect("open gemma");
    assert_eq!(default_draft_vocab(&gemma.metadata), None, "Gemma's SentencePiece ids are not in frequency order");
    // The draft proposes only shortlisted ids.
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let mut draft = BatchedDraftModel::new(short.into_runner(), &tokenizer, &tokenizer, 256).expect("compatible");
    draft.min_confidence = 0.0;
    let mut sequence = draft.add_sequence(&SamplingParams::default());
    let mut requests = [DraftRequest { sequence: &mut sequence, context: &prompt, max_tokens: 8 }];
    let proposal = block_on(draft.propose(&mut requests)).expect("propose").remove(0);
    assert_eq!(proposal.tokens.len(), 8);
    assert!(proposal.tokens.iter().all(|&t| (t as usize) < SHORTLIST), "{:?}", proposal.tokens);
}

/// Drafts and verifies up to `k` tokens every step, whatever the measured costs: for tests that
/// need verification to happen (the default policy may decide it does not pay on this machine).
fn fixed_length(k: usize) -> SpeculativeOptions {
    SpeculativeOptions { max_draft_tokens: k, adaptive: false }
}

/// Prompt lookup from the request's own context, within `options`.
fn lookup(options: SpeculativeOptions) -> Drafting {
    Drafting::Lookup { reference: Vec::new(), options }
}

fn prompt_lookup_equals_greedy(stem: &str) {
    let mut engine = cpu_engine(stem);
    let code = chat_prompt(&engine, CODE_EDIT);
    let label = format!("{stem} lookup, code edit");
    let spec = assert_same_as_greedy(&mut engine, lookup(fixed_length(15)), &code, &label);
    assert!(spec.speculative.unwrap().acceptance_rate > 0.0, "{stem}: prompt lookup never accepted on a rewrite");
    // The default policy verifies what pays here: any choice must give the same tokens.
    let adaptive = SpeculativeOptions::lookup();
    let want =
        assert_same_as_greedy(&mut engine, lookup(adaptive.clone()), &code, &format!("{label}, adaptive")).tokens;
    // Later requests start from what earlier ones learnt (`hearth chat`, the server, the JS API),
    // and reuse the cached prompt: same tokens.
    for turn in 0..2 {
        let g =
            engine.generate_with(&code, &greedy(N_TOKENS), lookup(adaptive.clone()), &mut |_| true).expect("generate");
        assert_eq!(g.tokens, want, "{label}, turn {turn} with the policy carried");
    }
    let prose = chat_prompt(&engine, PROSE);
    assert_same_as_greedy(&mut engine, lookup(adaptive), &prose, &format!("{stem} lookup, prose"));
}

#[test]
fn prompt_lookup_greedy_equals_greedy_on_qwen_05b() {
    prompt_lookup_equals_greedy(QWEN_05B);
}

#[test]
fn prompt_lookup_greedy_equals_greedy_on_gemma_270m() {
    prompt_lookup_equals_greedy(GEMMA_270M);
}

/// After speculation (with rejections and rollbacks) the KV cache must hold exactly the accepted
/// tokens: the blocks the request leaves in the prefix cache, read by a new sequence, give the
/// logits of a fresh session that saw the same tokens.
#[test]
fn rollback_leaves_the_kv_cache_consistent() {
    let mut engine = cpu_engine(QWEN_05B);
    let prompt = chat_prompt(&engine, CODE_EDIT);
    let spec =
        engine.generate_with(&prompt, &greedy(N_TOKENS), lookup(fixed_length(5)), &mut |_| true).expect("generate");
    let m = spec.speculative.expect("metrics");
    assert!(m.proposed > m.accepted, "the check needs at least one rejection: {m:?}");
    let all: Vec<u32> = prompt.iter().chain(&spec.tokens).copied().collect();
    let (runner, _, _) = engine.into_parts();
    let mut session = Session::from_runner(runner, 256);
    let reused = session.prepare_prompt(&all).expect("reuse the cached blocks");
    // The cached blocks reach into the output, which was written speculatively.
    assert!(reused > prompt.len() && reused < all.len(), "reused {reused} of {} ({} prompt)", all.len(), prompt.len());
    let got = session.eval(&all[reused..], LogitsMode::Last).expect("eval").to_vec();

    // The fresh session sees the same tokens the way plain decoding does: the prompt in one
    // batch, then one token per pass. The speculative one evaluated them in batches of 1..=6
    // (with rejected tokens written and rolled back in between); the CPU backend computes each
    // row independently of the other rows of a batch below 64 tokens, so stale or misplaced KV
    // entries are the only way the logits could differ.
    let (_file, mut fresh) = cpu_session(QWEN_05B, 1024);
    let mut want = fresh.eval(&prompt, LogitsMode::Last).expect("fresh prefill").to_vec();
    for &token in &all[prompt.len()..] {
        want = fresh.eval(&[token], LogitsMode::Last).expect("fresh eval").to_vec();
    }
    let max_diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(max_diff < 1e-4, "logits differ from a fresh session by {max_diff}");
    assert_eq!(argmax(&got), argmax(&want));
}

#[test]
fn gemma_cannot_draft_for_qwen() {
    let target =
        Tokenizer::from_gguf(&GgufFile::open(&model_path(QWEN_15B)).expect("open").metadata).expect("tokenizer");
    let gemma_file = GgufFile::open(&model_path(GEMMA_270M)).expect("open");
    let gemma = Tokenizer::from_gguf(&gemma_file.metadata).expect("tokenizer");
    let err = hearth_core::speculative::check_vocab_compatible(&target, &gemma).expect_err("incompatible");
    assert!(matches!(err, CoreError::VocabMismatch(_)), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(&target.vocab_size().to_string()) && message.contains(&gemma.vocab_size().to_string()),
        "{message}"
    );

    // Through the draft model's constructor too, with the real model.
    let (_file, session) = cpu_session(GEMMA_270M, 64);
    let refused = BatchedDraftModel::new(session.into_runner(), &gemma, &target, 64);
    assert!(matches!(refused, Err(CoreError::VocabMismatch(_))));
    // And the Qwen pair is compatible over the whole vocabulary.
    let small =
        Tokenizer::from_gguf(&GgufFile::open(&model_path(QWEN_05B)).expect("open").metadata).expect("tokenizer");
    assert_eq!(
        hearth_core::speculative::check_vocab_compatible(&target, &small).expect("compatible"),
        target.vocab_size()
    );
}

/// Pearson's chi-square statistic of observed counts against probabilities `p` (all > 0).
fn chi_square(counts: &[u64], p: &[f64], n: u64) -> f64 {
    counts.iter().zip(p).map(|(&o, &p)| (o as f64 - p * n as f64).powi(2) / (p * n as f64)).sum()
}

/// Critical value of chi-square with 5 degrees of freedom at significance 0.001.
const CHI2_5_DOF_0_001: f64 = 20.515;

/// Speculative sampling must output tokens distributed as p whatever q is: draws x ~ q, applies
/// the acceptance rule, counts the output tokens and runs a chi-square test against p.
#[test]
fn rejection_sampling_outputs_the_target_distribution() {
    let p: Vec<(u32, f32)> = vec![(0, 0.40), (1, 0.25), (2, 0.15), (3, 0.10), (4, 0.06), (5, 0.04)];
    // q puts mass where p has little, and on token 6 which p excludes.
    let q: Vec<(u32, f32)> = vec![(0, 0.10), (1, 0.10), (2, 0.30), (3, 0.20), (4, 0.10), (5, 0.05), (6, 0.15)];
    let p64: Vec<f64> = p.iter().map(|&(_, x)| x as f64).collect();
    let n = 200_000u64;
    let mut draft_rng = Xoshiro256StarStar::seed_from_u64(11);
    let mut rng = Xoshiro256StarStar::seed_from_u64(12);

    let mut run = |q: Option<&[(u32, f32)]>, propose: &mut dyn FnMut(&mut Xoshiro256StarStar) -> u32, naive: bool| {
        let mut counts = [0u64; 7];
        let mut accepted = 0u64;
        for _ in 0..n {
            let x = propose(&mut draft_rng);
            let token = match verify_token(&p, q, x, &mut rng).expect("p has mass") {
                TokenVerdict::Accepted => {
                    accepted += 1;
                    x
                }
                // The naive variant resamples from p instead of the residual: biased towards q.
                TokenVerdict::Rejected { replacement } if !naive => replacement,
                TokenVerdict::Rejected { .. } => sample_from(&p, &mut rng).expect("mass"),
            };
            counts[token as usize] += 1;
        }
        (counts, accepted)
    };

    let (counts, accepted) = run(Some(&q), &mut |r| sample_from(&q, r).expect("q"), false);
    assert_eq!(counts[6], 0, "a token outside p's support was output");
    let stat = chi_square(&counts[..6], &p64, n);
    assert!(stat < CHI2_5_DOF_0_001, "chi-square {stat:.1}: output is not distributed as p ({counts:?})");
    // Acceptance rate is sum_x min(p(x), q(x)) = 0.10+0.10+0.15+0.10+0.06+0.04 = 0.55.
    let rate = accepted as f64 / n as f64;
    assert!((rate - 0.55).abs() < 0.01, "acceptance rate {rate}");

    // Deterministic drafter (q one-hot on token 2, as prompt lookup): still distributed as p.
    let (counts, accepted) = run(None, &mut |_| 2, false);
    let stat = chi_square(&counts[..6], &p64, n);
    assert!(stat < CHI2_5_DOF_0_001, "one-hot q: chi-square {stat:.1} ({counts:?})");
    assert!((accepted as f64 / n as f64 - 0.15).abs() < 0.01, "one-hot q accepts with probability p(x)");

    // The test has power: resampling from p instead of the residual is detected.
    let (counts, _) = run(Some(&q), &mut |r| sample_from(&q, r).expect("q"), true);
    let stat = chi_square(&counts[..6], &p64, n);
    assert!(stat > CHI2_5_DOF_0_001 * 10.0, "the naive rule went undetected: chi-square {stat:.1}");
}

/// With sampling (temperature > 0) prompt-lookup drafts are verified by rejection sampling:
/// with fixed draft lengths the run is reproducible for a seed, and the bookkeeping adds up.
/// (The default policy picks lengths from measured timings, and which drafts are verified
/// changes which random numbers decide each token: same distribution, not the same tokens.)
#[test]
fn sampled_speculation_is_reproducible_and_consistent() {
    let mut engine = cpu_engine(QWEN_05B);
    let prompt = chat_prompt(&engine, CODE_EDIT);
    let sampling = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, seed: 42, ..SamplingParams::default() };
    let options =
        GenerateOptions { max_tokens: 32, sampling, stop: Vec::new(), ignore_eos: true, ..GenerateOptions::default() };
    let first = engine.generate_with(&prompt, &options, lookup(fixed_length(15)), &mut |_| true).expect("first");
    engine.clear_prefix_cache(); // same numerics as the first run (see assert_same_as_greedy)
    let second = engine.generate_with(&prompt, &options, lookup(fixed_length(15)), &mut |_| true).expect("second");
    assert_eq!(first.tokens, second.tokens, "same seed, same tokens");
    assert_eq!(first.tokens.len(), 32);
    let m = first.speculative.expect("metrics");
    assert_eq!(1 + m.accepted + m.target_forward_passes, 32, "{m:?}");
}

/// The first token reaches the caller before the draft model reads the prompt: its prefill
/// delays the second token, not the first; a request that ends at its first token never runs
/// the draft model.
#[test]
fn the_first_token_streams_before_the_draft_model_reads_the_prompt() {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open");
    let options = EngineOptions { n_ctx: 1024, max_sequences: 1, ..EngineOptions::default() };
    let (_, runner) = cpu_runner(QWEN_05B, &options);
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let mut scheduler =
        Scheduler::new(runner, tokenizer, SchedulerOptions { max_batch: 1, ..SchedulerOptions::default() });
    let backend = hearth_cpu::CpuBackend::new(None).expect("cpu backend");
    let draft = hearth_tests::draft_model(&file, Box::new(backend), &options, scheduler.tokenizer());
    scheduler.set_draft_model(draft, fixed_length(3));
    let draft_steps = |s: &Scheduler| s.draft_model().expect("draft").runner().backend().counters().steps_executed;
    // The whole prompt in one step (shorter than the prefill chunk), which samples the first token.
    let prompt = chat_prompt(&cpu_engine(QWEN_05B), CODE_EDIT);
    for max_tokens in [8, 1] {
        let options = GenerateOptions { max_tokens, ..greedy(max_tokens) };
        scheduler.submit_with(prompt.clone(), options, Drafting::Default).expect("submit");
        let texts = std::cell::Cell::new(0);
        let finished = std::cell::RefCell::new(None);
        let mut on_event = |event: SchedulerEvent| match event {
            SchedulerEvent::Text { .. } => texts.set(texts.get() + 1),
            SchedulerEvent::Finished { generation, .. } => *finished.borrow_mut() = Some(generation),
            SchedulerEvent::Failed { error, .. } => panic!("{error}"),
            SchedulerEvent::Started { .. } | SchedulerEvent::PromptScored { .. } => {}
        };
        let before = draft_steps(&scheduler);
        scheduler.step(&mut on_event).expect("prompt step");
        assert_eq!(texts.get(), 1, "the prompt's step streams the first token");
        assert_eq!(draft_steps(&scheduler), before, "the draft model ran before the first token streamed");
        while finished.borrow().is_none() {
            scheduler.step(&mut on_event).expect("step");
        }
        let generation = finished.take().expect("finished");
        assert_eq!(generation.tokens.len(), max_tokens);
        let drafted = draft_steps(&scheduler) > before;
        assert_eq!(drafted, max_tokens > 1, "{max_tokens} tokens: the draft model ran: {drafted}");
    }
}

/// Sampled prompt lookup keeps the target's distribution on a real model: after the copying
/// prompt's most likely first token (`def`), the lookup drafts the token that followed it in the
/// prompt, and the token chosen there must follow the target's distribution for that row, the
/// draft's own probability included. (The acceptance rule alone is checked above; this catches
/// what feeds it, e.g. a verification generator seeded like the sampler, whose draws repeated
/// the one that chose `def`: the draft was then kept every time instead of 69%.)
#[test]
fn sampled_prompt_lookup_keeps_the_targets_distribution() {
    let mut engine = cpu_engine(QWEN_05B);
    let text =
        "def merge_counts(first, second):\n    result = dict(first)\n    for key, value in second.items():\n        \
                result[key] = result.get(key, 0) + value\n    return result\n\n\n# The same function, unchanged:\n";
    let prompt = engine.tokenizer().encode(text, false, false).expect("encode");
    let sampling = SamplingParams { temperature: 1.5, top_k: 8, ..SamplingParams::default() };
    let def = engine.tokenizer().encode("def", false, false).expect("encode")[0];
    // The target's distribution after prompt + `def`.
    let mut context = prompt.clone();
    context.push(def);
    let (_, mut session) = cpu_session(QWEN_05B, 1024);
    let mut row = session.eval(&context, LogitsMode::Last).expect("eval").to_vec();
    let p = hearth_core::sampling::Sampler::new(sampling.clone()).distribution(&mut row, &context);
    let mut counts: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
    let mut verified = 0;
    for seed in 0..240u64 {
        // Three tokens: room for one draft after the first (the last token is the pass's own).
        let options = GenerateOptions {
            max_tokens: 3,
            sampling: SamplingParams { seed, ..sampling.clone() },
            stop: Vec::new(),
            ignore_eos: true,
            ..GenerateOptions::default()
        };
        // (Each run reuses the prompt's cached blocks.)
        let g = engine.generate_with(&prompt, &options, lookup(fixed_length(1)), &mut |_| true).expect("generate");
        if g.tokens[0] == def {
            *counts.entry(g.tokens[1]).or_insert(0) += 1;
            verified += g.speculative.as_ref().map_or(0, |m| m.proposed);
        }
    }
    let n: u64 = counts.values().sum();
    assert!(n >= 60 && verified == n as usize, "{n} runs began with `def`, {verified} verified a draft");
    // Goodness of fit over p's tokens, those expected fewer than 5 times pooled.
    let (mut cells, mut pooled) = (Vec::new(), (0u64, 0f64));
    for &(token, probability) in &p {
        let observed = counts.get(&token).copied().unwrap_or(0);
        let expected = probability as f64 * n as f64;
        if expected >= 5.0 {
            cells.push((observed, expected))
        } else {
            pooled = (pooled.0 + observed, pooled.1 + expected)
        }
    }
    if pooled.1 > 0.0 {
        cells.push(pooled);
    }
    assert_eq!(counts.keys().filter(|t| !p.iter().any(|(id, _)| id == *t)).count(), 0, "a token outside p: {counts:?}");
    let statistic: f64 = cells.iter().map(|&(o, e)| (o as f64 - e).powi(2) / e).sum();
    // Chi-square critical values at significance 0.001 for 1..=7 degrees of freedom.
    let critical = [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32];
    let dof = (cells.len() - 1).clamp(1, critical.len());
    eprintln!("after `def` ({n} runs): {counts:?} against {p:?}: chi-square {statistic:.1}, {dof} dof");
    assert!(statistic < critical[dof - 1], "the second token does not follow the target: chi-square {statistic:.1}");
}
