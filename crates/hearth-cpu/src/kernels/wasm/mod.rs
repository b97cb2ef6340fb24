//! wasm simd128 kernels for the browser's CPU engine (wasm32 with `+simd128`, single-threaded).
//!
//! Every kernel computes the integer part of a block exactly (as the scalar reference of
//! `hearth_core::quant` does) and then applies the block's float scales in the reference's own
//! order — per block `sumi as f32 * (d_w * d_a)` added to one running f32 sum, block after block —
//! so a simd128 dot product equals the scalar one bit for bit. The multi-row kernels
//! (`DotRows<R>`: one weight row against R activation rows, the weight blocks unpacked once for
//! all R) compute each row exactly as the one-row kernel does, so they agree bit for bit too.
//!
//! The integer trick throughout: weight codes widened to i16 (and, for K-quants, pre-multiplied
//! by their sub-block scale, which stays within i16), activation bytes widened to i16, then
//! `i32x4_dot_i16x8` (x86 `pmaddwd`) sums pairs into i32 lanes.

mod kquants;
mod legacy;
mod quantize;

use core::arch::wasm32::*;
use hearth_core::quant::GgmlType;

pub(super) use quantize::{quantize_q8_0, quantize_q8_k};

/// Activation rows one pass of a multi-row kernel handles (weight blocks unpacked once for all).
const ROWS: usize = 4;

/// Whether there is a simd128 kernel for weights of type `ty`.
pub(super) fn supports(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_K | GgmlType::Q6_K)
}

/// An activation row as the kernels read it: its codes widened to i16 once per call (rather than
/// once per weight row), its Q8_0 block scales converted to f32, and the row itself (Q8_K's `d`
/// and `bsums`).
#[derive(Clone, Copy)]
struct WideRow {
    /// [n] codes.
    qs: *const i16,
    /// [n / 32] Q8_0 block scales (unused for Q8_K).
    d: *const f32,
    /// The quantized row.
    raw: *const u8,
}

/// One weight row of `n` elements against R activation rows.
///
/// # Safety
/// `w` points at a whole weight row of `n` elements of `ty`; each of `a` describes a whole
/// activation row of `n` elements of `ty.vec_dot_type()` (see [`widen`]); `supports(ty)`.
#[inline(always)]
unsafe fn dot_rows<const R: usize>(ty: GgmlType, n: usize, w: *const u8, a: [WideRow; R]) -> [f32; R] {
    match ty {
        GgmlType::Q8_0 => legacy::dot::<R, legacy::Q8_0>(n, w, a),
        GgmlType::Q5_0 => legacy::dot::<R, legacy::Q5_0>(n, w, a),
        GgmlType::Q4_K => kquants::dot_q4_k::<R>(n, w, a),
        GgmlType::Q6_K => kquants::dot_q6_k::<R>(n, w, a),
        _ => [f32::NAN; R],
    }
}

/// The widened form of the last activation rows seen, kept while later calls pass the same bytes:
/// a mat-mul calls [`vec_dot_tile`] once per 16 weight rows, each time with the same activations.
struct Wide {
    /// The activation type and row length that `qs` and `d` were made for, from the bytes `raw`.
    key: Option<(GgmlType, usize)>,
    raw: Vec<u8>,
    qs: Vec<i16>,
    d: Vec<f32>,
}

thread_local! {
    /// [`vec_dot_tile`] is not re-entered, and the wasm engine runs on one thread.
    static WIDE: core::cell::RefCell<Wide> =
        const { core::cell::RefCell::new(Wide { key: None, raw: Vec::new(), qs: Vec::new(), d: Vec::new() }) };
}

/// Whether `a` and `b` hold the same bytes.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let whole = a.len() / 16 * 16;
    let mut diff = u8x16_splat(0);
    for i in (0..whole).step_by(16) {
        // SAFETY: i + 16 <= whole <= len of both.
        unsafe {
            let x = v128_load(a.as_ptr().add(i) as *const v128);
            let y = v128_load(b.as_ptr().add(i) as *const v128);
            diff = v128_or(diff, v128_xor(x, y));
        }
    }
    !v128_any_true(diff) && a[whole..] == b[whole..]
}

