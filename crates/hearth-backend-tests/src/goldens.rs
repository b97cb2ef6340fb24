//! llama.cpp's references for the synthetic models (tests/fixtures/synthetic/: every architecture
//! the real models do not cover, the mixtures of experts included), on the subject's first
//! variant, by the rules and bounds of tests/support/golden.rs. The models and references are
//! committed, so this runs in the hermetic tier.

use crate::Subject;
use hearth_core::engine::{EngineOptions, Session};
use hearth_core::gguf::GgufFile;
use hearth_tests::fixtures_dir;
use hearth_tests::golden::{check_synthetic, SYNTHETIC_MODELS};

pub fn synthetic_models_match_llama_cpp(subject: &dyn Subject) {
    for (stem, tol) in SYNTHETIC_MODELS {
        let Some((variant, backend)) = subject.first_variant() else { return };
        eprintln!("{stem}: variant {variant}");
        let path = fixtures_dir().join("synthetic").join(format!("{stem}.gguf"));
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        let options = EngineOptions { n_ctx: 256, ..EngineOptions::default() };
        let mut session =
            Session::load(&file, backend, &options, &mut |_, _| {}).unwrap_or_else(|e| panic!("load {stem}: {e}"));
        check_synthetic(stem, &mut session, tol);
        // The recorded decode step holds whatever the routing picks: replayed, it builds nothing.
        let token = *session.history().last().expect("history");
        crate::models::decode_step_builds_nothing(stem, &mut session, &[token]);
    }
}
