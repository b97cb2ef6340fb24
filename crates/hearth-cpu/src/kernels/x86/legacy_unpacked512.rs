//! Prefill Q5_0 / Q8_0 × Q8_0 with AVX-512 VNNI on weights unpacked once per tile of W rows.
//!
//! `legacy_tile_512` unpacks each weight block (Q5_0: nibbles + the 5th bit; Q8_0: the sign flip;
//! both: the f16 scale) once per R activation rows, so a prefill of T tokens unpacks every weight
//! row T / R times. Here the W rows of a tile are unpacked once into a small buffer (W × K bytes
//! of codes plus W × K / 32 scales: 14 KiB for 16 rows of 896) that then serves every token of
//! the chunk: per block and weight row the kernel does one 256-bit load; the scale products
//! dx * dy go 8 weight rows per multiply and are broadcast from memory into the FMAs. The codes,
//! integer lanes and float operations are those of `legacy_tile_512` (the same unsigned codes,
//! the same `dpbusd` lanes, the same f16 → f32 scales and `dx * dy` products, the same FMA order),
//! so every output equals the one-row kernel bit for bit.

use super::*;

const Q8_0_BYTES: usize = 34;

/// W weight rows of `nb` blocks, unpacked: `codes[w * nb * 32 + 32 * ib ..][..32]` the unsigned
/// codes of block ib of row w (Q5_0: value + 16; Q8_0: value + 128) and `scales[ib * W + w]` its
/// scale as f32.
pub(in crate::kernels) struct UnpackedRows<'a> {
    pub codes: &'a mut [u8],
    pub scales: &'a mut [f32],
}

/// Unpacks W rows of Q5_0 (`Q8 = false`) or Q8_0 (`Q8 = true`) weights into `dst`.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL must be available; every `x` is a whole row of `nb` blocks;
/// `dst.codes` holds at least W × nb × 32 bytes and `dst.scales` W × nb floats.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(in crate::kernels) unsafe fn unpack_legacy_rows<const Q8: bool, const W: usize>(
    nb: usize,
    x: [*const u8; W],
    dst: &mut UnpackedRows<'_>,
) {
    debug_assert!(dst.codes.len() >= W * nb * 32 && dst.scales.len() >= W * nb);
    let block_bytes = if Q8 { Q8_0_BYTES } else { 22 };
    let codes = dst.codes.as_mut_ptr();
    let scales = dst.scales.as_mut_ptr();
    for (w, &row) in x.iter().enumerate() {
        for ib in 0..nb {
            let xb = row.add(ib * block_bytes);
            *scales.add(ib * W + w) = f16_at(xb);
            // The codes of legacy_tile_512's 256-bit odd-block path (the same bytes as its
            // 512-bit path's halves).
            let code = if Q8 {
                _mm256_xor_si256(load256(xb.add(2)), _mm256_set1_epi8(0x80u8 as i8))
            } else {
                let qh = (xb.add(2) as *const u32).read_unaligned();
                _mm256_or_si256(bytes_from_nibbles_32(xb.add(6)), _mm256_maskz_mov_epi8(qh, _mm256_set1_epi8(0x10)))
            };
            _mm256_storeu_si256(codes.add((w * nb + ib) * 32) as *mut __m256i, code);
        }
    }
}

