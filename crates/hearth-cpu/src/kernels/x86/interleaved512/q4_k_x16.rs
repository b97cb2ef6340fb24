//! Q4_K tiles repacked once (kernels/q4k_x16.rs has the layout) × Q8_K rows, AVX-512 VNNI.
//! The arithmetic is q4_k.rs's — exact integer super-block sums per output, then the float steps
//! of the packed kernels — so every output equals the one-row kernel bit for bit; only the codes
//! are unpacked here (an `and`, a shift) instead of before the call.

use super::super::kquants::{Q8K_BYTES, Q8K_QS};
use super::*;
use crate::kernels::q4k_x16::{BLOCK, CODES, D, DMIN, MINS, SCALES};

/// How far ahead (bytes) a tile's first call prefetches: two super-blocks.
const PREFETCH_AHEAD: usize = 2 * BLOCK;

/// The tiles of 16 weight rows at `tiles` (`nb` super-blocks each, [`BLOCK`] bytes apiece) × the
/// `rows` Q8_K rows of `act_row` bytes at `activations`: `out[w * rows + r]` for weight row w of
/// the tiles (16 per tile) and activation row r.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; `tiles` holds whole tiles of `nb`
/// super-blocks, `activations` `rows` whole Q8_K rows of `nb` super-blocks, and `out` one float
/// per (weight row, activation row).
pub(in crate::kernels) unsafe fn q4_k_x16_pass(
    nb: usize,
    tiles: &[u8],
    activations: &[u8],
    act_row: usize,
    out: &mut [f32],
) {
    let rows = activations.len() / act_row;
    let tile_bytes = nb * BLOCK;
    for (t, this_tile) in tiles.chunks_exact(tile_bytes).enumerate() {
        let blocks = this_tile.as_ptr();
        // Two super-blocks ahead in address order (into the next tile at its end; a prefetch past
        // the last tile does not fault), spread over the chunks: one row from memory then runs at
        // about the packed decode kernel's speed (Qwen2.5-1.5B decode ~3% slower, the 2.8% more
        // bytes; one block ahead or a burst of lines per block measured slower, L2 slower still).
        let ahead = this_tile.as_ptr().wrapping_add(PREFETCH_AHEAD);
        let y = |r: usize| activations.as_ptr().add(r * act_row);
        let mut store = |r: usize, dots: &[[f32; ROWS]]| {
            for (i, row) in dots.iter().enumerate() {
                for (l, &d) in row.iter().enumerate() {
                    out[(t * ROWS + l) * rows + r + i] = d;
                }
            }
        };
        let mut r = 0;
        while r < rows {
            // Independent `vpdpbusd` chains: with few activation rows, each row's sub-block sum
            // is split in 4 or 2 (exact integer sums, added before the scale).
            // Only the first activation rows prefetch: the rest find the tile in cache.
            let prefetch = if r == 0 { ahead } else { std::ptr::null() };
            r += match rows - r {
                1 => {
                    store(r, &tile::<1, 4>(nb, blocks, prefetch, [y(r)]));
                    1
                }
                2 => {
                    store(r, &tile::<2, 2>(nb, blocks, prefetch, [y(r), y(r + 1)]));
                    2
                }
                3 => {
                    store(r, &tile::<3, 1>(nb, blocks, prefetch, [y(r), y(r + 1), y(r + 2)]));
                    3
                }
                _ => {
                    store(r, &tile::<ACT_ROWS, 1>(nb, blocks, prefetch, std::array::from_fn(|i| y(r + i))));
                    ACT_ROWS
                }
            };
        }
    }
}

