//! A long batched workload whose step shapes keep changing, as a server's or a browser tab's do:
//! the runner keeps at most `MAX_GRAPHS` compiled graphs and releases the least recently used, so
//! the wgpu backend's live graphs and device memory must stay bounded however many graphs it
//! compiles, and a graph compiled into a released graph's slot must compute what the CPU
//! backend computes.

mod common;

use hearth_core::engine::EngineOptions;
use hearth_core::gguf::GgufFile;
use hearth_core::graph::LogitsMode;
use hearth_core::kv::SeqId;
use hearth_core::runner::{BatchEntry, Runner, MAX_GRAPHS};
use hearth_cpu::CpuBackend;
use hearth_tests::fixtures_dir;
use hearth_wgpu::WgpuOptions;

const N_CTX: usize = 64;
const N_SEQS: usize = 3;

/// Distinct step shapes (tokens per sequence, sequences, logits mode): more than the runner keeps,
/// so cycling through them evicts and recompiles at every step.
fn shapes() -> Vec<(usize, usize, LogitsMode)> {
    let mut shapes = Vec::new();
    for n_seqs in 1..=N_SEQS {
        for per_seq in 1..=8 {
            shapes.push((per_seq, n_seqs, LogitsMode::Last));
        }
    }
    shapes.extend((1..=10).map(|per_seq| (per_seq, 1, LogitsMode::All)));
    assert!(shapes.len() > MAX_GRAPHS + 8);
    shapes
}

/// Runs one step of `shape` on both runners (the same tokens on the same sequences, each emptied
/// first when the step would overflow the context) and returns the normalised squared error of
/// wgpu's logits against the CPU's.
fn step_both(runners: &mut [Runner; 2], seqs: &[[SeqId; 2]], shape: (usize, usize, LogitsMode), round: u32) -> f64 {
    let (per_seq, n_seqs, mode) = shape;
    let tokens: Vec<Vec<u32>> =
        (0..n_seqs).map(|s| (0..per_seq).map(|t| (round * 7 + s as u32 * 5 + t as u32 * 3) % 32).collect()).collect();
    let mut outputs = Vec::new();
    for (r, runner) in runners.iter_mut().enumerate() {
        for pair in &seqs[..n_seqs] {
            if runner.kv().len(pair[r]) + per_seq > N_CTX {
                runner.kv_mut().truncate(pair[r], 0).expect("truncate");
            }
        }
        let batch: Vec<BatchEntry<'_>> =
            seqs[..n_seqs].iter().zip(&tokens).map(|(pair, t)| BatchEntry { seq: pair[r], tokens: t }).collect();
        outputs.push(runner.step(&batch, mode).expect("step").to_vec());
    }
    let (cpu, gpu) = (&outputs[0], &outputs[1]);
    assert_eq!(cpu.len(), gpu.len());
    let err: f64 = cpu.iter().zip(gpu).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let norm: f64 = cpu.iter().map(|a| (*a as f64).powi(2)).sum();
    err / norm.max(1e-30)
}

#[test]
fn evicted_graphs_free_their_device_memory_and_recompiled_ones_stay_correct() {
    let path = fixtures_dir().join("synthetic/qwen2-mqa-f32.gguf");
    let file = GgufFile::open(&path).expect("open synthetic model");
    let options = EngineOptions { n_ctx: N_CTX, max_sequences: N_SEQS, ..EngineOptions::default() };
    let Some(gpu) = common::open(WgpuOptions::from_env()) else { return };
    let cpu = CpuBackend::new(Some(1)).expect("cpu backend");
    let load = |backend: Box<dyn hearth_core::backend::Backend>| {
        Runner::load(&file, backend, &options, &mut |_, _| {}).expect("load")
    };
    let mut runners = [load(Box::new(cpu)), load(Box::new(gpu))];
    let seqs: Vec<[SeqId; 2]> =
        (0..N_SEQS).map(|_| [runners[0].kv_mut().add_sequence(), runners[1].kv_mut().add_sequence()]).collect();
    let shapes = shapes();

    // One pass over every shape: the pool of live graphs fills to MAX_GRAPHS and starts evicting.
    let mut worst = 0f64;
    for (i, &shape) in shapes.iter().enumerate() {
        worst = worst.max(step_both(&mut runners, &seqs, shape, i as u32));
    }
    let backend = runners[1].backend();
    let after_first = (backend.counters(), backend.memory_bytes());
    // Three more: every step now compiles a graph into a released one's slot.
    for round in 1..=3u32 {
        for (i, &shape) in shapes.iter().enumerate() {
            worst = worst.max(step_both(&mut runners, &seqs, shape, round * 100 + i as u32));
            let c = runners[1].backend().counters();
            let live = c.graphs_compiled - c.graphs_released;
            assert!(live <= MAX_GRAPHS as u64, "{live} live graphs after {} compiled: {c:?}", c.graphs_compiled);
        }
    }
    let backend = runners[1].backend();
    let (counters, bytes) = (backend.counters(), backend.memory_bytes());
    eprintln!(
        "first pass: {:?}, {} bytes; after three more: {counters:?}, {bytes} bytes; worst nmse {worst:.2e}",
        after_first.0, after_first.1
    );
    assert!(
        counters.graphs_compiled >= after_first.0.graphs_compiled + 3 * shapes.len() as u64,
        "the workload recompiles: {counters:?}"
    );
    assert_eq!(counters.graphs_compiled - counters.graphs_released, MAX_GRAPHS as u64, "{counters:?}");
    // The same shapes cycle through the same number of slots, so the memory held returns to
    // what it was after the first pass (without releasing, it would grow by every graph).
    assert!(bytes <= after_first.1, "device memory grew from {} to {bytes} bytes", after_first.1);
    assert!(worst < 1e-6, "wgpu logits differ from the CPU's: nmse {worst:.2e}");
}
