//! Q4_K, Q5_K, Q6_K × Q8_K (256-element super-blocks), as ggml's AVX2 kernels: integer sums with
//! per-sub-block scales applied via `madd_epi16`, mins (or Q6_K's -32 offset) via Q8_K's bsums.

use super::*;

pub(super) const Q8K_BYTES: usize = 292;
pub(super) const Q8K_QS: usize = 4;
pub(super) const Q8K_BSUMS: usize = 260;

/// Row `i`: bytes (2i, 2i+1) repeated, so `shuffle_epi8` broadcasts the i-th i16 scale of sub-block i.
pub(super) static SCALE_SHUFFLE_K4: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut i = 0;
    while i < 8 {
        let mut j = 0;
        while j < 16 {
            t[i][2 * j] = 2 * i as u8;
            t[i][2 * j + 1] = 2 * i as u8 + 1;
            j += 1;
        }
        i += 1;
    }
    t
};

/// Q6_K: for i in 0..8, eight copies of byte 2i then eight of byte 2i+1.
static SCALE_SHUFFLE_Q6: [[u8; 16]; 8] = {
    let mut t = [[0u8; 16]; 8];
    let mut i = 0;
    while i < 8 {
        let mut j = 0;
        while j < 8 {
            t[i][j] = 2 * i as u8;
            t[i][8 + j] = 2 * i as u8 + 1;
            j += 1;
        }
        i += 1;
    }
    t
};

/// Q6_K's 6-bit codes (0..63, the stored value + 32) of half `j` (0 or 1) of the super-block at
/// `xb`, as four 32-byte groups: the low 4 bits from `ql` (bytes 64j..64j+64, low then high
/// nibbles), the high 2 from `qh` (bytes 128+32j..), ggml's AVX2 unpacking. Shared by every
/// Q6_K kernel (one-row, multi-row, tiles; 256- and 512-bit), so they unpack alike.
///
/// # Safety
/// AVX2 must be available (the callers are AVX2 kernels this inlines into); `xb` points to a
/// whole Q6_K super-block (210 bytes).
#[inline(always)]
pub(super) unsafe fn q6_k_codes(xb: *const u8, j: usize) -> [__m256i; 4] {
    let m15 = _mm256_set1_epi8(15);
    let q4bits1 = load256(xb.add(64 * j));
    let q4bits2 = load256(xb.add(64 * j + 32));
    let q4bits_h = load256(xb.add(128 + 32 * j));
    let q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(3)), 4);
    let q4h_1 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)), 2);
    let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
    let q4h_3 = _mm256_srli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)), 2);
    [
        _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0),
        _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15), q4h_2),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15), q4h_3),
    ]
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q8k_d(yb: *const u8) -> f32 {
    (yb as *const f32).read_unaligned()
}

/// Q4_K/Q5_K packed 6-bit scales and mins → 8 scales (bytes 0..8) then 8 mins (bytes 8..16),
/// zero-extended to 16 × i16 (ggml's `utmp` shuffle).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn mins_and_scales(packed: *const u8) -> __m256i {
    // ggml's t0 = u0 & 0x3f.., t1 = (u2 & 0x0f..) | ((u0 >> 6) & 0x03..) << 4,
    // t2 = u1 & 0x3f.., t3 = ((u2 >> 4) & 0x0f..) | ((u1 >> 6) & 0x03..) << 4 (u0, u1, u2 the
    // three packed words), two words per 64-bit general-register operation: [t0 | t2] and
    // [t1 | t3], then interleaved as [t0, t1, t2, t3] in a vector register. The masks act per
    // byte, so the 64-bit shifts move no bit across a word's boundary that survives its mask.
    // In general registers on purpose (the opaque loads keep LLVM from vectorising it): the
    // vector pipes are the Q4_K kernels' bottleneck, the integer ones are idle.
    let u01 = opaque_u64((packed as *const u64).read_unaligned());
    let u2 = opaque_u64((packed.add(8) as *const u32).read_unaligned() as u64);
    let t02 = u01 & 0x3f3f3f3f_3f3f3f3f;
    let u22 = (u2 | (u2 >> 4) << 32) & 0x0f0f0f0f_0f0f0f0f;
    let t13 = u22 | ((u01 >> 6) & 0x03030303_03030303) << 4;
    let t = _mm_unpacklo_epi32(_mm_cvtsi64_si128(t02 as i64), _mm_cvtsi64_si128(t13 as i64));
    _mm256_cvtepu8_epi16(t)
}

