//! Prefill Q5_0 / Q8_0 × Q8_0 with AVX2 on weights unpacked once per tile of W rows: the AVX2
//! counterpart of `legacy_unpacked512.rs`. The AVX2 tile (`legacy_tile` in multi.rs) unpacks each
//! Q5_0 block once per 4 tokens; here each task's weight rows are unpacked once for all its
//! tokens. Codes, integer lanes and float operations are those of `legacy_tile` (Q5_0: unsigned
//! codes + 16, `maddubs` + `madd`, minus 16 × Σy; Q8_0: ggml's sign trick on the raw codes; the
//! same f16 → f32 scales, `dx * dy` products and FMA order), so every output equals the one-row
//! AVX2 kernel bit for bit.

use super::legacy_unpacked512::UnpackedRows;
use super::*;

const Q8_0_BYTES: usize = 34;

/// Unpacks W rows of Q5_0 (`Q8 = false`: codes + 16) or Q8_0 (`Q8 = true`: the raw signed codes)
/// weights into `dst` (`codes[w * nb * 32 + 32 * ib ..][..32]`, `scales[ib * W + w]`).
///
/// # Safety
/// AVX2/FMA/F16C must be available; every `x` is a whole row of `nb` blocks; `dst.codes` holds at
/// least W × nb × 32 bytes and `dst.scales` W × nb floats.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_rows<const Q8: bool, const W: usize>(nb: usize, x: [*const u8; W], dst: &mut UnpackedRows<'_>) {
    debug_assert!(dst.codes.len() >= W * nb * 32 && dst.scales.len() >= W * nb);
    let block_bytes = if Q8 { Q8_0_BYTES } else { 22 };
    let codes = dst.codes.as_mut_ptr();
    let scales = dst.scales.as_mut_ptr();
    for (w, &row) in x.iter().enumerate() {
        for ib in 0..nb {
            let xb = row.add(ib * block_bytes);
            *scales.add(ib * W + w) = f16_at(xb);
            let code = if Q8 {
                load256(xb.add(2))
            } else {
                let bit4 = _mm256_and_si256(bytes_from_bits_32(xb.add(2)), _mm256_set1_epi8(0x10));
                _mm256_or_si256(bytes_from_nibbles_32(xb.add(6)), bit4)
            };
            _mm256_storeu_si256(codes.add((w * nb + ib) * 32) as *mut __m256i, code);
        }
    }
}

