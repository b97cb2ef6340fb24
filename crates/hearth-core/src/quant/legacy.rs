//! Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1: 32-element blocks, ggml's reference layouts.
//!
//! Block layouts (little-endian, unaligned; `d`, `m`, `s` are f16):
//! - Q4_0 (18 B): `d`, `qs[16]` — element j is `qs[j] & 15`, element j+16 is `qs[j] >> 4`; value `(q-8)*d`.
//! - Q4_1 (20 B): `d`, `m`, `qs[16]` — value `q*d + m`.
//! - Q5_0 (22 B): `d`, `qh[4]` (u32 of 5th bits), `qs[16]` — value `(q-16)*d`.
//! - Q5_1 (24 B): `d`, `m`, `qh[4]`, `qs[16]` — value `q*d + m`.
//! - Q8_0 (34 B): `d`, `qs[32]` (i8) — value `q*d`.
//! - Q8_1 (36 B): `d`, `s = d*sum(qs)`, `qs[32]` (i8) — activation-only.
//! - MXFP4 (17 B): `e` (u8, an E8M0 power of two), `qs[16]` as Q4_0's — value
//!   `E2M1[q] * 2^(e - 127)`, computed as ggml does: the doubled E2M1 value times `2^(e - 128)`.

use super::GgmlType;
use half::f16;

/// Elements per block of every legacy format.
pub const QK: usize = 32;

#[inline]
pub(crate) fn f16_at(bytes: &[u8], offset: usize) -> f32 {
    f16::from_le_bytes([bytes[offset], bytes[offset + 1]]).to_f32()
}

#[inline]
fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes([bytes[offset], bytes[offset + 1], bytes[offset + 2], bytes[offset + 3]])
}

/// The E2M1 (FP4) values doubled, by 4-bit code: an integer times [`e8m0_half`] is the value.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `ggml_e8m0_to_fp32_half`: half the E8M0 scale `e`, 2^(e - 128), subnormal for e < 2.
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { (e as u32 - 1) << 23 };
    f32::from_bits(bits)
}

/// The 32 unsigned 4- or 5-bit codes of a Q4_x/Q5_x block, in element order.
#[inline]
fn unpack_codes(qs: &[u8], qh: Option<u32>) -> [u8; QK] {
    let mut codes = [0u8; QK];
    for j in 0..QK / 2 {
        let (mut lo, mut hi) = (qs[j] & 0x0F, qs[j] >> 4);
        if let Some(qh) = qh {
            lo |= (((qh >> j) << 4) & 0x10) as u8;
            hi |= ((qh >> (j + 12)) & 0x10) as u8;
        }
        codes[j] = lo;
        codes[j + QK / 2] = hi;
    }
    codes
}

pub(super) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let bytes = ty.block_bytes();
    for (block, out) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(QK)) {
        match ty {
            GgmlType::Q4_0 => {
                let d = f16_at(block, 0);
                for (o, q) in out.iter_mut().zip(unpack_codes(&block[2..], None)) {
                    *o = (q as i32 - 8) as f32 * d;
                }
            }
            GgmlType::Q4_1 => {
                let (d, m) = (f16_at(block, 0), f16_at(block, 2));
                for (o, q) in out.iter_mut().zip(unpack_codes(&block[4..], None)) {
                    *o = q as f32 * d + m;
                }
            }
            GgmlType::Q5_0 => {
                let d = f16_at(block, 0);
                for (o, q) in out.iter_mut().zip(unpack_codes(&block[6..], Some(u32_at(block, 2)))) {
                    *o = (q as i32 - 16) as f32 * d;
                }
            }
            GgmlType::Q5_1 => {
                let (d, m) = (f16_at(block, 0), f16_at(block, 2));
                for (o, q) in out.iter_mut().zip(unpack_codes(&block[8..], Some(u32_at(block, 4)))) {
                    *o = q as f32 * d + m;
                }
            }
            GgmlType::Q8_0 | GgmlType::Q8_1 => {
                let d = f16_at(block, 0);
                let qs = &block[bytes - QK..];
                for (o, &q) in out.iter_mut().zip(qs) {
                    *o = q as i8 as f32 * d;
                }
            }
            GgmlType::MXFP4 => {
                let d = e8m0_half(block[0]);
                for (o, q) in out.iter_mut().zip(unpack_codes(&block[1..], None)) {
                    *o = MXFP4_VALUES[q as usize] as f32 * d;
                }
            }
            _ => unreachable!("legacy::dequantize called with {ty}"),
        }
    }
}