/// One Q4_K output's two exact integer sums of a super-block as i32 lanes [S, M, S, M]: S the sum
/// of the 8 scaled-code lanes `sumi`, M the sum of the 4 mins · bsums lanes `mins`. Integer sums
/// are exact in any order, so every kernel's lanes reduce to the same two numbers. (Unpacks and
/// adds, single-uop each, rather than `hadd`s: the decode kernels pay this per super-block.)
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q4k_sums(sumi: __m256i, mins: __m128i) -> __m128i {
    let s = fold_i32(sumi);
    // [s0+s2, m0+m2, s1+s3, m1+m3]
    let t = _mm_add_epi32(_mm_unpacklo_epi32(s, mins), _mm_unpackhi_epi32(s, mins));
    _mm_add_epi32(t, _mm_unpackhi_epi64(t, t))
}

/// Two Q4_K outputs' sums as [Sa, Ma, Sb, Mb] (see [`q4k_sums`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q4k_sums2(sumi_a: __m256i, mins_a: __m128i, sumi_b: __m256i, mins_b: __m128i) -> __m128i {
    let (sa, sb) = (fold_i32(sumi_a), fold_i32(sumi_b));
    let ta = _mm_add_epi32(_mm_unpacklo_epi32(sa, mins_a), _mm_unpackhi_epi32(sa, mins_a));
    let tb = _mm_add_epi32(_mm_unpacklo_epi32(sb, mins_b), _mm_unpackhi_epi32(sb, mins_b));
    _mm_add_epi32(_mm_unpacklo_epi64(ta, tb), _mm_unpackhi_epi64(ta, tb))
}

/// The sums of four outputs' exact super-block integers at once, [Σa, Σb, Σc, Σd] of four vectors
/// of 8 i32 lanes: a transpose-and-add of single-uop unpacks, cheaper than three `hadd`s a pair.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn sum4x8(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m128i {
    // Per 128-bit half: [a0+a2, b0+b2, a1+a3, b1+b3], then [Σa, Σb, Σc, Σd] of that half.
    let ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    let cd = _mm256_add_epi32(_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
    let halves = _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
    _mm_add_epi32(_mm256_castsi256_si128(halves), _mm256_extracti128_si256::<1>(halves))
}

/// [`sum4x8`] of four vectors of 4 i32 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn sum4x4(a: __m128i, b: __m128i, c: __m128i, d: __m128i) -> __m128i {
    let ab = _mm_add_epi32(_mm_unpacklo_epi32(a, b), _mm_unpackhi_epi32(a, b));
    let cd = _mm_add_epi32(_mm_unpacklo_epi32(c, d), _mm_unpackhi_epi32(c, d));
    _mm_add_epi32(_mm_unpacklo_epi64(ab, cd), _mm_unpackhi_epi64(ab, cd))
}

/// The 8 i32 lanes of `v` added in pairs (low half + high half).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn fold_i32(v: __m256i) -> __m128i {
    _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v))
}

/// One super-block step of up to two Q4_K outputs: `acc` lanes (2k, 2k + 1) of output k hold
/// Σ f32(S) · (xd · yd) and Σ f32(M) · (xdmin · yd), one FMA per super-block in order; `sums` as
/// [`q4k_sums2`], `scales` [xd · yd, xdmin · yd] per output. This is llama.cpp's rounding for
/// Q4_K on x86 (its repacked `gemv`/`gemm_q4_K_8x8_q8_K`: exact integers per super-block, then
/// these two FMA chains), the same in every kernel here whatever its lane layout.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q4k_accumulate(acc: __m128, sums: __m128i, scales: __m128) -> __m128 {
    _mm_fmadd_ps(_mm_cvtepi32_ps(sums), scales, acc)
}

