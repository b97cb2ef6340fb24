//! Causal attention over the KV cache, with GQA (query heads share KV heads) and sliding windows.

use hearth_core::graph::AttentionParams;

#[cfg(not(target_arch = "wasm32"))]
use rayon::prelude::*;

/// q, out: [n_tokens, n_head * head_dim]; k_cache, v_cache: [capacity, n_head_kv * head_dim].
/// Token t sits at position pos0 + t and sees positions max(0, p - window + 1)..=p.
pub fn attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    p: &AttentionParams,
    pos0: usize,
    n_tokens: usize,
    out: &mut [f32],
) {
    let hd = p.head_dim;
    let q_width = p.n_head * hd;
    let kv_width = p.n_head_kv * hd;
    let group = p.n_head / p.n_head_kv;
    let task = |(index, out_head): (usize, &mut [f32])| {
        let (t, h) = (index / p.n_head, index % p.n_head);
        let kvh = h / group;
        let pos = pos0 + t;
        let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let q_head = &q[t * q_width + h * hd..t * q_width + (h + 1) * hd];
        let mut scores: Vec<f32> = (lo..=pos)
            .map(|j| {
                let k_row = &k_cache[j * kv_width + kvh * hd..j * kv_width + (kvh + 1) * hd];
                let s = dot(q_head, k_row) * p.scale;
                match p.softcap {
                    Some(c) => c * (s / c).tanh(),
                    None => s,
                }
            })
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f64;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s as f64;
        }
        let inv = (1.0 / sum) as f32;
        out_head.iter_mut().for_each(|o| *o = 0.0);
        for (j, &s) in (lo..=pos).zip(&scores) {
            let v_row = &v_cache[j * kv_width + kvh * hd..j * kv_width + (kvh + 1) * hd];
            let wgt = s * inv;
            out_head.iter_mut().zip(v_row).for_each(|(o, v)| *o += wgt * v);
        }
    };
    let heads = out[..n_tokens * q_width].chunks_exact_mut(hd).enumerate();
    #[cfg(not(target_arch = "wasm32"))]
    heads.par_bridge().for_each(task);
    #[cfg(target_arch = "wasm32")]
    heads.for_each(task);
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators let the compiler vectorise without reassociation flags.
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}
