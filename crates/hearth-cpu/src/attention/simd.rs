//! The two inner loops of attention, several key or value rows per pass: the scores of one query
//! against a run of key rows, and the weighted sum of a run of value rows into one query's
//! output. Bit for bit the results of the plain loops in mod.rs (`dot` per key, then one
//! multiply-add pass over the output per value row): the same operations in the same order for
//! every output value, only interleaved over rows (keys), so that their dependency chains overlap,
//! and the output row is held in registers over a run of value rows instead of loaded and stored
//! per row.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// `out[j] = dot(q, key row j)` for the `out.len()` rows of `keys` ([rows, width]).
pub(super) fn dots(q: &[f32], keys: &[f32], width: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if width.is_multiple_of(8) && q.len() == width && keys.len() >= out.len() * width && crate::fma::available() {
        // SAFETY: AVX2 is present (checked); q is one row of `width` values and keys holds
        // `out.len()` rows of them (checked).
        unsafe { dots_avx2(q, keys, width, out) };
        return;
    }
    for (o, k) in out.iter_mut().zip(keys.chunks_exact(width)) {
        *o = dot(q, k);
    }
}

/// `acc[c] += weights[j] * value row j [c]` for each row j in order, for every column c of
/// `acc` ([width]); `values` is [rows, width] with one row per weight.
pub(super) fn weighted_sum(acc: &mut [f32], weights: &[f32], values: &[f32]) {
    let width = acc.len();
    #[cfg(target_arch = "x86_64")]
    if width.is_multiple_of(8) && values.len() >= weights.len() * width && crate::fma::available() {
        // SAFETY: AVX2 is present (checked); values holds one row of `width` per weight.
        unsafe { weighted_sum_avx2(acc, weights, values) };
        return;
    }
    for (&w, v) in weights.iter().zip(values.chunks_exact(width)) {
        acc.iter_mut().zip(v).for_each(|(o, v)| *o += w * v);
    }
}

/// Scales `scores` in place and returns the largest of them and `max` (NaNs ignored, as
/// `f32::max` does). The order of the comparisons may differ from a running `f32::max`, which
/// can only change the sign of a zero maximum: the softmax subtracts it, and exp(±0) is 1.
pub(super) fn scale_and_max(scores: &mut [f32], scale: f32, max: f32) -> f32 {
    scores.iter_mut().for_each(|s| *s *= scale);
    #[cfg(target_arch = "x86_64")]
    if crate::fma::available() && !max.is_nan() {
        // SAFETY: AVX2 is present (checked).
        return unsafe { max_avx2(scores, max) };
    }
    scores.iter().fold(max, |m, &s| m.max(s))
}

/// The largest of `values` and `init` (not NaN), NaNs ignored.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn max_avx2(values: &[f32], init: f32) -> f32 {
    // `max_ps(v, m)` returns m when v is NaN, so the lanes never hold a NaN.
    let mut m = _mm256_set1_ps(init);
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        m = _mm256_max_ps(_mm256_loadu_ps(c.as_ptr()), m);
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let m1 = _mm_max_ss(m2, _mm_movehdup_ps(m2));
    rest.iter().fold(_mm_cvtss_f32(m1), |m, &s| m.max(s))
}

/// q · k with eight lane sums (lane l over elements l, l + 8, ...) added in a fixed tree.
#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators let the compiler vectorise without reassociation flags; the
    // order is fixed, so every build and batch gives the same result.
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ca[l] * cb[l];
        }
    }
    // Identity, as a barrier: without it LLVM shapes the loop after the pairwise sum below and
    // keeps the accumulators in four 2-lane halves of xmm registers with two shuffles per
    // multiply; behind it the loop is one multiply and one add per 8 lanes of a ymm register
    // (same operations in the same order: same bits).
    let acc = std::hint::black_box(acc);
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in chunks * 8..a.len().min(b.len()) {
        s += a[i] * b[i];
    }
    s
}

/// [`dot`]'s tree over the 8 lanes of `acc`: ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn lane_tree(acc: __m256) -> f32 {
    // s = [a0 + a4, a1 + a5, a2 + a6, a3 + a7]; u = [s0 + s1, _, s2 + s3, _]; u0 + u2.
    let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    let u = _mm_add_ps(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(_mm_add_ss(u, _mm_movehl_ps(u, u)))
}

/// [`dots`] with AVX2, four keys per pass (no fused multiply-adds: [`dot`]'s roundings).
///
/// # Safety
/// AVX2 must be available; `q` is `width` values (a multiple of 8) and `keys` holds `out.len()`
/// rows of `width`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2(q: &[f32], keys: &[f32], width: usize, out: &mut [f32]) {
    // Eight keys in flight: each key's lane sums are a chain of dependent adds (the order that
    // fixes the result), so fewer keys per pass left the adder waiting on the chains.
    const ROWS: usize = 8;
    let (qp, kp) = (q.as_ptr(), keys.as_ptr());
    let chunks = width / 8;
    let mut j = 0;
    while j + ROWS <= out.len() {
        let mut acc = [_mm256_setzero_ps(); ROWS];
        for c in 0..chunks {
            let qv = _mm256_loadu_ps(qp.add(8 * c));
            for (r, acc) in acc.iter_mut().enumerate() {
                let kv = _mm256_loadu_ps(kp.add((j + r) * width + 8 * c));
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(qv, kv));
            }
        }
        for (r, &acc) in acc.iter().enumerate() {
            out[j + r] = lane_tree(acc);
        }
        j += ROWS;
    }
    for (o, k) in out[j..].iter_mut().zip(keys[j * width..].chunks_exact(width)) {
        let mut acc = _mm256_setzero_ps();
        for c in 0..chunks {
            acc = _mm256_add_ps(
                acc,
                _mm256_mul_ps(_mm256_loadu_ps(qp.add(8 * c)), _mm256_loadu_ps(k.as_ptr().add(8 * c))),
            );
        }
        *o = lane_tree(acc);
    }
}

/// [`weighted_sum`] with AVX2: 64 columns of `acc` at a time stay in registers over all the
/// value rows (per column the same multiply, then add, in row order).
///
/// # Safety
/// AVX2 must be available; `acc.len()` is a multiple of 8 and `values` holds one row of
/// `acc.len()` per weight.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_sum_avx2(acc: &mut [f32], weights: &[f32], values: &[f32]) {
    const CHUNKS: usize = 8;
    let width = acc.len();
    let (ap, vp) = (acc.as_mut_ptr(), values.as_ptr());
    let mut c0 = 0;
    while c0 + 8 * CHUNKS <= width {
        let mut a = [_mm256_setzero_ps(); CHUNKS];
        for (k, a) in a.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(ap.add(c0 + 8 * k));
        }
        for (j, &w) in weights.iter().enumerate() {
            let w = _mm256_set1_ps(w);
            let row = vp.add(j * width + c0);
            for (k, a) in a.iter_mut().enumerate() {
                *a = _mm256_add_ps(*a, _mm256_mul_ps(w, _mm256_loadu_ps(row.add(8 * k))));
            }
        }
        for (k, &a) in a.iter().enumerate() {
            _mm256_storeu_ps(ap.add(c0 + 8 * k), a);
        }
        c0 += 8 * CHUNKS;
    }
    for c in (c0..width).step_by(8) {
        let mut a = _mm256_loadu_ps(ap.add(c));
        for (j, &w) in weights.iter().enumerate() {
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_set1_ps(w), _mm256_loadu_ps(vp.add(j * width + c))));
        }
        _mm256_storeu_ps(ap.add(c), a);
    }
}
