//! Prefill Q4_K × Q8_K with AVX-512 VNNI on 16 weight rows interleaved lane by lane.
//!
//! The tile kernels (ktile512.rs) keep one register per (weight row, activation row) pair whose
//! 16 i32 lanes each cover a few columns: every sub-block costs a scale multiply per pair, and
//! every super-block a reduction of the lanes. Here a tile of 16 weight rows is rearranged once
//! per call (for all its tokens) so that lane l of a register holds 4 codes of row l: one
//! `dpbusd` against 4 activation bytes broadcast to every lane does 64 multiply-adds for 16
//! outputs, a sub-block's 8 `dpbusd` are scaled by one `vpmulld`, and no lane is ever reduced.
//! (llama.cpp's repacked Q4_K kernels interleave rows the same way.)
//!
//! Per output the integers are the exact super-block sums S (scaled codes) and M (mins · bsums),
//! and the float steps those of `q4k_accumulate` (kquants.rs): f32(S) · (xd · yd) and
//! f32(M) · (xdmin · yd) in two FMA chains, one step per super-block, then their difference. So
//! every output equals the one-row kernel bit for bit.

use super::kquants::{mins_and_scales, q8k_d, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::*;

/// Weight rows per interleaved tile: one per i32 lane of a 512-bit register.
const INTERLEAVED_ROWS: usize = 16;
/// Activation rows per kernel call: 4 registers each (sub-block part, super-block sum, the two
/// float chains), so 4 rows take 16 of the 32 registers.
const ACT_ROWS: usize = 4;

// One interleaved super-block of the 16 rows, byte offsets:
/// codes [8 sub-blocks][8 groups of 4 columns][16 rows][4] u8 (0..15);
const CODES: usize = 0;
/// scales [4 sub-block pairs][16 rows][2] i16 (sub-block 2q, then 2q + 1);
const SCALES: usize = 4096;
/// mins, as the scales;
const MINS: usize = SCALES + 4 * 64;
/// d, then dmin: [16 rows] f32 each.
const D: usize = MINS + 4 * 64;
const DMIN: usize = D + 64;
const BLOCK: usize = DMIN + 64;

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn load512(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const __m512i)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn store512(p: *mut u8, v: __m512i) {
    _mm512_storeu_si512(p as *mut __m512i, v)
}

/// The 16 × 16 i32 matrix `rows` transposed: lane l of the result's register c is lane c of
/// `rows[l]` (four rounds of 16 shuffles).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn transpose16(rows: [__m512i; 16]) -> [__m512i; 16] {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        // Per 128-bit lane: (a0 b0 a1 b1), (a2 b2 a3 b3) of rows a = 2i, b = 2i + 1.
        t[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        // u[4i + m], 128-bit lane q: column m + 4q of rows 4i..4i + 4.
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    let mut cols = [_mm512_setzero_si512(); 16];
    for m in 0..4 {
        // Lanes 0 and 2 (`even`) or 1 and 3 (`odd`) of the four row groups' registers, then
        // column m + 4q gathered from the four row groups.
        let even_lo = _mm512_shuffle_i32x4::<0b10_00_10_00>(u[m], u[4 + m]);
        let even_hi = _mm512_shuffle_i32x4::<0b10_00_10_00>(u[8 + m], u[12 + m]);
        let odd_lo = _mm512_shuffle_i32x4::<0b11_01_11_01>(u[m], u[4 + m]);
        let odd_hi = _mm512_shuffle_i32x4::<0b11_01_11_01>(u[8 + m], u[12 + m]);
        cols[m] = _mm512_shuffle_i32x4::<0b10_00_10_00>(even_lo, even_hi);
        cols[m + 8] = _mm512_shuffle_i32x4::<0b11_01_11_01>(even_lo, even_hi);
        cols[m + 4] = _mm512_shuffle_i32x4::<0b10_00_10_00>(odd_lo, odd_hi);
        cols[m + 12] = _mm512_shuffle_i32x4::<0b11_01_11_01>(odd_lo, odd_hi);
    }
    cols
}

/// Rearranges the 16 Q4_K rows at `x0` (`w_row` bytes apart, `nb` super-blocks each) into `dst`
/// (`nb` interleaved blocks of [`BLOCK`] bytes). Each row is read in order (whole 64-byte lines,
/// which the hardware prefetcher follows; gathering 4 bytes from 16 rows measured ~2.5x slower
/// from memory) and the 16 rows are transposed in registers.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; the 16 rows are whole rows of `nb`
/// super-blocks; `dst` holds `nb` · [`BLOCK`] bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn interleave_rows(nb: usize, x0: *const u8, w_row: usize, dst: *mut u8) {
    let m4 = _mm512_set1_epi8(0xF);
    for i in 0..nb {
        let blk = dst.add(i * BLOCK);
        let row = |l: usize| x0.add(l * w_row + i * 144);
        // The same super-block of the next 16 rows (the next tile, usually this thread's next
        // task) into L2, while this tile is interleaved and multiplied: 16 rows read a block at
        // a time are 16 streams, more than the hardware prefetcher tracks (without it, 4 tokens
        // against rows of 1536 from memory took twice the packed tiles' time).
        for l in 0..INTERLEAVED_ROWS {
            let next = row(l).wrapping_add(INTERLEAVED_ROWS * w_row) as usize;
            for line in (next & !63..next + 144).step_by(64) {
                _mm_prefetch::<_MM_HINT_T1>(line as *const i8);
            }
        }
        // Packed bytes 64h..64h + 64 of a row, as 16 i32 lanes c: in their low nibbles columns
        // 4g..4g + 4 of sub-block 2j and in their high nibbles those of sub-block 2j + 1
        // (j = 2h + c / 8, g = c % 8).
        for h in 0..2 {
            for high in [false, true] {
                let mut lanes = [_mm512_setzero_si512(); 16];
                for (l, lane) in lanes.iter_mut().enumerate() {
                    let packed = load512(row(l).add(16 + 64 * h));
                    *lane = _mm512_and_si512(if high { _mm512_srli_epi16(packed, 4) } else { packed }, m4);
                }
                for (c, col) in transpose16(lanes).into_iter().enumerate() {
                    let sub_block = 2 * (2 * h + c / 8) + usize::from(high);
                    store512(blk.add(CODES + (sub_block * 8 + c % 8) * 64), col);
                }
            }
        }
        // Per row: 8 scales then 8 mins as i16, i.e. 8 i32 lanes of two each (the upper half
        // of the register zero); transposed, lanes 0-3 are the scale pairs, 4-7 the min pairs.
        let mut lanes = [_mm512_setzero_si512(); 16];
        let mut d_dmin = [0u32; 16];
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
        _mm512_storeu_ps(blk.add(DMIN) as *mut f32, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(d_dmin, 16))));
    }
}

