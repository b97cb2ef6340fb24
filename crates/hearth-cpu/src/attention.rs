//! Causal attention over the KV cache, with GQA (query heads share KV heads) and sliding windows.
//!
//! One path for every query, ggml's CPU flash-attention numerics for decode (the one-pass online
//! softmax with Q rounded to f16 and an f16 accumulator for V), so decode reproduces llama.cpp's
//! numbers. ggml switches to f32 for batches of 64+ queries; we do not: a query's result then
//! depends only on its sequence and position, never on how many other queries share the step —
//! continuous batching, chunked prefill and speculative verification cannot change outputs.
//! (Goldens and perplexity stay within their tolerances; see tests/.)

use crate::fma::with_fma;
use half::f16;
use hearth_core::graph::AttentionParams;

#[cfg(not(target_arch = "wasm32"))]
use rayon::prelude::*;

/// A sequence's keys and values from position `first_pos` on: k, v: [n, n_head_kv * head_dim].
#[derive(Clone, Copy)]
pub struct KvSpan<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub first_pos: usize,
}

/// One sequence's queries: q, out: [n_tokens, n_head * head_dim]. Token t sits at position
/// pos0 + t and sees positions max(0, p - window + 1)..=p, all of which `kv` holds.
pub fn attention(q: &[f32], kv: KvSpan<'_>, p: &AttentionParams, pos0: usize, n_tokens: usize, out: &mut [f32]) {
    let hd = p.head_dim;
    let q_width = p.n_head * hd;
    let head = HeadContext { q, k_cache: kv.k, v_cache: kv.v, first_pos: kv.first_pos, p, pos0 };
    let out = &mut out[..n_tokens * q_width];
    #[cfg(target_arch = "x86_64")]
    if crate::attention_avx512::available() {
        // SAFETY: AVX-512F, AVX2 and FMA were detected.
        let task = |(index, out_head): (usize, &mut [f32])| unsafe { attend_head_avx512(&head, index, out_head) };
        out.par_chunks_exact_mut(hd).enumerate().for_each(task);
        return;
    }
    let task = |(index, out_head): (usize, &mut [f32])| with_fma!(attend_head(&head, index, out_head));
    #[cfg(not(target_arch = "wasm32"))]
    out.par_chunks_exact_mut(hd).enumerate().for_each(task);
    #[cfg(target_arch = "wasm32")]
    out.chunks_exact_mut(hd).enumerate().for_each(task);
}

/// The inner loops of attention: the f16-precision dot product and the f16-rounded updates of
/// the V accumulator. Every implementation gives the same bits.
trait F16Loops {
    fn dot(a: &[f32], b: &[f32]) -> f32;
    /// out[i] = round_f16(v[i] * vs + out[i]) (fused).
    fn accumulate(out: &mut [f32], v: &[f32], vs: f32);
    /// out[i] = round_f16(out[i] * ms).
    fn rescale(out: &mut [f32], ms: f32);
}

/// Plain Rust, compiled with or without FMA (`with_fma!`).
struct Portable;

impl F16Loops for Portable {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        dot_f16_ggml(a, b)
    }
    #[inline(always)]
    fn accumulate(out: &mut [f32], v: &[f32], vs: f32) {
        let v = &v[..out.len()];
        map_rounded_f16(out, |i, o| v[i].mul_add(vs, o));
    }
    #[inline(always)]
    fn rescale(out: &mut [f32], ms: f32) {
        map_rounded_f16(out, |_, o| o * ms);
    }
}

/// AVX-512F intrinsics; only used where `attention_avx512::available()`.
#[cfg(target_arch = "x86_64")]
struct Avx512;

