//! llama.cpp-compatible numerics: the CPU backend computing what llama.cpp's CPU backend computes
//! on an AVX-512 x86 machine, bit for bit, so that a comparison with llama.cpp measures our model
//! code and not two valid roundings (tests/golden_greedy.rs: all three models' logits equal).
//!
//! Most of our arithmetic already is ggml's (kernels/ and ops.rs follow its AVX2/AVX-512 kernels
//! and roundings). Three choices differ, on purpose, in [`Numerics::Hearth`]:
//! - **Attention.** For fewer than 64 queries per batch ggml's flash attention converts each
//!   query to f16, keeps an online softmax and accumulates V in an f16 vector, rounding after
//!   every position (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`); ours is an exact
//!   two-pass softmax with V summed in f32. `attention/ggml_f16.rs` is ggml's.
//! - **Q4_K with 4+ token rows.** ggml's repacked Q4_K kernels run the token rows in groups of 4
//!   through `gemm_q4_K_8x8_q8_K`, which rounds to float per 64 elements, and the last
//!   `rows % 4` rows through `gemv_q4_K_8x8_q8_K`, which rounds per 256: a row's result depends on
//!   how many rows share its batch. Ours always rounds per 256, so that speculative verification
//!   and chunked prefill give the same logits as plain decoding. [`q4_k_gemm_dot`] is the gemm's.
//! - **Q6_K with 8+ token rows.** ggml's tiled K-quant mat-mul (`ggml-cpu/tiled/`, from 8 rows,
//!   for weights that are not repacked: Q6_K on x86) rounds each super-block's exact integer sum
//!   S as fma(f32(S) · d, yd, acc) (GCC contracts its add of a product); its
//!   `ggml_vec_dot_q6_K_q8_K` (fewer rows), like our kernels, converts 8 partial sums separately.
//!   [`q6_k_tiled_dot`] is the tiled kernel's.
//!
//! These follow ggml's batch-dependent choices for the shapes the goldens use: attention over f16
//! KV in batches of fewer than 64 tokens and contexts under 512. From 64 queries ggml switches to
//! a tiled f32 kernel, where this mode (as for other KV types) keeps our attention; from 512
//! positions ggml's decode splits the context across threads, which this mode does not reproduce.
//! The compat mat-mul kernels are scalar: this mode is for checking, not for speed.

use crate::weights::CpuWeight;
use hearth_core::quant::GgmlType;
#[cfg(not(target_arch = "wasm32"))]
use rayon::prelude::*;

/// Which arithmetic the CPU backend uses where two roundings are both valid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    /// Ours: every token's result independent of the batch it is computed in, attention in f32.
    #[default]
    Hearth,
    /// llama.cpp's CPU backend (see the module docs): batch-dependent, attention in f16.
    LlamaCpp,
}

/// How many of a mat-mul's `rows` token rows llama.cpp rounds differently from us (its first
/// ones): Q4_K's rows in whole groups of 4 (its repacked gemm; the rest, its gemv, round as ours
/// do), and from 8 rows all of Q6_K's (its tiled mat-mul).
pub(crate) fn llama_cpp_rows(ty: GgmlType, rows: usize) -> usize {
    match ty {
        GgmlType::Q4_K if rows >= 4 => rows - rows % 4,
        GgmlType::Q6_K if rows >= 8 => rows,
        _ => 0,
    }
}

/// out[r, j] = dot(W row j, activation row r) (+ bias[j]) for the first `rows` of the Q8_K
/// activation rows `act` ([rows.., k]) in llama.cpp's rounding for W's type (Q4_K or Q6_K, see
/// [`llama_cpp_rows`]); out: [.., n] for W: [n, k]. Scalar, in parallel over weight rows.
pub(crate) fn matmul_rows(w: &CpuWeight, act: &[u8], k: usize, rows: usize, bias: Option<&[f32]>, out: &mut [f32]) {
    let ty = w.desc.ty;
    let dot = if ty == GgmlType::Q4_K { q4_k_gemm_dot } else { q6_k_tiled_dot };
    let act_row = GgmlType::Q8_K.row_bytes(k).unwrap_or(0);
    let (n, nb) = (w.desc.n_rows(), k / ty.block_len());
    // [rows] outputs of weight row j.
    let column =
        |j: usize| -> Vec<f32> { act[..rows * act_row].chunks_exact(act_row).map(|a| dot(nb, w.row(j), a)).collect() };
    #[cfg(not(target_arch = "wasm32"))]
    let columns: Vec<Vec<f32>> = (0..n).into_par_iter().map(column).collect();
    #[cfg(target_arch = "wasm32")]
    let columns: Vec<Vec<f32>> = (0..n).map(column).collect();
    for (j, column) in columns.iter().enumerate() {
        for (r, &d) in column.iter().enumerate() {
            out[r * n + j] = d + bias.map_or(0.0, |b| b[j]);
        }
    }
}

