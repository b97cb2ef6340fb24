//! The shared conformance suite (crates/hearth-backend-tests: every op, weight type and KV type
//! against the CPU oracle) on every kernel variant the adapter offers, plus what only a GPU
//! backend has: weights split into row ranges by a small binding cap, and a replayed step that
//! submits exactly once.

mod common;

use common::case::{run_step, single, small_layout, tokens, Case};
use common::{open, Rng, WgpuSubject};
use hearth_backend_tests::Tolerance;
use hearth_core::backend::Backend;
use hearth_core::graph::Op;
use hearth_core::quant::GgmlType;
use hearth_wgpu::WgpuOptions;

hearth_backend_tests::conformance_suite!(WgpuSubject(WgpuOptions::default()));

#[test]
fn embed_and_matmul_split_into_row_ranges() {
    // A binding cap of 1 KiB forces many chunks (rows split across buffers).
    let mut rng = Rng(2);
    for ty in [GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F32] {
        let k = 256;
        let n = 4;
        let mut c = Case::new(n);
        let table = c.weight(ty, &[k as u64, 50], &mut rng);
        let x = c.graph.buf("x", n, k);
        c.graph.push(Op::Embed { table, out: x });
        let out = c.graph.buf("out", n, 50);
        c.graph.push(Op::MatMul { w: table, x, bias: None, out });
        c.graph.logits = out;
        let subject = WgpuSubject(WgpuOptions { max_binding_bytes: Some(1024), ..WgpuOptions::default() });
        let steps = [single(tokens(n, 50, &mut rng), 0, &small_layout())];
        c.check(&subject, &format!("split {ty:?}"), Tolerance::SUM_ORDER, &steps);
    }
}

#[test]
fn a_replayed_step_submits_once_and_counts_what_it_built() {
    let Some(mut gpu) = open(WgpuOptions::default()) else { return };
    let mut rng = Rng(15);
    let mut c = Case::new(3);
    let x = c.input("x", 256, &mut rng);
    let w = c.weight(GgmlType::Q4_K, &[256, 40], &mut rng);
    let out = c.graph.buf("out", 3, 40);
    c.graph.push(Op::MatMul { w, x, bias: None, out });
    c.graph.logits = out;
    let (kv, g) = c.load(&mut gpu);
    let step = single(tokens(3, 64, &mut rng), 0, &small_layout());
    run_step(&mut gpu, g, kv, &step).expect("warm-up step");
    for _ in 0..3 {
        let before = gpu.counters();
        run_step(&mut gpu, g, kv, &step).expect("step");
        assert_eq!(gpu.counters().submits, before.submits + 1, "a replayed step submits once");
    }
    let counters = gpu.counters();
    assert!(counters.pipelines_created > 0 && counters.bind_groups_created > 0, "counters are not kept: {counters:?}");
}

/// With `profile`, every dispatch of a step is timed and named by kernel family: the families'
/// dispatch counts add up to the dispatches the counters saw, a product reports the bytes of its
/// weights, and the profile empties once taken. An adapter without timestamps inside passes
/// reports no profile at all (rather than an empty one).
#[test]
fn a_profiled_step_times_every_dispatch_by_family() {
    let Some(mut gpu) = open(WgpuOptions { profile: true, ..WgpuOptions::default() }) else { return };
    let mut rng = Rng(16);
    let mut c = Case::new(1);
    let x = c.input("x", 256, &mut rng);
    let h = c.graph.buf("h", 1, 256);
    c.graph.push(Op::RmsNorm { x, weight: None, eps: 1e-6, group: 256, out: h });
    let w = c.weight(GgmlType::Q4_K, &[256, 40], &mut rng);
    let out = c.graph.buf("out", 1, 40);
    c.graph.push(Op::MatMul { w, x: h, bias: None, out });
    c.graph.logits = out;
    let (kv, g) = c.load(&mut gpu);
    let step = single(tokens(1, 64, &mut rng), 0, &small_layout());
    run_step(&mut gpu, g, kv, &step).expect("warm-up step");
    if !gpu.info().timestamps {
        assert_eq!(gpu.kernel_profile(), None, "a profile without timestamps");
        return;
    }
    gpu.kernel_profile();
    let before = gpu.counters();
    run_step(&mut gpu, g, kv, &step).expect("step");
    let dispatched = gpu.counters().dispatches - before.dispatches;
    let profile = gpu.kernel_profile().expect("a profile");
    let families: Vec<&str> = profile.iter().map(|k| k.family.as_str()).collect();
    assert_eq!(profile.iter().map(|k| k.dispatches).sum::<u64>(), dispatched, "families {families:?}");
    let matmul = profile.iter().find(|k| k.family == "matmul_q8 Q4_K").expect("the product's family");
    assert_eq!(matmul.weight_bytes, 40 * 144, "the Q4_K weights read");
    assert!(families.contains(&"act_quant NORM+Q8_K"), "the norm runs as the rounding's prologue: {families:?}");
    assert!(profile.iter().all(|k| k.nanos > 0), "untimed families: {profile:?}");
    assert_eq!(gpu.kernel_profile(), Some(Vec::new()), "the profile empties once taken");
}
