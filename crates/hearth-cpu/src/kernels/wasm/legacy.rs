//! Q8_0 and Q5_0 weights × Q8_0 activations (32-element blocks), four blocks per step: the four
//! blocks' integer sums end in one i32x4, scaled by four `d_w * d_a` products in one f32x4 and then
//! added to the row's sum one block after another, as the reference adds them.

use super::{f16_bits_at, f16x4_to_f32x4, hsum_i32x4_4, mac16, WideRow};
use core::arch::wasm32::*;

/// Elements per block.
const QK: usize = 32;
/// Blocks per step.
const STEP: usize = 4;

/// A weight block format whose value is `d * code` with `d` an f16 at byte 0.
pub(super) trait Block {
    /// Bytes per block.
    const BYTES: usize;
    /// The block's 32 codes (centred, as i8): elements 0..16 and 16..32.
    ///
    /// # Safety
    /// `p` points at a whole block.
    unsafe fn codes(p: *const u8) -> (v128, v128);
}

/// Q8_0 (34 B): `d`, `qs[32]` (i8).
pub(super) struct Q8_0;

impl Block for Q8_0 {
    const BYTES: usize = 2 + QK;
    #[inline(always)]
    unsafe fn codes(p: *const u8) -> (v128, v128) {
        (v128_load(p.add(2) as *const v128), v128_load(p.add(18) as *const v128))
    }
}

/// Q5_0 (22 B): `d`, `qh` (u32: the 5th bit of element j is bit j), `qs[16]` (element j in the
/// low nibble of byte j, element j+16 in its high nibble); the code is the 5-bit value minus 16.
pub(super) struct Q5_0;

impl Block for Q5_0 {
    const BYTES: usize = 2 + 4 + QK / 2;
    #[inline(always)]
    unsafe fn codes(p: *const u8) -> (v128, v128) {
        let qs = v128_load(p.add(6) as *const v128);
        let qh = u32x4_splat(u32::from_le_bytes([*p.add(2), *p.add(3), *p.add(4), *p.add(5)]));
        // Byte k of the block's qh to lanes 8k..8k+8, then bit (lane % 8) of it.
        let bit = u8x16(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
        let qh_lo = v128_and(u8x16_swizzle(qh, u8x16(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)), bit);
        let qh_hi = v128_and(u8x16_swizzle(qh, u8x16(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3)), bit);
        // nibble + 16*bit - 16: where the 5th bit is clear, setting the high nibble (0xF0) makes
        // the i8 `nibble - 16`; where it is set, the nibble itself is the code.
        let high_nibble = u8x16_splat(0xF0);
        let lo = v128_or(v128_and(qs, u8x16_splat(0x0F)), v128_and(i8x16_eq(qh_lo, i8x16_splat(0)), high_nibble));
        let hi = v128_or(u8x16_shr(qs, 4), v128_and(i8x16_eq(qh_hi, i8x16_splat(0)), high_nibble));
        (lo, hi)
    }
}

/// One weight row of `n` elements of `B` against R Q8_0 activation rows.
///
/// # Safety
/// `w` points at `n / 32` blocks of `B`, each of `a` at `n` widened codes and `n / 32` scales.
#[inline(always)]
pub(super) unsafe fn dot<const R: usize, B: Block>(n: usize, w: *const u8, a: [WideRow; R]) -> [f32; R] {
    let blocks = n / QK;
    let mut sumf = [0f32; R];
    let mut b = 0;
    let at = |b: usize| a.map(|row| WideRow { qs: row.qs.add(b * QK), d: row.d.add(b), raw: row.raw });
    while b + STEP <= blocks {
        step::<R, B>(w.add(b * B::BYTES), at(b), STEP, &mut sumf);
        b += STEP;
    }
    if b < blocks {
        // The last 1-3 blocks, copied into zero-filled steps (only the real blocks are added).
        let count = blocks - b;
        let mut wbuf = [0u8; STEP * 34];
        core::ptr::copy_nonoverlapping(w.add(b * B::BYTES), wbuf.as_mut_ptr(), count * B::BYTES);
        let mut qbuf = [[0i16; STEP * QK]; R];
        let mut dbuf = [[0f32; STEP]; R];
        let tail = at(b);
        for r in 0..R {
            core::ptr::copy_nonoverlapping(tail[r].qs, qbuf[r].as_mut_ptr(), count * QK);
            core::ptr::copy_nonoverlapping(tail[r].d, dbuf[r].as_mut_ptr(), count);
        }
        let rows = core::array::from_fn(|r| WideRow { qs: qbuf[r].as_ptr(), d: dbuf[r].as_ptr(), raw: tail[r].raw });
        step::<R, B>(wbuf.as_ptr(), rows, count, &mut sumf);
    }
    sumf
}

/// Four blocks of the weight row against four blocks of each activation row; adds the first
/// `count` blocks' `sumi * (d_w * d_a)` to `sumf`, in block order.
#[inline(always)]
unsafe fn step<const R: usize, B: Block>(w: *const u8, a: [WideRow; R], count: usize, sumf: &mut [f32; R]) {
    let mut isums = [[i32x4_splat(0); STEP]; R];
    for k in 0..STEP {
        let (c0, c1) = B::codes(w.add(k * B::BYTES));
        let (w0, w1) = (i16x8_extend_low_i8x16(c0), i16x8_extend_high_i8x16(c0));
        let (w2, w3) = (i16x8_extend_low_i8x16(c1), i16x8_extend_high_i8x16(c1));
        for (row, sums) in a.iter().zip(isums.iter_mut()) {
            let q = row.qs.add(k * QK);
            sums[k] = mac16(mac16(i32x4_splat(0), w0, w1, q), w2, w3, q.add(16));
        }
    }
    let dw = f16x4_to_f32x4(u32x4(
        f16_bits_at(w),
        f16_bits_at(w.add(B::BYTES)),
        f16_bits_at(w.add(2 * B::BYTES)),
        f16_bits_at(w.add(3 * B::BYTES)),
    ));
    for r in 0..R {
        let [s0, s1, s2, s3] = isums[r];
        let sumi = f32x4_convert_i32x4(hsum_i32x4_4(s0, s1, s2, s3));
        let terms = f32x4_mul(sumi, f32x4_mul(dw, v128_load(a[r].d as *const v128)));
        let terms = [
            f32x4_extract_lane::<0>(terms),
            f32x4_extract_lane::<1>(terms),
            f32x4_extract_lane::<2>(terms),
            f32x4_extract_lane::<3>(terms),
        ];
        for t in &terms[..count] {
            sumf[r] += t;
        }
    }
}
