//! Decode (one activation row) Q4_K and Q6_K × Q8_K kernels over W weight rows at once, with VNNI
//! on 256-bit registers. Each activation block is loaded once for the W rows, and the W rows'
//! independent chains keep more instructions in flight than one row does. Per weight row the i32
//! lanes (exact integer sums) and the float operations are those of the one-row kernels
//! (`multi.rs`, `kquants512.rs`), so every result is bit-identical to them.

use super::kquants::{mins_and_scales, mins_dot_bsums, q6_scale, q8k_d, Q8K_BSUMS, Q8K_BYTES, Q8K_QS, SCALE_SHUFFLE_K4};
use super::*;

/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; whole rows of `nb` super-blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4_k_rows<const W: usize>(nb: usize, x: [*const u8; W], y: *const u8) -> [f32; W] {
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); W];
    let mut acc_m = [_mm_setzero_ps(); W];
    for i in 0..nb {
        let yb = y.add(i * Q8K_BYTES);
        let yd = q8k_d(yb);
        let mut scales = [_mm256_setzero_si256(); W];
        let mut xd = [0f32; W];
        for w in 0..W {
            let xb = x[w].add(i * 144);
            // The same block 4 rows further on (the one-row kernel's distance).
            prefetch_ahead(xb, 4 * nb * 144, 3);
            let xdmin = f16_at(xb.add(2));
            xd[w] = f16_at(xb);
            let ms = mins_and_scales(xb.add(4));
            let sc128 = _mm256_extracti128_si256(ms, 0);
            scales[w] = _mm256_set_m128i(sc128, sc128);
            let dmin = -yd * xdmin;
            acc_m[w] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins_dot_bsums(ms, yb)), acc_m[w]);
        }
        let mut sumi = [_mm256_setzero_si256(); W];
        for j in 0..4 {
            let q8 = yb.add(Q8K_QS + 64 * j);
            let (q8l, q8h) = (load256(q8), load256(q8.add(32)));
            let (shuf_l, shuf_h) = (load256(SCALE_SHUFFLE_K4[2 * j].as_ptr()), load256(SCALE_SHUFFLE_K4[2 * j + 1].as_ptr()));
            for w in 0..W {
                let q4bits = load256(x[w].add(i * 144 + 16 + 32 * j));
                let q4l = _mm256_and_si256(q4bits, m4);
                let q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);
                let p16l = _mm256_maddubs_epi16(q4l, q8l);
                let p16h = _mm256_maddubs_epi16(q4h, q8h);
                let s = _mm256_dpwssd_epi32(sumi[w], _mm256_shuffle_epi8(scales[w], shuf_l), p16l);
                sumi[w] = _mm256_dpwssd_epi32(s, _mm256_shuffle_epi8(scales[w], shuf_h), p16h);
            }
        }
        for w in 0..W {
            let d = yd * xd[w];
            acc[w] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[w]), acc[w]);
        }
    }
    let mut out = [0f32; W];
    for w in 0..W {
        let mut m = acc_m[w];
        m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        out[w] = hsum_float_8(acc[w]) + _mm_cvtss_f32(m);
    }
    out
}

/// # Safety
/// As [`q4_k_rows`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q6_k_rows<const W: usize>(nb: usize, x: [*const u8; W], y: *const u8) -> [f32; W] {
    let m3 = _mm256_set1_epi8(3);
    let m15 = _mm256_set1_epi8(15);
    let mut acc = [_mm256_setzero_ps(); W];
    for i in 0..nb {
        let yb = y.add(i * Q8K_BYTES);
        let mut sumi = [_mm256_setzero_si256(); W];
        for w in 0..W {
            prefetch_ahead(x[w].add(i * 210), 4 * nb * 210, 4);
        }
        for j in 0..2 {
            let q8 = yb.add(Q8K_QS + 128 * j);
            let q8v = [load256(q8), load256(q8.add(32)), load256(q8.add(64)), load256(q8.add(96))];
            for w in 0..W {
                let xb = x[w].add(i * 210);
                let scales = _mm_loadu_si128(xb.add(192) as *const __m128i);
                let q4bits1 = load256(xb.add(64 * j));
                let q4bits2 = load256(xb.add(64 * j + 32));
                let q4bits_h = load256(xb.add(128 + 32 * j));
                let q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, m3), 4);
                let q4h_1 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)), 2);
                let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
                let q4h_3 = _mm256_srli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)), 2);
                let q4_0 = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
                let q4_1 = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
                let q4_2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15), q4h_2);
                let q4_3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15), q4h_3);
                let is = 4 * j;
                let mut s = sumi[w];
                s = _mm256_dpwssd_epi32(s, q6_scale(scales, is), _mm256_maddubs_epi16(q4_0, q8v[0]));
                s = _mm256_dpwssd_epi32(s, q6_scale(scales, is + 1), _mm256_maddubs_epi16(q4_1, q8v[1]));
                s = _mm256_dpwssd_epi32(s, q6_scale(scales, is + 2), _mm256_maddubs_epi16(q4_2, q8v[2]));
                s = _mm256_dpwssd_epi32(s, q6_scale(scales, is + 3), _mm256_maddubs_epi16(q4_3, q8v[3]));
                sumi[w] = s;
            }
        }
        let q8sums = load256(yb.add(Q8K_BSUMS));
        let yd = q8k_d(yb);
        for w in 0..W {
            let xb = x[w].add(i * 210);
            // Codes are stored +32; subtract 32 * Σ scale * bsum once instead of per element.
            let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(xb.add(192) as *const __m128i));
            let q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales16), 5);
            let s = _mm256_sub_epi32(sumi[w], q8sclsub);
            let d = yd * f16_at(xb.add(208));
            acc[w] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc[w]);
        }
    }
    acc.map(|a| hsum_float_8(a))
}
