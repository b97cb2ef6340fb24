//! Q4_0/Q5_0/Q8_0/MXFP4 × Q8_0 and Q4_1/Q5_1 × Q8_1 (32-element blocks), as ggml's AVX2 kernels:
//! per block, 32 byte products summed into 8 i32 lanes, converted to f32 and FMA'd with d_x*d_y.

use super::*;
use hearth_core::quant::{e8m0_half, MXFP4_VALUES};

const Q8_0_BYTES: usize = 34;
const Q8_1_BYTES: usize = 36;

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0_q8_0(nb: usize, x: *const u8, y: *const u8) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for ib in 0..nb {
        let (xb, yb) = (x.add(ib * 18), y.add(ib * Q8_0_BYTES));
        let d = _mm256_set1_ps(f16_at(xb) * f16_at(yb));
        let qx = _mm256_sub_epi8(bytes_from_nibbles_32(xb.add(2)), _mm256_set1_epi8(8));
        let q = mul_sum_i8_pairs_float(qx, load256(yb.add(2)));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum_float_8(acc)
}

/// MXFP4 × Q8_0: the codes become their doubled E2M1 values by a byte shuffle of the value table,
/// each block's integer sum scaled by d_y times half its E8M0 scale (the reference's order).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mxfp4_q8_0(nb: usize, x: *const u8, y: *const u8) -> f32 {
    let values = _mm256_broadcastsi128_si256(_mm_loadu_si128(MXFP4_VALUES.as_ptr() as *const __m128i));
    let mut acc = _mm256_setzero_ps();
    for ib in 0..nb {
        let (xb, yb) = (x.add(ib * 17), y.add(ib * Q8_0_BYTES));
        let d = _mm256_set1_ps(f16_at(yb) * e8m0_half(*xb));
        let qx = _mm256_shuffle_epi8(values, bytes_from_nibbles_32(xb.add(1)));
        let q = mul_sum_i8_pairs_float(qx, load256(yb.add(2)));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum_float_8(acc)
}

/// Q4_1 (`hi5 == false`) or Q5_1 (`hi5 == true`) × Q8_1: unsigned codes, plus Σ m_x * s_y.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn qx_1_q8_1(nb: usize, x: *const u8, y: *const u8, block_bytes: usize, hi5: bool) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for ib in 0..nb {
        let (xb, yb) = (x.add(ib * block_bytes), y.add(ib * Q8_1_BYTES));
        summs += f16_at(xb.add(2)) * f16_at(yb.add(2));
        let d0d1 = _mm256_mul_ps(_mm256_set1_ps(f16_at(xb)), _mm256_set1_ps(f16_at(yb)));
        let qx = if hi5 {
            let bxhi = _mm256_and_si256(bytes_from_bits_32(xb.add(4)), _mm256_set1_epi8(0x10));
            _mm256_or_si256(bytes_from_nibbles_32(xb.add(8)), bxhi)
        } else {
            bytes_from_nibbles_32(xb.add(4))
        };
        let xy = mul_sum_us8_pairs_float(qx, load256(yb.add(4)));
        acc = _mm256_fmadd_ps(d0d1, xy, acc);
    }
    hsum_float_8(acc) + summs
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_1_q8_1(nb: usize, x: *const u8, y: *const u8) -> f32 {
    qx_1_q8_1(nb, x, y, 20, false)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_1_q8_1(nb: usize, x: *const u8, y: *const u8) -> f32 {
    qx_1_q8_1(nb, x, y, 24, true)
}
