//! Q4_K and Q6_K × Q8_K with AVX2: W weight rows × R activation rows per pass, for the few-row
//! mat-muls of speculative verification and batched decode (2-16 rows). Per super-block the
//! activation side is loaded once for the W weight rows and each weight block unpacked once for
//! the R activation rows. Every (weight row, activation row) pair keeps its own i32 lanes (exact
//! integer sums) and float accumulators, updated by the same operations in the same order as the
//! single-row kernels of multi.rs: each output equals the single-row dot product bit for bit.

use super::kquants::{
    mins_and_scales, q4k_accumulate, q4k_results, q4k_sums2, q6_k_codes, q6_scale, q8k_d, Q8K_BSUMS, Q8K_BYTES, Q8K_QS,
    SCALE_SHUFFLE_K4,
};
use super::*;

/// How many tiles of W weight rows ahead the tile kernels prefetch their weights.
pub(super) const TILE_PREFETCH_TILES: usize = 2;

/// Prefetches, for row `w` of a tile of `tile_rows` rows at `x0` and super-block `i`, the
/// `block_bytes` of the rows that follow this tile (TILE_PREFETCH_TILES tiles ahead) at the same
/// position: the tiles are swept in address order, a few lines per row and block, at the rate
/// the tile is read. The rows are read interleaved, a pattern the hardware prefetcher follows
/// poorly.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn sweep_prefetch(
    x0: *const u8,
    tile_rows: usize,
    w: usize,
    i: usize,
    nb: usize,
    block_bytes: usize,
) {
    let span = tile_rows * block_bytes;
    prefetch_ahead(
        x0.wrapping_add(i * span + w * block_bytes),
        TILE_PREFETCH_TILES * nb * span,
        block_bytes.div_ceil(64),
    );
}

/// Q4_K, W weight rows `x` × R Q8_K rows `y` of `nb` super-blocks: `out[w][r]` = the dot product
/// of row w with row r, as `avx2::q4_k_q8_k::<1>` computes it.
///
/// # Safety
/// AVX2/FMA/F16C must be available; every pointer is a whole row of `nb` super-blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_tile_avx2<const W: usize, const R: usize, const PREFETCH: bool>(
    nb: usize,
    x: [*const u8; W],
    y: [*const u8; R],
) -> [[f32; R]; W] {
    let m4 = _mm256_set1_epi8(0xF);
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
            let q8sums = load256(yb.add(Q8K_BSUMS));
            q8s[r] = _mm_hadd_epi16(_mm256_extracti128_si256(q8sums, 0), _mm256_extracti128_si256(q8sums, 1));
        }
        // Per pair: [q8s of row 2p | of row 2p + 1] and [yd of row 2p (x2), of row 2p + 1 (x2)].
        let mut q8s_pair = [_mm256_setzero_si256(); R];
        let mut yd_pair = [_mm_setzero_ps(); R];
        for p in 0..pairs {
            let hi = (2 * p + 1).min(R - 1);
            q8s_pair[p] = _mm256_set_m128i(q8s[hi], q8s[2 * p]);
            yd_pair[p] = _mm_movelh_ps(_mm_set1_ps(yd[2 * p]), _mm_set1_ps(yd[hi]));
        }
        let mut scales = [_mm256_setzero_si256(); W];
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
            let sc128 = _mm256_extracti128_si256(ms, 0);
            scales[w] = _mm256_set_m128i(sc128, sc128);
        }
        let mut sumi = [[_mm256_setzero_si256(); R]; W];
        for j in 0..4 {
            let shuf_l = load256(SCALE_SHUFFLE_K4[2 * j].as_ptr());
            let shuf_h = load256(SCALE_SHUFFLE_K4[2 * j + 1].as_ptr());
            for w in 0..W {
                let scale_l = _mm256_shuffle_epi8(scales[w], shuf_l);
                let scale_h = _mm256_shuffle_epi8(scales[w], shuf_h);
                let q4bits = load256(x[w].add(i * 144 + 16 + 32 * j));
                let q4l = _mm256_and_si256(q4bits, m4);
                let q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);
                for r in 0..R {
                    let q8 = y[r].add(i * Q8K_BYTES + Q8K_QS + 64 * j);
                    let p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, load256(q8)));
                    let p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, load256(q8.add(32))));
                    sumi[w][r] = _mm256_add_epi32(_mm256_add_epi32(sumi[w][r], p16l), p16h);
                }
            }
        }
        for w in 0..W {
            for p in 0..pairs {
                let (a, b) = (2 * p, (2 * p + 1).min(R - 1));
                let m = mins[w][p];
                let sums =
                    q4k_sums2(sumi[w][a], _mm256_castsi256_si128(m), sumi[w][b], _mm256_extracti128_si256::<1>(m));
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

/// Q6_K, W weight rows × R Q8_K rows, as `avx2::q6_k_q8_k::<1>` computes each; as [`q4_k_tile_avx2`].
///
/// # Safety
/// As [`q4_k_tile_avx2`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_tile_avx2<const W: usize, const R: usize, const PREFETCH: bool>(
    nb: usize,
    x: [*const u8; W],
    y: [*const u8; R],
) -> [[f32; R]; W] {
    let mut acc = [[_mm256_setzero_ps(); R]; W];
    for i in 0..nb {
        let mut xd = [0f32; W];
        let mut scales = [_mm_setzero_si128(); W];
        for w in 0..W {
            let xb = x[w].add(i * 210);
            if PREFETCH {
                sweep_prefetch(x[0], W, w, i, nb, 210);
            }
            xd[w] = f16_at(xb.add(208));
            scales[w] = _mm_loadu_si128(xb.add(192) as *const __m128i);
        }
        let mut sumi = [[_mm256_setzero_si256(); R]; W];
        for j in 0..2 {
            for w in 0..W {
                let xb = x[w].add(i * 210);
                let [q4_0, q4_1, q4_2, q4_3] = q6_k_codes(xb, j);
                let is = 4 * j;
                let (s0, s1) = (q6_scale(scales[w], is), q6_scale(scales[w], is + 1));
                let (s2, s3) = (q6_scale(scales[w], is + 2), q6_scale(scales[w], is + 3));
                for r in 0..R {
                    let q8 = y[r].add(i * Q8K_BYTES + Q8K_QS + 128 * j);
                    let mut s = sumi[w][r];
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(s0, _mm256_maddubs_epi16(q4_0, load256(q8))));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(s1, _mm256_maddubs_epi16(q4_1, load256(q8.add(32)))));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(s2, _mm256_maddubs_epi16(q4_2, load256(q8.add(64)))));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(s3, _mm256_maddubs_epi16(q4_3, load256(q8.add(96)))));
                    sumi[w][r] = s;
                }
            }
        }
        for r in 0..R {
            let yb = y[r].add(i * Q8K_BYTES);
            let q8sums = load256(yb.add(Q8K_BSUMS));
            let yd = q8k_d(yb);
            for w in 0..W {
                // Codes are stored +32; subtract 32 * Σ scale * bsum once instead of per element.
                let q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, _mm256_cvtepi8_epi16(scales[w])), 5);
                let s = _mm256_sub_epi32(sumi[w][r], q8sclsub);
                let d = yd * xd[w];
                acc[w][r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc[w][r]);
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