#[cfg(target_arch = "x86_64")]
impl F16Loops for Avx512 {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: this type is used only after `attention_avx512::available()`.
        unsafe { crate::attention_avx512::dot_f16_ggml(a, b) }
    }
    #[inline(always)]
    fn accumulate(out: &mut [f32], v: &[f32], vs: f32) {
        let v = &v[..out.len()];
        // SAFETY: as above; v holds out.len() values.
        unsafe { crate::attention_avx512::map_rounded_f16_fma(out, v, vs) }
    }
    #[inline(always)]
    fn rescale(out: &mut [f32], ms: f32) {
        // SAFETY: as above.
        unsafe { crate::attention_avx512::map_rounded_f16_scale(out, ms) }
    }
}

/// # Safety
/// AVX-512F, AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn attend_head_avx512(c: &HeadContext<'_>, index: usize, out_head: &mut [f32]) {
    attend_head_with::<Avx512>(c, index, out_head)
}

#[inline(always)]
fn attend_head(c: &HeadContext<'_>, index: usize, out_head: &mut [f32]) {
    attend_head_with::<Portable>(c, index, out_head)
}

struct HeadContext<'a> {
    q: &'a [f32],
    k_cache: &'a [f32],
    v_cache: &'a [f32],
    /// Position of the first row of k_cache/v_cache.
    first_pos: usize,
    p: &'a AttentionParams,
    pos0: usize,
}

/// One query head of one token: `index` = token * n_head + head; out_head: [head_dim].
#[inline(always)]
fn attend_head_with<L: F16Loops>(c: &HeadContext<'_>, index: usize, out_head: &mut [f32]) {
    let p = c.p;
    let hd = p.head_dim;
    let q_width = p.n_head * hd;
    let kv_width = p.n_head_kv * hd;
    let group = p.n_head / p.n_head_kv;
    let (t, h) = (index / p.n_head, index % p.n_head);
    let kvh = h / group;
    let pos = c.pos0 + t;
    let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let q_head = &c.q[t * q_width + h * hd..t * q_width + (h + 1) * hd];
    let kv = KvHead { c, offset: kvh * hd, kv_width };
    attend_f16_accumulate::<L>(q_head, lo..=pos, &kv, out_head);
}

/// The K and V rows of one KV head (methods rather than closures so that everything inlines
/// into the FMA-compiled copy of `attend_head`).
struct KvHead<'a> {
    c: &'a HeadContext<'a>,
    offset: usize,
    kv_width: usize,
}

impl<'a> KvHead<'a> {
    #[inline(always)]
    fn k_row(&self, j: usize) -> &'a [f32] {
        let start = (j - self.c.first_pos) * self.kv_width + self.offset;
        &self.c.k_cache[start..start + self.c.p.head_dim]
    }

    #[inline(always)]
    fn v_row(&self, j: usize) -> &'a [f32] {
        let start = (j - self.c.first_pos) * self.kv_width + self.offset;
        &self.c.v_cache[start..start + self.c.p.head_dim]
    }

    /// Scaled (and soft-capped) score of query `q` against position j.
    #[inline(always)]
    fn score<L: F16Loops>(&self, q: &[f32], j: usize) -> f32 {
        let p = self.c.p;
        let d = L::dot(q, self.k_row(j));
        let s = d * p.scale;
        match p.softcap {
            Some(cap) => cap * (s / cap).tanh(),
            None => s,
        }
    }
}

/// x rounded to the nearest f16 value (ties to even), kept as f32. Values in f16's normal range —
/// all the accumulators here — are rounded with integer arithmetic on the f32 bits, which is
/// what this hot loop needs; zero, subnormals and overflow take `half`'s exact path.
#[inline(always)]
pub(crate) fn round_f16(x: f32) -> f32 {
    let bits = x.to_bits();
    let exponent = (bits >> 23) & 0xff;
    // f32 exponents 113..142 are f16's normal binades 2^-14 .. 2^15 (below 65504, no overflow).
    if (113..142).contains(&exponent) {
        let lsb = (bits >> 13) & 1;
        f32::from_bits((bits + 0x0fff + lsb) & !0x1fff)
    } else if bits << 1 == 0 {
        x
    } else {
        f16::from_f32(x).to_f32()
    }
}

