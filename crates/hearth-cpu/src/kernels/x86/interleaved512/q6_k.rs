//! Q6_K on 16 interleaved weight rows (see mod.rs). Per output the integer is the exact
//! super-block sum S = Σ scale · Σ code · q8 − 32 · Σ scale · bsum (the codes are stored + 32),
//! and the float step that of `q6k_accumulate`: f32(S) · (xd · yd) in one FMA chain.

use super::super::kquants::{q6_k_codes, q8k_d, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::*;

// One interleaved super-block of the 16 rows, after the codes (byte offsets):
/// scales [8 sub-block pairs][16 rows][2] i16 (sub-block 2q, then 2q + 1; signed);
const SCALES: usize = CODES_BYTES;
/// d: [16 rows] f32.
const D: usize = SCALES + 8 * 64;
pub(super) const BLOCK: usize = D + 64;

/// Bytes of a Q6_K super-block.
const Q6K_BYTES: usize = 210;

/// Rearranges the 16 Q6_K rows at `x0` (`w_row` bytes apart, `nb` super-blocks each) into `dst`
/// (`nb` interleaved blocks of [`BLOCK`] bytes), as Q4_K's `interleave_rows`.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; the 16 rows are whole rows of `nb`
/// super-blocks; `dst` holds `nb` · [`BLOCK`] bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn interleave_rows(nb: usize, x0: *const u8, w_row: usize, dst: *mut u8) {
    for i in 0..nb {
        let blk = dst.add(i * BLOCK);
        prefetch_next_tile(x0, w_row, i * Q6K_BYTES, Q6K_BYTES);
        let row = |l: usize| x0.add(l * w_row + i * Q6K_BYTES);
        // Elements 64k..64k + 64 of a row: two of the four 32-code groups of half k / 2.
        for k in 0..4 {
            let mut quarter = [_mm512_setzero_si512(); ROWS];
            for (l, codes) in quarter.iter_mut().enumerate() {
                let groups = q6_k_codes(row(l), k / 2);
                let (lo, hi) = (groups[2 * (k % 2)], groups[2 * (k % 2) + 1]);
                *codes = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            }
            store_codes_quarter(blk, k, quarter);
        }
        // Per row: the 16 i8 scales as i16, i.e. 8 i32 lanes of two each; transposed.
        let mut lanes = [_mm512_setzero_si512(); ROWS];
        let mut d = [0u16; ROWS];
        for (l, lane) in lanes.iter_mut().enumerate() {
            let scales = _mm_loadu_si128(row(l).add(192) as *const __m128i);
            *lane = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(scales));
            d[l] = (row(l).add(208) as *const u16).read_unaligned();
        }
        let pairs = transpose16(lanes);
        for (q, &pair) in pairs.iter().take(8).enumerate() {
            store512(blk.add(SCALES + q * 64), pair);
        }
        // The f16 d of each row, converted exactly.
        let d = _mm256_loadu_si256(d.as_ptr() as *const __m256i);
        _mm512_storeu_ps(blk.add(D) as *mut f32, _mm512_cvtph_ps(d));
    }
}

/// The 16 interleaved weight rows at `blocks` × R Q8_K rows `y` of `nb` super-blocks:
/// `out[r][l]` = the dot product of weight row l with activation row r.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; `blocks` holds `nb` interleaved
/// blocks; every `y` is a whole Q8_K row of `nb` super-blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn tile<const R: usize>(nb: usize, blocks: *const u8, y: [*const u8; R]) -> [[f32; ROWS]; R] {
    // Per activation row, lane l: Σ f32(S) · (xd · yd) of weight row l.
    let mut acc = [_mm512_setzero_ps(); R];
    for i in 0..nb {
        let blk = blocks.add(i * BLOCK);
        let mut sums = [_mm512_setzero_si512(); R];
        for s in 0..16 {
            let mut part = [_mm512_setzero_si512(); R];
            for g in 0..4 {
                let codes = load512(blk.add((4 * s + g) * 64));
                for r in 0..R {
                    let q8 = (y[r].add(i * Q8K_BYTES + Q8K_QS + 16 * s + 4 * g) as *const i32).read_unaligned();
                    part[r] = _mm512_dpbusd_epi32(part[r], codes, _mm512_set1_epi32(q8));
                }
            }
            // Sub-block s's signed scale: the low (even s) or high (odd s) i16 of each lane's pair.
            let pair = load512(blk.add(SCALES + s / 2 * 64));
            let scale = if s % 2 == 0 { _mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16) } else { _mm512_srai_epi32(pair, 16) };
            for r in 0..R {
                sums[r] = _mm512_add_epi32(sums[r], _mm512_mullo_epi32(part[r], scale));
            }
        }
        let d = _mm512_loadu_ps(blk.add(D) as *const f32);
        for r in 0..R {
            let yb = y[r].add(i * Q8K_BYTES);
            // The codes' +32: Σ scale · bsum over the 16 sub-blocks (two per i32 of bsums), × 32.
            let mut offset = _mm512_setzero_si512();
            for q in 0..8 {
                let bsums = (yb.add(Q8K_BSUMS + 4 * q) as *const i32).read_unaligned();
                offset = _mm512_dpwssd_epi32(offset, load512(blk.add(SCALES + q * 64)), _mm512_set1_epi32(bsums));
            }
            let total = _mm512_sub_epi32(sums[r], _mm512_slli_epi32(offset, 5));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(d, _mm512_set1_ps(q8k_d(yb))), acc[r]);
        }
    }
    let mut out = [[0f32; ROWS]; R];
    for r in 0..R {
        _mm512_storeu_ps(out[r].as_mut_ptr(), acc[r]);
    }
    out
}
