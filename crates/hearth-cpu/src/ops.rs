//! Element-wise and per-row ops. Numerics follow ggml's CPU path where it matters for matching
//! llama.cpp token for token (f64 sums in RMSNorm, iterated RoPE angles, GELU through f16).

use crate::fma::with_fma;
use crate::weights::CpuWeight;
use crate::CpuError;
use half::f16;
use hearth_core::graph::{RopeMode, RopeParams};
use hearth_core::quant::dequantize_row;
use hearth_core::Result;

/// out: [n_tokens, n_embd] rows of the (quantized) table.
pub fn embed(table: &CpuWeight, tokens: &[u32], out: &mut [f32]) -> Result<()> {
    let cols = table.desc.row_len();
    let rows = table.desc.n_rows();
    for (t, &tok) in tokens.iter().enumerate() {
        if tok as usize >= rows {
            return Err(CpuError::TokenOutOfRange { token: tok, rows }.into());
        }
        dequantize_row(table.desc.ty, table.row(tok as usize), &mut out[t * cols..(t + 1) * cols])?;
    }
    Ok(())
}

/// In place: each `group` values scaled to unit RMS, then times `weight` (length `group`).
pub fn rms_norm(x: &mut [f32], group: usize, eps: f32, weight: Option<&[f32]>) {
    for chunk in x.chunks_exact_mut(group) {
        // ggml squares in f32 and accumulates in f64 (ggml_float).
        let sum: f64 = chunk.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / group as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        match weight {
            Some(w) => chunk.iter_mut().zip(w).for_each(|(v, w)| *v = (*v * scale) * w),
            None => chunk.iter_mut().for_each(|v| *v *= scale),
        }
    }
}

/// (a, b) rotated by the angle of (cos c, sin s), with the fused multiply-adds GCC makes of ggml's
/// `x0*cos - x1*sin` and `x0*sin + x1*cos` (C++ compiled with the default -ffp-contract=fast):
/// the second product is rounded, the first is fused into the addition.
#[inline(always)]
fn rotate_pair(a: f32, b: f32, c: f32, s: f32) -> (f32, f32) {
    (a.mul_add(c, -(b * s)), a.mul_add(s, b * c))
}

/// In place over x: [n_tokens, n_heads * head_dim]; token t at position pos0 + t.
/// x: [n_tokens, cols], token t at position positions[t].
pub fn rope(x: &mut [f32], cols: usize, p: &RopeParams, freq_factors: Option<&[f32]>, positions: &[usize]) {
    with_fma!(rope_body(x, cols, p, freq_factors, positions))
}

#[inline(always)]
fn rope_body(x: &mut [f32], cols: usize, p: &RopeParams, freq_factors: Option<&[f32]>, positions: &[usize]) {
    let half_rot = p.n_rot / 2;
    let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
    let mut cos_sin = vec![(0f32, 0f32); half_rot];
    for (t, row) in x.chunks_exact_mut(cols).enumerate() {
        // Angles as ggml computes them: theta_i = pos * theta_scale^i by repeated multiplication.
        let mut theta = positions[t] as f32;
        for (i, cs) in cos_sin.iter_mut().enumerate() {
            let ff = freq_factors.map_or(1.0, |f| f[i]);
            let extrapolated = theta / ff;
            let interpolated = p.freq_scale * extrapolated;
            *cs = match &p.yarn {
                None => (interpolated.cos(), interpolated.sin()),
                Some(yarn) => {
                    let mix = yarn.mix(i);
                    let angle = interpolated * (1.0 - mix) + extrapolated * mix;
                    (angle.cos() * yarn.mscale, angle.sin() * yarn.mscale)
                }
            };
            theta *= theta_scale;
        }
        for head in row.chunks_exact_mut(p.head_dim) {
            match p.mode {
                RopeMode::Normal => {
                    for (i, &(c, s)) in cos_sin.iter().enumerate() {
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        (head[2 * i], head[2 * i + 1]) = rotate_pair(a, b, c, s);
                    }
                }
                RopeMode::Neox => {
                    for (i, &(c, s)) in cos_sin.iter().enumerate() {
                        let (a, b) = (head[i], head[i + half_rot]);
                        (head[i], head[i + half_rot]) = rotate_pair(a, b, c, s);
                    }
                }
            }
        }
    }
}

