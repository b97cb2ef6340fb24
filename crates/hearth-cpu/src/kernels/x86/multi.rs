//! Q5_0, Q8_0 (× Q8_0), Q4_K and Q6_K (× Q8_K): one weight row against R activation rows at once.
//! Each weight block is unpacked once and dotted with all R rows, so a prefill mat-mul does the
//! bit twiddling once per R tokens instead of once per token. For every activation row the
//! operations, integer lanes and float accumulation order are those of ggml's AVX2 kernels
//! (quants.c) — for Q4_K, those of its repacked kernels (repack.cpp, which llama.cpp runs for
//! Q4_K on any AVX2 CPU): exact integer sums per super-block, then two FMA chains
//! (`q4k_accumulate`) — so R = 1 is the plain dot product and any R gives the same bits per row.
//!
//! The kernels are generated twice: for AVX2 and for AVX-512 VNNI (+VL). The VNNI flavour replaces
//! `madd(1, maddubs(a, b))` by `dpbusd(0, a, b)` and `acc + madd(s, p)` by `dpwssd(acc, s, p)` —
//! exactly the same i32 lanes (the i16 pair sums never saturate: |u8 code| ≤ 63, |i8| ≤ 127) — and
//! lets the compiler use 32 vector registers; results are bit-identical to the AVX2 flavour.

use super::kquants::{
    mins_and_scales, mins_dot_bsums, q4k_accumulate, q4k_results, q4k_sums, q4k_sums2, q6_k_codes, q6_scale, q8k_d,
    sum4x4, sum4x8, Q8K_BSUMS, Q8K_BYTES, Q8K_QS, SCALE_SHUFFLE_K4,
};
use super::kquants512::{q4_k_q8_k_512, q6_k_q8_k_512};
use super::ktile::{q4_k_tile_avx2, q6_k_tile_avx2};
use super::ktile512::{q4_k_tile_512, q6_k_tile_512};
use super::legacy512::legacy_tile_512;
use super::*;

const Q8_0_BYTES: usize = 34;
/// How many tiles of W rows ahead the one-row Q4_K decode tile prefetches: one tile measured
/// 3-8% faster than two on Qwen2.5-1.5B's ffn_gate/up (1536 x 8960, one thread, from memory).
const DECODE_TILE_AHEAD: usize = 1;

