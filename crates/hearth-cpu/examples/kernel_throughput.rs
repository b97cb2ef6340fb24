//! Single-thread throughput of the mat-vec kernels (weights/s), hot (in cache) and cold (a
//! weight buffer far larger than the caches), to tell compute-bound from memory-bound.
//! `cargo run --release -p hearth-cpu --example kernel_throughput`

use hearth_core::quant::GgmlType;
use hearth_cpu::kernels::{detected_isa, quantize_activation, vec_dot_rows_with, vec_dot_tile_with, vec_dot_with, Isa};
use std::time::Instant;

fn main() {
    let k = 896;
    for ty in [GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let (k, ty) = if ty.block_len() == 256 { (4864, ty) } else { (k, ty) };
        let row = ty.row_bytes(k).expect("row");
        let act_ty = ty.vec_dot_type();
        let x: Vec<f32> = (0..k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        let mut a = vec![0u8; act_ty.row_bytes(k).expect("act")];
        quantize_activation(act_ty, &x, &mut a);
        for (label, total_bytes) in [("hot", 256 << 10), ("cold", 512 << 20)] {
            let rows = total_bytes / row;
            let mut w: Vec<u8> = (0..rows * row).map(|i| (i * 131 % 251) as u8).collect();
            for b in w.chunks_exact_mut(ty.block_bytes()) {
                let off = if ty == GgmlType::Q6_K { 208 } else { 0 };
                b[off..off + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                if matches!(ty, GgmlType::Q4_K) {
                    b[2..4].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                }
            }
            for isa in [Isa::Avx2, detected_isa()] {
                let reps = if label == "hot" { 2000 } else { 3 };
                let start = Instant::now();
                let mut s = 0f32;
                for _ in 0..reps {
                    for r in w.chunks_exact(row) {
                        s += vec_dot_with(isa, ty, k, r, &a);
                    }
                }
                let secs = start.elapsed().as_secs_f64();
                let gw = (rows * k * reps) as f64 / secs / 1e9;
                println!("{ty} {label:>4} {isa:?}: {gw:.2} G weights/s ({:.2} GB/s) [{s}]", gw * row as f64 / k as f64);
            }
            if label == "hot" {
                let acts: Vec<u8> = a.iter().cycle().take(a.len() * 4).copied().collect();
                let mut out = [0f32; 4];
                for isa in [Isa::Avx2, detected_isa()] {
                    let start = Instant::now();
                    for _ in 0..500 {
                        for r in w.chunks_exact(row) {
                            vec_dot_rows_with(isa, ty, k, r, &acts, &mut out);
                        }
                    }
                    let gw = (rows * k * 500 * 4) as f64 / start.elapsed().as_secs_f64() / 1e9;
                    println!("{ty} hot x4 rows {isa:?}: {gw:.2} G MAC/s");
                }
                for tokens in [1, 64] {
                    let acts: Vec<u8> = a.iter().cycle().take(a.len() * tokens).copied().collect();
                    let mut out = vec![0f32; 16 * tokens];
                    let reps = 64000 / tokens;
                    let start = Instant::now();
                    for _ in 0..reps {
                        for ws in w.chunks_exact(row * 16) {
                            vec_dot_tile_with(detected_isa(), ty, k, ws, &acts, &mut out);
                        }
                    }
                    let gw = ((rows / 16 * 16) * k * reps * tokens) as f64 / start.elapsed().as_secs_f64() / 1e9;
                    println!("{ty} hot tile 16 x {tokens}: {gw:.2} G MAC/s");
                }
            }
        }
    }
}
