//! `Backend::supports` answers before anything compiles, and agrees with what `compile` accepts:
//! what the WebGPU kernels cannot run is refused by name, as a `CoreError::Unsupported` that
//! `--backend auto` and the browser's 'auto' fall back on; every weight type is supported, and
//! expert stacks larger than a binding run across up to three.

mod common;

use common::case::{random_weight, run_step, single, small_layout, tokens, Case, WEIGHT_TYPES};
use common::Rng;
use hearth_backend_tests::Tolerance;
use hearth_core::backend::{Backend, Capability, WeightData};
use hearth_core::gguf::MemorySource;
use hearth_core::graph::{BufType, ExpertGating, ExpertRouting, Op, WeightDesc};
use hearth_core::quant::GgmlType;
use hearth_core::CoreError;
use hearth_cpu::CpuBackend;
use hearth_wgpu::WgpuOptions;
use std::sync::Arc;

/// A mixture-of-experts FFN's routing, expert mat-mul and combination over `n_tokens` tokens:
/// 6 Q4_K experts of 64 rows (random weights), the expert weight named as in a GGUF.
fn experts_case(n_tokens: usize, rng: &mut Rng) -> Case {
    let (n_embd, n_ff, n_expert, n_used) = (256usize, 64usize, 6usize, 2usize);
    let mut case = Case::new(n_tokens);
    let x = case.input("x", n_embd, rng);
    let router = case.weight(GgmlType::F32, &[n_embd as u64, n_expert as u64], rng);
    let up = case.weight(GgmlType::Q4_K, &[n_embd as u64, n_ff as u64, n_expert as u64], rng);
    case.weights[up.0 as usize].0.name = "blk.0.ffn_up_exps.weight".into();
    let g = &mut case.graph;
    let logits = g.buf("ffn_moe_logits", n_tokens, n_expert);
    let ids = g.typed_buf("ffn_moe_topk", BufType::U32, n_tokens, n_used);
    let weights = g.buf("ffn_moe_weights", n_tokens, n_used);
    let up_out = g.buf("up", n_tokens, n_used * n_ff);
    let out = g.buf("out", n_tokens, n_ff);
    let routing = ExpertRouting {
        n_used,
        gating: ExpertGating::Softmax,
        normalize: true,
        scale: 1.0,
        selection_bias: None,
        groups: None,
    };
    g.push(Op::MatMul { w: router, x, bias: None, out: logits });
    g.push(Op::RouteExperts { logits, routing, ids, weights, tally: Some(0) });
    g.push(Op::MatMulExperts { w: up, x, ids, bias: None, out: up_out });
    g.push(Op::CombineExperts { x: up_out, weights, out });
    g.logits = out;
    case
}

fn upload(case: &Case, backend: &mut dyn Backend) {
    for (desc, bytes) in &case.weights {
        let data = WeightData { source: Arc::new(MemorySource::new(bytes.clone())), offset: 0, len: bytes.len() };
        backend.upload_weight(desc.clone(), data).expect("upload");
    }
}

/// An expert stack larger than a storage binding lies in up to three, whole experts each, and
/// runs as the CPU does: here with bindings capped at 4 and 2 experts' bytes (two bindings, and
/// three), for a decode-sized
/// step (one product per pair) and a long one (pairs grouped by expert).
#[test]
fn experts_across_several_bindings_match_the_cpu() {
    let expert_bytes = GgmlType::Q4_K.row_bytes(256).expect("row bytes") * 64;
    for cap_experts in [4, 2] {
        for n_tokens in [2, 24] {
            let mut rng = Rng(5);
            let case = experts_case(n_tokens, &mut rng);
            let options =
                WgpuOptions { max_binding_bytes: Some((cap_experts * expert_bytes) as u64), ..WgpuOptions::from_env() };
            let Some(mut gpu) = common::open(options) else { return };
            let mut cpu = CpuBackend::new(Some(1)).expect("cpu");
            let (kv, g) = case.load(&mut gpu);
            let (cpu_kv, cpu_g) = case.load(&mut cpu);
            let step = single(tokens(n_tokens, 64, &mut rng), 0, &small_layout());
            let got = run_step(&mut gpu, g, kv, &step).expect("gpu step");
            let want = run_step(&mut cpu, cpu_g, cpu_kv, &step).expect("cpu step");
            let what = format!("experts in bindings of {cap_experts} experts, {n_tokens} tokens");
            Tolerance::SUM_ORDER.assert_close(&what, &got, &want);
            assert_eq!(gpu.expert_tallies().expect("tallies"), cpu.expert_tallies().expect("tallies"), "{what}");
        }
    }
}