macro_rules! multi_kernels {
    ($module:ident, $features:literal, $vnni:literal) => {
        pub(super) mod $module {
            use super::*;

            /// Per i32 lane: the sum of 4 products of unsigned bytes `a` and signed bytes `b`.
            #[allow(dead_code)] // the VNNI flavour runs legacy512.rs for Q5_0/Q8_0 instead
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn dot_us8(a: __m256i, b: __m256i) -> __m256i {
                if $vnni {
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
                } else {
                    _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(a, b))
                }
            }

            /// acc + madd(scales, p16).
            #[allow(dead_code)] // the VNNI flavour runs kquants512.rs for Q4_K/Q6_K instead
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn add_scaled(acc: __m256i, scales: __m256i, p16: __m256i) -> __m256i {
                if $vnni {
                    _mm256_dpwssd_epi32(acc, scales, p16)
                } else {
                    _mm256_add_epi32(acc, _mm256_madd_epi16(scales, p16))
                }
            }

            /// c + Σ of 4 products of unsigned bytes `a` and signed bytes `b`, per i32 lane.
            #[allow(dead_code)] // the VNNI flavour runs legacy512.rs for Q5_0/Q8_0 instead
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn dot_us8_acc(c: __m256i, a: __m256i, b: __m256i) -> __m256i {
                if $vnni {
                    _mm256_dpbusd_epi32(c, a, b)
                } else {
                    _mm256_add_epi32(c, dot_us8(a, b))
                }
            }

            /// Q5_0 (`Q8 = false`) or Q8_0 (`Q8 = true`) weights, W rows × R Q8_0 activation rows.
            /// Per block, the activation side (scale, bytes, Σ of code offset × y) is loaded once for
            /// the W weight rows and the weight side unpacked once for the R activation rows. Weight
            /// codes are taken as unsigned (Q5_0: code = value + 16; Q8_0 with VNNI: value + 128)
            /// and the offset × Σy per group of 4 is subtracted up front: the same i32 lanes as
            /// ggml's sign trick, and then the same float operations.
            #[allow(dead_code)] // the VNNI flavour runs legacy512.rs for Q5_0/Q8_0 instead
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn legacy_tile<const Q8: bool, const W: usize, const R: usize>(
                nb: usize,
                x: [*const u8; W],
                y: [*const u8; R],
            ) -> [[f32; R]; W] {
                // The AVX2 Q8_0 form keeps the sign trick: maddubs would saturate on codes + 128.
                let signed = Q8 && !$vnni;
                let (block_bytes, offset) = if Q8 { (Q8_0_BYTES, 0x80u8 as i8) } else { (22, 16) };
                let mut acc = [[_mm256_setzero_ps(); R]; W];
                for ib in 0..nb {
                    if R == 1 {
                        // Decode: the next tile of W rows, in address order (`prefetch_span`).
                        prefetch_span(x[0].wrapping_add(W * nb * block_bytes + ib * W * block_bytes), W * block_bytes);
                    }
                    let mut dy = [_mm256_setzero_ps(); R];
                    let mut yq = [_mm256_setzero_si256(); R];
                    let mut yoff = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        let yb = y[r].add(ib * Q8_0_BYTES);
                        dy[r] = _mm256_set1_ps(f16_at(yb));
                        yq[r] = load256(yb.add(2));
                        if !signed {
                            yoff[r] =
                                _mm256_sub_epi32(_mm256_setzero_si256(), dot_us8(_mm256_set1_epi8(offset), yq[r]));
                        }
                    }
                    for w in 0..W {
                        let xb = x[w].add(ib * block_bytes);
                        let dx = _mm256_set1_ps(f16_at(xb));
                        let code = if Q8 {
                            let q = load256(xb.add(2));
                            if signed {
                                q
                            } else {
                                _mm256_xor_si256(q, _mm256_set1_epi8(0x80u8 as i8))
                            }
                        } else {
                            let bit4 = _mm256_and_si256(bytes_from_bits_32(xb.add(2)), _mm256_set1_epi8(0x10));
                            _mm256_or_si256(bytes_from_nibbles_32(xb.add(6)), bit4)
                        };
                        let abs = _mm256_sign_epi8(code, code);
                        for r in 0..R {
                            let sumi = if signed {
                                dot_us8(abs, _mm256_sign_epi8(yq[r], code))
                            } else {
                                dot_us8_acc(yoff[r], code, yq[r])
                            };
                            // d = d_x * d_y rounded to f32, as ggml's scalar product.
                            let d = _mm256_mul_ps(dx, dy[r]);
                            acc[w][r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[w][r]);
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

            #[allow(dead_code)] // the VNNI flavour runs legacy512.rs for Q5_0/Q8_0 instead
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn q5_0_tile<const W: usize, const R: usize>(
                nb: usize,
                x: [*const u8; W],
                y: [*const u8; R],
            ) -> [[f32; R]; W] {
                legacy_tile::<false, W, R>(nb, x, y)
            }

            #[allow(dead_code)] // the VNNI flavour runs legacy512.rs for Q5_0/Q8_0 instead
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn q8_0_tile<const W: usize, const R: usize>(
                nb: usize,
                x: [*const u8; W],
                y: [*const u8; R],
            ) -> [[f32; R]; W] {
                legacy_tile::<true, W, R>(nb, x, y)
            }

            /// Q4_K × R Q8_K rows; per row the exact super-block sums and FMA chains of
            /// `q4k_accumulate` (kquants.rs).
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn q4_k_q8_k<const R: usize>(nb: usize, x: *const u8, y: [*const u8; R]) -> [f32; R] {
                let m4 = _mm256_set1_epi8(0xF);
                let mut acc = [_mm_setzero_ps(); R];
                for i in 0..nb {
                    let xb = x.add(i * 144);
                    if R == 1 {
                        prefetch_ahead(xb, ROW_PREFETCH_BYTES, 3);
                    }
                    // [xd, xdmin, xd, xdmin]
                    let d_dmin = f16x2_at(xb);
                    let d_dmin = _mm_movelh_ps(d_dmin, d_dmin);
                    let ms = mins_and_scales(xb.add(4));
                    let sc128 = _mm256_extracti128_si256(ms, 0);
                    let scales = _mm256_set_m128i(sc128, sc128);
                    let mut sumi = [_mm256_setzero_si256(); R];
                    for j in 0..4 {
                        let scale_l = _mm256_shuffle_epi8(scales, load256(SCALE_SHUFFLE_K4[2 * j].as_ptr()));
                        let scale_h = _mm256_shuffle_epi8(scales, load256(SCALE_SHUFFLE_K4[2 * j + 1].as_ptr()));
                        let q4bits = load256(xb.add(16 + 32 * j));
                        let q4l = _mm256_and_si256(q4bits, m4);
                        let q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);
                        for r in 0..R {
                            let q8 = y[r].add(i * Q8K_BYTES + Q8K_QS + 64 * j);
                            let p16l = _mm256_maddubs_epi16(q4l, load256(q8));
                            let p16h = _mm256_maddubs_epi16(q4h, load256(q8.add(32)));
                            sumi[r] = add_scaled(add_scaled(sumi[r], scale_l, p16l), scale_h, p16h);
                        }
                    }
                    for r in 0..R {
                        let yb = y[r].add(i * Q8K_BYTES);
                        let sums = q4k_sums(sumi[r], mins_dot_bsums(ms, yb));
                        acc[r] = q4k_accumulate(acc[r], sums, _mm_mul_ps(d_dmin, _mm_set1_ps(q8k_d(yb))));
                    }
                }
                let mut out = [0f32; R];
                for r in 0..R {
                    out[r] = q4k_results(acc[r])[0];
                }
                out
            }

            #[allow(dead_code)] // the VNNI flavour runs kquants512.rs for Q4_K/Q6_K instead
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn q6_k_q8_k<const R: usize>(nb: usize, x: *const u8, y: [*const u8; R]) -> [f32; R] {
                let mut acc = [_mm256_setzero_ps(); R];
                for i in 0..nb {
                    let xb = x.add(i * 210);
                    if R == 1 {
                        prefetch_ahead_l2(xb, Q6K_ROW_PREFETCH_BYTES, 4);
                    }
                    let xd = f16_at(xb.add(208));
                    let scales = _mm_loadu_si128(xb.add(192) as *const __m128i);
                    let scales16 = _mm256_cvtepi8_epi16(scales);
                    let mut sumi = [_mm256_setzero_si256(); R];
                    for j in 0..2 {
                        let [q4_0, q4_1, q4_2, q4_3] = q6_k_codes(xb, j);
                        let is = 4 * j;
                        let (s0, s1) = (q6_scale(scales, is), q6_scale(scales, is + 1));
                        let (s2, s3) = (q6_scale(scales, is + 2), q6_scale(scales, is + 3));
                        for r in 0..R {
                            let q8 = y[r].add(i * Q8K_BYTES + Q8K_QS + 128 * j);
                            let mut s = sumi[r];
                            s = add_scaled(s, s0, _mm256_maddubs_epi16(q4_0, load256(q8)));
                            s = add_scaled(s, s1, _mm256_maddubs_epi16(q4_1, load256(q8.add(32))));
                            s = add_scaled(s, s2, _mm256_maddubs_epi16(q4_2, load256(q8.add(64))));
                            s = add_scaled(s, s3, _mm256_maddubs_epi16(q4_3, load256(q8.add(96))));
                            sumi[r] = s;
                        }
                    }
                    for r in 0..R {
                        let yb = y[r].add(i * Q8K_BYTES);
                        // Codes are stored +32; subtract 32 * Σ scale * bsum once instead of per element.
                        let q8sums = load256(yb.add(Q8K_BSUMS));
                        let q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales16), 5);
                        let s = _mm256_sub_epi32(sumi[r], q8sclsub);
                        let d = q8k_d(yb) * xd;
                        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc[r]);
                    }
                }
                // A loop, not a `map` closure, so that `hsum_float_8` inlines (see ktile512.rs).
                let mut out = [0f32; R];
                for r in 0..R {
                    out[r] = hsum_float_8(acc[r]);
                }
                out
            }

            /// Prefetches, for row `w` of a tile of W rows at `x0` and super-block `i`, the
            /// `block_bytes` of the rows that follow this tile (DECODE_TILE_AHEAD tiles ahead)
            /// at the same position: the tiles are swept in address order, a few lines per row
            /// and block, at the rate the tile is read. The rows are read interleaved, a pattern
            /// the hardware prefetcher follows poorly; and a burst of prefetches per block
            /// measured slower than spreading them.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn sweep_prefetch<const W: usize>(x0: *const u8, w: usize, i: usize, nb: usize, block_bytes: usize) {
                let span = W * block_bytes;
                prefetch_ahead(
                    x0.wrapping_add(i * span + w * block_bytes),
                    DECODE_TILE_AHEAD * nb * span,
                    block_bytes.div_ceil(64),
                );
            }

            /// Q4_K: W weight rows × one Q8_K activation row (decode). The activation side is
            /// loaded once for the W rows, and the W rows' integer chains interleave, so the
            /// latency of each row's `sumi` chain is hidden behind the others. Rows go in pairs
            /// through `q4k_sums2` / `q4k_accumulate` (one reduction and one FMA per pair and
            /// super-block), the exact sums and FMA chains of `q4_k_q8_k::<1>`: every output
            /// equals the single-row dot product bit for bit.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn q4_k_tile<const W: usize>(nb: usize, x: [*const u8; W], y: *const u8) -> [f32; W] {
                let m4 = _mm256_set1_epi8(0xF);
                // acc[p]: rows 2p and 2p + 1 (an odd last row twice), as `q4k_accumulate`; or,
                // when W is a multiple of 4, acc[2q] / acc[2q + 1]: the S / M chains of rows
                // 4q..4q + 4, one lane each (the same FMAs per row, fewer reductions).
                let mut acc = [_mm_setzero_ps(); W];
                let pairs = W.div_ceil(2);
                let quads = if W % 4 == 0 { W / 4 } else { 0 };
                for i in 0..nb {
                    let yb = y.add(i * Q8K_BYTES);
                    let yd = _mm_set1_ps(q8k_d(yb));
                    // Q8_K's 16 bsums summed in pairs (one per 32-element sub-block), as `mins_dot_bsums`.
                    let q8sums = load256(yb.add(Q8K_BSUMS));
                    let q8s = _mm_hadd_epi16(_mm256_extracti128_si256(q8sums, 0), _mm256_extracti128_si256(q8sums, 1));
                    let mut scales = [_mm256_setzero_si256(); W];
                    let mut mins = [_mm_setzero_si128(); W];
                    let mut d_dmin = [_mm_setzero_ps(); W];
                    for w in 0..W {
                        let xb = x[w].add(i * 144);
                        sweep_prefetch::<W>(x[0], w, i, nb, 144);
                        d_dmin[w] = f16x2_at(xb);
                        let ms = mins_and_scales(xb.add(4));
                        mins[w] = _mm_madd_epi16(_mm256_extracti128_si256(ms, 1), q8s);
                        let sc128 = _mm256_extracti128_si256(ms, 0);
                        scales[w] = _mm256_set_m128i(sc128, sc128);
                    }
                    let mut sumi = [_mm256_setzero_si256(); W];
                    for j in 0..4 {
                        let q8l = load256(yb.add(Q8K_QS + 64 * j));
                        let q8h = load256(yb.add(Q8K_QS + 64 * j + 32));
                        let shuf_l = load256(opaque(SCALE_SHUFFLE_K4[2 * j].as_ptr()));
                        let shuf_h = load256(opaque(SCALE_SHUFFLE_K4[2 * j + 1].as_ptr()));
                        for w in 0..W {
                            let q4bits = load256(x[w].add(i * 144 + 16 + 32 * j));
                            let q4l = _mm256_and_si256(q4bits, m4);
                            let q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);
                            let p16l = _mm256_maddubs_epi16(q4l, q8l);
                            let p16h = _mm256_maddubs_epi16(q4h, q8h);
                            let scale_l = _mm256_shuffle_epi8(scales[w], shuf_l);
                            let scale_h = _mm256_shuffle_epi8(scales[w], shuf_h);
                            sumi[w] = add_scaled(add_scaled(sumi[w], scale_l, p16l), scale_h, p16h);
                        }
                    }
                    for q in 0..quads {
                        let g = 4 * q;
                        let s = sum4x8(sumi[g], sumi[g + 1], sumi[g + 2], sumi[g + 3]);
                        let m = sum4x4(mins[g], mins[g + 1], mins[g + 2], mins[g + 3]);
                        // [xd, xd, xdmin, xdmin] of rows g, g + 1 and of g + 2, g + 3.
                        let (lo, hi) =
                            (_mm_unpacklo_ps(d_dmin[g], d_dmin[g + 1]), _mm_unpacklo_ps(d_dmin[g + 2], d_dmin[g + 3]));
                        let (xd, xdmin) = (_mm_movelh_ps(lo, hi), _mm_movehl_ps(hi, lo));
                        acc[2 * q] = _mm_fmadd_ps(_mm_cvtepi32_ps(s), _mm_mul_ps(xd, yd), acc[2 * q]);
                        acc[2 * q + 1] = _mm_fmadd_ps(_mm_cvtepi32_ps(m), _mm_mul_ps(xdmin, yd), acc[2 * q + 1]);
                    }
                    for p in 0..if quads > 0 { 0 } else { pairs } {
                        let (a, b) = (2 * p, (2 * p + 1).min(W - 1));
                        let sums = q4k_sums2(sumi[a], mins[a], sumi[b], mins[b]);
                        acc[p] = q4k_accumulate(acc[p], sums, _mm_mul_ps(_mm_movelh_ps(d_dmin[a], d_dmin[b]), yd));
                    }
                }
                let mut out = [0f32; W];
                for q in 0..quads {
                    let mut rows = [0f32; 4];
                    _mm_storeu_ps(rows.as_mut_ptr(), _mm_sub_ps(acc[2 * q], acc[2 * q + 1]));
                    out[4 * q..4 * q + 4].copy_from_slice(&rows);
                }
                for p in 0..if quads > 0 { 0 } else { pairs } {
                    let [a, b] = q4k_results(acc[p]);
                    out[2 * p] = a;
                    if 2 * p + 1 < W {
                        out[2 * p + 1] = b;
                    }
                }
                out
            }
        }
    };
}

