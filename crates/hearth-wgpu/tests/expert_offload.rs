//! `--moe-offload` on WebGPU: the expert weights on the host and their products on the CPU, the
//! rest of every step on the device, the buffers crossing between the parts of a step. The expert
//! ops against the CPU oracle, and the synthetic mixtures of experts against llama.cpp (the dense
//! ones run as on the device alone: the conformance suite's).

mod common;

use common::WgpuSubject;
use hearth_backend_tests::{experts, goldens, ExpertOffloadSubject};
use hearth_wgpu::WgpuOptions;

fn subject() -> ExpertOffloadSubject<WgpuSubject> {
    ExpertOffloadSubject(WgpuSubject(WgpuOptions::default()))
}

#[test]
fn mixture_of_experts_every_type() {
    experts::mixture_of_experts_every_type(&subject());
}

#[test]
fn mixture_of_experts_long_steps() {
    experts::mixture_of_experts_long_steps(&subject());
}

#[test]
fn synthetic_mixtures_of_experts_match_llama_cpp() {
    goldens::synthetic_mixtures_of_experts_match_llama_cpp(&subject());
}