pub fn add_assign(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// gate = silu(gate) * up, as ggml's `ggml_vec_swiglu_f32` computes it on an AVX-512 CPU (the
/// reference llama.cpp build): blocks of 16 use ggml's polynomial `ggml_v_expf`, the tail (fewer
/// than 16 values) uses libm's `expf`. The polynomial differs from libm by an ulp or so, and such
/// differences flip roundings in the next layer's 8-bit activations and then grow through the model
/// (~0.05 nats on Qwen2.5-0.5B's log-probs), so we match it value for value. Row by row
/// (`cols` values each), as ggml does: a row's blocks start at its first value, so its result
/// never depends on the rows beside it.
pub fn swiglu(gate: &mut [f32], up: &[f32], cols: usize) {
    if cols == 0 {
        return;
    }
    for_each_rows(gate, up, cols, |gate, up| {
        for (g, u) in gate.chunks_exact_mut(cols).zip(up.chunks_exact(cols)) {
            with_fma!(swiglu_body(g, u))
        }
    })
}

/// Runs `f` over matching runs of whole rows (`cols` values each) of `gate` and `up`, on the
/// rayon pool when there are several (prompt chunks: `[n_tokens, n_ff]`); a decode row stays on
/// the calling thread, where a fork-join would cost more than the work.
fn for_each_rows(gate: &mut [f32], up: &[f32], cols: usize, f: impl Fn(&mut [f32], &[f32]) + Sync) {
    let chunk = (16 * 1024 / cols.max(1)).max(1) * cols.max(1);
    if gate.len() <= chunk {
        return f(gate, up);
    }
    // (A wasm build has one thread and no pool.)
    #[cfg(not(target_arch = "wasm32"))]
    {
        use rayon::prelude::*;
        gate.par_chunks_mut(chunk).zip(up.par_chunks(chunk)).for_each(|(g, u)| f(g, u));
    }
    #[cfg(target_arch = "wasm32")]
    gate.chunks_mut(chunk).zip(up.chunks(chunk)).for_each(|(g, u)| f(g, u));
}

#[inline(always)]
fn swiglu_body(gate: &mut [f32], up: &[f32]) {
    const LANES: usize = 16;
    let vec_len = gate.len().min(up.len()) / LANES * LANES;
    let (gate_vec, gate_tail) = gate.split_at_mut(vec_len);
    for (g, u) in gate_vec.iter_mut().zip(up) {
        *g = *g / (1.0 + ggml_v_expf(0.0 - *g)) * u;
    }
    for (g, u) in gate_tail.iter_mut().zip(&up[vec_len..]) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// One lane of ggml's AVX-512 `ggml_v_expf` (adapted from ARM's optimized routines): the same
/// constants and the same fused multiply-adds, so the result is bit-identical.
#[inline(always)]
fn ggml_v_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // 0x1.715476p+0 = log2(e)
    let n = z - r;
    // b = x - n*ln2_hi - n*ln2_lo, each step fused (fnmadd).
    let b = (-n).mul_add(f32::from_bits(0x35bf_be8e), (-n).mul_add(f32::from_bits(0x3f31_7200), x));
    let u = b * b;
    let c5 = f32::from_bits(0x3c07_2010); // 0x1.0e4020p-7
    let c4 = f32::from_bits(0x3d2b_9f17); // 0x1.573e2ep-5
    let c3 = f32::from_bits(0x3e2a_af33); // 0x1.555e66p-3
    let c2 = f32::from_bits(0x3eff_fedb); // 0x1.fffdb6p-2
    let c1 = f32::from_bits(0x3f7f_fff6); // 0x1.ffffecp-1
    let j = c5.mul_add(b, c4).mul_add(u, c3.mul_add(b, c2)).mul_add(u, c1.mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // _mm512_scalef_ps(j, n) = j * 2^n with a single rounding; exact in f64, rounded once to f32.
    // 2^n built from its bits (|n| ≤ 192 is well inside f64's exponent range): the same value
    // as `powi`, without a libm call per element.
    let two_n = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (j as f64 * two_n) as f32
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_COEF_A: f32 = 0.044715;

/// ggml's `ggml_gelu_f32` as GCC compiles it (default -ffp-contract=fast): `1 + a·x·x` is one
/// FMA, fma(a·x, x, 1). Unfused, some table entries came out one f16 step apart, and Gemma 3's
/// logits parted from llama.cpp's at the first activation that hit one.
fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// GELU of every f16 value (indexed by its bits), rounded to f16: ggml's `ggml_table_gelu_f16`.
/// 128 KiB, built on first use; one lookup replaces a `tanh` per element (GeGLU took 14% of
/// Gemma-3-270M's prefill computed directly).
fn gelu_f16_table() -> &'static [u16] {
    static TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX).map(|bits| f16::from_f32(gelu_tanh(f16::from_bits(bits).to_f32())).to_bits()).collect()
    })
}

/// GELU of `x` evaluated on the f16-rounded input and rounded to f16 (0 below -10, x above 10).
#[inline]
fn gelu_f16(table: &[u16], x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        f16::from_bits(table[f16::from_f32(x).to_bits() as usize]).to_f32()
    }
}