multi_kernels!(avx2, "avx2,fma,f16c", false);
multi_kernels!(vnni, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", true);

/// Weight types with multi-row kernels.
pub(in crate::kernels) fn supports_multi(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q6_K)
}

/// # Safety
/// The features of the chosen flavour must be available (`vnni`: AVX-512 F/BW/VL/VNNI as well as
/// AVX2/FMA/F16C); `w` and every `y` must point to whole rows of `n` elements of `ty` and
/// `ty.vec_dot_type()`; `supports_multi(ty)` must hold.
#[inline]
pub(in crate::kernels) unsafe fn vec_dot_multi<const R: usize>(
    vnni: bool,
    ty: GgmlType,
    n: usize,
    w: *const u8,
    y: [*const u8; R],
) -> [f32; R] {
    let nb = n / ty.block_len();
    match (vnni, ty) {
        (false, GgmlType::Q5_0) => avx2::q5_0_tile::<1, R>(nb, [w], y)[0],
        (false, GgmlType::Q8_0) => avx2::q8_0_tile::<1, R>(nb, [w], y)[0],
        (false, GgmlType::Q4_K) => avx2::q4_k_q8_k(nb, w, y),
        (false, GgmlType::Q6_K) => avx2::q6_k_q8_k(nb, w, y),
        (true, GgmlType::Q5_0) => legacy_tile_512::<false, 1, R>(nb, [w], y)[0],
        (true, GgmlType::Q8_0) => legacy_tile_512::<true, 1, R>(nb, [w], y)[0],
        // One row: the 512-bit form measured no faster on Zen 4 (double-pumped 512-bit ops).
        (true, GgmlType::Q4_K) if R == 1 => vnni::q4_k_q8_k(nb, w, y),
        (true, GgmlType::Q4_K) => q4_k_q8_k_512(nb, w, y),
        (true, GgmlType::Q6_K) => q6_k_q8_k_512(nb, w, y),
        _ => [f32::NAN; R], // unreachable: guarded by `supports_multi`
    }
}

