//! Few-row mat-mul cost (speculative verification, batched decode): one sweep over a weight
//! matrix far larger than the caches with 1..=16 activation rows, split over 2 threads in tasks of
//! 16 weight rows as the mat-mul does, best of 5; the ratio to the 1-row sweep is what a
//! verification pass of 1 + k tokens costs against a decode step. Times are each thread's time
//! on a CPU (CLOCK_THREAD_CPUTIME_ID, the slower thread), not wall time: on a shared machine
//! the time other processes hold the cores would swamp the difference between kernels.
//! `cargo bench -p hearth-cpu --bench verify_tiles` (`HEARTH_ISA=avx2` forces the AVX2 kernels;
//! `HEARTH_ROWS=1,2,4` picks the row counts; `HEARTH_MB=1` sweeps a 1 MiB matrix, cache-resident, 192 times:
//! the kernels' compute alone). `Q4_K x16` lines sweep the same Q4_K rows repacked into x16 tiles
//! (the CPU backend's layout on AVX-512 VNNI machines).

mod common;
use common::thread_cpu_ns;
use hearth_core::quant::GgmlType;
use hearth_cpu::kernels::{detected_isa, q4k_x16, quantize_activation, vec_dot_q4k_x16, vec_dot_tile_with, Isa};
use std::time::Instant;

fn main() {
    let isa = match std::env::var("HEARTH_ISA").as_deref() {
        Ok("avx2") => Isa::Avx2,
        _ => detected_isa(),
    };
    let row_counts: Vec<usize> = std::env::var("HEARTH_ROWS")
        .map(|s| s.split(',').filter_map(|r| r.parse().ok()).collect())
        .unwrap_or_else(|_| vec![1, 2, 3, 4, 5, 6, 8, 12, 16]);
    println!("{isa:?}; ms per sweep (ratio to 1 row), best of 5, 2 threads");
    // Qwen2.5-1.5B shapes: attention/ffn_up/output rows of 1536, ffn_down rows of 8960 (Q4_K_M
    // has Q4_K and Q6_K ones).
    let shapes = [
        (GgmlType::Q4_K, 1536, false),
        (GgmlType::Q4_K, 1536, true),
        (GgmlType::Q4_K, 8960, false),
        (GgmlType::Q4_K, 8960, true),
        (GgmlType::Q6_K, 1536, false),
        (GgmlType::Q6_K, 8960, false),
    ];
    for (ty, k, x16) in shapes {
        let row = ty.row_bytes(k).expect("row");
        let mib: usize = std::env::var("HEARTH_MB").ok().and_then(|m| m.parse().ok()).unwrap_or(192).clamp(1, 192);
        let n_w = (mib << 20) / row / 32 * 32;
        let repeats = 192 / mib;
        let mut w: Vec<u8> = (0..n_w * row).map(|i| (i.wrapping_mul(131) % 251) as u8).collect();
        for b in w.chunks_exact_mut(ty.block_bytes()) {
            let off = if ty == GgmlType::Q6_K { 208 } else { 0 };
            b[off..off + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
        let act_ty = ty.vec_dot_type();
        let act_row = act_ty.row_bytes(k).expect("act");
        let max_rows = row_counts.iter().copied().max().unwrap_or(1);
        let mut acts = vec![0u8; act_row * max_rows];
        for (r, a) in acts.chunks_exact_mut(act_row).enumerate() {
            let x: Vec<f32> = (0..k).map(|i| (((i + 7 * r) * 37 % 101) as f32 - 50.0) / 25.0).collect();
            quantize_activation(act_ty, &x, a);
        }
        if x16 {
            let tile_bytes = q4k_x16::tile_bytes(k);
            let mut tiles = vec![0u8; n_w / 16 * tile_bytes];
            for (dst, src) in tiles.chunks_exact_mut(tile_bytes).zip(w.chunks_exact(16 * row)) {
                q4k_x16::repack_tile(k, src, dst);
            }
            w = tiles;
        }
        // Bytes per task of 16 weight rows.
        let task = if x16 { q4k_x16::tile_bytes(k) } else { row * 16 };
        let mut line = format!("{ty}{} k={k:<5}", if x16 { " x16" } else { "" });
        let mut base = 0.0;
        for &rows in &row_counts {
            let acts = &acts[..rows * act_row];
            let mut best = f64::MAX;
            for _ in 0..5 {
                let start = Instant::now();
                let cpu_ms = std::thread::scope(|s| {
                    let workers: Vec<_> = w
                        .chunks(w.len() / task / 2 * task)
                        .map(|half| {
                            s.spawn(move || {
                                let mut out = vec![0f32; 16 * rows];
                                let t0 = thread_cpu_ns();
                                for _ in 0..repeats {
                                    for ws in half.chunks_exact(task) {
                                        if x16 {
                                            vec_dot_q4k_x16(k, ws, acts, &mut out);
                                        } else {
                                            vec_dot_tile_with(isa, ty, k, ws, acts, &mut out);
                                        }
                                    }
                                }
                                std::hint::black_box(&out);
                                thread_cpu_ns().map(|t1| (t1 - t0.unwrap_or(t1)) as f64 / 1e6)
                            })
                        })
                        .collect();
                    workers.into_iter().map(|h| h.join().ok().flatten()).try_fold(0f64, |m, t| t.map(|t| m.max(t)))
                });
                best = best.min(cpu_ms.unwrap_or_else(|| start.elapsed().as_secs_f64() * 1e3));
            }
            if rows == 1 {
                base = best;
            }
            line += &format!(" {rows}:{best:.1}({:.2})", best / base);
        }
        println!("{line}");
    }
}
