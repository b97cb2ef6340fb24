//! Speculative decoding on wgpu (lavapipe in CI): greedy with a drafter gives exactly the tokens
//! of plain greedy decoding on the same backend. Verification evaluates 1 + k tokens in one pass
//! and rolls rejected ones back; every wgpu kernel computes a row the same way whatever the batch
//! (one attention path, row-wise mat-muls), so any difference is a verification or rollback bug.
//! A real draft model (Qwen 0.5B with a shortlisted head, on the CPU) drafts for a real target on
//! wgpu; a draft model on wgpu too (a device of its own, its proposals awaited through the async
//! path as in a browser) drafts for the tiny synthetic model, whose steps cost lavapipe little.

mod common;

use hearth_core::block_on::block_on;
use hearth_core::engine::{Engine, EngineOptions, GenerateOptions, Generation};
use hearth_core::gguf::GgufFile;
use hearth_core::scheduler::Drafting;
use hearth_core::speculative::SpeculativeOptions;
use hearth_tests::{as_ids, draft_model, fixtures_dir, model_path, read_json, QWEN_05B};
use hearth_wgpu::WgpuOptions;

const N_CTX: usize = 256;

/// A rewrite: the answer copies most of the prompt, so drafts get accepted early.
const REWRITE: &str = "Add type hints:\ndef area(width, height):\n    return width * height\n\n\
def area(width: float, height: float) -> float:\n    return width * height\n\n\
Add type hints:\ndef perimeter(width, height):\n    return 2 * (width + height)\n\n";

fn wgpu_engine(stem: &str) -> Option<Engine> {
    let gpu = common::open(WgpuOptions::from_env())?;
    let file = GgufFile::open(&model_path(stem)).expect("open model");
    let options = EngineOptions { n_ctx: N_CTX, ..EngineOptions::default() };
    Some(Engine::load(&file, Box::new(gpu), &options, &mut |_, _| {}).expect("load on wgpu"))
}

/// Plain greedy vs speculative greedy on the same engine, both from an empty cache.
fn assert_same_as_greedy(
    engine: &mut Engine,
    prompt: &str,
    drafting: Drafting,
    max_tokens: usize,
    label: &str,
) -> Generation {
    let prompt = engine.tokenizer().encode(prompt, true, false).expect("encode");
    let greedy = GenerateOptions { max_tokens, ignore_eos: true, ..GenerateOptions::default() };
    engine.clear_prefix_cache();
    let plain = engine.generate_with(&prompt, &greedy, Drafting::None, &mut |_| true).expect("generate");
    engine.clear_prefix_cache();
    let spec = engine.generate_with(&prompt, &greedy, drafting, &mut |_| true).expect("speculative generate");
    let metrics = spec.speculative.clone().expect("metrics");
    eprintln!("{label}: {metrics:?}\nplain: {:?}\nspec:  {:?}", plain.text, spec.text);
    assert_eq!(plain.tokens.len(), max_tokens, "{label}: plain generation length");
    assert_eq!(spec.tokens, plain.tokens, "{label}: speculative greedy differs from greedy on wgpu");
    assert_eq!(1 + metrics.accepted + metrics.target_forward_passes, max_tokens, "{label}: {metrics:?}");
    // Without an accepted draft nothing was verified in a batch, and the check would be vacuous.
    assert!(metrics.accepted > 0, "{label}: no draft was accepted: {metrics:?}");
    spec
}