/// Weight types whose [`vec_dot_tile`] shares work across weight rows too, for `rows` activation
/// rows of `n` elements: Q5_0 and Q8_0 always; Q4_K and Q6_K for two or more activation rows
/// (ktile.rs, ktile512.rs), and for a single activation row (decode) of short rows, where the
/// single-row kernel is latency-bound (one dependent integer chain per row). On long rows
/// (Qwen2.5's ffn_down, 4864 and 8960) the decode tiles streamed worse from memory than one row
/// after the other (Q4_K: the 4-row 256-bit and the 2-row 512-bit tile; Q6_K: the 2-row tile,
/// ~10% slower at 8960), while on Q6_K rows of 1536 the 2-row sweep-prefetched tile measured
/// ~10% faster than the single-row kernel (benches/verify_tiles.rs, from memory).
pub(in crate::kernels) fn supports_tile(ty: GgmlType, rows: usize, n: usize) -> bool {
    match ty {
        GgmlType::Q5_0 | GgmlType::Q8_0 => true,
        GgmlType::Q4_K | GgmlType::Q6_K => rows >= 2 || n <= 2048,
        _ => false,
    }
}

/// W weight rows × R activation rows; `out[w][r]` equals `vec_dot_multi` of row w bit for bit.
/// `PREFETCH`: the W × R Q4_K/Q6_K kernels (ktile.rs, ktile512.rs) prefetch the weights of the
/// tiles of W rows that follow (the one-row Q4_K decode tile always does; Q5_0/Q8_0 ignore it).
///
/// # Safety
/// As [`vec_dot_multi`], for every weight row; `supports_tile(ty, R, n)` must hold, or R = 1 with
/// Q4_K/Q6_K weights.
#[inline]
pub(in crate::kernels) unsafe fn vec_dot_tile<const W: usize, const R: usize, const PREFETCH: bool>(
    vnni: bool,
    ty: GgmlType,
    n: usize,
    w: [*const u8; W],
    y: [*const u8; R],
) -> [[f32; R]; W] {
    let nb = n / ty.block_len();
    match (vnni, ty) {
        (false, GgmlType::Q5_0) => avx2::q5_0_tile(nb, w, y),
        (false, GgmlType::Q8_0) => avx2::q8_0_tile(nb, w, y),
        (true, GgmlType::Q5_0) => legacy_tile_512::<false, W, R>(nb, w, y),
        (true, GgmlType::Q8_0) => legacy_tile_512::<true, W, R>(nb, w, y),
        (false, GgmlType::Q4_K) if R == 1 => spread(avx2::q4_k_tile(nb, w, y[0])),
        (true, GgmlType::Q4_K) if R == 1 => spread(vnni::q4_k_tile(nb, w, y[0])),
        (false, GgmlType::Q4_K) => q4_k_tile_avx2::<W, R, PREFETCH>(nb, w, y),
        (true, GgmlType::Q4_K) => q4_k_tile_512::<W, R, PREFETCH>(nb, w, y),
        (false, GgmlType::Q6_K) => q6_k_tile_avx2::<W, R, PREFETCH>(nb, w, y),
        (true, GgmlType::Q6_K) => q6_k_tile_512::<W, R, PREFETCH>(nb, w, y),
        _ => [[f32::NAN; R]; W], // unreachable: guarded by `supports_tile`
    }
}

