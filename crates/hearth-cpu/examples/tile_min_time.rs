//! Single-thread mat-mul tile throughput as the best of many short runs (the minimum filters out
//! preemption on a shared machine), for decode (1 token) and prefill (64 tokens) tiles.
//! `cargo run --release -p hearth-cpu --example tile_min_time`

use hearth_core::quant::GgmlType;
use hearth_cpu::kernels::{detected_isa, quantize_activation, vec_dot_tile_with, Isa};
use std::time::Instant;

fn main() {
    for ty in [GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let k = if ty.block_len() == 256 { 1536 } else { 896 };
        let row = ty.row_bytes(k).expect("row");
        let act_ty = ty.vec_dot_type();
        let x: Vec<f32> = (0..k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        let mut a = vec![0u8; act_ty.row_bytes(k).expect("act")];
        quantize_activation(act_ty, &x, &mut a);
        // 64 weight rows: hot in L2.
        let rows = 64;
        let mut w: Vec<u8> = (0..rows * row).map(|i| (i * 131 % 251) as u8).collect();
        for b in w.chunks_exact_mut(ty.block_bytes()) {
            let off = if ty == GgmlType::Q6_K { 208 } else { 0 };
            b[off..off + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            if ty == GgmlType::Q4_K {
                b[2..4].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            }
        }
        {
            // Decode from memory: a weight buffer far larger than the caches, 1 token, best of 5.
            let rows = (256 << 20) / row / 16 * 16;
            let w: Vec<u8> = (0..rows * row).map(|i| (i * 131 % 251) as u8).collect();
            let mut out = vec![0f32; 16];
            let mut best = f64::MAX;
            for _ in 0..5 {
                let start = Instant::now();
                for ws in w.chunks_exact(row * 16) {
                    vec_dot_tile_with(detected_isa(), ty, k, ws, &a, &mut out);
                }
                best = best.min(start.elapsed().as_secs_f64());
            }
            let gbs = (rows * row) as f64 / best / 1e9;
            println!("{ty} cold tile 16 x  1: {gbs:.2} GB/s of weights (best of 5)");
        }
        // The detected ISA's tiles, and the AVX2 ones where that is not AVX2 already.
        let isas =
            if detected_isa() == Isa::Avx512Vnni { vec![detected_isa(), Isa::Avx2] } else { vec![detected_isa()] };
        for (isa, tokens) in isas.into_iter().flat_map(|isa| [(isa, 1usize), (isa, 64)]) {
            let acts: Vec<u8> = a.iter().cycle().take(a.len() * tokens).copied().collect();
            let mut out = vec![0f32; 16 * tokens];
            let inner = 256 / tokens;
            let mut best = f64::MAX;
            for _ in 0..300 {
                let start = Instant::now();
                for _ in 0..inner {
                    for ws in w.chunks_exact(row * 16) {
                        vec_dot_tile_with(isa, ty, k, ws, &acts, &mut out);
                    }
                }
                best = best.min(start.elapsed().as_secs_f64());
            }
            let gmac = (rows * k * inner * tokens) as f64 / best / 1e9;
            println!("{ty} {isa:?} tile 16 x {tokens:>2}: {gmac:.2} G MAC/s (best of 300)");
        }
    }
}
