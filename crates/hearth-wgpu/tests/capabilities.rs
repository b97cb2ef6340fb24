//! `Backend::supports` answers before anything compiles, and agrees with what `compile` accepts:
//! a weight type the WebGPU kernels do not decode is refused with the weight's name and type,
//! as a `CoreError::Unsupported` that `--backend auto` and the browser's 'auto' fall back on.

mod common;

use common::case::{random_weight, Case};
use common::Rng;
use hearth_core::backend::{Backend, Capability, WeightData};
use hearth_core::gguf::MemorySource;
use hearth_core::graph::{Op, WeightDesc};
use hearth_core::quant::GgmlType;
use hearth_core::CoreError;
use hearth_cpu::CpuBackend;
use hearth_wgpu::WgpuOptions;
use std::sync::Arc;

/// A mat-mul of a [16, 256] weight of `ty` (raw random blocks: nothing runs) after a random input.
fn mat_mul_case(ty: GgmlType, rng: &mut Rng) -> Case {
    let mut case = Case::new(2);
    let x = case.input("x", 256, rng);
    let bytes: Vec<u8> = (0..ty.row_bytes(256).expect("row bytes") * 16).map(|_| rng.next_u64() as u8).collect();
    case.weights.push((WeightDesc { name: "blk.0.ffn_down.weight".into(), ty, dims: vec![256, 16] }, bytes));
    let w = hearth_core::graph::WeightId(case.weights.len() as u32 - 1);
    let out = case.graph.buf("out", 2, 16);
    case.graph.push(Op::MatMul { w, x, bias: None, out });
    case.graph.logits = out;
    case
}

fn upload(case: &Case, backend: &mut dyn Backend) {
    for (desc, bytes) in &case.weights {
        let data = WeightData { source: Arc::new(MemorySource::new(bytes.clone())), offset: 0, len: bytes.len() };
        backend.upload_weight(desc.clone(), data).expect("upload");
    }
}

#[test]
fn a_weight_type_without_a_kernel_is_refused_by_name_before_compiling() {
    let Some(mut gpu) = common::open(WgpuOptions::from_env()) else { return };
    let mut cpu = CpuBackend::new(Some(1)).expect("cpu");
    let mut rng = Rng(5);
    for ty in [GgmlType::Q4_1, GgmlType::Q5_K] {
        let case = mat_mul_case(ty, &mut rng);
        upload(&case, &mut gpu);
        upload(&case, &mut cpu);
        let matmul = case.graph.ops.last().expect("op");
        let refused = gpu.supports(Capability::Op { op: matmul, graph: &case.graph }).expect_err("no WebGPU kernel");
        assert!(refused.contains("blk.0.ffn_down.weight") && refused.contains(ty.name()), "{refused}");
        // The CPU runs every weight type.
        cpu.supports(Capability::Op { op: matmul, graph: &case.graph }).expect("the CPU has a kernel");
        // compile agrees, with the structured error the loaders fall back on.
        match gpu.compile(&case.graph) {
            Err(CoreError::Unsupported { backend, what }) => {
                assert!(backend == "wgpu" && what.contains(ty.name()), "{what}")
            }
            Err(other) => panic!("expected Unsupported, got {other}"),
            Ok(_) => panic!("{ty:?} compiled on wgpu"),
        }
        gpu = common::open(WgpuOptions::from_env()).expect("reopen");
        cpu = CpuBackend::new(Some(1)).expect("cpu");
    }
}

#[test]
fn the_kernels_weight_types_are_supported() {
    let Some(mut gpu) = common::open(WgpuOptions::from_env()) else { return };
    let mut rng = Rng(6);
    for ty in
        [GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K]
    {
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