/// One activation row's dots (`R` = 1) in the [w][r] shape of [`vec_dot_tile`].
#[inline(always)]
fn spread<const W: usize, const R: usize>(dots: [f32; W]) -> [[f32; R]; W] {
    dots.map(|d| [d; R])
}

/// One activation row `y` (decode) against the whole tiles of W weight rows at `x0` (`n_w` rows of
/// `w_row` bytes, `n` elements each): writes `out[w]` for each row done and returns how many (a
/// multiple of W). Q4_K (the `q4_k_tile` decode tiles) and Q6_K (the prefetching W × 1 tiles).
/// The loop runs inside the kernels' target features, so every tile's kernel inlines into it:
/// called per tile from generic code, the calls and their setup took ~3% of Qwen2.5-1.5B's
/// decode. Each output equals the single-row dot product bit for bit, as the tiles do.
///
/// # Safety
/// As [`vec_dot_tile`] with R = 1, for all `n_w` rows; `out` has room for `n_w` values.
#[allow(clippy::too_many_arguments)]
pub(in crate::kernels) unsafe fn decode_tiles<const W: usize>(
    vnni: bool,
    ty: GgmlType,
    n: usize,
    x0: *const u8,
    w_row: usize,
    n_w: usize,
    y: *const u8,
    out: *mut f32,
) -> usize {
    let nb = n / ty.block_len();
    if vnni {
        decode_tiles_vnni::<W>(ty, nb, x0, w_row, n_w, y, out)
    } else {
        decode_tiles_avx2::<W>(ty, nb, x0, w_row, n_w, y, out)
    }
}