/// Queries per batch from which ggml's CPU flash attention leaves the f16 path.
pub(crate) const GGML_FA_TILE_Q: usize = 64;

/// Bytes of a Q4_K / Q6_K / Q8_K super-block.
const Q4K_BYTES: usize = 144;
const Q6K_BYTES: usize = 210;
const Q8K_BYTES: usize = 292;

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Q4_K sub-block `j`'s 6-bit (scale, min), ggml's `get_scale_min_k4`.
fn scale_min_k4(j: usize, s: &[u8]) -> (i32, i32) {
    if j < 4 {
        ((s[j] & 63) as i32, (s[j + 4] & 63) as i32)
    } else {
        (((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4)) as i32, ((s[j + 4] >> 4) | ((s[j] >> 6) << 4)) as i32)
    }
}

/// One Q4_K weight row · one Q8_K activation row (`nb` super-blocks each) as ggml's
/// `gemm_q4_K_8x8_q8_K` rounds it: per 64 elements (two sub-blocks), the exact integer sums
/// S = Σ scale · Σ code · q8 and M = Σ min · bsum go into two FMA chains, f32(S) · (d · yd) and
/// f32(M) · (dmin · yd); the result is their difference.
fn q4_k_gemm_dot(nb: usize, w: &[u8], a: &[u8]) -> f32 {
    let (mut acc_s, mut acc_m) = (0f32, 0f32);
    for (x, y) in w.chunks_exact(Q4K_BYTES).zip(a.chunks_exact(Q8K_BYTES)).take(nb) {
        let (d, dmin) = (f16_at(x, 0), f16_at(x, 2));
        let (scales, qs) = (&x[4..16], &x[16..144]);
        let yd = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        let q8 = |i: usize| y[4 + i] as i8 as i32;
        let bsum = |i: usize| i16::from_le_bytes([y[260 + 2 * i], y[261 + 2 * i]]) as i32;
        let (ds, dm) = (d * yd, dmin * yd);
        for sb in 0..4 {
            let (mut s, mut m) = (0i32, 0i32);
            for half in 0..2 {
                let j = 2 * sb + half;
                let (scale, min) = scale_min_k4(j, scales);
                let dot: i32 = (0..32).map(|l| ((qs[32 * sb + l] >> (4 * half)) & 0xF) as i32 * q8(32 * j + l)).sum();
                s += scale * dot;
                m += min * (bsum(2 * j) + bsum(2 * j + 1));
            }
            acc_s = (s as f32).mul_add(ds, acc_s);
            acc_m = (m as f32).mul_add(dm, acc_m);
        }
    }
    acc_s - acc_m
}

/// One Q6_K weight row · one Q8_K activation row (`nb` super-blocks each) as ggml's tiled
/// mat-mul rounds it: per super-block the exact sum S = Σ scale · Σ (code − 32) · q8, then
/// acc = fma(f32(S) · d, yd, acc).
fn q6_k_tiled_dot(nb: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (x, y) in w.chunks_exact(Q6K_BYTES).zip(a.chunks_exact(Q8K_BYTES)).take(nb) {
        let (ql, qh, scales) = (&x[0..128], &x[128..192], &x[192..208]);
        let d = f16_at(x, 208);
        let yd = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        let q8 = |i: usize| y[4 + i] as i8 as i32;
        let mut sum = 0i32;
        // ggml's element order: per 128-element half n, for l in 0..32, the four codes at
        // l, l + 32, l + 64, l + 96 (low nibbles of ql[l], ql[l + 32], then their high nibbles,
        // each with 2 bits of qh[l]), sub-block scales 8n + l / 16 + {0, 2, 4, 6}.
        for n in 0..2 {
            let (ql, qh) = (&ql[64 * n..], &qh[32 * n..]);
            for l in 0..32 {
                let codes = [
                    (ql[l] & 0xF) | ((qh[l] & 3) << 4),
                    (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                ];
                for (k, &code) in codes.iter().enumerate() {
                    let scale = scales[8 * n + l / 16 + 2 * k] as i8 as i32;
                    sum += scale * (code as i32 - 32) * q8(128 * n + 32 * k + l);
                }
            }
        }
        // GCC contracts the kernel's `add(acc, mul(result, yd))` into one FMA.
        acc = (sum as f32 * d).mul_add(yd, acc);
    }
    acc
}