/// Widens the activation rows in `activations` (`n` elements of `act_ty`: Q8_0 or Q8_K, each
/// `BLOCK_BYTES`-byte block holding `BLOCK_LEN` codes from byte `QS_AT`) into `qs` ([rows, n])
/// and, for Q8_0, their block scales into `d` ([rows, n / 32]).
fn widen<const BLOCK_LEN: usize, const BLOCK_BYTES: usize, const QS_AT: usize>(
    activations: &[u8],
    qs: &mut Vec<i16>,
    d: &mut Vec<f32>,
) {
    let blocks = activations.len() / BLOCK_BYTES;
    qs.resize(blocks * BLOCK_LEN, 0);
    let q8_0 = BLOCK_LEN == 32;
    d.resize(if q8_0 { blocks } else { 0 }, 0.0);
    for (b, (block, out)) in activations.chunks_exact(BLOCK_BYTES).zip(qs.chunks_exact_mut(BLOCK_LEN)).enumerate() {
        // SAFETY: `block` holds `BLOCK_LEN` codes from `QS_AT`, `out` room for as many i16, and
        // `d` one scale per block.
        unsafe {
            for k in (0..BLOCK_LEN).step_by(16) {
                let q = v128_load(block.as_ptr().add(QS_AT + k) as *const v128);
                v128_store(out.as_mut_ptr().add(k) as *mut v128, i16x8_extend_low_i8x16(q));
                v128_store(out.as_mut_ptr().add(k + 8) as *mut v128, i16x8_extend_high_i8x16(q));
            }
            if q8_0 {
                *d.get_unchecked_mut(b) = f16_at(block.as_ptr());
            }
        }
    }
}

/// `out[w * rows + r]` = the dot of weight row w (`w_row` bytes each) with activation row r
/// (`act_row` bytes each): per weight row in passes of [`ROWS`] activation rows and one pass for
/// the rest.
///
/// # Safety
/// `weights` holds whole weight rows of `n` elements of `ty`, `activations` whole activation rows
/// of `n` elements of `ty.vec_dot_type()`, and `out` one value per pair; `supports(ty)`.
pub(super) unsafe fn vec_dot_tile(
    ty: GgmlType,
    n: usize,
    weights: &[u8],
    w_row: usize,
    activations: &[u8],
    act_row: usize,
    out: &mut [f32],
) {
    let rows = activations.len() / act_row;
    if rows == 0 {
        return;
    }
    let act_ty = ty.vec_dot_type();
    WIDE.with_borrow_mut(|wide| {
        if wide.key != Some((act_ty, n)) || !same_bytes(&wide.raw, activations) {
            match act_ty {
                GgmlType::Q8_0 => widen::<32, 34, 2>(activations, &mut wide.qs, &mut wide.d),
                _ => widen::<256, 292, 4>(activations, &mut wide.qs, &mut wide.d),
            }
            wide.raw.clear();
            wide.raw.extend_from_slice(activations);
            wide.key = Some((act_ty, n));
        }
        let (qs, d) = (&wide.qs, &wide.d);
        let row = |i: usize| WideRow {
            qs: qs.as_ptr().add(i * n),
            d: d.as_ptr().add(i * n / 32),
            raw: activations.as_ptr().add(i * act_row),
        };
        for (w, out) in weights.chunks_exact(w_row).zip(out.chunks_exact_mut(rows)) {
            let w = w.as_ptr();
            let mut done = 0;
            while done + ROWS <= rows {
                let dots = dot_rows::<ROWS>(ty, n, w, core::array::from_fn(|i| row(done + i)));
                out[done..done + ROWS].copy_from_slice(&dots);
                done += ROWS;
            }
            match rows - done {
                3 => out[done..].copy_from_slice(&dot_rows::<3>(ty, n, w, [row(done), row(done + 1), row(done + 2)])),
                2 => out[done..].copy_from_slice(&dot_rows::<2>(ty, n, w, [row(done), row(done + 1)])),
                1 => out[done] = dot_rows::<1>(ty, n, w, [row(done)])[0],
                _ => {}
            }
        }
    })
}