macro_rules! decode_tiles_loop {
    ($name:ident, $features:literal, $q4k:path, $q6k:path) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const W: usize>(
            ty: GgmlType,
            nb: usize,
            x0: *const u8,
            w_row: usize,
            n_w: usize,
            y: *const u8,
            out: *mut f32,
        ) -> usize {
            let mut w0 = 0;
            while w0 + W <= n_w {
                let mut wp = [x0; W];
                for (i, p) in wp.iter_mut().enumerate() {
                    *p = x0.add((w0 + i) * w_row);
                }
                let mut dots = [f32::NAN; W];
                match ty {
                    GgmlType::Q4_K => dots = $q4k(nb, wp, y),
                    GgmlType::Q6_K => {
                        let tile = $q6k(nb, wp, [y]);
                        for i in 0..W {
                            dots[i] = tile[i][0];
                        }
                    }
                    _ => {} // unreachable: `decode_tiles` takes Q4_K and Q6_K
                }
                for (i, d) in dots.into_iter().enumerate() {
                    *out.add(w0 + i) = d;
                }
                w0 += W;
            }
            w0
        }
    };
}

decode_tiles_loop!(decode_tiles_avx2, "avx2,fma,f16c", avx2::q4_k_tile::<W>, q6_k_tile_avx2::<W, 1, true>);
decode_tiles_loop!(
    decode_tiles_vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    vnni::q4_k_tile::<W>,
    q6_k_tile_512::<W, 1, true>
);
