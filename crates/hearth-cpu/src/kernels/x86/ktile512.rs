//! Q4_K and Q6_K × Q8_K with AVX-512 (BW + VNNI): W weight rows × R activation rows per pass, for
//! the few-row mat-muls of speculative verification and batched decode (2-16 rows). Per
//! super-block the activation side (scale, bsums, bytes) is loaded once for the W weight rows and
//! each weight block unpacked once for the R activation rows. Every (weight row, activation row)
//! pair keeps its own i32 lanes (exact integer sums, the same as the 256-bit kernels' lanes after
//! `fold_halves`) and its own float accumulators, updated by the same operations in the same
//! order as `q4_k_q8_k_512::<1>` / `q6_k_q8_k_512::<1>`: each output equals the single-row dot
//! product bit for bit. (From 5 activation rows, Q4_K goes through q4k_interleaved512.rs.)

use super::kquants::{
    mins_and_scales, q4k_accumulate, q4k_results, q4k_sums2, q6_k_codes, q6_scale, q8k_d, Q8K_BSUMS, Q8K_BYTES, Q8K_QS,
    SCALE_SHUFFLE_K4,
};
use super::ktile::sweep_prefetch;
use super::*;

/// The 8 i32 lanes of the 256-bit kernels: low half + high half.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn fold_halves(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))
}

/// Q8_K's 16 bsums summed in pairs (one i16 per 32-element sub-block), as `mins_dot_bsums`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn paired_bsums(yb: *const u8) -> __m128i {
    let q8sums = load256(yb.add(Q8K_BSUMS));
    _mm_hadd_epi16(_mm256_extracti128_si256(q8sums, 0), _mm256_extracti128_si256(q8sums, 1))
}

/// Q4_K, W weight rows `x` × R Q8_K rows `y` of `nb` super-blocks: `out[w][r]` = the dot product
/// of row w with row r. With `PREFETCH` the weight rows `TILE_PREFETCH_TILES` tiles of W rows
/// further on are prefetched at the rate this tile reads its own (see `sweep_prefetch`).
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; every pointer is a whole row of `nb`
/// super-blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4_k_tile_512<const W: usize, const R: usize, const PREFETCH: bool>(
    nb: usize,
    x: [*const u8; W],
    y: [*const u8; R],
) -> [[f32; R]; W] {
    let m4 = _mm512_set1_epi8(0xF);
    // acc[w][p]: weight row w × activation rows 2p and 2p + 1 (an odd last row twice), as
    // `q4k_accumulate`.
    let mut acc = [[_mm_setzero_ps(); R]; W];
    let pairs = R.div_ceil(2);
    for i in 0..nb {
        let mut yd = [0f32; R];
        let mut q8s = [_mm_setzero_si128(); R];
        for r in 0..R {
            let yb = y[r].add(i * Q8K_BYTES);
            yd[r] = q8k_d(yb);
            q8s[r] = paired_bsums(yb);
        }
        // Per pair: [q8s of row 2p | of row 2p + 1] and [yd of row 2p (x2), of row 2p + 1 (x2)].
        let mut q8s_pair = [_mm256_setzero_si256(); R];
        let mut yd_pair = [_mm_setzero_ps(); R];
        for p in 0..pairs {
            let hi = (2 * p + 1).min(R - 1);
            q8s_pair[p] = _mm256_set_m128i(q8s[hi], q8s[2 * p]);
            yd_pair[p] = _mm_movelh_ps(_mm_set1_ps(yd[2 * p]), _mm_set1_ps(yd[hi]));
        }
        let mut scales = [_mm512_setzero_si512(); W];
        // [xd, xdmin, xd, xdmin] per weight row; per pair, the mins · bsums of row 2p (low half)
        // and 2p + 1 (high half).
        let mut d_dmin = [_mm_setzero_ps(); W];
        let mut mins = [[_mm256_setzero_si256(); R]; W];
        for w in 0..W {
            let xb = x[w].add(i * 144);
            if PREFETCH {
                sweep_prefetch(x[0], W, w, i, nb, 144);
            }
            let dd = f16x2_at(xb);
            d_dmin[w] = _mm_movelh_ps(dd, dd);
            let ms = mins_and_scales(xb.add(4));
            let mins16 = _mm256_permute2x128_si256::<0x11>(ms, ms);
            for p in 0..pairs {
                mins[w][p] = _mm256_madd_epi16(mins16, q8s_pair[p]);
            }
            scales[w] = _mm512_broadcast_i32x4(_mm256_extracti128_si256(ms, 0));
        }
        let mut sumi = [[_mm512_setzero_si512(); R]; W];
        for j in 0..4 {
            // Scales of sub-blocks 2j (low half) and 2j+1 (high half): rows 2j and 2j+1 of the table.
            let shuffle = load512(SCALE_SHUFFLE_K4[2 * j].as_ptr());
            let mut q4 = [_mm512_setzero_si512(); W];
            let mut scale = [_mm512_setzero_si512(); W];
            for w in 0..W {
                scale[w] = _mm512_shuffle_epi8(scales[w], shuffle);
                let bits = load256(x[w].add(i * 144 + 16 + 32 * j));
                let both = _mm512_inserti64x4(_mm512_castsi256_si512(bits), _mm256_srli_epi16(bits, 4), 1);
                q4[w] = _mm512_and_si512(both, m4);
            }
            for r in 0..R {
                let q8 = load512(y[r].add(i * Q8K_BYTES + Q8K_QS + 64 * j));
                for w in 0..W {
                    sumi[w][r] = _mm512_dpwssd_epi32(sumi[w][r], scale[w], _mm512_maddubs_epi16(q4[w], q8));
                }
            }
        }
        for w in 0..W {
            for p in 0..pairs {
                let (a, b) = (2 * p, (2 * p + 1).min(R - 1));
                let m = mins[w][p];
                let sums = q4k_sums2(
                    fold_halves(sumi[w][a]),
                    _mm256_castsi256_si128(m),
                    fold_halves(sumi[w][b]),
                    _mm256_extracti128_si256::<1>(m),
                );
                acc[w][p] = q4k_accumulate(acc[w][p], sums, _mm_mul_ps(d_dmin[w], yd_pair[p]));
            }
        }
    }
    let mut out = [[0f32; R]; W];
    for w in 0..W {
        for p in 0..pairs {
            let [a, b] = q4k_results(acc[w][p]);
            out[w][2 * p] = a;
            if 2 * p + 1 < R {
                out[w][2 * p + 1] = b;
            }
        }
    }
    out
}