/// Prompt lookup first, a draft model where nothing matches (`--lookup --draft-model`; the draft,
/// the 0.5B itself with a shortlisted head, on the CPU): both kinds of drafts verified on wgpu.
/// (Prompt lookup alone on wgpu is the conformance suite's `prompt_lookup_greedy_equals_plain_greedy`.)
#[test]
fn qwen_05b_lookup_then_draft_greedy_equals_plain_greedy() {
    let Some(mut engine) = wgpu_engine(QWEN_05B) else { return };
    let draft_file = GgufFile::open(&model_path(QWEN_05B)).expect("open draft model");
    let options = EngineOptions { n_ctx: N_CTX, logits_vocab: Some(65_536), ..EngineOptions::default() };
    let backend = hearth_cpu::CpuBackend::new(None).expect("cpu backend");
    let draft = draft_model(&draft_file, Box::new(backend), &options, engine.tokenizer());
    let speculative = SpeculativeOptions { max_draft_tokens: 3, adaptive: false };
    engine.set_draft_model(draft, speculative.clone());
    let drafting = Drafting::LookupThenDraftModel { options: speculative, min_confidence: 0.0 };
    let spec = assert_same_as_greedy(&mut engine, REWRITE, drafting, 16, "wgpu qwen 0.5B lookup then draft");
    let m = spec.speculative.expect("metrics");
    assert!(
        m.free_accepted > 0 && m.accepted > m.free_accepted,
        "both drafters should have had drafts accepted: {m:?}"
    );
}

/// The tiny synthetic qwen2 model (f32 weights) drafting for itself, both on wgpu, through the
/// async path (`Engine::generate_with_async` awaiting the draft's passes): the tokens are
/// plain greedy's and the native CPU backend's (the browser fixture of webgpu-synthetic.test.js,
/// every step decisive by at least 0.6 nats), and every draft is accepted, since the draft computes
/// each row exactly as the verification pass does.
#[test]
fn synthetic_model_drafting_for_itself_on_wgpu_through_the_async_path() {
    let reference = read_json("browser/synthetic_qwen2_repeat_greedy.json");
    let path = fixtures_dir().join("synthetic").join(reference["model_file"].as_str().expect("model_file"));
    let (prompt, expected) = (as_ids(&reference["prompt_tokens"]), as_ids(&reference["tokens"]));
    let file = GgufFile::open(&path).expect("open synthetic model");
    let options = EngineOptions { n_ctx: 64, ..EngineOptions::default() };
    let Some(target_gpu) = common::open(WgpuOptions::from_env()) else { return };
    let mut engine = Engine::load(&file, Box::new(target_gpu), &options, &mut |_, _| {}).expect("load target on wgpu");
    let Some(draft_gpu) = common::open(WgpuOptions::from_env()) else { return };
    let draft = draft_model(&file, Box::new(draft_gpu), &options, engine.tokenizer());

    let greedy = GenerateOptions { max_tokens: expected.len(), ignore_eos: true, ..GenerateOptions::default() };
    let plain = engine.generate_with(&prompt, &greedy, Drafting::None, &mut |_| true).expect("generate");
    assert_eq!(plain.tokens, expected, "wgpu greedy vs the CPU backend");
    engine.clear_prefix_cache();
    let speculative = SpeculativeOptions { max_draft_tokens: 3, adaptive: false };
    engine.set_draft_model(draft, speculative.clone());
    // A random-weights model is rarely confident: draft the full length.
    let drafting = Drafting::DraftModel { options: speculative, min_confidence: 0.0 };
    let spec = block_on(engine.generate_with_async(&prompt, &greedy, drafting, &mut |_| true)).expect("speculative");
    let metrics = spec.speculative.expect("metrics");
    eprintln!("wgpu self-drafting synthetic qwen2: {metrics:?}");
    assert_eq!(spec.tokens, expected, "speculative greedy with a wgpu draft");
    assert!(metrics.proposed > 0, "{metrics:?}");
    assert_eq!(metrics.accepted, metrics.proposed, "a model drafting for itself: {metrics:?}");
    assert_eq!(1 + metrics.accepted + metrics.target_forward_passes, expected.len(), "{metrics:?}");
    // Greedy drafting reads back one candidate and the row's log-sum-exp per step (12 bytes;
    // reading the prompt, one candidate: 8), never the logits (4 bytes per vocabulary entry).
    let drafter = engine.scheduler().draft_model().expect("draft model");
    let counters = drafter.runner().backend().counters();
    let n_vocab = drafter.runner().config().n_vocab as u64;
    assert!(counters.steps_executed > 0, "{counters:?}");
    let steps = counters.steps_executed;
    assert!(
        (8 * steps..=12 * steps).contains(&counters.bytes_read_back),
        "draft readback {counters:?} (vocabulary {n_vocab})"
    );
}