/// W unpacked weight rows (`codes`, `scales` as [`UnpackedRows`], `nb` blocks each) × R Q8_0
/// activation rows; `offset` is the code offset (16 for Q5_0, 128 as `0x80u8 as i8` for Q8_0).
/// `out[w][r]` equals `legacy_tile_512` of the packed rows bit for bit.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; `codes`/`scales` hold W rows of `nb`
/// unpacked blocks; every `y` is a whole Q8_0 row of `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(in crate::kernels) unsafe fn unpacked_tile_512<const W: usize, const R: usize>(
    nb: usize,
    codes: *const u8,
    scales: *const f32,
    offset: i8,
    y: [*const u8; R],
) -> [[f32; R]; W] {
    const { assert!(W.is_multiple_of(8), "the scale products go 8 weight rows per multiply") };
    let off = _mm256_set1_epi8(offset);
    let mut acc = [[_mm256_setzero_ps(); R]; W];
    let mut ib = 0;
    while ib + 2 <= nb {
        // Two blocks per step, in 256-bit halves: on Zen 4 a 512-bit op costs two 256-bit ones,
        // and the halves need no extracts (measured 61.8 -> 64.5+ G MAC/s with 512-bit dpbusd).
        let mut dy = [[_mm256_setzero_ps(); 2]; R];
        let mut yq = [[_mm256_setzero_si256(); 2]; R];
        let mut yoff = [[_mm256_setzero_si256(); 2]; R];
        for r in 0..R {
            for h in 0..2 {
                let yb = y[r].add((ib + h) * Q8_0_BYTES);
                dy[r][h] = _mm256_set1_ps(f16_at(yb));
                yq[r][h] = load256(yb.add(2));
                yoff[r][h] = _mm256_sub_epi32(
                    _mm256_setzero_si256(),
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), off, yq[r][h]),
                );
            }
        }
        // dx * dy for every (block, r, w), 8 weight rows per multiply (the same IEEE products as
        // one multiply per (w, r), which kept the two FMA pipes busy with scale products), each
        // then broadcast from memory (a load, no vector-pipe work).
        let mut prod = [[[0f32; W]; R]; 2];
        for (h, prod_h) in prod.iter_mut().enumerate() {
            for (r, prod_hr) in prod_h.iter_mut().enumerate() {
                for w8 in (0..W).step_by(8) {
                    let dx = _mm256_loadu_ps(scales.add((ib + h) * W + w8));
                    _mm256_storeu_ps(prod_hr.as_mut_ptr().add(w8), _mm256_mul_ps(dx, dy[r][h]));
                }
            }
        }
        for (w, acc_w) in acc.iter_mut().enumerate() {
            let cp = codes.add((w * nb + ib) * 32);
            let code = [load256(cp), load256(cp.add(32))];
            for r in 0..R {
                // Block ib, then block ib + 1, as the one-block loop does.
                for h in 0..2 {
                    let q = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(yoff[r][h], code[h], yq[r][h]));
                    let d = _mm256_broadcast_ss(&prod[h][r][w]);
                    acc_w[r] = _mm256_fmadd_ps(d, q, acc_w[r]);
                }
            }
        }
        ib += 2;
    }
    if ib < nb {
        // The odd last block, with 256-bit registers.
        for (w, acc_w) in acc.iter_mut().enumerate() {
            let code = load256(codes.add((w * nb + ib) * 32));
            let dx = *scales.add(ib * W + w);
            for r in 0..R {
                let yb = y[r].add(ib * Q8_0_BYTES);
                let yv = load256(yb.add(2));
                let yoff = _mm256_sub_epi32(
                    _mm256_setzero_si256(),
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(offset), yv),
                );
                let sumi = _mm256_dpbusd_epi32(yoff, code, yv);
                acc_w[r] = _mm256_fmadd_ps(_mm256_set1_ps(dx * f16_at(yb)), _mm256_cvtepi32_ps(sumi), acc_w[r]);
            }
        }
    }
    let mut out = [[0f32; R]; W];
    for w in 0..W {
        for r in 0..R {
            out[w][r] = hsum_float_8(acc[w][r]);
        }
    }
    out
}

/// Weight rows per unpacked tile, and activation rows per kernel call on it. The activation side
/// (scales, bytes, offset sums) is rebuilt per kernel call and block pair, so wide tiles of weight
/// rows pay: 16 x 64 tile, K = 896, one thread (examples/tile_min_time.rs), Q5_0 G MAC/s for
/// W x R = 4x3 48.9, 4x4 49.6, 2x8 41.8, 8x1 52.1, 8x2 51.5, 8x3 52.7, 16x1 58.1, 16x2 61.8,
/// 16x3 61.1, 16x4 57.9 with 512-bit dpbusd (16 x 2: 32 accumulators; the packed 4 x 4 tile
/// measured 39.1); with the 256-bit halves 16x1 65.0 (Q8_0 57.1), 16x2 64.5, 16x3 63.6, 8x4 63.5;
/// with the scale products 8 rows per multiply 16x1 59.5, 16x2 72.0, 16x3 77.1, 16x4 78.5,
/// 16x6 76.4, 16x8 76.1, 8x4 73.1, 8x8 75.7.
/// 16 is matmul.rs's CHUNK of weight rows per task: a smaller last chunk goes the packed way
/// (`tile_pass` in kernels/mod.rs).
pub(in crate::kernels) const UNPACKED_WEIGHT_ROWS: usize = 16;
pub(in crate::kernels) const UNPACKED_ACT_ROWS: usize = 4;

