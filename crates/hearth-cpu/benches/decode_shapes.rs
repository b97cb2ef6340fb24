//! One-thread decode cost of the real models' mat-vec shapes, from memory: one sweep over each
//! weight matrix (a fresh copy per repeat set, larger than the caches) with one activation row,
//! in tasks of 16 weight rows as the mat-mul splits them, best of 5. Times are this thread's time
//! on a CPU (CLOCK_THREAD_CPUTIME_ID), not wall time, so other processes on a shared machine
//! disturb them less. `cargo bench -p hearth-cpu --bench decode_shapes` (`HEARTH_ISA=avx2`
//! forces the AVX2 kernels; `HEARTH_SHAPES=0,2` picks shapes by index).

mod common;
use common::thread_cpu_ns;
use hearth_core::quant::GgmlType;
use hearth_cpu::kernels::{detected_isa, quantize_activation, vec_dot_tile_with, Isa};
use std::time::Instant;

/// (label, weight type, row length k, weight rows n).
const HEARTH_SHAPES: [(&str, GgmlType, usize, usize); 6] = [
    ("gemma-270m output", GgmlType::Q8_0, 640, 262144),
    ("qwen-1.5b gate/up", GgmlType::Q4_K, 1536, 8960),
    ("qwen-1.5b down q6k", GgmlType::Q6_K, 8960, 1536),
    ("qwen-1.5b down q4k", GgmlType::Q4_K, 8960, 1536),
    ("qwen-1.5b output", GgmlType::Q6_K, 1536, 151936),
    ("gemma-270m q5_0", GgmlType::Q5_0, 640, 2048),
];

fn main() {
    let isa = match std::env::var("HEARTH_ISA").as_deref() {
        Ok("avx2") => Isa::Avx2,
        _ => detected_isa(),
    };
    let picked: Option<Vec<usize>> =
        std::env::var("HEARTH_SHAPES").ok().map(|s| s.split(',').filter_map(|r| r.parse().ok()).collect());
    println!("{isa:?}; one thread, from memory (HEARTH_HOT=1: cache); ms per matrix, best of 5");
    for (idx, (label, ty, k, n)) in HEARTH_SHAPES.iter().copied().enumerate() {
        if picked.as_ref().is_some_and(|p| !p.contains(&idx)) {
            continue;
        }
        let row = ty.row_bytes(k).expect("row");
        // Enough copies of the matrix to hold 256 MiB: each sweep reads from memory. `HEARTH_HOT=1`:
        // 512 KiB of its rows swept again and again instead (in cache: the kernels' compute).
        let hot = std::env::var("HEARTH_HOT").is_ok_and(|h| h == "1");
        let n = if hot { n.min((512 << 10) / row / 16 * 16) } else { n };
        let copies = ((256usize << 20) / (n * row)).max(1);
        let stored = if hot { 1 } else { copies };
        let mut w: Vec<u8> = (0..stored * n * row).map(|i| (i.wrapping_mul(131) % 251) as u8).collect();
        for b in w.chunks_exact_mut(ty.block_bytes()) {
            let off = if ty == GgmlType::Q6_K { 208 } else { 0 };
            b[off..off + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            if ty == GgmlType::Q4_K {
                b[2..4].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            }
        }
        let act_ty = ty.vec_dot_type();
        let mut act = vec![0u8; act_ty.row_bytes(k).expect("act")];
        let x: Vec<f32> = (0..k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        quantize_activation(act_ty, &x, &mut act);
        let mut out = vec![0f32; n];
        let mut best = f64::MAX;
        let mut check = 0f64;
        for _ in 0..5 {
            let start = Instant::now();
            let t0 = thread_cpu_ns();
            for m in w.chunks_exact(n * row).cycle().take(copies) {
                for (ws, o) in m.chunks(row * 16).zip(out.chunks_mut(16)) {
                    vec_dot_tile_with(isa, ty, k, ws, &act, o);
                }
                check += out.iter().map(|&v| v as f64).sum::<f64>();
            }
            let ms = match (t0, thread_cpu_ns()) {
                (Some(a), Some(b)) => (b - a) as f64 / 1e6,
                _ => start.elapsed().as_secs_f64() * 1e3,
            };
            best = best.min(ms / copies as f64);
        }
        let gbs = (n * row) as f64 / best / 1e6;
        println!("{idx} {label:<20} {ty} {k}x{n}: {best:.3} ms ({gbs:.1} GB/s) [{check:.3e}]");
    }
}