/// Q6_K, W weight rows × R Q8_K rows; as [`q4_k_tile_512`].
///
/// # Safety
/// As [`q4_k_tile_512`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q6_k_tile_512<const W: usize, const R: usize, const PREFETCH: bool>(
    nb: usize,
    x: [*const u8; W],
    y: [*const u8; R],
) -> [[f32; R]; W] {
    let pair = |lo: __m256i, hi: __m256i| _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    let mut acc = [[_mm256_setzero_ps(); R]; W];
    for i in 0..nb {
        let mut xd = [_mm256_setzero_ps(); W];
        let mut scales = [_mm_setzero_si128(); W];
        let mut scales16 = [_mm256_setzero_si256(); W];
        for w in 0..W {
            let xb = x[w].add(i * 210);
            if PREFETCH {
                sweep_prefetch(x[0], W, w, i, nb, 210);
            }
            xd[w] = _mm256_set1_ps(f16_at(xb.add(208)));
            scales[w] = _mm_loadu_si128(xb.add(192) as *const __m128i);
            scales16[w] = _mm256_cvtepi8_epi16(scales[w]);
        }
        let mut sumi = [[_mm512_setzero_si512(); R]; W];
        for j in 0..2 {
            let mut q01 = [_mm512_setzero_si512(); W];
            let mut q23 = [_mm512_setzero_si512(); W];
            let mut s01 = [_mm512_setzero_si512(); W];
            let mut s23 = [_mm512_setzero_si512(); W];
            for w in 0..W {
                let xb = x[w].add(i * 210);
                let [q4_0, q4_1, q4_2, q4_3] = q6_k_codes(xb, j);
                q01[w] = pair(q4_0, q4_1);
                q23[w] = pair(q4_2, q4_3);
                let is = 4 * j;
                s01[w] = pair(q6_scale(scales[w], is), q6_scale(scales[w], is + 1));
                s23[w] = pair(q6_scale(scales[w], is + 2), q6_scale(scales[w], is + 3));
            }
            for r in 0..R {
                let q8 = y[r].add(i * Q8K_BYTES + Q8K_QS + 128 * j);
                let (q8a, q8b) = (load512(q8), load512(q8.add(64)));
                for w in 0..W {
                    let s = _mm512_dpwssd_epi32(sumi[w][r], s01[w], _mm512_maddubs_epi16(q01[w], q8a));
                    sumi[w][r] = _mm512_dpwssd_epi32(s, s23[w], _mm512_maddubs_epi16(q23[w], q8b));
                }
            }
        }
        for r in 0..R {
            let yb = y[r].add(i * Q8K_BYTES);
            let q8sums = load256(yb.add(Q8K_BSUMS));
            let yd = _mm256_set1_ps(q8k_d(yb));
            for w in 0..W {
                // Codes are stored +32; subtract 32 * Σ scale * bsum once instead of per element.
                let q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales16[w]), 5);
                let s = _mm256_sub_epi32(fold_halves(sumi[w][r]), q8sclsub);
                // d = yd * xd per lane, as the single-row kernel's scalar product.
                let d = _mm256_mul_ps(yd, xd[w]);
                acc[w][r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[w][r]);
            }
        }
    }
    // Loops, not `map` closures: a closure does not inherit this function's target features,
    // so `hsum_float_8` would be a call per output instead of inlined.
    let mut out = [[0f32; R]; W];
    for w in 0..W {
        for r in 0..R {
            out[w][r] = hsum_float_8(acc[w][r]);
        }
    }
    out
}