/// The 16 interleaved weight rows at `blocks` × R Q8_K rows `y` of `nb` super-blocks:
/// `out[r][l]` = the dot product of weight row l with activation row r.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; `blocks` holds `nb` interleaved
/// blocks; every `y` is a whole Q8_K row of `nb` super-blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn interleaved_tile<const R: usize>(nb: usize, blocks: *const u8, y: [*const u8; R]) -> [[f32; INTERLEAVED_ROWS]; R] {
    // Per activation row, lane l: Σ f32(S) · (xd · yd) and Σ f32(M) · (xdmin · yd) of weight row l.
    let mut acc = [_mm512_setzero_ps(); R];
    let mut acc_min = [_mm512_setzero_ps(); R];
    for i in 0..nb {
        let blk = blocks.add(i * BLOCK);
        let mut sums = [_mm512_setzero_si512(); R];
        for s in 0..8 {
            let mut part = [_mm512_setzero_si512(); R];
            for g in 0..8 {
                let codes = load512(blk.add(CODES + (s * 8 + g) * 64));
                for r in 0..R {
                    let q8 = (y[r].add(i * Q8K_BYTES + Q8K_QS + 32 * s + 4 * g) as *const i32).read_unaligned();
                    part[r] = _mm512_dpbusd_epi32(part[r], codes, _mm512_set1_epi32(q8));
                }
            }
            // Sub-block s's scale: the low (even s) or high (odd s) i16 of each lane's pair.
            let scale_pair = load512(blk.add(SCALES + s / 2 * 64));
            let scale = if s % 2 == 0 { _mm512_and_si512(scale_pair, _mm512_set1_epi32(0xFFFF)) } else { _mm512_srli_epi32(scale_pair, 16) };
            for r in 0..R {
                sums[r] = _mm512_add_epi32(sums[r], _mm512_mullo_epi32(part[r], scale));
            }
        }
        let mut min_sums = [_mm512_setzero_si512(); R];
        for r in 0..R {
            let yb = y[r].add(i * Q8K_BYTES);
            // Q8_K's 16 bsums added in pairs: one i16 per sub-block, as i32 lanes of 2 sub-blocks.
            let q8sums = load256(yb.add(Q8K_BSUMS));
            let pair_sums = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
            let mut bsums = [0i32; 4];
            _mm_storeu_si128(bsums.as_mut_ptr() as *mut __m128i, pair_sums);
            for (p, &b) in bsums.iter().enumerate() {
                min_sums[r] = _mm512_dpwssd_epi32(min_sums[r], load512(blk.add(MINS + p * 64)), _mm512_set1_epi32(b));
            }
        }
        let (d, dmin) = (_mm512_loadu_ps(blk.add(D) as *const f32), _mm512_loadu_ps(blk.add(DMIN) as *const f32));
        for r in 0..R {
            let yd = _mm512_set1_ps(q8k_d(y[r].add(i * Q8K_BYTES)));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), _mm512_mul_ps(d, yd), acc[r]);
            acc_min[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(min_sums[r]), _mm512_mul_ps(dmin, yd), acc_min[r]);
        }
    }
    let mut out = [[0f32; INTERLEAVED_ROWS]; R];
    for r in 0..R {
        _mm512_storeu_ps(out[r].as_mut_ptr(), _mm512_sub_ps(acc[r], acc_min[r]));
    }
    out
}