/// W unpacked weight rows × R Q8_0 activation rows; `out[w][r]` equals the AVX2 `legacy_tile`
/// of the packed rows bit for bit.
///
/// # Safety
/// AVX2/FMA/F16C must be available; `codes`/`scales` hold W rows of `nb` blocks unpacked by
/// [`unpack_rows`] with the same `Q8`; every `y` is a whole Q8_0 row of `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpacked_tile<const Q8: bool, const W: usize, const R: usize>(
    nb: usize,
    codes: *const u8,
    scales: *const f32,
    y: [*const u8; R],
) -> [[f32; R]; W] {
    const { assert!(W.is_multiple_of(8), "the scale products go 8 weight rows per multiply") };
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); R]; W];
    for ib in 0..nb {
        let mut dy = [_mm256_setzero_ps(); R];
        let mut yq = [_mm256_setzero_si256(); R];
        let mut yoff = [_mm256_setzero_si256(); R];
        for r in 0..R {
            let yb = y[r].add(ib * Q8_0_BYTES);
            dy[r] = _mm256_set1_ps(f16_at(yb));
            yq[r] = load256(yb.add(2));
            if !Q8 {
                let off = _mm256_madd_epi16(ones, _mm256_maddubs_epi16(_mm256_set1_epi8(16), yq[r]));
                yoff[r] = _mm256_sub_epi32(_mm256_setzero_si256(), off);
            }
        }
        // dx * dy for every (r, w), 8 weight rows per multiply, broadcast from memory below.
        let mut prod = [[0f32; W]; R];
        for (r, prod_r) in prod.iter_mut().enumerate() {
            for w8 in (0..W).step_by(8) {
                let dx = _mm256_loadu_ps(scales.add(ib * W + w8));
                _mm256_storeu_ps(prod_r.as_mut_ptr().add(w8), _mm256_mul_ps(dx, dy[r]));
            }
        }
        for (w, acc_w) in acc.iter_mut().enumerate() {
            let code = load256(codes.add((w * nb + ib) * 32));
            let abs = _mm256_sign_epi8(code, code);
            for r in 0..R {
                let sumi = if Q8 {
                    _mm256_madd_epi16(ones, _mm256_maddubs_epi16(abs, _mm256_sign_epi8(yq[r], code)))
                } else {
                    _mm256_add_epi32(yoff[r], _mm256_madd_epi16(ones, _mm256_maddubs_epi16(code, yq[r])))
                };
                let d = _mm256_broadcast_ss(&prod[r][w]);
                acc_w[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc_w[r]);
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

/// Weight rows per unpacked tile and tokens per kernel call (16 vector registers). 16 x 64 tile,
/// K = 896, one thread, Zen 4 running the AVX2 code (examples/tile_min_time.rs), Q5_0 / Q8_0
/// G MAC/s: 8x1 45.2 / 37.0, 8x2 42.7 / 38.7, 8x3 33.1 / 32.9, 16x1 43.8 / 37.1 (the packed
/// 2 x 4 tile: 26.7 / 36.1).
const WEIGHT_ROWS: usize = 8;
const ACT_ROWS: usize = 1;

/// [`super::legacy_prefill_pass`] for AVX2: the whole groups of [`WEIGHT_ROWS`] weight rows;
/// returns how many weight rows it did.
///
/// # Safety
/// AVX2/FMA/F16C must be available; `ty` is Q5_0 or Q8_0; `weights` and `activations` hold whole
/// rows of `nb` blocks and `out` one float per (weight row, activation row).
#[allow(clippy::too_many_arguments)]
pub(in crate::kernels) unsafe fn legacy_prefill_pass_avx2(
    ty: GgmlType,
    nb: usize,
    weights: &[u8],
    w_row: usize,
    activations: &[u8],
    act_row: usize,
    out: &mut [f32],
) -> usize {
    const W: usize = WEIGHT_ROWS;
    const R: usize = ACT_ROWS;
    let q8 = ty == GgmlType::Q8_0;
    let (n_w, rows) = (weights.len() / w_row, activations.len() / act_row);
    let (wbase, abase) = (weights.as_ptr(), activations.as_ptr());
    let mut codes = vec![0u8; W * nb * 32];
    let mut scales = vec![0f32; W * nb];
    let mut w_done = 0;
    while w_done + W <= n_w {
        let wp: [*const u8; W] = std::array::from_fn(|i| wbase.add((w_done + i) * w_row));
        let mut dst = UnpackedRows { codes: &mut codes, scales: &mut scales };
        if q8 {
            unpack_rows::<true, W>(nb, wp, &mut dst);
        } else {
            unpack_rows::<false, W>(nb, wp, &mut dst);
        }
        let (cp, sp) = (codes.as_ptr(), scales.as_ptr());
        let mut r = 0;
        while r + R <= rows {
            let ap: [*const u8; R] = std::array::from_fn(|i| abase.add((r + i) * act_row));
            let dots = if q8 {
                unpacked_tile::<true, W, R>(nb, cp, sp, ap)
            } else {
                unpacked_tile::<false, W, R>(nb, cp, sp, ap)
            };
            for (i, d) in dots.iter().enumerate() {
                out[(w_done + i) * rows + r..][..R].copy_from_slice(d);
            }
            r += R;
        }
        while r < rows {
            let ap = [abase.add(r * act_row)];
            let dots = if q8 {
                unpacked_tile::<true, W, 1>(nb, cp, sp, ap)
            } else {
                unpacked_tile::<false, W, 1>(nb, cp, sp, ap)
            };
            for (i, d) in dots.iter().enumerate() {
                out[(w_done + i) * rows + r] = d[0];
            }
            r += 1;
        }
        w_done += W;
    }
    w_done
}
