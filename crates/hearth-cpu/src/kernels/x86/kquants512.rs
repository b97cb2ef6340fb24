//! Q4_K and Q6_K × Q8_K with AVX-512 (BW + VNNI), R activation rows per pass: two 32-element
//! sub-blocks per 512-bit register for `maddubs` + `dpwssd`, the two 256-bit halves added at the
//! end of each super-block. Integer sums are exact, so the i32 lanes equal the AVX2 kernels'
//! lanes (and Q4_K's super-block sums theirs), and the float operations that follow are the same:
//! results are bit-identical.

use super::kquants::{
    mins_and_scales, mins_dot_bsums, q4k_accumulate, q4k_results, q4k_sums, q6_k_codes, q6_scale, q8k_d, Q8K_BSUMS,
    Q8K_BYTES, Q8K_QS, SCALE_SHUFFLE_K4,
};
use super::*;

/// The 8 i32 lanes of the 256-bit kernels: low half + high half.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn fold_halves(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))
}

/// Q4_K × R Q8_K rows; per row the exact super-block sums and FMA chains of `q4k_accumulate`.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; whole rows of `nb` super-blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4_k_q8_k_512<const R: usize>(nb: usize, x: *const u8, y: [*const u8; R]) -> [f32; R] {
    let m4 = _mm512_set1_epi8(0xF);
    let mut acc = [_mm_setzero_ps(); R];
    for i in 0..nb {
        let xb = x.add(i * 144);
        // [xd, xdmin, xd, xdmin]
        let d_dmin = f16x2_at(xb);
        let d_dmin = _mm_movelh_ps(d_dmin, d_dmin);
        let ms = mins_and_scales(xb.add(4));
        let scales = _mm512_broadcast_i32x4(_mm256_extracti128_si256(ms, 0));
        let mut sumi = [_mm512_setzero_si512(); R];
        for j in 0..4 {
            // Scales of sub-blocks 2j (low half) and 2j+1 (high half): rows 2j and 2j+1 of the table.
            let scale = _mm512_shuffle_epi8(scales, load512(SCALE_SHUFFLE_K4[2 * j].as_ptr()));
            let bits = load256(xb.add(16 + 32 * j));
            let both = _mm512_inserti64x4(_mm512_castsi256_si512(bits), _mm256_srli_epi16(bits, 4), 1);
            let q4 = _mm512_and_si512(both, m4);
            for r in 0..R {
                let q8 = load512(y[r].add(i * Q8K_BYTES + Q8K_QS + 64 * j));
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], scale, _mm512_maddubs_epi16(q4, q8));
            }
        }
        for r in 0..R {
            let yb = y[r].add(i * Q8K_BYTES);
            let sums = q4k_sums(fold_halves(sumi[r]), mins_dot_bsums(ms, yb));
            acc[r] = q4k_accumulate(acc[r], sums, _mm_mul_ps(d_dmin, _mm_set1_ps(q8k_d(yb))));
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        out[r] = q4k_results(acc[r])[0];
    }
    out
}

/// # Safety
/// As [`q4_k_q8_k_512`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q6_k_q8_k_512<const R: usize>(nb: usize, x: *const u8, y: [*const u8; R]) -> [f32; R] {
    let pair = |lo: __m256i, hi: __m256i| _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        let xb = x.add(i * 210);
        if R == 1 {
            prefetch_ahead_l2(xb, Q6K_ROW_PREFETCH_BYTES, 4);
        }
        let xd = f16_at(xb.add(208));
        let scales = _mm_loadu_si128(xb.add(192) as *const __m128i);
        let scales16 = _mm256_cvtepi8_epi16(scales);
        let mut sumi = [_mm512_setzero_si512(); R];
        for j in 0..2 {
            let [q4_0, q4_1, q4_2, q4_3] = q6_k_codes(xb, j);
            let (q01, q23) = (pair(q4_0, q4_1), pair(q4_2, q4_3));
            let is = 4 * j;
            let s01 = pair(q6_scale(scales, is), q6_scale(scales, is + 1));
            let s23 = pair(q6_scale(scales, is + 2), q6_scale(scales, is + 3));
            for r in 0..R {
                let q8 = y[r].add(i * Q8K_BYTES + Q8K_QS + 128 * j);
                let s = _mm512_dpwssd_epi32(sumi[r], s01, _mm512_maddubs_epi16(q01, load512(q8)));
                sumi[r] = _mm512_dpwssd_epi32(s, s23, _mm512_maddubs_epi16(q23, load512(q8.add(64))));
            }
        }
        for r in 0..R {
            let yb = y[r].add(i * Q8K_BYTES);
            // Codes are stored +32; subtract 32 * Σ scale * bsum once instead of per element.
            let q8sums = load256(yb.add(Q8K_BSUMS));
            let q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales16), 5);
            let s = _mm256_sub_epi32(fold_halves(sumi[r]), q8sclsub);
            let d = q8k_d(yb) * xd;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc[r]);
        }
    }
    // A loop, not a `map` closure, so that `hsum_float_8` inlines (see ktile512.rs).
    let mut out = [0f32; R];
    for r in 0..R {
        out[r] = hsum_float_8(acc[r]);
    }
    out
}
