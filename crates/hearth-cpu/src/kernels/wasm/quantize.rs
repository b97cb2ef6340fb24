//! The activation quantizers in simd128, bit-identical to the portable forms: Q8_0 as
//! `kernels::quantize_q8_legacy_body` (`127/amax`, round half to even) and Q8_K as ggml's
//! `quantize_row_q8_K_ref`. `f32x4_nearest` rounds half to even, `i32x4_trunc_sat_f32x4` and the
//! saturating narrows saturate as Rust's `as` casts do; `f32x4_pmax` ignores a NaN element as
//! `f32::max` does in the reference's fold.

use core::arch::wasm32::*;
use hearth_core::quant::GgmlType;

/// Largest |x| of `x` (a multiple of 16 elements long), NaN elements ignored.
#[inline(always)]
unsafe fn abs_max(x: &[f32]) -> f32 {
    let p = x.as_ptr();
    let mut m = [f32x4_splat(0.0); 4];
    for i in (0..x.len()).step_by(16) {
        for (k, mk) in m.iter_mut().enumerate() {
            *mk = f32x4_pmax(*mk, f32x4_abs(v128_load(p.add(i + 4 * k) as *const v128)));
        }
    }
    let m = f32x4_pmax(f32x4_pmax(m[0], m[1]), f32x4_pmax(m[2], m[3]));
    f32x4_extract_lane::<0>(m)
        .max(f32x4_extract_lane::<1>(m))
        .max(f32x4_extract_lane::<2>(m))
        .max(f32x4_extract_lane::<3>(m))
}

/// 16 elements at `p` times `scale`, rounded half to even, saturated to i8.
#[inline(always)]
unsafe fn round16(p: *const f32, scale: v128) -> v128 {
    let q = |k: usize| i32x4_trunc_sat_f32x4(f32x4_nearest(f32x4_mul(v128_load(p.add(4 * k) as *const v128), scale)));
    i8x16_narrow_i16x8(i16x8_narrow_i32x4(q(0), q(1)), i16x8_narrow_i32x4(q(2), q(3)))
}

/// Q8_0 blocks (`d` f16, `qs[32]`) of `src`: `d = amax/127`, `q = round_ties_even(x * 127/amax)`.
/// `dst` must be `Q8_0.row_bytes(src.len())` bytes (checked by the caller).
pub(in crate::kernels) fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    const QK: usize = 32;
    let bytes = GgmlType::Q8_0.block_bytes();
    for (x, block) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(bytes)) {
        // SAFETY: x holds 32 floats and block 34 bytes.
        unsafe {
            let amax = abs_max(x);
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            block[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
            let q = block.as_mut_ptr().add(2);
            v128_store(q as *mut v128, round16(x.as_ptr(), f32x4_splat(id)));
            v128_store(q.add(16) as *mut v128, round16(x.as_ptr().add(16), f32x4_splat(id)));
        }
    }
}

/// Q8_K blocks (`d` f32, `qs[256]`, `bsums[16]` i16) of `src`: the first element of largest
/// magnitude maps to -127 (`iscale = -127/max`), codes rounded half to even and capped at 127,
/// `d = 1/iscale`. `dst` must be `Q8_K.row_bytes(src.len())` bytes (checked by the caller).
pub(in crate::kernels) fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    const QK_K: usize = 256;
    let bytes = GgmlType::Q8_K.block_bytes();
    for (x, block) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(bytes)) {
        // SAFETY: x holds 256 floats and block 292 bytes.
        unsafe {
            let amax = abs_max(x);
            if amax == 0.0 {
                block.fill(0);
                continue;
            }
            // The reference keeps the first element whose |x| exceeds every earlier one.
            let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
            let iscale = -127.0 / max;
            let scale = f32x4_splat(iscale);
            let q = block.as_mut_ptr().add(4);
            let bsums = block.as_mut_ptr().add(4 + QK_K);
            for j in 0..QK_K / 16 {
                // The saturating narrow caps at 127 as the reference's `min(127)` does.
                let codes = round16(x.as_ptr().add(16 * j), scale);
                v128_store(q.add(16 * j) as *mut v128, codes);
                let wide = i32x4_extadd_pairwise_i16x8(i16x8_extadd_pairwise_i8x16(codes));
                let sum = super::hsum_i32(wide) as i16;
                core::ptr::copy_nonoverlapping(sum.to_le_bytes().as_ptr(), bsums.add(2 * j), 2);
            }
            block[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        }
    }
}
