//! The attention inner loops of `attention.rs` with AVX-512F intrinsics: the f16-precision dot
//! product of ggml's AVX-512 `ggml_vec_dot_f16` (4 accumulators of 16 lanes, the same pairwise
//! reduction, the same f64 tail) and the f16-rounded V accumulator, 16 lanes per instruction.
//! Every lane runs the same IEEE operations as the portable code, so the results are bit-identical
//! (tested against it); the portable loops did not vectorise (bounds checks, the rounding branch).

use core::arch::x86_64::*;

/// Whether this CPU runs [`dot_f16_ggml`] and [`map_rounded_f16_fma`] / [`map_rounded_f16_scale`].
pub(crate) fn available() -> bool {
    use std::sync::OnceLock;
    static AVX512: OnceLock<bool> = OnceLock::new();
    *AVX512.get_or_init(|| is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2"))
}

/// `attention::dot_f16_ggml` bit for bit.
///
/// # Safety
/// AVX-512F, AVX2 and FMA must be available.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn dot_f16_ggml(a: &[f32], b: &[f32]) -> f32 {
    const STEP: usize = 64;
    let n = a.len().min(b.len());
    let blocks = n / STEP * STEP;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i < blocks {
        for (j, sum) in acc.iter_mut().enumerate() {
            // SAFETY: i + 16 j + 16 <= blocks <= n, within both slices.
            *sum = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i + 16 * j)), _mm512_loadu_ps(pb.add(i + 16 * j)), *sum);
        }
        i += STEP;
    }
    // x[l] = (acc0 + acc2) + (acc1 + acc3); then halves: 8 lanes, 4 lanes, (0 + 2) + (1 + 3).
    let x = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
    let x_lo = _mm512_castps512_ps256(x);
    let x_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
    let h8 = _mm256_add_ps(x_lo, x_hi);
    let h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    let t = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    let lanes_sum = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
    let mut sum = lanes_sum as f64;
    for k in blocks..n {
        sum += (a[k] * b[k]) as f64;
    }
    sum as f32
}

/// Rounds the 16 lanes of `x` to f16 precision where they are in f16's normal range (the rest
/// unchanged); returns the lanes and whether any lane was outside that range and not ±0.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn round_normal_lanes(x: __m512) -> (__m512, bool) {
    let bits = _mm512_castps_si512(x);
    let exponent = _mm512_and_si512(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(0xff));
    // 113 <= exponent < 142, as one unsigned comparison.
    let normal = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(exponent, _mm512_set1_epi32(113)), _mm512_set1_epi32(142 - 113));
    let lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 13), _mm512_set1_epi32(1));
    let bumped = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x0fff), lsb));
    let rounded = _mm512_and_si512(bumped, _mm512_set1_epi32(!0x1fff));
    let nonzero = _mm512_test_epi32_mask(_mm512_slli_epi32(bits, 1), _mm512_set1_epi32(-1));
    let rare = (!normal & nonzero) != 0;
    (_mm512_castsi512_ps(_mm512_mask_mov_epi32(bits, normal, rounded)), rare)
}

/// `map_rounded_f16(out, |i, o| v[i].mul_add(vs, o))` of `attention.rs`, bit for bit.
///
/// # Safety
/// AVX-512F, AVX2 and FMA must be available; `v.len() >= out.len()`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn map_rounded_f16_fma(out: &mut [f32], v: &[f32], vs: f32) {
    let n = out.len().min(v.len());
    let whole = n / 16 * 16;
    let (po, pv) = (out.as_mut_ptr(), v.as_ptr());
    let vsv = _mm512_set1_ps(vs);
    let mut rare = false;
    let mut i = 0;
    while i < whole {
        // SAFETY: i + 16 <= whole <= n.
        let x = _mm512_fmadd_ps(_mm512_loadu_ps(pv.add(i)), vsv, _mm512_loadu_ps(po.add(i)));
        let (r, odd) = round_normal_lanes(x);
        _mm512_storeu_ps(po.add(i), r);
        rare |= odd;
        i += 16;
    }
    for k in whole..n {
        let x = v[k].mul_add(vs, out[k]);
        rare |= round_lane(&mut out[k], x);
    }
    if rare {
        out.iter_mut().for_each(|o| *o = crate::attention::round_f16(*o));
    }
}

/// `map_rounded_f16(out, |_, o| o * ms)` of `attention.rs`, bit for bit.
///
/// # Safety
/// AVX-512F, AVX2 and FMA must be available.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn map_rounded_f16_scale(out: &mut [f32], ms: f32) {
    let n = out.len();
    let whole = n / 16 * 16;
    let po = out.as_mut_ptr();
    let msv = _mm512_set1_ps(ms);
    let mut rare = false;
    let mut i = 0;
    while i < whole {
        // SAFETY: i + 16 <= whole <= n.
        let (r, odd) = round_normal_lanes(_mm512_mul_ps(_mm512_loadu_ps(po.add(i)), msv));
        _mm512_storeu_ps(po.add(i), r);
        rare |= odd;
        i += 16;
    }
    for k in whole..n {
        let x = out[k] * ms;
        rare |= round_lane(&mut out[k], x);
    }
    if rare {
        out.iter_mut().for_each(|o| *o = crate::attention::round_f16(*o));
    }
}

/// One lane of `map_rounded_f16`'s first pass: stores the rounded (or unchanged) value and
/// returns whether the lane needs the exact second pass.
#[inline(always)]
fn round_lane(o: &mut f32, x: f32) -> bool {
    let bits = x.to_bits();
    let exponent = (bits >> 23) & 0xff;
    let normal = (113..142).contains(&exponent);
    let lsb = (bits >> 13) & 1;
    *o = if normal { f32::from_bits((bits.wrapping_add(0x0fff + lsb)) & !0x1fff) } else { x };
    !normal && bits << 1 != 0
}