/// The two outputs of a [`q4k_accumulate`] accumulator: lane 0 − lane 1 and lane 2 − lane 3.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q4k_results(acc: __m128) -> [f32; 2] {
    let diff = _mm_sub_ps(acc, _mm_movehdup_ps(acc));
    [_mm_cvtss_f32(diff), _mm_cvtss_f32(_mm_movehl_ps(diff, diff))]
}

/// Σ_j bsums[j] * mins[j/2] as 4 i32 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn mins_dot_bsums(mins_and_scales: __m256i, yb: *const u8) -> __m128i {
    let q8sums = load256(yb.add(Q8K_BSUMS));
    let q8s = _mm_hadd_epi16(_mm256_extracti128_si256(q8sums, 0), _mm256_extracti128_si256(q8sums, 1));
    _mm_madd_epi16(_mm256_extracti128_si256(mins_and_scales, 1), q8s)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_k_q8_k(nb: usize, x: *const u8, y: *const u8) -> f32 {
    let m4 = _mm256_set1_epi8(0xF);
    let mone = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for i in 0..nb {
        let (xb, yb) = (x.add(i * 176), y.add(i * Q8K_BYTES));
        let yd = q8k_d(yb);
        let d = yd * f16_at(xb);
        let dmin = -yd * f16_at(xb.add(2));
        let ms = mins_and_scales(xb.add(4));
        let prod = mins_dot_bsums(ms, yb);
        let zero = _mm_setzero_si128();
        let hsum = _mm_hadd_epi32(_mm_hadd_epi32(prod, zero), zero);
        summs += dmin * _mm_cvtsi128_si32(hsum) as f32;
        let sc128 = _mm256_extracti128_si256(ms, 0);
        let scales = _mm256_set_m128i(sc128, sc128);

        let hbits = load256(xb.add(16));
        let mut hmask = mone;
        let mut q5 = xb.add(48);
        let mut q8 = yb.add(Q8K_QS);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let scale_0 = _mm256_shuffle_epi8(scales, load256(SCALE_SHUFFLE_K4[2 * j].as_ptr()));
            let scale_1 = _mm256_shuffle_epi8(scales, load256(SCALE_SHUFFLE_K4[2 * j + 1].as_ptr()));
            let q5bits = load256(q5);
            q5 = q5.add(32);
            // The 5th bit of sub-block 2j is bit 2j of qh, of sub-block 2j+1 bit 2j+1; move it to bit 4.
            let bit = _mm_cvtsi32_si128(2 * j as i32);
            let bit1 = _mm_cvtsi32_si128(2 * j as i32 + 1);
            let q5h_0 = _mm256_slli_epi16(_mm256_srl_epi16(_mm256_and_si256(hbits, hmask), bit), 4);
            let q5_0 = _mm256_add_epi8(_mm256_and_si256(q5bits, m4), q5h_0);
            hmask = _mm256_slli_epi16(hmask, 1);
            let q5h_1 = _mm256_slli_epi16(_mm256_srl_epi16(_mm256_and_si256(hbits, hmask), bit1), 4);
            let q5_1 = _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(q5bits, 4), m4), q5h_1);
            hmask = _mm256_slli_epi16(hmask, 1);

            let p16_0 = _mm256_madd_epi16(scale_0, _mm256_maddubs_epi16(q5_0, load256(q8)));
            let p16_1 = _mm256_madd_epi16(scale_1, _mm256_maddubs_epi16(q5_1, load256(q8.add(32))));
            q8 = q8.add(64);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_0, p16_1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc) + summs
}

/// Q6_K scales 2k (×8) and 2k+1 (×8) as 16 × i16 — the scales of the 32 elements of group k.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q6_scale(scales: __m128i, k: usize) -> __m256i {
    let shuffle = _mm_loadu_si128(SCALE_SHUFFLE_Q6[k].as_ptr() as *const __m128i);
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuffle))
}
