//! Q4_K and Q6_K weights × Q8_K activations (256-element super-blocks). Each weight code is
//! widened to i16 and multiplied by its sub-block scale once per pass (|code × scale| ≤ 4096, in
//! range), so one `i32x4_dot_i16x8` per 8 elements accumulates the whole scaled integer sum; the
//! float scales then follow the reference's order per super-block.

use super::{f16_at, hsum_i32, mac16, WideRow};
use core::arch::wasm32::*;

const QK_K: usize = 256;
/// Q8_K block: `d` (f32) at 0, `qs[256]` (i8) at 4 (read widened from `WideRow::qs`),
/// `bsums[16]` (i16) at 260.
const ACT_BLOCK: usize = 4 + QK_K + 32;
const ACT_BSUMS: usize = 4 + QK_K;

#[inline(always)]
unsafe fn f32_at(p: *const u8) -> f32 {
    f32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)])
}

#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)])
}

/// 16 u8 codes (0..=15) widened to i16 and multiplied by `scale`: values 0..8 and 8..16.
#[inline(always)]
fn widen_scaled_u8(codes: v128, scale: v128) -> (v128, v128) {
    (i16x8_mul(u16x8_extend_low_u8x16(codes), scale), i16x8_mul(u16x8_extend_high_u8x16(codes), scale))
}

/// 16 i8 codes widened to i16 and multiplied by `scale`: values 0..8 and 8..16.
#[inline(always)]
fn widen_scaled_i8(codes: v128, scale: v128) -> (v128, v128) {
    (i16x8_mul(i16x8_extend_low_i8x16(codes), scale), i16x8_mul(i16x8_extend_high_i8x16(codes), scale))
}

/// The 8 six-bit scales and 8 six-bit mins of a Q4_K super-block from its 12 packed bytes at `p`
/// (ggml's `get_scale_min_k4` for j = 0..8, done on whole words).
#[inline(always)]
unsafe fn q4k_scales_mins(p: *const u8) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let (u0, u1, u2) = (u32_at(p), u32_at(p.add(4)), u32_at(p.add(8)));
    // Scales 0..4 and mins 0..4 are the low 6 bits of bytes 0..4 / 4..8; scales 4..8 and mins
    // 4..8 take their low 4 bits from the nibbles of bytes 8..12 and their top 2 bits from the
    // top bits of bytes 0..4 / 4..8.
    let scales_hi = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
    let mins_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    scales[..4].copy_from_slice(&(u0 & LOW6).to_le_bytes());
    scales[4..].copy_from_slice(&scales_hi.to_le_bytes());
    mins[..4].copy_from_slice(&(u1 & LOW6).to_le_bytes());
    mins[4..].copy_from_slice(&mins_hi.to_le_bytes());
    (scales, mins)
}

