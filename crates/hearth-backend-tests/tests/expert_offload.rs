//! Expert weights kept on the host (`--moe-offload`), here with the CPU as the device too: the
//! step cut into parts and the buffers crossing between them change nothing, so the logits are
//! the CPU's own bit for bit; and the expert ops and synthetic models of the conformance suite.

use hearth_backend_tests::{experts, goldens, CpuSubject, ExpertOffloadSubject};
use hearth_core::backend::Backend;
use hearth_core::engine::{EngineOptions, Session};
use hearth_core::gguf::GgufFile;
use hearth_core::graph::LogitsMode;
use hearth_core::model::Model;
use hearth_core::offload::ExpertOffload;
use hearth_cpu::CpuBackend;
use hearth_tests::fixtures_dir;

const SUBJECT: ExpertOffloadSubject<CpuSubject> = ExpertOffloadSubject(CpuSubject);

/// Every synthetic mixture of experts over a prompt of 20 tokens in chunks of 8 (every row's
/// logits), then 4 decode steps: each logit equal to the CPU backend's alone.
#[test]
fn offloaded_experts_give_the_cpus_logits_bit_for_bit() {
    let moe = [
        "qwen3moe-q8_0",
        "olmoe-f32",
        "mixtral-q8_0",
        "qwen2moe-f32",
        "granitemoe-f32",
        "gpt-oss-mxfp4",
        "deepseek2-f32",
        "deepseek3-f32",
    ];
    let prompt: Vec<u32> = (0..20).map(|i| 3 + (i * 37) % 250).collect();
    for stem in moe {
        let path = fixtures_dir().join("synthetic").join(format!("{stem}.gguf"));
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        let options = EngineOptions { n_ctx: 64, prefill_chunk: 8, ..EngineOptions::default() };
        let run = |backend: Box<dyn Backend>| -> Vec<Vec<f32>> {
            let mut session = Session::load(&file, backend, &options, &mut |_, _| {}).expect("load");
            let mut steps = vec![session.eval(&prompt, LogitsMode::All).expect("prompt").to_vec()];
            for t in [5u32, 17, 99, 42] {
                steps.push(session.eval(&[t], LogitsMode::Last).expect("decode").to_vec());
            }
            steps
        };
        let alone = run(Box::new(CpuBackend::new(Some(1)).expect("cpu")));
        let device = Box::new(CpuBackend::new(Some(1)).expect("cpu"));
        let host = Box::new(CpuBackend::new(Some(1)).expect("cpu"));
        let split = run(Box::new(ExpertOffload::new(device, host)));
        for (step, (a, b)) in alone.iter().zip(&split).enumerate() {
            let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            assert_eq!(differ, 0, "{stem}: step {step}: {differ} of {} logits differ", a.len());
        }
    }
}

/// The expert stacks never reach the device: it holds every other tensor from the load on, and
/// the host receives the stacks when the first step's graph compiles. The placement the backend
/// reports (its variant, which load messages print) counts them on the host from the load on.
#[test]
fn expert_stacks_live_on_the_host_only() {
    let path = fixtures_dir().join("synthetic").join("qwen3moe-q8_0.gguf");
    let file = GgufFile::open(&path).expect("open");
    let bytes = |experts: bool| -> u64 {
        file.tensors.iter().filter(|t| t.name.contains("_exps") == experts).map(|t| t.n_bytes).sum()
    };
    let (device, host) =
        (Box::new(CpuBackend::new(Some(1)).expect("cpu")), Box::new(CpuBackend::new(Some(1)).expect("cpu")));
    let mut offload = ExpertOffload::new(device, host);
    let model = Model::load(&file, &mut offload, None, &mut |_, _| {}).expect("load");
    assert!(bytes(true) > 0 && bytes(false) > 0);
    assert_eq!(offload.weight_bytes(), [bytes(false), 0]);
    assert_eq!(offload.planned_bytes(), [bytes(false), bytes(true)]);
    offload.compile(&model.build_graph(1, 1, LogitsMode::Last)).expect("compile");
    assert_eq!(offload.weight_bytes(), [bytes(false), bytes(true)]);
    assert_eq!(offload.planned_bytes(), [bytes(false), bytes(true)]);
    let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
    let variant = offload.variant().expect("a variant");
    assert!(
        variant.ends_with(&format!(
            "weights: {} on the device, {} of experts in host memory",
            mb(bytes(false)),
            mb(bytes(true))
        )),
        "{variant}"
    );
}

#[test]
fn mixture_of_experts_every_type() {
    experts::mixture_of_experts_every_type(&SUBJECT);
}

#[test]
fn mixture_of_experts_routing_variants() {
    experts::mixture_of_experts_routing_variants(&SUBJECT);
}

#[test]
fn mixture_of_experts_long_steps() {
    experts::mixture_of_experts_long_steps(&SUBJECT);
}

#[test]
fn synthetic_mixtures_of_experts_match_llama_cpp() {
    goldens::synthetic_mixtures_of_experts_match_llama_cpp(&SUBJECT);
}
