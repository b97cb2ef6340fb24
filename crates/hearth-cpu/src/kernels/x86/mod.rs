//! x86_64 AVX2 + FMA + F16C kernels, following ggml-cpu/arch/x86/quants.c (Q4_K: the roundings
//! of its repacked kernels, repack.cpp; interleaved512/ interleaves weight rows as they do).
//! Every function here requires those features and whole-row buffers (checked by the caller).

mod interleaved512;
mod kquants;
mod kquants512;
mod ktile;
mod ktile512;
mod legacy;
mod legacy512;
mod legacy_unpacked512;
mod legacy_unpacked_avx2;
mod multi;

pub(super) use interleaved512::{q4_k_prefill_pass, q4_k_x16_pass, q4_k_x16_repack_tile};
pub(super) use legacy_unpacked512::legacy_prefill_pass;
pub(super) use legacy_unpacked_avx2::legacy_prefill_pass_avx2;
pub(super) use multi::{decode_tiles, supports_multi, supports_tile, vec_dot_multi, vec_dot_tile};

use core::arch::x86_64::*;
use hearth_core::quant::GgmlType;

pub(super) fn supports(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::MXFP4
    )
}

/// # Safety
/// AVX2, FMA and F16C must be available, and AVX-512 F/BW/VL/VNNI too when `vnni`; `w` and `a`
/// must point to whole rows of `n` elements of `ty` and `ty.vec_dot_type()`; `supports(ty)` must hold.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn vec_dot(vnni: bool, ty: GgmlType, n: usize, w: *const u8, a: *const u8) -> f32 {
    if supports_multi(ty) {
        return vec_dot_multi::<1>(vnni, ty, n, w, [a])[0];
    }
    let nb = n / ty.block_len();
    match ty {
        GgmlType::F32 => dot_f32(n, w as *const f32, a as *const f32),
        GgmlType::F16 => dot_f16(n, w, a),
        GgmlType::Q4_0 => legacy::q4_0_q8_0(nb, w, a),
        GgmlType::Q4_1 => legacy::q4_1_q8_1(nb, w, a),
        GgmlType::Q5_1 => legacy::q5_1_q8_1(nb, w, a),
        GgmlType::Q5_K => kquants::q5_k_q8_k(nb, w, a),
        GgmlType::MXFP4 => legacy::mxfp4_q8_0(nb, w, a),
        _ => f32::NAN, // unreachable: guarded by `supports`
    }
}

/// An unaligned little-endian f16 at `p`, converted with F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn f16_at(p: *const u8) -> f32 {
    _mm_cvtss_f32(cvtph_low(u32::from((p as *const u16).read_unaligned())))
}

/// The two adjacent unaligned little-endian f16 at `p` as lanes 0 and 1 (lanes 2-3 zero),
/// converted with F16C: the same conversions as two [`f16_at`] calls, one instruction fewer each.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn f16x2_at(p: *const u8) -> __m128 {
    cvtph_low((p as *const u32).read_unaligned())
}

/// The two f16 in `bits` (low half first) converted to lanes 0 and 1.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn cvtph_low(bits: u32) -> __m128 {
    let converted: __m128;
    // In asm because LLVM turns `_mm_cvtsi32_si128` + `_mm_cvtph_ps` into a `vpinsrw` that merges
    // into whatever register it picks — often a loop accumulator, which chained every block of
    // a dot product behind the previous block's FMA (3-4x slower Q8_0/Q5_0 kernels). `vmovd`
    // writes the whole register, so there is no false dependency.
    core::arch::asm!(
        "vmovd {x}, {bits:e}",
        "vcvtph2ps {x}, {x}",
        bits = in(reg) bits,
        x = out(xmm_reg) converted,
        options(pure, nomem, nostack, preserves_flags),
    );
    converted
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// An unaligned 512-bit load (for the AVX-512 kernels).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn load512(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const __m512i)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn hsum_float_8(x: __m256) -> f32 {
    let mut res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    _mm_cvtss_f32(res)
}

/// 32 packed nibbles (16 bytes) → 32 bytes in 0..15: low nibbles first, then high nibbles.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
}

/// 32 bits → 32 bytes, 0xFF where the bit is set.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    let x32 = (p as *const u32).read_unaligned();
    let shuf_mask = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf_mask);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Unsigned bytes × signed bytes, summed in groups of 4, as 8 floats.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot))
}

