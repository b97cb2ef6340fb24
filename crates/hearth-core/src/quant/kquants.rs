//! K-quants: 256-element super-blocks ([`QK_K`]), ggml's reference layouts.
//!
//! Block layouts (little-endian, unaligned; `d`, `dmin` are f16 unless noted):
//! - Q2_K (84 B):  `scales[16]` (lo nibble scale, hi nibble min), `qs[64]` (2-bit), `d`, `dmin`.
//! - Q3_K (110 B): `hmask[32]` (3rd bit), `qs[64]` (low 2 bits), `scales[12]` (16 × 6-bit), `d`.
//! - Q4_K (144 B): `d`, `dmin`, `scales[12]` (8 × 6-bit scale + 8 × 6-bit min), `qs[128]`.
//! - Q5_K (176 B): `d`, `dmin`, `scales[12]`, `qh[32]` (5th bit), `qs[128]`.
//! - Q6_K (210 B): `ql[128]` (low 4 bits), `qh[64]` (high 2 bits), `scales[16]` (i8), `d`.
//! - Q8_K (292 B): `d` (f32), `qs[256]` (i8), `bsums[16]` (i16, sums of 16 consecutive qs).

mod dot;

use super::legacy::f16_at;
use super::{GgmlType, QK_K};

pub use dot::quantize_q8_k;
pub(super) use dot::vec_dot;

/// Q4_K/Q5_K: the 6-bit (scale, min) pair of sub-block `j` (0..8), ggml's `get_scale_min_k4`.
#[inline]
pub(crate) fn scale_min_k4(j: usize, scales: &[u8]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        ((scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4), (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))
    }
}

/// Q3_K: the 16 signed sub-block scales (6-bit code minus 32) packed in 12 bytes.
#[inline]
pub(crate) fn q3k_scales(packed: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low4 = if j < 8 { packed[j] & 0x0F } else { packed[j - 8] >> 4 };
        let high2 = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = ((low4 | (high2 << 4)) as i8) - 32;
    }
    out
}

/// Q2_K..Q6_K: the 256 integer codes of a super-block in element order. Q2_K and Q4_K/Q5_K
/// codes are unsigned (0..3 / 0..15 / 0..31); Q3_K and Q6_K are already centred (-4..3 / -32..31).
pub(crate) fn unpack_codes(ty: GgmlType, block: &[u8]) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    match ty {
        GgmlType::Q2_K | GgmlType::Q3_K => {
            let qs = if ty == GgmlType::Q2_K { &block[16..80] } else { &block[32..96] };
            let hmask = &block[0..32];
            for half in 0..2 {
                let q = &qs[half * 32..half * 32 + 32];
                for j in 0..4 {
                    let shift = 2 * j;
                    let bit = 1u8 << (half * 4 + j);
                    for l in 0..32 {
                        let mut v = ((q[l] >> shift) & 3) as i8;
                        if ty == GgmlType::Q3_K && hmask[l] & bit == 0 {
                            v -= 4;
                        }
                        a[half * 128 + j * 32 + l] = v;
                    }
                }
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (qh, qs) =
                if ty == GgmlType::Q4_K { (None, &block[16..144]) } else { (Some(&block[16..48]), &block[48..176]) };
            for j in 0..4 {
                let q = &qs[j * 32..j * 32 + 32];
                for l in 0..32 {
                    let (mut lo, mut hi) = ((q[l] & 0x0F) as i8, (q[l] >> 4) as i8);
                    if let Some(qh) = qh {
                        lo += if qh[l] & (1 << (2 * j)) != 0 { 16 } else { 0 };
                        hi += if qh[l] & (2 << (2 * j)) != 0 { 16 } else { 0 };
                    }
                    a[j * 64 + l] = lo;
                    a[j * 64 + 32 + l] = hi;
                }
            }
        }
        GgmlType::Q6_K => {
            for half in 0..2 {
                let ql = &block[half * 64..half * 64 + 64];
                let qh = &block[128 + half * 32..128 + half * 32 + 32];
                let out = &mut a[half * 128..half * 128 + 128];
                for l in 0..32 {
                    out[l] = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i8 - 32;
                    out[l + 32] = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                    out[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                    out[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                }
            }
        }
        _ => unreachable!("kquants::unpack_codes called with {ty}"),
    }
    a
}

pub(super) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    for (block, y) in src.chunks_exact(ty.block_bytes()).zip(dst.chunks_exact_mut(QK_K)) {
        match ty {
            GgmlType::Q2_K => {
                let (d, min) = (f16_at(block, 80), f16_at(block, 82));
                let codes = unpack_codes(ty, block);
                // One scale byte per 16 elements, in element order.
                for (is, chunk) in y.chunks_exact_mut(16).enumerate() {
                    let sc = block[is];
                    let dl = d * (sc & 0x0F) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for (o, &q) in chunk.iter_mut().zip(&codes[is * 16..is * 16 + 16]) {
                        *o = dl * q as f32 - ml;
                    }
                }
            }
            GgmlType::Q3_K => {
                let d_all = f16_at(block, 108);
                let scales = q3k_scales(&block[96..108]);
                let codes = unpack_codes(ty, block);
                for (is, chunk) in y.chunks_exact_mut(16).enumerate() {
                    let dl = d_all * scales[is] as f32;
                    for (o, &q) in chunk.iter_mut().zip(&codes[is * 16..is * 16 + 16]) {
                        *o = dl * q as f32;
                    }
                }
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (d, min) = (f16_at(block, 0), f16_at(block, 2));
                let codes = unpack_codes(ty, block);
                for (is, chunk) in y.chunks_exact_mut(32).enumerate() {
                    let (sc, m) = scale_min_k4(is, &block[4..16]);
                    let (d1, m1) = (d * sc as f32, min * m as f32);
                    for (o, &q) in chunk.iter_mut().zip(&codes[is * 32..is * 32 + 32]) {
                        *o = d1 * q as f32 - m1;
                    }
                }
            }
            GgmlType::Q6_K => {
                let d = f16_at(block, 208);
                let codes = unpack_codes(ty, block);
                for (is, chunk) in y.chunks_exact_mut(16).enumerate() {
                    let sc = block[192 + is] as i8;
                    for (o, &q) in chunk.iter_mut().zip(&codes[is * 16..is * 16 + 16]) {
                        *o = d * sc as f32 * q as f32;
                    }
                }
            }
            GgmlType::Q8_K => {
                let d = f32::from_le_bytes([block[0], block[1], block[2], block[3]]);
                for (o, &q) in y.iter_mut().zip(&block[4..4 + QK_K]) {
                    *o = d * q as i8 as f32;
                }
            }
            _ => unreachable!("kquants::dequantize called with {ty}"),
        }
    }
}
