//! Prefill and verification Q4_K × Q8_K with AVX-512 VNNI on 16 weight rows interleaved lane by
//! lane.
//!
//! The packed tile kernels (ktile512.rs) keep one register per (weight row, activation row) pair
//! whose 16 i32 lanes each cover a few columns: every sub-block costs a scale multiply per pair,
//! and every super-block a reduction of the lanes. Here a tile of 16 weight rows is rearranged
//! once per call (for all its tokens) so that lane l of a register holds 4 codes of row l: one
//! `dpbusd` against 4 activation bytes broadcast to every lane does 64 multiply-adds for 16
//! outputs, a sub-block's `dpbusd`s are scaled by one `vpmulld`, and no lane is ever reduced.
//! (llama.cpp's repacked Q4_K kernels interleave rows the same way.)
//!
//! Per output the integers are the exact super-block sums, and the float steps those of the
//! packed kernels (`q4k_accumulate` in kquants.rs): every output equals the one-row kernel bit for
//! bit.
//!
//! Not Q6_K: llama.cpp has no repacked Q6_K kernel on x86, and its `ggml_vec_dot_q6_K_q8_K`
//! converts 8 partial i32 sums per super-block (lane l: elements 4l..4l+3 of every 32, less the
//! bsum term of elements 32l..32l+31) to floats separately, a rounding the packed kernels keep
//! and one lane per row cannot produce without 8 accumulators per output.
//!
//! An interleaved super-block of 16 rows starts with their codes, 0..15 as bytes in element
//! order: [64 groups of 4 elements][16 rows][4] (4 KiB), then the scales (q4_k.rs).

mod q4_k;
mod q4_k_x16;

pub(in crate::kernels) use q4_k_x16::{q4_k_x16_pass, repack_tile as q4_k_x16_repack_tile};

use super::*;

/// Weight rows per interleaved tile: one per i32 lane of a 512-bit register.
const ROWS: usize = 16;
/// Activation rows per kernel call: 4 registers each (a sub-block's part, the super-block sum,
/// the float chains), so 4 rows take about half of the 32 registers. 6 measured the same.
const ACT_ROWS: usize = 4;
/// Bytes of the codes of an interleaved super-block (at its start).
const CODES_BYTES: usize = 64 * 64;

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn store512(p: *mut u8, v: __m512i) {
    _mm512_storeu_si512(p as *mut __m512i, v)
}

/// Q8_K's 16 bsums of the super-block at `yb` added in pairs: one i16 per sub-block, as the i32
/// of sub-blocks (2q, 2q + 1) for q in 0..4, the operand the mins' `dpwssd` takes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q8k_bsum_pairs(yb: *const u8) -> [i32; 4] {
    let q8sums = load256(yb.add(super::kquants::Q8K_BSUMS));
    let pair_sums = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
    let mut bsums = [0i32; 4];
    _mm_storeu_si128(bsums.as_mut_ptr() as *mut __m128i, pair_sums);
    bsums
}

/// The float steps of one super-block i for R activation rows `y`, those of the packed kernels
/// (`q4k_accumulate` in kquants.rs): per row, lane l, f32(S) · (xd · yd) and f32(M) · (xdmin · yd)
/// onto the two FMA chains `acc` and `acc_min`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate_super_block<const R: usize>(
    acc: &mut [__m512; R],
    acc_min: &mut [__m512; R],
    sums: &[__m512i; R],
    min_sums: &[__m512i; R],
    d: __m512,
    dmin: __m512,
    y: &[*const u8; R],
    i: usize,
) {
    for r in 0..R {
        let yd = _mm512_set1_ps(super::kquants::q8k_d(y[r].add(i * super::kquants::Q8K_BYTES)));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), _mm512_mul_ps(d, yd), acc[r]);
        acc_min[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(min_sums[r]), _mm512_mul_ps(dmin, yd), acc_min[r]);
    }
}

/// The outputs of the two chains: `out[r][l]` = acc − acc_min.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn chain_outputs<const R: usize>(acc: &[__m512; R], acc_min: &[__m512; R]) -> [[f32; ROWS]; R] {
    let mut out = [[0f32; ROWS]; R];
    for r in 0..R {
        _mm512_storeu_ps(out[r].as_mut_ptr(), _mm512_sub_ps(acc[r], acc_min[r]));
    }
    out
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

