//! The synthetic models of tests/fixtures/synthetic/ on the WebGPU backend against llama.cpp's
//! references, by the rules and bounds the CPU backend is held to (tests/golden_synthetic.rs):
//! every architecture the repository's models do not cover, the mixture of experts (qwen3moe:
//! routing, expert mat-muls and their combination on the device) included, each decode step a
//! replay that builds nothing. The models and references are committed, so this runs with no
//! download.

mod common;

use hearth_core::engine::{EngineOptions, Session};
use hearth_core::gguf::GgufFile;
use hearth_core::graph::LogitsMode;
use hearth_tests::fixtures_dir;
use hearth_tests::golden::{check_synthetic, SYNTHETIC_MODELS};
use hearth_wgpu::WgpuOptions;

#[test]
fn synthetic_models_on_webgpu_match_llama_cpp() {
    for (stem, tol) in SYNTHETIC_MODELS {
        let Some(gpu) = common::open(WgpuOptions::from_env()) else { return };
        let path = fixtures_dir().join("synthetic").join(format!("{stem}.gguf"));
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        let options = EngineOptions { n_ctx: 256, ..EngineOptions::default() };
        let mut session = Session::load(&file, Box::new(gpu), &options, &mut |_, _| {})
            .unwrap_or_else(|e| panic!("{stem} on wgpu: {e}"));
        check_synthetic(stem, &mut session, tol);
        // The recorded decode step holds whatever the routing picks: replayed, it builds nothing
        // and submits once.
        let token = *session.history().last().expect("history");
        session.eval(&[token], LogitsMode::Last).expect("warm-up decode");
        let before = session.backend().counters();
        let token = *session.history().last().expect("history");
        session.eval(&[token], LogitsMode::Last).expect("decode");
        let after = session.backend().counters();
        assert_eq!(after.pipelines_created, before.pipelines_created, "{stem}: a decode step created pipelines");
        assert_eq!(after.bind_groups_created, before.bind_groups_created, "{stem}: a decode step created bind groups");
        assert_eq!(after.submits, before.submits + 1, "{stem}: a decode step submitted more than once");
    }
}
