//! Element-wise and per-row ops. Numerics follow ggml's CPU path where it matters for matching
//! llama.cpp token for token (f64 sums in RMSNorm, iterated RoPE angles, GELU through f16).

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
        let sum: f64 = chunk.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let mean = (sum / group as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        match weight {
            Some(w) => chunk.iter_mut().zip(w).for_each(|(v, w)| *v = (*v * scale) * w),
            None => chunk.iter_mut().for_each(|v| *v *= scale),
        }
    }
}

/// In place over x: [n_tokens, n_heads * head_dim]; token t at position pos0 + t.
pub fn rope(x: &mut [f32], cols: usize, p: &RopeParams, freq_factors: Option<&[f32]>, pos0: usize) {
    let half_rot = p.n_rot / 2;
    let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
    let mut cos_sin = vec![(0f32, 0f32); half_rot];
    for (t, row) in x.chunks_exact_mut(cols).enumerate() {
        // Angles as ggml computes them: theta_i = pos * theta_scale^i by repeated multiplication.
        let mut theta = (pos0 + t) as f32;
        for (i, cs) in cos_sin.iter_mut().enumerate() {
            let ff = freq_factors.map_or(1.0, |f| f[i]);
            let angle = p.freq_scale * (theta / ff);
            *cs = (angle.cos(), angle.sin());
            theta *= theta_scale;
        }
        for head in row.chunks_exact_mut(p.head_dim) {
            match p.mode {
                RopeMode::Normal => {
                    for (i, &(c, s)) in cos_sin.iter().enumerate() {
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = a * c - b * s;
                        head[2 * i + 1] = a * s + b * c;
                    }
                }
                RopeMode::Neox => {
                    for (i, &(c, s)) in cos_sin.iter().enumerate() {
                        let (a, b) = (head[i], head[i + half_rot]);
                        head[i] = a * c - b * s;
                        head[i + half_rot] = a * s + b * c;
                    }
                }
            }
        }
    }
}

/// Copies values rounded to f16 precision (the precision of llama.cpp's KV cache).
pub fn store_f16_rounded(src: &[f32], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(s).to_f32();
    }
}

pub fn add_assign(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// gate = silu(gate) * up.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_COEF_A: f32 = 0.044715;

fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// gate = gelu(gate) * up, with GELU evaluated on the f16-rounded input and rounded to f16, as
/// ggml's table-driven CPU GELU does.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        let x = *g;
        let y = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x
        } else {
            f16::from_f32(gelu_tanh(f16::from_f32(x).to_f32())).to_f32()
        };
        *g = y * u;
    }
}