/// Signed bytes × signed bytes, summed in groups of 4, as 8 floats.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    mul_sum_us8_pairs_float(ax, sy)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32(n: usize, x: *const f32, y: *const f32) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(i + 8 * k)), _mm256_loadu_ps(y.add(i + 8 * k)), *a);
        }
        i += 32;
    }
    let mut sum = hsum_float_8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    while i < n {
        sum += x.add(i).read_unaligned() * y.add(i).read_unaligned();
        i += 1;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16(n: usize, x: *const u8, y: *const u8) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let (xs, ys) = (x.add(2 * (i + 8 * k)), y.add(2 * (i + 8 * k)));
            let xv = _mm256_cvtph_ps(_mm_loadu_si128(xs as *const __m128i));
            let yv = _mm256_cvtph_ps(_mm_loadu_si128(ys as *const __m128i));
            *a = _mm256_fmadd_ps(xv, yv, *a);
        }
        i += 32;
    }
    let mut sum = hsum_float_8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    while i < n {
        sum += f16_at(x.add(2 * i)) * f16_at(y.add(2 * i));
        i += 1;
    }
    sum
}

/// Decode streams every weight from memory once: prefetch `lines` cache lines at `p` plus
/// `ahead` bytes, past the page boundaries where the hardware prefetcher stops. A prefetch never
/// faults, so addresses past the matrix are harmless.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn prefetch_ahead(p: *const u8, ahead: usize, lines: usize) {
    for l in 0..lines {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead + 64 * l) as *const i8);
    }
}

/// [`prefetch_ahead`] into L2 only (`prefetcht1`; L2 takes far more misses in flight than L1).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn prefetch_ahead_l2(p: *const u8, ahead: usize, lines: usize) {
    for l in 0..lines {
        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(ahead + 64 * l) as *const i8);
    }
}

/// How far ahead (bytes) the one-row Q4_K kernel prefetches its weights into L1. Measured on
/// Qwen2.5-1.5B's ffn_down (rows of 8960), one thread, from memory: 4 rows ahead (~20 KB, the
/// former distance) 0.56 ms; 1 KiB 0.52; 2 KiB 0.46-0.48; 4 KiB 0.46-0.53; 8 KiB 0.51-0.52; into
/// L2 at 2/4/8 KiB 0.64/0.54-0.58/0.56-0.58 (benches/decode_shapes.rs, busy machine).
const ROW_PREFETCH_BYTES: usize = 2048;

/// How far ahead (bytes) the one-row Q6_K kernel prefetches its weights, into L2. Same bench,
/// Q6_K ffn_down: 4 rows ahead (~29 KB) into L1 0.81 ms; 2 KiB into L1 0.67-0.75; into L2 at
/// 2/4/8 KiB 0.84-0.89/0.66/0.63-0.65; 8 KiB into L2 plus 1 KiB into L1 0.74-0.75.
const Q6K_ROW_PREFETCH_BYTES: usize = 8192;

/// Prefetches every cache line that holds one of the `bytes` bytes at `p`, in address order.
/// The decode tiles read W rows interleaved, which the hardware prefetcher follows poorly; a sweep
/// over the next tile's lines in address order, spread over the current tile's blocks, keeps the
/// stream at memory speed: Gemma-3-270M's Q8_0 output mat-mul (640 x 262144), one thread, from
/// memory: 19.7 ms with one prefetch per row and block -> 7.7 ms (benches/decode_shapes.rs).
/// A prefetch never faults, so addresses past the matrix are harmless.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn prefetch_span(p: *const u8, bytes: usize) {
    let end = (p as usize).wrapping_add(bytes);
    let mut line = (p as usize) & !63;
    while line < end {
        _mm_prefetch::<_MM_HINT_T0>(line as *const i8);
        line += 64;
    }
}

/// `v`, through an empty `asm!` the optimiser cannot see into (so it stays in a general register).
#[inline(always)]
fn opaque_u64(v: u64) -> u64 {
    let mut v = v;
    // SAFETY: an empty instruction sequence that only "reads and writes" a general register.
    unsafe { core::arch::asm!("/* {0} */", inout(reg) v, options(pure, nomem, nostack, preserves_flags)) };
    v
}

/// `p`, through an empty `asm!` the optimiser cannot see into. For shuffle tables: LLVM knows a
/// static's contents and rewrites a `vpshufb` with a constant mask that broadcasts one i16 into
/// two shuffles (`vpshuflw`/`vpshufhw` + `vpshufd`), which doubled the shuffle-port work of the
/// Q4_K kernels; with the table's address opaque, each stays one `vpshufb` with a memory operand.
// The asm reads no memory: the pointer only passes through it, and the tables read through the
// result are immutable statics, so nothing needs ordering against it.
#[allow(clippy::pointers_in_nomem_asm_block)]
#[inline(always)]
fn opaque<T>(p: *const T) -> *const T {
    let mut p = p;
    // SAFETY: an empty instruction sequence that only "reads and writes" a general register.
    unsafe { core::arch::asm!("/* {0} */", inout(reg) p, options(pure, nomem, nostack, preserves_flags)) };
    p
}