/// out[i] = round_f16(f(i, out[i])) for every i, in a loop the compiler vectorises: the bit
/// arithmetic of `round_f16` runs on every lane, and only if some value fell outside f16's
/// normal range (zero aside) does a second pass give those values `half`'s exact conversion.
/// Rounding is idempotent, so the second pass leaves the already rounded values unchanged.
#[inline(always)]
fn map_rounded_f16(out: &mut [f32], f: impl Fn(usize, f32) -> f32) {
    let mut rare = false;
    for (i, o) in out.iter_mut().enumerate() {
        let x = f(i, *o);
        let bits = x.to_bits();
        let exponent = (bits >> 23) & 0xff;
        let normal = (113..142).contains(&exponent);
        let lsb = (bits >> 13) & 1;
        let rounded = f32::from_bits((bits.wrapping_add(0x0fff + lsb)) & !0x1fff);
        rare |= !normal && bits << 1 != 0;
        *o = if normal { rounded } else { x };
    }
    if rare {
        for o in out.iter_mut() {
            *o = round_f16(*o);
        }
    }
}

#[inline(always)]
fn attend_f16_accumulate<L: F16Loops>(q: &[f32], range: std::ops::RangeInclusive<usize>, kv: &KvHead<'_>, out: &mut [f32]) {
    // Q at f16 precision; on the stack for the usual head sizes (this runs per head per token).
    const STACK_HEAD: usize = 256;
    let mut stack = [0f32; STACK_HEAD];
    let mut heap = Vec::new();
    let q16: &mut [f32] = if q.len() <= STACK_HEAD {
        &mut stack[..q.len()]
    } else {
        heap.resize(q.len(), 0.0);
        &mut heap
    };
    for (d, &x) in q16.iter_mut().zip(q) {
        *d = round_f16(x);
    }
    let q16: &[f32] = q16;
    let mut max = f32::NEG_INFINITY;
    let mut sum = 0f32;
    // `out` holds the f16 accumulator (values kept at f16 precision).
    out.iter_mut().for_each(|o| *o = 0.0);
    for j in range {
        let s = kv.score::<L>(q16, j);
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if s > max {
            ms = (max - s).exp();
            max = s;
            L::rescale(out, ms);
        } else {
            vs = (s - max).exp();
        }
        L::accumulate(out, kv.v_row(j), vs);
        // ggml's `S = S*ms + vs`, contracted to one FMA by GCC.
        sum = sum.mul_add(ms, vs);
    }
    let inv = 1.0 / sum;
    out.iter_mut().for_each(|o| *o *= inv);
}

