//! Q8_K activation quantizer and the reference K-quant × Q8_K dot products
//! (ggml's `quantize_row_q8_K_ref` and `ggml_vec_dot_q{2..6}_K_q8_K_generic`).

use super::super::legacy::f16_at;
use super::super::{GgmlType, QK_K};
use super::{q3k_scales, scale_min_k4, unpack_codes};

/// Byte offsets inside a Q8_K block: `d` (f32) at 0, `qs[256]` at 4, `bsums[16]` (i16) at 260.
pub(crate) const Q8K_QS: usize = 4;
pub(crate) const Q8K_BSUMS: usize = 4 + QK_K;

/// ggml's `quantize_row_q8_K_ref`: the element of largest magnitude (first one on ties) maps to
/// -127 via `iscale = -127/max`; codes are rounded half-to-even (ggml's `nearest_int`) and capped
/// at 127; `d = 1/iscale` is stored as f32. Whole blocks only: `dst` holds
/// `Q8_K.row_bytes(src.len())` bytes. Always inlined so that a caller compiled for a wider ISA
/// (hearth-cpu's AVX2 wrapper) gets the rounding as an instruction, not a libm call per element.
#[inline(always)]
pub fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    for (x, block) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(GgmlType::Q8_K.block_bytes())) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            block.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in block[Q8K_QS..Q8K_BSUMS].iter_mut().zip(x) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8 as u8;
        }
        for j in 0..QK_K / 16 {
            let sum: i32 = block[Q8K_QS + 16 * j..Q8K_QS + 16 * j + 16].iter().map(|&q| q as i8 as i32).sum();
            block[Q8K_BSUMS + 2 * j..Q8K_BSUMS + 2 * j + 2].copy_from_slice(&(sum as i16).to_le_bytes());
        }
        block[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

#[inline]
fn q8k_d(block: &[u8]) -> f32 {
    f32::from_le_bytes([block[0], block[1], block[2], block[3]])
}

#[inline]
fn q8k_bsum(block: &[u8], j: usize) -> i32 {
    i16::from_le_bytes([block[Q8K_BSUMS + 2 * j], block[Q8K_BSUMS + 2 * j + 1]]) as i32
}

/// Σ over `len`-element groups of `scale(group) * Σ code*q8` — the integer part of every K dot.
#[inline]
fn scaled_isum(codes: &[i8; QK_K], q8: &[u8], len: usize, scale: impl Fn(usize) -> i32) -> i32 {
    codes
        .chunks_exact(len)
        .zip(q8.chunks_exact(len))
        .enumerate()
        .map(|(g, (c, q))| scale(g) * c.iter().zip(q).map(|(&c, &q)| c as i32 * q as i8 as i32).sum::<i32>())
        .sum()
}

pub(crate) fn vec_dot(ty: GgmlType, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(ty.block_bytes()).zip(a.chunks_exact(GgmlType::Q8_K.block_bytes())) {
        let dy = q8k_d(y);
        let q8 = &y[Q8K_QS..Q8K_BSUMS];
        let codes = unpack_codes(ty, x);
        match ty {
            GgmlType::Q2_K => {
                let sc = &x[0..16];
                let summs: i32 = (0..16).map(|j| q8k_bsum(y, j) * (sc[j] >> 4) as i32).sum();
                let isum = scaled_isum(&codes, q8, 16, |g| (sc[g] & 0x0F) as i32);
                let dall = dy * f16_at(x, 80);
                let dmin = dy * f16_at(x, 82);
                sumf += dall * isum as f32 - dmin * summs as f32;
            }
            GgmlType::Q3_K => {
                let scales = q3k_scales(&x[96..108]);
                let isum = scaled_isum(&codes, q8, 16, |g| scales[g] as i32);
                sumf += f16_at(x, 108) * dy * isum as f32;
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let packed = &x[4..16];
                let mins: i32 = (0..16).map(|j| q8k_bsum(y, j) * scale_min_k4(j / 2, packed).1 as i32).sum();
                let isum = scaled_isum(&codes, q8, 32, |g| scale_min_k4(g, packed).0 as i32);
                let d = f16_at(x, 0) * dy;
                let dmin = f16_at(x, 2) * dy;
                sumf += d * isum as f32;
                sumf -= dmin * mins as f32;
            }
            GgmlType::Q6_K => {
                let isum = scaled_isum(&codes, q8, 16, |g| x[192 + g] as i8 as i32);
                sumf += f16_at(x, 208) * dy * isum as f32;
            }
            _ => unreachable!("kquants::vec_dot called with {ty}"),
        }
    }
    sumf
}
