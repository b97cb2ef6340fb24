//! The device top-k reduction (shaders/sampling.wgsl, `Readback::TopK`) against the host
//! reference `top_k_rows` and the CPU backend: the same ids and the same logit bits, on random
//! rows with many exact ties, NaN, ±inf, ±0, and vocabulary sizes around the shader's chunk
//! length. The rows enter as an `Embed` of an F32 table (an exact copy on both backends).

mod common;

use common::case::{single, small_layout, Case};
use common::{open, Rng};
use hearth_core::backend::{run_step, Backend, GraphId, KvId, Readback, TopK};
use hearth_core::graph::{Op, SeqStep, StepInput};
use hearth_core::quant::GgmlType;
use hearth_core::sampling::top_k_rows;
use hearth_cpu::CpuBackend;
use hearth_wgpu::WgpuOptions;

/// Table rows of `n_vocab` logits: a coarse grid (many ties), sprinkled with NaN, ±inf and -0,
/// then special rows: all equal, only zeros of both signs, all NaN.
fn table(n_vocab: usize, rng: &mut Rng) -> Vec<f32> {
    let mut rows = Vec::new();
    for _ in 0..5 {
        rows.extend((0..n_vocab).map(|_| match rng.below(400) {
            0 => f32::NAN,
            1 => f32::NEG_INFINITY,
            2 => -0.0,
            3 if rng.below(50) == 0 => f32::INFINITY,
            r => (r % 64) as f32 * 0.125 - 4.0,
        }));
    }
    rows.extend(std::iter::repeat_n(0.5, n_vocab));
    rows.extend((0..n_vocab).map(|i| if i % 3 == 0 { -0.0 } else { 0.0 }));
    rows.extend(std::iter::repeat_n(f32::NAN, n_vocab));
    rows
}

/// A graph whose logits are rows of `values` (`[rows, n_vocab]`), picked by token id through an
/// `Embed` of an F32 table; returns it with the number of rows.
fn logits_case(values: &[f32], n_vocab: usize) -> (Case, usize) {
    let n_table_rows = values.len() / n_vocab;
    let mut case = Case::new(n_table_rows);
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    case.weights.push((
        hearth_core::graph::WeightDesc {
            name: "rows".into(),
            ty: GgmlType::F32,
            dims: vec![n_vocab as u64, n_table_rows as u64],
        },
        bytes,
    ));
    let out = case.graph.buf("logits", n_table_rows, n_vocab);
    case.graph.push(Op::Embed { table: hearth_core::graph::WeightId(0), out });
    case.graph.logits = out;
    (case, n_table_rows)
}

/// (ids, logit bits) of a step's candidates.
fn bits(top: &TopK) -> (Vec<u32>, Vec<u32>) {
    (top.ids.clone(), top.logits.iter().map(|l| l.to_bits()).collect())
}

/// Runs one step of the loaded case (`ids` from `Case::load`) reading back `readback`.
fn run_top_k(backend: &mut dyn Backend, ids: (KvId, GraphId), tokens: &[u32], readback: Readback) -> (Vec<f32>, TopK) {
    let (kv, g) = ids;
    let step = single(tokens.to_vec(), 0, &small_layout());
    let seqs: Vec<SeqStep<'_>> =
        step.seqs.iter().map(|s| SeqStep { n_tokens: s.n_tokens, pos0: s.pos0, block_tables: &s.tables }).collect();
    let input = StepInput { tokens: &step.tokens, seqs: &seqs };
    let (mut logits, mut top) = (Vec::new(), TopK::default());
    run_step(backend, g, kv, input, readback, &mut logits, &mut top).expect("step");
    (logits, top)
}

#[test]
fn device_top_k_equals_host_reference_bit_for_bit() {
    let mut rng = Rng(0x70b);
    // Around the 4096-logit chunk (1 and 2 chunks, a short last chunk), tiny, and Qwen's size.
    for n_vocab in [1usize, 7, 64, 4095, 4096, 4097, 12289, 151_936] {
        let values = table(n_vocab, &mut rng);
        let (case, n_table_rows) = logits_case(&values, n_vocab);
        // Every table row once, in a shuffled order.
        let mut tokens: Vec<u32> = (0..n_table_rows as u32).collect();
        for i in (1..tokens.len()).rev() {
            tokens.swap(i, rng.below(i as u32 + 1) as usize);
        }
        let Some(mut gpu) = open(WgpuOptions::default()) else { return };
        let gpu_ids = case.load(&mut gpu);
        let mut cpu = CpuBackend::new(Some(1)).expect("cpu");
        let cpu_ids = case.load(&mut cpu);
        for k in [1usize, 2, 40, 64, 256] {
            let k = k.min(n_vocab);
            let (logits, got) = run_top_k(&mut gpu, gpu_ids, &tokens, Readback::TopK(k));
            assert!(logits.is_empty(), "the logits were read back too");
            let mut want = TopK::default();
            let rows: Vec<f32> = tokens
                .iter()
                .flat_map(|&t| values[t as usize * n_vocab..(t as usize + 1) * n_vocab].iter().copied())
                .collect();
            top_k_rows(&rows, n_vocab, k, &mut want);
            assert_eq!(got.k, k);
            assert_eq!(
                bits(&got),
                bits(&want),
                "n_vocab {n_vocab} k {k}: device top-k differs from the host reference"
            );
            // The CPU backend (host reduction of its logits) agrees too.
            let (_, cpu_top) = run_top_k(&mut cpu, cpu_ids, &tokens, Readback::TopK(k));
            assert_eq!(bits(&cpu_top), bits(&want), "n_vocab {n_vocab} k {k}: CPU backend");
        }
        eprintln!("n_vocab {n_vocab}: ok");
    }
}

