//! llama.cpp's references on the subject's first variant, by the rules of tests/support/golden.rs:
//! the synthetic models (tests/fixtures/synthetic/: every architecture the real models do not
//! cover, the mixtures of experts included; committed, so the hermetic tier runs them) and three
//! of the real models (tests/fixtures/golden/; from the cache, in the `real-models` tier): every
//! weight type of the four. Qwen2.5-Coder 1.5B has the 0.5B's types at three times its cost (six
//! minutes on lavapipe): its llama.cpp references are checked on the CPU (tests/golden_greedy.rs).

use crate::Subject;
use hearth_core::engine::{EngineOptions, Session};
use hearth_core::gguf::GgufFile;
use hearth_core::model::ModelConfig;
use hearth_tests::golden::{check_synthetic, compare_teacher_forced_in_one_batch, Tolerance, SYNTHETIC_MODELS};
use hearth_tests::{fixtures_dir, model_path, read_json, GEMMA_270M, QWEN_05B, SMOLLM2_135M};

pub fn synthetic_models_match_llama_cpp(subject: &dyn Subject) {
    synthetic_models_where(subject, &|_| true);
}

/// The synthetic models with a mixture of experts: where a subject differs from its device only in
/// how it runs the experts (`ExpertOffloadSubject`), a dense model would run as the device's own.
pub fn synthetic_mixtures_of_experts_match_llama_cpp(subject: &dyn Subject) {
    synthetic_models_where(subject, &|config| config.moe.is_some());
}

/// The synthetic models whose configuration `chosen` accepts, on the subject's first variant.
fn synthetic_models_where(subject: &dyn Subject, chosen: &dyn Fn(&ModelConfig) -> bool) {
    for (stem, tol) in SYNTHETIC_MODELS {
        let path = fixtures_dir().join("synthetic").join(format!("{stem}.gguf"));
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        // Chosen from the metadata: no device is opened for a model left out.
        let config = ModelConfig::from_metadata(&file.metadata).unwrap_or_else(|e| panic!("{stem}: {e}"));
        if !chosen(&config) {
            continue;
        }
        let Some((variant, backend)) = subject.first_variant() else { return };
        eprintln!("{stem}: variant {variant}");
        let options = EngineOptions { n_ctx: 256, ..EngineOptions::default() };
        let mut session =
            Session::load(&file, backend, &options, &mut |_, _| {}).unwrap_or_else(|e| panic!("load {stem}: {e}"));
        check_synthetic(stem, &mut session, tol);
        // The recorded decode step holds whatever the routing picks: replayed, it builds nothing.
        let token = *session.history().last().expect("history");
        crate::models::decode_step_builds_nothing(stem, &mut session, &[token]);
    }
}

/// `stem` on the subject's first variant against llama.cpp's greedy tokens and top-5 log-probs
/// (4 prompts, plain and chat, 48 tokens each), teacher-forced with each case in one batch (a
/// slow device affords a few prompt passes, not a hundred decode steps a case; the decode path is
/// held to the CPU's tokens in models.rs, and the CPU's to llama.cpp's one token a step in
/// tests/golden_greedy.rs). The top-1 must also agree on 95% of the steps. Every backend is held
/// to the CPU's bounds: each rounds activations to 8 bits as llama.cpp does and sums in its own
/// order, so each drifts from llama.cpp by the same kind of error (tests/support/golden.rs).
fn real_model_matches_llama_cpp(subject: &dyn Subject, stem: &str, tol: Tolerance) {
    let Some((variant, backend)) = subject.first_variant() else { return };
    eprintln!("{stem}: variant {variant}");
    let golden = read_json(&format!("golden/{stem}.json"));
    let file = GgufFile::open(&model_path(stem)).unwrap_or_else(|e| panic!("open {stem}: {e}"));
    // The longest case (30 prompt tokens and 48 generated) fits; a longer context would only
    // widen the grid of WebGPU's decode attention, which is sized for the whole context.
    let options = EngineOptions { n_ctx: 96, ..EngineOptions::default() };
    let mut session =
        Session::load(&file, backend, &options, &mut |_, _| {}).unwrap_or_else(|e| panic!("load {stem}: {e}"));
    let report = compare_teacher_forced_in_one_batch(&format!("{stem} ({variant})"), &mut session, &golden, tol);
    assert!(
        report.top1_agree * 100 >= report.steps * 95,
        "{stem}: top-1 agrees on only {}/{} steps",
        report.top1_agree,
        report.steps
    );
}

pub fn qwen_05b_matches_llama_cpp(subject: &dyn Subject) {
    real_model_matches_llama_cpp(subject, QWEN_05B, Tolerance::REAL_QWEN);
}

pub fn gemma_270m_matches_llama_cpp(subject: &dyn Subject) {
    real_model_matches_llama_cpp(subject, GEMMA_270M, Tolerance::REAL_GEMMA);
}

pub fn smollm2_135m_matches_llama_cpp(subject: &dyn Subject) {
    real_model_matches_llama_cpp(subject, SMOLLM2_135M, Tolerance::REAL_SMOLLM2);
}