/// What the kernels cannot run is refused by name before anything compiles: an expert stack in
/// more than three bindings (a cap of one expert's bytes: six bindings), or one expert larger
/// than a binding.
#[test]
fn experts_beyond_three_bindings_are_refused_by_name_before_compiling() {
    let case = experts_case(2, &mut Rng(5));
    let expert_bytes = GgmlType::Q4_K.row_bytes(256).expect("row bytes") * 64;
    for (cap, reason) in [(expert_bytes, "6 storage bindings"), (expert_bytes / 2, "one expert exceeds")] {
        let options = WgpuOptions { max_binding_bytes: Some(cap as u64), ..WgpuOptions::from_env() };
        let Some(mut gpu) = common::open(options) else { return };
        let mut cpu = CpuBackend::new(Some(1)).expect("cpu");
        upload(&case, &mut gpu);
        upload(&case, &mut cpu);
        for op in &case.graph.ops {
            let on_gpu = gpu.supports(Capability::Op { op, graph: &case.graph });
            match op {
                Op::MatMulExperts { .. } => {
                    let refused = on_gpu.expect_err("experts apart");
                    assert!(refused.contains("blk.0.ffn_up_exps.weight") && refused.contains(reason), "{refused}");
                }
                _ => on_gpu.unwrap_or_else(|e| panic!("{}: {e}", op.name())),
            }
            // The CPU runs every op.
            cpu.supports(Capability::Op { op, graph: &case.graph }).expect("the CPU has a kernel");
        }
        // compile agrees, with the structured error the loaders fall back on.
        match gpu.compile(&case.graph) {
            Err(CoreError::Unsupported { backend, what }) => {
                assert!(backend == "wgpu" && what.contains("blk.0.ffn_up_exps.weight"), "{what}")
            }
            Err(other) => panic!("expected Unsupported, got {other}"),
            Ok(_) => panic!("experts apart compiled on wgpu"),
        }
    }
}

#[test]
fn the_kernels_weight_types_are_supported() {
    let Some(mut gpu) = common::open(WgpuOptions::from_env()) else { return };
    let mut rng = Rng(6);
    for ty in WEIGHT_TYPES {
        // A multiple of every block length (32 and the K-quants' 256).
        let row_len = 256;
        let mut case = Case::new(2);
        let x = case.input("x", row_len, &mut rng);
        case.weights.push((
            WeightDesc { name: "w".into(), ty, dims: vec![row_len as u64, 16] },
            random_weight(ty, row_len, 16, &mut rng),
        ));
        let w = hearth_core::graph::WeightId(case.weights.len() as u32 - 1);
        let out = case.graph.buf("out", 2, 16);
        case.graph.push(Op::MatMul { w, x, bias: None, out });
        case.graph.logits = out;
        let (_, graph) = case.load(&mut gpu);
        for op in &case.graph.ops {
            gpu.supports(Capability::Op { op, graph: &case.graph }).unwrap_or_else(|e| panic!("{ty:?}: {e}"));
        }
        gpu.release_graph(graph);
        gpu = common::open(WgpuOptions::from_env()).expect("reopen");
    }
}
