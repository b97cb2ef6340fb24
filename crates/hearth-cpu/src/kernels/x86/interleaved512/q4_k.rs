//! Q4_K on 16 interleaved weight rows (see mod.rs). Per output the integers are the exact
//! super-block sums S (scaled codes) and M (mins · bsums), and the float steps those of
//! `q4k_accumulate`: f32(S) · (xd · yd) and f32(M) · (xdmin · yd) in two FMA chains, one step
//! per super-block, then their difference.

use super::super::kquants::{mins_and_scales, Q8K_BYTES, Q8K_QS};
use super::*;

// One interleaved super-block of the 16 rows, after the codes (byte offsets):
/// scales [4 sub-block pairs][16 rows][2] i16 (sub-block 2q, then 2q + 1);
pub(super) const SCALES: usize = CODES_BYTES;
/// mins, as the scales;
pub(super) const MINS: usize = SCALES + 4 * 64;
/// d, then dmin: [16 rows] f32 each.
const D: usize = MINS + 4 * 64;
const DMIN: usize = D + 64;
pub(super) const BLOCK: usize = DMIN + 64;

/// Rearranges the 16 Q4_K rows at `x0` (`w_row` bytes apart, `nb` super-blocks each) into `dst`
/// (`nb` interleaved blocks of [`BLOCK`] bytes). Each row is read in order (whole 64-byte lines;
/// gathering 4 bytes from 16 rows measured ~2.5x slower from memory) and the 16 rows are
/// transposed in registers.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; the 16 rows are whole rows of `nb`
/// super-blocks; `dst` holds `nb` · [`BLOCK`] bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn interleave_rows(nb: usize, x0: *const u8, w_row: usize, dst: *mut u8) {
    let m4 = _mm512_set1_epi8(0xF);
    for i in 0..nb {
        let blk = dst.add(i * BLOCK);
        prefetch_next_tile(x0, w_row, i * 144, 144);
        let row = |l: usize| x0.add(l * w_row + i * 144);
        // Elements 64k..64k + 64 of a row: packed bytes 32k.. in their low nibbles (sub-block
        // 2k), then in their high nibbles (sub-block 2k + 1).
        for k in 0..4 {
            let mut quarter = [_mm512_setzero_si512(); ROWS];
            for (l, codes) in quarter.iter_mut().enumerate() {
                let bits = load256(row(l).add(16 + 32 * k));
                *codes = _mm512_and_si512(
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bits), _mm256_srli_epi16(bits, 4)),
                    m4,
                );
            }
            store_codes_quarter(blk, k, quarter);
        }
        // Per row: 8 scales then 8 mins as i16, i.e. 8 i32 lanes of two each (the upper half
        // of the register zero); transposed, lanes 0-3 are the scale pairs, 4-7 the min pairs.
        let mut lanes = [_mm512_setzero_si512(); ROWS];
        let mut d_dmin = [0u32; ROWS];
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane = _mm512_castsi256_si512(mins_and_scales(row(l).add(4)));
            d_dmin[l] = (row(l) as *const u32).read_unaligned();
        }
        let pairs = transpose16(lanes);
        for q in 0..4 {
            store512(blk.add(SCALES + q * 64), pairs[q]);
            store512(blk.add(MINS + q * 64), pairs[4 + q]);
        }
        // The f16 d (low half) and dmin (high half) of each row, converted exactly.
        let d_dmin = _mm512_loadu_si512(d_dmin.as_ptr() as *const __m512i);
        _mm512_storeu_ps(blk.add(D) as *mut f32, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d_dmin)));
        _mm512_storeu_ps(
            blk.add(DMIN) as *mut f32,
            _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(d_dmin, 16))),
        );
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
    // Per activation row, lane l: Σ f32(S) · (xd · yd) and Σ f32(M) · (xdmin · yd) of weight row l.
    let mut acc = [_mm512_setzero_ps(); R];
    let mut acc_min = [_mm512_setzero_ps(); R];
    for i in 0..nb {
        let blk = blocks.add(i * BLOCK);
        let mut sums = [_mm512_setzero_si512(); R];
        for s in 0..8 {
            let mut part = [_mm512_setzero_si512(); R];
            for g in 0..8 {
                let codes = load512(blk.add((s * 8 + g) * 64));
                for r in 0..R {
                    let q8 = (y[r].add(i * Q8K_BYTES + Q8K_QS + 32 * s + 4 * g) as *const i32).read_unaligned();
                    part[r] = _mm512_dpbusd_epi32(part[r], codes, _mm512_set1_epi32(q8));
                }
            }
            // Sub-block s's scale: the low (even s) or high (odd s) i16 of each lane's pair.
            let scale_pair = load512(blk.add(SCALES + s / 2 * 64));
            let scale = if s % 2 == 0 {
                _mm512_and_si512(scale_pair, _mm512_set1_epi32(0xFFFF))
            } else {
                _mm512_srli_epi32(scale_pair, 16)
            };
            for r in 0..R {
                sums[r] = _mm512_add_epi32(sums[r], _mm512_mullo_epi32(part[r], scale));
            }
        }
        let mut min_sums = [_mm512_setzero_si512(); R];
        for r in 0..R {
            for (q, &b) in q8k_bsum_pairs(y[r].add(i * Q8K_BYTES)).iter().enumerate() {
                min_sums[r] = _mm512_dpwssd_epi32(min_sums[r], load512(blk.add(MINS + q * 64)), _mm512_set1_epi32(b));
            }
        }
        let (d, dmin) = (_mm512_loadu_ps(blk.add(D) as *const f32), _mm512_loadu_ps(blk.add(DMIN) as *const f32));
        accumulate_super_block(&mut acc, &mut acc_min, &sums, &min_sums, d, dmin, &y, i);
    }
    chain_outputs(&acc, &acc_min)
}