/// ggml's `quantize_row_q8_{0,1}_ref`: `d = amax/127`, `q = roundf(x * (1/d))` (half away from zero),
/// `d` stored as f16 (round to nearest even); Q8_1 also stores `s = f16(sum(q) * d)`.
pub(super) fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    let bytes = ty.block_bytes();
    for (x, block) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(bytes)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        let mut sum = 0i32;
        for (q, &v) in block[bytes - QK..].iter_mut().zip(x) {
            // `as i8` saturates like C's float->int8 conversion does for in-range values.
            let r = (v * id).round() as i8;
            sum += r as i32;
            *q = r as u8;
        }
        if ty == GgmlType::Q8_1 {
            block[2..4].copy_from_slice(&f16::from_f32(sum as f32 * d).to_le_bytes());
        }
    }
}

/// ggml's `quantize_row_q4_0_ref`: the value of largest magnitude maps to -8, `d = max / -8`,
/// `q = min(15, trunc(x / d + 8.5))` (used for the q4_0 KV cache).
pub(super) fn quantize_q4_0(src: &[f32], dst: &mut [u8]) {
    for (x, block) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(GgmlType::Q4_0.block_bytes())) {
        let max = x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        for j in 0..QK / 2 {
            // x * id + 8.5 is at least 0.5, so C's truncating cast is a floor here.
            let lo = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let hi = ((x[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            block[2 + j] = lo | (hi << 4);
        }
    }
}

/// Integer dot of one 32-element block of codes (already offset) with a Q8 block's `qs`.
#[inline]
fn block_isum(codes: &[u8; QK], offset: i32, q8: &[u8]) -> i32 {
    codes.iter().zip(q8).map(|(&c, &y)| (c as i32 - offset) * (y as i8 as i32)).sum()
}

/// ggml's `ggml_vec_dot_*_q8_{0,1}_generic`: per block an integer sum, then scaled in f32.
pub(super) fn vec_dot(ty: GgmlType, w: &[u8], a: &[u8]) -> f32 {
    let wbytes = ty.block_bytes();
    let abytes = ty.vec_dot_type().block_bytes();
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(wbytes).zip(a.chunks_exact(abytes)) {
        let dy = f16_at(y, 0);
        let q8 = &y[abytes - QK..];
        match ty {
            GgmlType::Q4_0 => {
                let sumi = block_isum(&unpack_codes(&x[2..], None), 8, q8);
                sumf += sumi as f32 * f16_at(x, 0) * dy;
            }
            GgmlType::Q4_1 => {
                let sumi = block_isum(&unpack_codes(&x[4..], None), 0, q8);
                sumf += (f16_at(x, 0) * dy) * sumi as f32 + f16_at(x, 2) * f16_at(y, 2);
            }
            GgmlType::Q5_0 => {
                let sumi = block_isum(&unpack_codes(&x[6..], Some(u32_at(x, 2))), 16, q8);
                sumf += (f16_at(x, 0) * dy) * sumi as f32;
            }
            GgmlType::Q5_1 => {
                let sumi = block_isum(&unpack_codes(&x[8..], Some(u32_at(x, 4))), 0, q8);
                sumf += (f16_at(x, 0) * dy) * sumi as f32 + f16_at(x, 2) * f16_at(y, 2);
            }
            GgmlType::Q8_0 => {
                let sumi: i32 = x[2..].iter().zip(q8).map(|(&p, &q)| (p as i8 as i32) * (q as i8 as i32)).sum();
                sumf += sumi as f32 * (f16_at(x, 0) * dy);
            }
            GgmlType::MXFP4 => {
                let codes = unpack_codes(&x[1..], None);
                let sumi: i32 =
                    codes.iter().zip(q8).map(|(&c, &q)| MXFP4_VALUES[c as usize] as i32 * (q as i8 as i32)).sum();
                sumf += (dy * e8m0_half(x[0])) * sumi as f32;
            }
            _ => unreachable!("legacy::vec_dot called with {ty}"),
        }
    }
    sumf
}
