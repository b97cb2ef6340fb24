//! The backend conformance suite, in the spirit of ggml's `test-backend-ops`: every graph op over
//! many shapes and weight types, attention over the paged KV cache with every storage type, and
//! the step protocol's error paths, and whole real models (greedy tokens, quantized KV, batches,
//! speculative decoding; models.rs), each run on the backend under test and on the CPU backend
//! (the oracle) and compared within a written [`Tolerance`]; and llama.cpp's own references for
//! the synthetic and the real models (goldens.rs).
//!
//! A backend gets the whole suite with one line in a test file of its crate:
//!
//! ```text
//! hearth_backend_tests::conformance_suite!(my_subject());
//! ```
//!
//! where `my_subject()` returns a [`Subject`]: the backend's variants (a GPU backend's kernel
//! fallbacks, say), each freshly opened. Ops, weight types and KV types the backend refuses through
//! `Backend::supports` are not skipped: the suite asserts that `compile` then fails with
//! `CoreError::Unsupported`, the refusal model loading relies on, and says so in the test output.
//! The whole-model checks run where the crate defines a `real-models` feature and it is enabled
//! (the models come from the cache: `hearth models fetch all`).

pub mod case;
pub mod experts;
pub mod goldens;
pub mod models;
pub mod ops;
pub mod paged_kv;
pub mod tolerance;

pub use case::{nmse, Rng};
pub use tolerance::Tolerance;

use hearth_core::backend::Backend;

/// A backend under test.
pub trait Subject {
    /// One freshly opened backend per kernel variant worth comparing, with a name for messages.
    /// Empty only where no device exists and the environment allows that (the caller decides:
    /// `HEARTH_REQUIRE_GPU=1` makes a missing GPU adapter a failure, never a skip).
    fn variants(&self) -> Vec<(String, Box<dyn Backend>)>;

    /// The variant whole models run on (the model checks are too slow for every variant): the
    /// one a user gets by default. A subject whose variants are costly to open all at once opens
    /// just this one.
    fn first_variant(&self) -> Option<(String, Box<dyn Backend>)> {
        self.variants().into_iter().next()
    }
}

/// The CPU backend as a subject: all cores with Q4_K repacking, and one thread reading the rows
/// as the file stores them, both against the single-threaded oracle. Results never depend on the
/// thread count or the weight layout, so every comparison is exact in practice.
pub struct CpuSubject;

impl Subject for CpuSubject {
    fn variants(&self) -> Vec<(String, Box<dyn Backend>)> {
        use hearth_cpu::{CpuBackend, CpuOptions};
        let repacked = CpuBackend::with_options(CpuOptions { threads: None, repack: true, ..CpuOptions::default() });
        let rows = CpuBackend::with_options(CpuOptions { threads: Some(1), repack: false, ..CpuOptions::default() });
        vec![
            ("cpu, all threads, repacked".to_string(), Box::new(repacked.expect("cpu backend")) as Box<dyn Backend>),
            ("cpu, one thread, rows".to_string(), Box::new(rows.expect("cpu backend"))),
        ]
    }
}

/// Another subject's variants with their expert weights kept on the host and the expert mat-muls
/// run there ([`hearth_core::offload::ExpertOffload`], `--moe-offload`), a CPU backend as the host.
pub struct ExpertOffloadSubject<S>(pub S);

impl<S: Subject> ExpertOffloadSubject<S> {
    fn offload((name, device): (String, Box<dyn Backend>)) -> (String, Box<dyn Backend>) {
        let host = hearth_cpu::CpuBackend::new(None).expect("cpu backend");
        (
            format!("{name}, experts on the cpu"),
            Box::new(hearth_core::offload::ExpertOffload::new(device, Box::new(host))),
        )
    }
}

impl<S: Subject> Subject for ExpertOffloadSubject<S> {
    fn variants(&self) -> Vec<(String, Box<dyn Backend>)> {
        self.0.variants().into_iter().map(Self::offload).collect()
    }

    fn first_variant(&self) -> Option<(String, Box<dyn Backend>)> {
        self.0.first_variant().map(Self::offload)
    }
}

/// Expands to one `#[test]` per conformance check, each run on `$subject` (an expression of a
/// type implementing [`Subject`], evaluated per test); the whole-model checks (module `models`)
/// only where the calling crate has a `real-models` feature and enables it.
#[macro_export]
macro_rules! conformance_suite {
    ($subject:expr) => {
        $crate::conformance_suite!(@tests $subject;
            ops::embed_every_type,
            ops::matmul_every_type_and_shape,
            ops::rms_norm_shapes,
            ops::rope_modes,
            ops::elementwise_ops,
            ops::per_head_matmuls_and_concat,
            ops::producers_feeding_matmuls,
            ops::post_norm_chains_feeding_matmuls,
            ops::sibling_matmuls_sharing_an_input,
            ops::bad_input_is_an_error_not_a_panic,
            experts::mixture_of_experts_every_type,
            experts::mixture_of_experts_routing_variants,
            experts::mixture_of_experts_long_steps,
            goldens::synthetic_models_match_llama_cpp,
            paged_kv::kv_offsets_are_invisible_to_attention_and_shrink_quantization_error,
            paged_kv::attention_one_sequence_gqa_window_softcap,
            paged_kv::attention_several_sequences_every_kv_type,
            paged_kv::attention_with_sinks,
            paged_kv::attention_with_values_narrower_than_keys,
            paged_kv::heads_prepared_for_attention,
            paged_kv::attention_over_long_contexts,
            paged_kv::attention_feeding_an_output_projection,
            paged_kv::copied_blocks_are_seen_by_the_new_owner,
            paged_kv::rope_and_last_rows_per_sequence,
            paged_kv::steady_state_batched_decode_builds_nothing,
            paged_kv::kv_memory_follows_the_storage_type,
        );
        /// Whole real models, where the calling crate enables its `real-models` feature.
        #[cfg(feature = "real-models")]
        mod models {
            use super::*;
            $crate::conformance_suite!(@tests $subject;
                goldens::qwen_05b_matches_llama_cpp,
                goldens::gemma_270m_matches_llama_cpp,
                goldens::smollm2_135m_matches_llama_cpp,
                models::greedy_tokens_match_the_cpu,
                models::smollm2_greedy_tokens_match_the_cpu,
                models::decisive_tokens_match_the_cpu,
                models::quantized_kv_decisive_tokens_match_the_cpu,
                models::batched_steps_match_the_cpu,
                models::prompt_lookup_greedy_equals_plain_greedy,
            );
        }
    };
    (@tests $subject:expr; $($module:ident :: $check:ident),* $(,)?) => {
        $(
            #[test]
            fn $check() {
                $crate::$module::$check(&$subject);
            }
        )*
    };
}