/// Sum of the four i32 lanes (integer: any order gives the same value).
#[inline(always)]
fn hsum_i32(v: v128) -> i32 {
    i32x4_extract_lane::<0>(v)
        .wrapping_add(i32x4_extract_lane::<1>(v))
        .wrapping_add(i32x4_extract_lane::<2>(v))
        .wrapping_add(i32x4_extract_lane::<3>(v))
}

/// `[hsum(a), hsum(b), hsum(c), hsum(d)]` as one i32x4.
#[inline(always)]
fn hsum_i32x4_4(a: v128, b: v128, c: v128, d: v128) -> v128 {
    // [a0+a2, b0+b2, a1+a3, b1+b3] and the same for c, d; then the pairs of those.
    let ab = i32x4_add(i32x4_shuffle::<0, 4, 1, 5>(a, b), i32x4_shuffle::<2, 6, 3, 7>(a, b));
    let cd = i32x4_add(i32x4_shuffle::<0, 4, 1, 5>(c, d), i32x4_shuffle::<2, 6, 3, 7>(c, d));
    i32x4_add(i32x4_shuffle::<0, 1, 4, 5>(ab, cd), i32x4_shuffle::<2, 3, 6, 7>(ab, cd))
}

/// Dot of 16 widened activation codes at `a` with 16 weight values widened to i16 (`w_lo`:
/// values 0..8, `w_hi`: 8..16), as i32x4 partial sums, added to `acc`.
///
/// # Safety
/// `a` points at 16 i16.
#[inline(always)]
unsafe fn mac16(acc: v128, w_lo: v128, w_hi: v128, a: *const i16) -> v128 {
    let lo = i32x4_dot_i16x8(w_lo, v128_load(a as *const v128));
    let hi = i32x4_dot_i16x8(w_hi, v128_load(a.add(8) as *const v128));
    i32x4_add(acc, i32x4_add(lo, hi))
}

/// Four little-endian f16 values (one per lane, the low 16 bits of each u32) to f32, exactly as
/// `half::f16::to_f32` converts them.
#[inline(always)]
fn f16x4_to_f32x4(h: v128) -> v128 {
    let magnitude = v128_and(h, u32x4_splat(0x7fff));
    if v128_any_true(u32x4_ge(magnitude, u32x4_splat(0x7c00))) {
        // Infinity or NaN (never in real scales): per lane, as the reference does.
        let lane = |bits: u32| half::f16::from_bits(bits as u16).to_f32();
        return f32x4(
            lane(u32x4_extract_lane::<0>(h)),
            lane(u32x4_extract_lane::<1>(h)),
            lane(u32x4_extract_lane::<2>(h)),
            lane(u32x4_extract_lane::<3>(h)),
        );
    }
    // Exponent and mantissa moved into f32 position, then rebiased by 2^(127-15) = 2^112: an
    // exact power-of-two product, which also turns f16 subnormals into the right normal f32.
    let unbiased = f32x4_mul(i32x4_shl(magnitude, 13), f32x4_splat(f32::from_bits(0x7780_0000)));
    let sign = i32x4_shl(v128_and(h, u32x4_splat(0x8000)), 16);
    v128_or(unbiased, sign)
}

/// The f16 at `p` (unaligned, little-endian) as the low bits of a u32.
#[inline(always)]
unsafe fn f16_bits_at(p: *const u8) -> u32 {
    u16::from_le_bytes([*p, *p.add(1)]) as u32
}

/// The f16 at `p` to f32 (one value; exactly `half::f16::to_f32`).
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    f32x4_extract_lane::<0>(f16x4_to_f32x4(u32x4_splat(f16_bits_at(p))))
}