/// One tile at `blocks` × R Q8_K rows `y`: `out[r][l]` = weight row l · activation row r, with
/// C independent accumulators per activation row; super-block i of the bytes at `prefetch`
/// (unless null) is prefetched into L1 while super-block i of this tile is multiplied.
///
/// # Safety
/// As [`q4_k_x16_pass`]; `blocks` holds `nb` super-blocks of a tile.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const R: usize, const C: usize>(
    nb: usize,
    blocks: *const u8,
    prefetch: *const u8,
    y: [*const u8; R],
) -> [[f32; ROWS]; R] {
    let m4 = _mm512_set1_epi8(0xF);
    // Per activation row, lane l: Σ f32(S) · (xd · yd) and Σ f32(M) · (xdmin · yd) of weight row l.
    let mut acc = [_mm512_setzero_ps(); R];
    let mut acc_min = [_mm512_setzero_ps(); R];
    for i in 0..nb {
        let blk = blocks.add(i * BLOCK);
        let ahead = prefetch.wrapping_add(i * BLOCK);
        let mut sums = [_mm512_setzero_si512(); R];
        for s in 0..8 {
            let mut part = [[_mm512_setzero_si512(); C]; R];
            for c in 0..4 {
                if !prefetch.is_null() {
                    // One line per chunk: spread over the block, not a burst per block.
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add((4 * s + c) * 64) as *const i8);
                }
                let packed = load512(blk.add(CODES + (4 * s + c) * 64));
                let low = _mm512_and_si512(packed, m4);
                let high = _mm512_and_si512(_mm512_srli_epi16(packed, 4), m4);
                for r in 0..R {
                    let q8 = y[r].add(i * Q8K_BYTES + Q8K_QS + 32 * s + 8 * c);
                    let (a, b) = ((q8 as *const i32).read_unaligned(), (q8.add(4) as *const i32).read_unaligned());
                    let p = &mut part[r][c % C];
                    *p = _mm512_dpbusd_epi32(*p, low, _mm512_set1_epi32(a));
                    *p = _mm512_dpbusd_epi32(*p, high, _mm512_set1_epi32(b));
                }
            }
            if !prefetch.is_null() && SCALES + 64 * s < BLOCK {
                // The scales' 5 lines, over the first 5 sub-blocks.
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(SCALES + 64 * s) as *const i8);
            }
            let scale = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(SCALES + 16 * s) as *const __m128i));
            for r in 0..R {
                let mut sub = part[r][0];
                for p in &part[r][1..] {
                    sub = _mm512_add_epi32(sub, *p);
                }
                sums[r] = _mm512_add_epi32(sums[r], _mm512_mullo_epi32(sub, scale));
            }
        }
        let mut min_sums = [_mm512_setzero_si512(); R];
        for r in 0..R {
            for (q, &b) in q8k_bsum_pairs(y[r].add(i * Q8K_BYTES)).iter().enumerate() {
                let mins = _mm512_cvtepu8_epi16(load256(blk.add(MINS + q * 32)));
                min_sums[r] = _mm512_dpwssd_epi32(min_sums[r], mins, _mm512_set1_epi32(b));
            }
        }
        let d = _mm512_cvtph_ps(load256(blk.add(D)));
        let dmin = _mm512_cvtph_ps(load256(blk.add(DMIN)));
        accumulate_super_block(&mut acc, &mut acc_min, &sums, &min_sums, d, dmin, &y, i);
    }
    chain_outputs(&acc, &acc_min)
}

/// `kernels::q4k_x16::repack_tile` with AVX-512: each super-block of the 16 rows at `x0`
/// (`w_row` bytes apart) interleaved by q4_k.rs's `interleave_rows`, then its codes packed two
/// to a byte and its scales and mins narrowed to bytes, into `dst` (`nb` x16 blocks). The same
/// bytes as the scalar form, ~10x faster (Qwen2.5-1.5B's repack took ~0.35 s on 2 threads).
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; the 16 rows are whole rows of `nb`
/// super-blocks; `dst` holds `nb` · [`BLOCK`] bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(in crate::kernels) unsafe fn repack_tile(nb: usize, x0: *const u8, w_row: usize, dst: *mut u8) {
    let mut interleaved = [0u8; super::q4_k::BLOCK];
    let tmp = interleaved.as_mut_ptr();
    for i in 0..nb {
        super::q4_k::interleave_rows(1, x0.add(i * 144), w_row, tmp);
        let blk = dst.add(i * BLOCK);
        for p in 0..32 {
            // Groups 2p and 2p + 1 (codes 0..15, a byte each) into one byte's two nibbles.
            let (low, high) = (load512(tmp.add(2 * p * 64)), load512(tmp.add((2 * p + 1) * 64)));
            store512(blk.add(CODES + p * 64), _mm512_or_si512(low, _mm512_slli_epi16(high, 4)));
        }
        for q in 0..4 {
            // Lane l: row l's i16 pair (sub-block 2q low, 2q + 1 high), for scales and mins.
            let scales = load512(tmp.add(super::q4_k::SCALES + q * 64));
            let even = _mm512_cvtepi32_epi8(_mm512_and_si512(scales, _mm512_set1_epi32(0xFFFF)));
            let odd = _mm512_cvtepi32_epi8(_mm512_srli_epi32(scales, 16));
            _mm_storeu_si128(blk.add(SCALES + 2 * q * 16) as *mut __m128i, even);
            _mm_storeu_si128(blk.add(SCALES + (2 * q + 1) * 16) as *mut __m128i, odd);
            let mins = _mm512_cvtepi16_epi8(load512(tmp.add(super::q4_k::MINS + q * 64)));
            _mm256_storeu_si256(blk.add(MINS + q * 32) as *mut __m256i, mins);
        }
        for l in 0..ROWS {
            let row = x0.add(l * w_row + i * 144);
            std::ptr::copy_nonoverlapping(row, blk.add(D + 2 * l), 2);
            std::ptr::copy_nonoverlapping(row.add(2), blk.add(DMIN + 2 * l), 2);
        }
    }
}