/// Prefill Q4_K mat-mul with VNNI: `out[w * rows + r]` for the whole groups of
/// [`INTERLEAVED_ROWS`] weight rows in `weights` (rows of `w_row` bytes, `nb` super-blocks)
/// against the `rows` Q8_K rows of `act_row` bytes in `activations`; returns how many weight rows
/// it did.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; `weights` and `activations` hold
/// whole Q4_K / Q8_K rows of `nb` super-blocks and `out` one float per (weight row, activation row).
pub(in crate::kernels) unsafe fn q4_k_prefill_pass(
    nb: usize,
    weights: &[u8],
    w_row: usize,
    activations: &[u8],
    act_row: usize,
    out: &mut [f32],
) -> usize {
    // Each thread keeps its buffer: a call takes one task's 16 weight rows, and allocating (and
    // zeroing) 28-166 KiB per call cost as much as interleaving them.
    thread_local! {
        static BLOCKS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BLOCKS.with_borrow_mut(|blocks| {
        if blocks.len() < nb * BLOCK {
            blocks.resize(nb * BLOCK, 0);
        }
        prefill_tiles(nb, weights, w_row, activations, act_row, out, &mut blocks[..nb * BLOCK])
    })
}

/// [`q4_k_prefill_pass`] with its interleaving buffer `blocks` (`nb` · [`BLOCK`] bytes).
///
/// # Safety
/// As [`q4_k_prefill_pass`].
unsafe fn prefill_tiles(nb: usize, weights: &[u8], w_row: usize, activations: &[u8], act_row: usize, out: &mut [f32], blocks: &mut [u8]) -> usize {
    let (n_w, rows) = (weights.len() / w_row, activations.len() / act_row);
    let mut w_done = 0;
    while w_done + INTERLEAVED_ROWS <= n_w {
        interleave_rows(nb, weights.as_ptr().add(w_done * w_row), w_row, blocks.as_mut_ptr());
        let mut r = 0;
        while r < rows {
            r += match rows - r {
                1 => tile_into::<1>(nb, blocks, activations, act_row, r, rows, w_done, out),
                2 => tile_into::<2>(nb, blocks, activations, act_row, r, rows, w_done, out),
                3 => tile_into::<3>(nb, blocks, activations, act_row, r, rows, w_done, out),
                _ => tile_into::<ACT_ROWS>(nb, blocks, activations, act_row, r, rows, w_done, out),
            };
        }
        w_done += INTERLEAVED_ROWS;
    }
    w_done
}

/// One [`interleaved_tile`] call for activation rows `r..r + R` (of `rows`) against the
/// interleaved weight rows `w_done..w_done + 16`, written into `out` ([weight row, activation
/// row]); returns R.
///
/// # Safety
/// As [`q4_k_prefill_pass`]; rows `r..r + R` exist and `blocks` holds the interleaved rows.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile_into<const R: usize>(
    nb: usize,
    blocks: &[u8],
    activations: &[u8],
    act_row: usize,
    r: usize,
    rows: usize,
    w_done: usize,
    out: &mut [f32],
) -> usize {
    let y: [*const u8; R] = std::array::from_fn(|i| activations.as_ptr().add((r + i) * act_row));
    let dots = interleaved_tile::<R>(nb, blocks.as_ptr(), y);
    for (i, row) in dots.iter().enumerate() {
        for (l, &d) in row.iter().enumerate() {
            out[(w_done + l) * rows + r + i] = d;
        }
    }
    R
}