/// ggml's `ggml_vec_dot_f16` on AVX-512 (inputs already at f16 precision): blocks of 64 are
/// summed in 4 accumulators of 16 lanes by FMA, the accumulators added pairwise (0+2, 1+3, then
/// the two), the 16 lanes reduced as `_mm512_reduce_add_ps` does (halves: 8, 4, then 2+2, 1+1);
/// the tail past the last block of 64 is added in f64 (ggml_float).
#[inline(always)]
fn dot_f16_ggml(a: &[f32], b: &[f32]) -> f32 {
    const STEP: usize = 64;
    const LANES: usize = 16;
    let n = a.len().min(b.len());
    let blocks = n / STEP * STEP;
    let mut acc = [[0f32; LANES]; 4];
    for i in (0..blocks).step_by(STEP) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, sum) in lanes.iter_mut().enumerate() {
                let k = i + j * LANES + l;
                *sum = a[k].mul_add(b[k], *sum);
            }
        }
    }
    let mut x = [0f32; LANES];
    for l in 0..LANES {
        x[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let h8: [f32; 8] = std::array::from_fn(|l| x[l] + x[l + 8]);
    let h4: [f32; 4] = std::array::from_fn(|l| h8[l] + h8[l + 4]);
    let lanes_sum = (h4[0] + h4[2]) + (h4[1] + h4[3]);
    let mut sum = lanes_sum as f64;
    for k in blocks..n {
        sum += (a[k] * b[k]) as f64;
    }
    sum as f32
}

#[cfg(test)]
mod tests {
    use super::{map_rounded_f16, round_f16};

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_loops_equal_portable_loops() {
        use super::{Avx512, F16Loops, Portable};
        if !crate::attention_avx512::available() {
            return;
        }
        let mut state = 0x853c49e6748fea9bu64;
        let mut next = move |scale: f32| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        };
        for round in 0..3000 {
            // Head sizes of the models (64, 128, 256) and odd ones with a scalar tail.
            let n = [64, 128, 256, 80, 70, 5, 200][round % 7];
            // Ordinary values; some rounds tiny (f16 subnormal), huge, or with zeros.
            let scale = match round % 5 {
                0 => 1e-6,
                1 => 7e4,
                _ => 3.0,
            };
            let a: Vec<f32> = (0..n).map(|_| round_f16(next(scale))).collect();
            let b: Vec<f32> = (0..n).map(|i| if round % 11 == 0 && i % 3 == 0 { 0.0 } else { next(scale) }).collect();
            let (d0, d1) = (Portable::dot(&a, &b), Avx512::dot(&a, &b));
            assert_eq!(d0.to_bits(), d1.to_bits(), "dot, round {round}: {d0:e} vs {d1:e}");
            let factor = next(2.0);
            let (mut p, mut q) = (a.clone(), a.clone());
            Portable::accumulate(&mut p, &b, factor);
            Avx512::accumulate(&mut q, &b, factor);
            assert!(p.iter().zip(&q).all(|(x, y)| x.to_bits() == y.to_bits()), "accumulate, round {round}");
            Portable::rescale(&mut p, factor.abs());
            Avx512::rescale(&mut q, factor.abs());
            assert!(p.iter().zip(&q).all(|(x, y)| x.to_bits() == y.to_bits()), "rescale, round {round}");
        }
    }

    #[test]
    fn vectorised_rounding_equals_scalar_rounding() {
        let mut state = 0x2545f4914f6cdd1du64;
        for round in 0..2000 {
            let mut acc = [0f32; 64];
            let mut v = [0f32; 64];
            for (a, b) in acc.iter_mut().zip(v.iter_mut()) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                // Mostly ordinary values; every few rounds tiny (subnormal in f16), huge or zero ones.
                let scale = match round % 5 {
                    0 => 1e-6,
                    1 => 7e4,
                    _ => 3.0,
                };
                *a = round_f16(((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale);
                *b = ((state & 0xffffff) as f32 / (1u64 << 24) as f32 - 0.5) * scale;
            }
            if round % 7 == 0 {
                v[5] = 0.0;
                acc[5] = 0.0;
            }
            let vs = 0.75f32;
            let want: Vec<f32> = acc.iter().zip(&v).map(|(&o, &x)| round_f16(x.mul_add(vs, o))).collect();
            map_rounded_f16(&mut acc, |i, o| v[i].mul_add(vs, o));
            for (i, (g, w)) in acc.iter().zip(&want).enumerate() {
                assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "round {round} lane {i}: {g:e} vs {w:e}");
            }
        }
    }

    #[test]
    fn fast_rounding_equals_half_conversion() {
        let mut state = 0x9e3779b97f4a7c15u64;
        for i in 0..200_000u32 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let x = f32::from_bits(state as u32);
            let x = if x.is_finite() { x } else { i as f32 * 0.37 - 1000.0 };
            let want = half::f16::from_f32(x).to_f32();
            let got = round_f16(x);
            assert!(got == want || (got.is_nan() && want.is_nan()), "{x:e}: {got:e} vs {want:e}");
        }
    }
}