/// Q4_K (144 B: `d`, `dmin`, `scales[12]`, `qs[128]`) against R Q8_K rows; per super-block
/// `sumf += (d_w*d_a) * isum; sumf -= (dmin_w*d_a) * Σ bsum_j * min_(j/2)`, as the reference.
///
/// # Safety
/// `w` points at `n / 256` Q4_K blocks, each of `a` at `n / 256` Q8_K blocks and their widened codes.
#[inline(always)]
pub(super) unsafe fn dot_q4_k<const R: usize>(n: usize, w: *const u8, a: [WideRow; R]) -> [f32; R] {
    let mut sumf = [0f32; R];
    for b in 0..n / QK_K {
        let x = w.add(b * 144);
        let y: [*const u8; R] = a.map(|row| row.raw.add(b * ACT_BLOCK));
        let q8: [*const i16; R] = a.map(|row| row.qs.add(b * QK_K));
        let (scales, mins) = q4k_scales_mins(x.add(4));
        let mut acc = [i32x4_splat(0); R];
        for j in 0..4 {
            // 32 bytes: elements 64j..64j+32 in the low nibbles (sub-block 2j), the next 32 in
            // the high nibbles (sub-block 2j+1).
            let q0 = v128_load(x.add(16 + 32 * j) as *const v128);
            let q1 = v128_load(x.add(32 + 32 * j) as *const v128);
            let (sc_lo, sc_hi) = (i16x8_splat(scales[2 * j] as i16), i16x8_splat(scales[2 * j + 1] as i16));
            let nibble = u8x16_splat(0x0F);
            let (l0a, l0b) = widen_scaled_u8(v128_and(q0, nibble), sc_lo);
            let (l1a, l1b) = widen_scaled_u8(v128_and(q1, nibble), sc_lo);
            let (h0a, h0b) = widen_scaled_u8(u8x16_shr(q0, 4), sc_hi);
            let (h1a, h1b) = widen_scaled_u8(u8x16_shr(q1, 4), sc_hi);
            for r in 0..R {
                let q = q8[r].add(64 * j);
                let mut s = mac16(acc[r], l0a, l0b, q);
                s = mac16(s, l1a, l1b, q.add(16));
                s = mac16(s, h0a, h0b, q.add(32));
                acc[r] = mac16(s, h1a, h1b, q.add(48));
            }
        }
        // bsums j = 0..16 pair with min j/2: the mins, each twice, as i16.
        let m = u8x16_swizzle(
            v128_load64_zero(mins.as_ptr() as *const u64),
            u8x16(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
        );
        let (m_lo, m_hi) = (u16x8_extend_low_u8x16(m), u16x8_extend_high_u8x16(m));
        let (dx, dmx) = (f16_at(x), f16_at(x.add(2)));
        for r in 0..R {
            let bsums0 = v128_load(y[r].add(ACT_BSUMS) as *const v128);
            let bsums1 = v128_load(y[r].add(ACT_BSUMS + 16) as *const v128);
            let summs = hsum_i32(i32x4_add(i32x4_dot_i16x8(bsums0, m_lo), i32x4_dot_i16x8(bsums1, m_hi)));
            let dy = f32_at(y[r]);
            let (d, dmin) = (dx * dy, dmx * dy);
            sumf[r] += d * hsum_i32(acc[r]) as f32;
            sumf[r] -= dmin * summs as f32;
        }
    }
    sumf
}

/// Q6_K (210 B: `ql[128]`, `qh[64]`, `scales[16]` (i8), `d`) against R Q8_K rows; per
/// super-block `sumf += (d_w*d_a) * Σ scale_g * Σ code*q8` with codes `(6-bit value) - 32`.
///
/// # Safety
/// `w` points at `n / 256` Q6_K blocks, each of `a` at `n / 256` Q8_K blocks and their widened codes.
#[inline(always)]
pub(super) unsafe fn dot_q6_k<const R: usize>(n: usize, w: *const u8, a: [WideRow; R]) -> [f32; R] {
    let mut sumf = [0f32; R];
    for b in 0..n / QK_K {
        let x = w.add(b * 210);
        let y: [*const u8; R] = a.map(|row| row.raw.add(b * ACT_BLOCK));
        let q8: [*const i16; R] = a.map(|row| row.qs.add(b * QK_K));
        let mut acc = [i32x4_splat(0); R];
        let (nibble, two_bits, centre) = (u8x16_splat(0x0F), u8x16_splat(0x30), i8x16_splat(32));
        for half in 0..2 {
            let ql = x.add(64 * half);
            let qh = x.add(128 + 32 * half);
            for l in [0, 16] {
                let low_a = v128_load(ql.add(l) as *const v128);
                let low_b = v128_load(ql.add(32 + l) as *const v128);
                let high = v128_load(qh.add(l) as *const v128);
                // Elements 128*half + l + 32k (k = 0..4): low 4 bits from ql, bits 2k..2k+2 of qh
                // as bits 4..6.
                let codes = [
                    v128_or(v128_and(low_a, nibble), v128_and(i8x16_shl(high, 4), two_bits)),
                    v128_or(v128_and(low_b, nibble), v128_and(i8x16_shl(high, 2), two_bits)),
                    v128_or(u8x16_shr(low_a, 4), v128_and(high, two_bits)),
                    v128_or(u8x16_shr(low_b, 4), v128_and(u8x16_shr(high, 2), two_bits)),
                ];
                for (k, c) in codes.into_iter().enumerate() {
                    let element = 128 * half + l + 32 * k;
                    let scale = i16x8_splat(*x.add(192 + element / 16) as i8 as i16);
                    let (wa, wb) = widen_scaled_i8(i8x16_sub(c, centre), scale);
                    for r in 0..R {
                        acc[r] = mac16(acc[r], wa, wb, q8[r].add(element));
                    }
                }
            }
        }
        let dx = f16_at(x.add(208));
        for r in 0..R {
            sumf[r] += dx * f32_at(y[r]) * hsum_i32(acc[r]) as f32;
        }
    }
    sumf
}
