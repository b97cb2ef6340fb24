//! Q5_0 / Q8_0 × Q8_0 tiles with AVX-512 (BW + VNNI): two 32-element blocks per 512-bit register
//! for the integer work (unpacking, dot products), then each block's 8 i32 lanes converted and
//! FMA'd into the same 256-bit accumulator in block order — the exact lanes and float operations
//! of the AVX2 tile in `multi.rs`, so the results are bit-identical to it.

use super::*;

const Q8_0_BYTES: usize = 34;

/// W weight rows × R activation rows, Q5_0 (`Q8 = false`) or Q8_0 (`Q8 = true`) weights.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI must be available; every pointer is a whole row of `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn legacy_tile_512<const Q8: bool, const W: usize, const R: usize>(
    nb: usize,
    x: [*const u8; W],
    y: [*const u8; R],
) -> [[f32; R]; W] {
    // Weight codes as unsigned bytes: Q5_0 value + 16, Q8_0 value + 128; the offset × Σy (per
    // group of 4) is subtracted through the accumulator's start value.
    let (block_bytes, offset) = if Q8 { (Q8_0_BYTES, 0x80u8 as i8) } else { (22, 16) };
    let off512 = _mm512_set1_epi8(offset);
    let low4 = _mm512_set1_epi8(0x0F);
    let bit4 = _mm512_set1_epi8(0x10);
    let flip = _mm512_set1_epi8(0x80u8 as i8);
    // 16-bit shift counts: 128-bit lanes 1 and 3 (the high nibbles) by 4.
    const S: i64 = 0x0004_0004_0004_0004;
    let nibble_shift = _mm512_set_epi64(S, S, 0, 0, S, S, 0, 0);
    let mut acc = [[_mm256_setzero_ps(); R]; W];
    let mut ib = 0;
    while ib + 2 <= nb {
        // Scales broadcast once per row: each (w, r) then needs one vector multiply per block,
        // the same IEEE product as the scalar dx * dy.
        let mut dy = [[_mm256_setzero_ps(); 2]; R];
        let mut yq = [_mm512_setzero_si512(); R];
        let mut yoff = [_mm512_setzero_si512(); R];
        for r in 0..R {
            let yb = y[r].add(ib * Q8_0_BYTES);
            dy[r] = [_mm256_set1_ps(f16_at(yb)), _mm256_set1_ps(f16_at(yb.add(Q8_0_BYTES)))];
            yq[r] = _mm512_inserti64x4(_mm512_castsi256_si512(load256(yb.add(2))), load256(yb.add(Q8_0_BYTES + 2)), 1);
            yoff[r] =
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), off512, yq[r]));
        }
        if R == 1 {
            // Decode streams every weight from memory once: prefetch the next tile of W rows
            // (contiguous, W * nb blocks) in address order, at the rate this one is read.
            let span = W * 2 * block_bytes;
            prefetch_span(x[0].wrapping_add(W * nb * block_bytes + (ib / 2) * span), span);
        }
        for w in 0..W {
            let xb = x[w].add(ib * block_bytes);
            let xb1 = xb.add(block_bytes);
            let dx = [_mm256_set1_ps(f16_at(xb)), _mm256_set1_ps(f16_at(xb1))];
            let code = if Q8 {
                let q = _mm512_inserti64x4(_mm512_castsi256_si512(load256(xb.add(2))), load256(xb1.add(2)), 1);
                _mm512_xor_si512(q, flip)
            } else {
                let lo0 = _mm_loadu_si128(xb.add(6) as *const __m128i);
                let lo1 = _mm_loadu_si128(xb1.add(6) as *const __m128i);
                let packed = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_set_m128i(lo0, lo0)),
                    _mm256_set_m128i(lo1, lo1),
                    1,
                );
                let nibbles = _mm512_and_si512(_mm512_srlv_epi16(packed, nibble_shift), low4);
                let qh0 = (xb.add(2) as *const u32).read_unaligned() as u64;
                let qh1 = (xb1.add(2) as *const u32).read_unaligned() as u64;
                _mm512_or_si512(nibbles, _mm512_maskz_mov_epi8(qh0 | qh1 << 32, bit4))
            };
            for r in 0..R {
                let sumi = _mm512_dpbusd_epi32(yoff[r], code, yq[r]);
                let q = _mm512_cvtepi32_ps(sumi);
                let q0 = _mm512_castps512_ps256(q);
                let q1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(q), 1));
                // Block ib, then block ib + 1, as the one-block loop does.
                acc[w][r] = _mm256_fmadd_ps(_mm256_mul_ps(dx[0], dy[r][0]), q0, acc[w][r]);
                acc[w][r] = _mm256_fmadd_ps(_mm256_mul_ps(dx[1], dy[r][1]), q1, acc[w][r]);
            }
        }
        ib += 2;
    }
    if ib < nb {
        // The odd last block, with 256-bit registers.
        if R == 1 {
            prefetch_span(x[0].wrapping_add(W * nb * block_bytes + ib * W * block_bytes), W * block_bytes);
        }
        for w in 0..W {
            let xb = x[w].add(ib * block_bytes);
            let dx = f16_at(xb);
            let code = if Q8 {
                _mm256_xor_si256(load256(xb.add(2)), _mm256_set1_epi8(0x80u8 as i8))
            } else {
                let hi = _mm256_and_si256(bytes_from_bits_32(xb.add(2)), _mm256_set1_epi8(0x10));
                _mm256_or_si256(bytes_from_nibbles_32(xb.add(6)), hi)
            };
            for r in 0..R {
                let yb = y[r].add(ib * Q8_0_BYTES);
                let yv = load256(yb.add(2));
                let yoff = _mm256_sub_epi32(
                    _mm256_setzero_si256(),
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(offset), yv),
                );
                let sumi = _mm256_dpbusd_epi32(yoff, code, yv);
                acc[w][r] = _mm256_fmadd_ps(_mm256_set1_ps(dx * f16_at(yb)), _mm256_cvtepi32_ps(sumi), acc[w][r]);
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