/// Prefill Q5_0 / Q8_0 (`ty`) mat-mul with VNNI: `out[w * rows + r]` for the whole groups of
/// [`UNPACKED_WEIGHT_ROWS`] weight rows in `weights` (rows of `w_row` bytes, `nb` blocks) against
/// the `rows` Q8_0 rows of `act_row` bytes in `activations`; returns how many weight rows it did.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; `ty` is Q5_0 or Q8_0; `weights` and
/// `activations` hold whole rows of `nb` blocks and `out` one float per (weight row, activation row).
#[allow(clippy::too_many_arguments)]
pub(in crate::kernels) unsafe fn legacy_prefill_pass(
    ty: GgmlType,
    nb: usize,
    weights: &[u8],
    w_row: usize,
    activations: &[u8],
    act_row: usize,
    out: &mut [f32],
) -> usize {
    const W: usize = UNPACKED_WEIGHT_ROWS;
    const R: usize = UNPACKED_ACT_ROWS;
    let q8 = ty == GgmlType::Q8_0;
    let offset = if q8 { 0x80u8 as i8 } else { 16 };
    let (n_w, rows) = (weights.len() / w_row, activations.len() / act_row);
    let (wbase, abase) = (weights.as_ptr(), activations.as_ptr());
    // [W, nb, 32] codes and [W, nb] scales: one tile of weight rows, reused for every token.
    let mut codes = vec![0u8; W * nb * 32];
    let mut scales = vec![0f32; W * nb];
    let mut w_done = 0;
    while w_done + W <= n_w {
        let wp: [*const u8; W] = std::array::from_fn(|i| wbase.add((w_done + i) * w_row));
        let mut dst = UnpackedRows { codes: &mut codes, scales: &mut scales };
        if q8 {
            unpack_legacy_rows::<true, W>(nb, wp, &mut dst);
        } else {
            unpack_legacy_rows::<false, W>(nb, wp, &mut dst);
        }
        let (cp, sp) = (codes.as_ptr(), scales.as_ptr());
        let mut r = 0;
        while r < rows {
            // Tiles of R tokens, then the last 1-3 in one call.
            let done = match (rows - r).min(R) {
                R => tile_into::<W, R>(nb, cp, sp, offset, abase, act_row, r, rows, w_done, out),
                3 => tile_into::<W, 3>(nb, cp, sp, offset, abase, act_row, r, rows, w_done, out),
                2 => tile_into::<W, 2>(nb, cp, sp, offset, abase, act_row, r, rows, w_done, out),
                _ => tile_into::<W, 1>(nb, cp, sp, offset, abase, act_row, r, rows, w_done, out),
            };
            r += done;
        }
        w_done += W;
    }
    w_done
}

/// One [`unpacked_tile_512`] call for activation rows `r..r + R` (of `rows`, `act_row` bytes each
/// at `abase`) against the unpacked weight rows `w_done..w_done + W`, written into `out`
/// ([weight row, activation row]); returns R.
///
/// # Safety
/// As [`unpacked_tile_512`]; rows `r..r + R` exist and `out` holds `(w_done + W) * rows` floats.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile_into<const W: usize, const R: usize>(
    nb: usize,
    codes: *const u8,
    scales: *const f32,
    offset: i8,
    abase: *const u8,
    act_row: usize,
    r: usize,
    rows: usize,
    w_done: usize,
    out: &mut [f32],
) -> usize {
    let ap: [*const u8; R] = std::array::from_fn(|i| abase.add((r + i) * act_row));
    let dots = unpacked_tile_512::<W, R>(nb, codes, scales, offset, ap);
    for (i, d) in dots.iter().enumerate() {
        out[(w_done + i) * rows + r..][..R].copy_from_slice(d);
    }
    R
}