/// Stores the codes of one super-block of 16 rows, interleaved, at `blk`: `quarter[l]` holds 64
/// codes (elements 64k.. of row l), so its lane c is the group 16k + c.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn store_codes_quarter(blk: *mut u8, k: usize, quarter: [__m512i; 16]) {
    for (c, col) in transpose16(quarter).into_iter().enumerate() {
        store512(blk.add((16 * k + c) * 64), col);
    }
}

/// Prefetches into L2 the super-block at `offset` of the 16 rows after the tile at `x0` (the next
/// tile, usually this thread's next task) while this tile is interleaved and multiplied: 16 rows
/// read a block at a time are 16 streams, more than the hardware prefetcher tracks (without it, 4
/// tokens against rows of 1536 from memory took twice the packed tiles' time).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn prefetch_next_tile(x0: *const u8, w_row: usize, offset: usize, block_bytes: usize) {
    for l in 0..ROWS {
        let start = x0.wrapping_add((ROWS + l) * w_row + offset) as usize;
        for line in (start & !63..start + block_bytes).step_by(64) {
            _mm_prefetch::<_MM_HINT_T1>(line as *const i8);
        }
    }
}

/// Prefill / verification mat-mul of Q4_K weights with VNNI: `out[w * rows + r]` for the whole
/// groups of 16 weight rows in `weights` (rows of `w_row` bytes, `nb` super-blocks) against the
/// `rows` Q8_K rows of `act_row` bytes in `activations`; returns how many weight rows it did.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; `weights` and `activations` hold
/// whole Q4_K / Q8_K rows of `nb` super-blocks and `out` one float per (weight row, activation
/// row).
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
        if blocks.len() < nb * q4_k::BLOCK {
            blocks.resize(nb * q4_k::BLOCK, 0);
        }
        let pass = Pass {
            nb,
            activations,
            act_row,
            rows: activations.len() / act_row,
            blocks: &mut blocks[..nb * q4_k::BLOCK],
        };
        pass.run(weights, w_row, out)
    })
}

/// The activation rows and interleaving buffer of a [`q4_k_prefill_pass`].
struct Pass<'a> {
    nb: usize,
    activations: &'a [u8],
    act_row: usize,
    rows: usize,
    blocks: &'a mut [u8],
}

impl Pass<'_> {
    /// Every whole tile of 16 weight rows against every activation row; returns the weight rows
    /// done.
    ///
    /// # Safety
    /// As [`q4_k_prefill_pass`].
    unsafe fn run(self, weights: &[u8], w_row: usize, out: &mut [f32]) -> usize {
        let n_w = weights.len() / w_row;
        let mut w_done = 0;
        while w_done + ROWS <= n_w {
            let x0 = weights.as_ptr().add(w_done * w_row);
            q4_k::interleave_rows(self.nb, x0, w_row, self.blocks.as_mut_ptr());
            let mut r = 0;
            while r < self.rows {
                r += match self.rows - r {
                    1 => self.tile_into::<1>(r, w_done, out),
                    2 => self.tile_into::<2>(r, w_done, out),
                    3 => self.tile_into::<3>(r, w_done, out),
                    _ => self.tile_into::<ACT_ROWS>(r, w_done, out),
                };
            }
            w_done += ROWS;
        }
        w_done
    }

    /// One tile kernel call for activation rows `r..r + R` against the interleaved weight rows
    /// `w_done..w_done + 16`, written into `out` ([weight row, activation row]); returns R.
    ///
    /// # Safety
    /// As [`q4_k_prefill_pass`]; rows `r..r + R` exist and the buffer holds the interleaved rows.
    #[inline(always)]
    unsafe fn tile_into<const R: usize>(&self, r: usize, w_done: usize, out: &mut [f32]) -> usize {
        let y: [*const u8; R] = std::array::from_fn(|i| self.activations.as_ptr().add((r + i) * self.act_row));
        let dots = q4_k::tile::<R>(self.nb, self.blocks.as_ptr(), y);
        for (i, row) in dots.iter().enumerate() {
            for (l, &d) in row.iter().enumerate() {
                out[(w_done + l) * self.rows + r + i] = d;
            }
        }
        R
    }
}