/// gate = gelu(gate) * up, with GELU evaluated on the f16-rounded input and rounded to f16, as
/// ggml's table-driven CPU GELU does.
/// out's rows: `groups` pairs of slices of a's and b's rows ([rows, cols_a] and [rows, cols_b]),
/// a's g-th slice then b's, for g = 0..groups.
pub fn concat(a: &[f32], b: &[f32], (cols_a, cols_b): (usize, usize), groups: usize, out: &mut [f32]) {
    let (ga, gb) = (cols_a / groups, cols_b / groups);
    for ((o, a), b) in out.chunks_exact_mut(cols_a + cols_b).zip(a.chunks_exact(cols_a)).zip(b.chunks_exact(cols_b)) {
        for ((o, a), b) in o.chunks_exact_mut(ga + gb).zip(a.chunks_exact(ga)).zip(b.chunks_exact(gb)) {
            o[..ga].copy_from_slice(a);
            o[ga..].copy_from_slice(b);
        }
    }
}

/// gate = gpt-oss's clamped SwiGLU of gate and up, as ggml's `swiglu_oai` computes it:
/// x = min(gate, limit), y = clamp(up, ±limit), x / (1 + e^(-alpha·x)) · (y + 1).
pub fn clamped_swiglu(gate: &mut [f32], up: &[f32], cols: usize, alpha: f32, limit: f32) {
    for_each_rows(gate, up, cols, |gate, up| {
        for (g, &u) in gate.iter_mut().zip(up) {
            let x = g.min(limit);
            let y = u.clamp(-limit, limit);
            *g = x / (1.0 + (alpha * -x).exp()) * (y + 1.0);
        }
    })
}

pub fn geglu(gate: &mut [f32], up: &[f32], cols: usize) {
    let table = gelu_f16_table();
    for_each_rows(gate, up, cols, |gate, up| {
        #[cfg(target_arch = "x86_64")]
        if f16c_available() {
            // SAFETY: AVX2 and F16C are present (checked).
            unsafe { geglu_f16c(table, gate, up) };
            return;
        }
        geglu_scalar(table, gate, up)
    })
}

fn geglu_scalar(table: &[u16], gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = gelu_f16(table, *g) * u;
    }
}

#[cfg(target_arch = "x86_64")]
fn f16c_available() -> bool {
    use std::sync::OnceLock;
    static F16C: OnceLock<bool> = OnceLock::new();
    *F16C.get_or_init(|| is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx2"))
}

/// [`geglu_scalar`] 8 values at a time: F16C rounds to f16 (nearest even, as `half` does) and
/// widens the looked-up results; the table lookups stay scalar. Equal to the scalar path bit for
/// bit (NaN in, NaN out). `half`'s scalar conversions made GeGLU 4.5% of Gemma-3's prefill.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn geglu_f16c(table: &[u16], gate: &mut [f32], up: &[f32]) {
    use core::arch::x86_64::*;
    let n = gate.len().min(up.len());
    let vec_len = n / 8 * 8;
    let (low, high) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let mut i = 0;
    while i < vec_len {
        let x = _mm256_loadu_ps(gate.as_ptr().add(i));
        let halves = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
        let mut idx = [0u16; 8];
        _mm_storeu_si128(idx.as_mut_ptr() as *mut __m128i, halves);
        let looked_up = idx.map(|h| table[h as usize]);
        let mut y = _mm256_cvtph_ps(_mm_loadu_si128(looked_up.as_ptr() as *const __m128i));
        // x >= 10: x itself; x <= -10: 0 (NaN compares false both ways: the table's NaN).
        y = _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_GE_OQ>(x, high));
        y = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, low), y);
        _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(y, _mm256_loadu_ps(up.as_ptr().add(i))));
        i += 8;
    }
    geglu_scalar(table, &mut gate[vec_len..n], &up[vec_len..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table lookup gives exactly the direct computation (f16 in, GELU, f16 out) for every
    /// finite f16 input, NaN for NaN, and the cut-offs outside [-10, 10].
    #[test]
    fn table_gelu_equals_direct_gelu_for_every_f16() {
        let table = gelu_f16_table();
        for bits in 0..=u16::MAX {
            let x = f16::from_bits(bits).to_f32();
            let got = gelu_f16(table, x);
            let want = if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x
            } else {
                f16::from_f32(gelu_tanh(x)).to_f32()
            };
            assert!(got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(), "x = {x}: {got} vs {want}");
        }
        // The vectorised path equals the scalar one on every f16 value, values between them,
        // the cut-offs and odd lengths.
        let mut inputs: Vec<f32> = (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).collect();
        inputs.extend((0..5000).map(|i| (i as f32 - 2500.0) * 0.004_321));
        inputs.extend([-10.0, 10.0, -10.000_001, 9.999_999, f32::INFINITY, f32::NEG_INFINITY, 65520.0, 1e-9]);
        let up: Vec<f32> = (0..inputs.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let (mut got, mut want) = (inputs.clone(), inputs.clone());
        geglu(&mut got, &up, inputs.len());
        geglu_scalar(table, &mut want, &up);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan(), "x = {}: {g} vs {w}", inputs[i]);
        }
        // Inputs between f16 values are rounded first, as ggml does.
        let x = 0.300_01_f32;
        assert_eq!(gelu_f16(table, x), f16::from_f32(gelu_tanh(f16::from_f32(x).to_f32())).to_f32());
    }
}