/// After the first step with a given k, a step with the reduction builds nothing, submits once
/// and reads back 8 bytes per candidate.
#[test]
fn top_k_steps_replay_without_creating_anything() {
    let Some(mut gpu) = open(WgpuOptions::default()) else { return };
    let mut rng = Rng(9);
    let n_vocab = 5000;
    let mut case = Case::new(2);
    let x = case.input("logits", n_vocab, &mut rng);
    case.graph.logits = x;
    let (kv, g) = case.load(&mut gpu);
    let step = single(vec![3, 17], 0, &small_layout());
    let seqs: Vec<SeqStep<'_>> =
        step.seqs.iter().map(|s| SeqStep { n_tokens: s.n_tokens, pos0: s.pos0, block_tables: &s.tables }).collect();
    let run = |gpu: &mut dyn Backend| {
        let (mut logits, mut top) = (Vec::new(), TopK::default());
        run_step(
            gpu,
            g,
            kv,
            StepInput { tokens: &step.tokens, seqs: &seqs },
            Readback::TopK(40),
            &mut logits,
            &mut top,
        )
        .expect("step");
        top
    };
    let first = run(&mut gpu);
    let before = gpu.counters();
    let second = run(&mut gpu);
    let after = gpu.counters();
    assert_eq!(bits(&first), bits(&second));
    assert_eq!(after.pipelines_created, before.pipelines_created);
    assert_eq!(after.bind_groups_created, before.bind_groups_created);
    assert_eq!(after.submits, before.submits + 1);
    assert_eq!(after.bytes_read_back - before.bytes_read_back, 2 * 40 * 8, "2 rows of 40 (id, logit) pairs");
}

/// `Readback::TopKAndLogSumExp`: the same candidates as `TopK`, plus each row's log-sum-exp equal
/// to the host reference within float rounding (-inf and +inf rows exactly), including rows with
/// NaN and infinities and vocabularies around the chunk length; the CPU backend too.
#[test]
fn device_log_sum_exp_matches_host_reference() {
    let mut rng = Rng(0x15e);
    for n_vocab in [1usize, 7, 4095, 4097, 151_936] {
        let values = table(n_vocab, &mut rng);
        let (case, n_table_rows) = logits_case(&values, n_vocab);
        let tokens: Vec<u32> = (0..n_table_rows as u32).rev().collect();
        let Some(mut gpu) = open(WgpuOptions::default()) else { return };
        let gpu_ids = case.load(&mut gpu);
        let mut cpu = CpuBackend::new(Some(1)).expect("cpu");
        let cpu_ids = case.load(&mut cpu);
        let rows: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| values[t as usize * n_vocab..(t as usize + 1) * n_vocab].iter().copied())
            .collect();
        let mut want_lse = Vec::new();
        hearth_core::sampling::log_sum_exp_rows(&rows, n_vocab, &mut want_lse);
        assert_eq!(want_lse.len(), n_table_rows);
        for k in [1usize, 3] {
            let k = k.min(n_vocab);
            let mut want = TopK::default();
            top_k_rows(&rows, n_vocab, k, &mut want);
            for (name, backend, ids) in
                [("wgpu", &mut gpu as &mut dyn Backend, gpu_ids), ("cpu", &mut cpu as &mut dyn Backend, cpu_ids)]
            {
                let (_, got) = run_top_k(backend, ids, &tokens, Readback::TopKAndLogSumExp(k));
                assert_eq!(bits(&got), bits(&want), "{name} n_vocab {n_vocab} k {k}: candidates");
                assert_eq!(got.log_sum_exp.len(), n_table_rows, "{name}: one log-sum-exp per row");
                for (r, (&g, &w)) in got.log_sum_exp.iter().zip(&want_lse).enumerate() {
                    if w.is_finite() {
                        assert!(
                            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                            "{name} n_vocab {n_vocab} row {r}: {g} vs {w}"
                        );
                    } else {
                        assert_eq!(g.to_bits(), w.to_bits(), "{name} n_vocab {n_vocab} row {r}: {g} vs {w}");
                    }
                }
            }
        }
        eprintln!("n_vocab {n_vocab}: ok");
    }
}
