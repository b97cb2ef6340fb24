//! ggml's CPU flash attention for f16 KV and fewer than 64 queries per batch
//! (`ggml_compute_forward_flash_attn_ext_f16_one_chunk` on an AVX-512 machine), for
//! [`crate::Numerics::LlamaCpp`]: the query rounded to f16; each score the f16 dot product of
//! `ggml_vec_dot_f16` (4 × 16 f32 lanes, FMA, reduced in ggml's order), scaled; an online softmax
//! (the running maximum M, sum S = S·ms + vs in one FMA) whose weighted V sum is an f16 vector,
//! rescaled by expf(M_old − M) at each new maximum and rounded to f16 after every position; the
//! result converted to f32 and divided by S.

use super::rows::decode_tile;
use super::{blocks, HeadContext, Task};
use half::f16;

/// Rounds to the nearest f16 and back.
fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// `ggml_vec_dot_f16` for rows of a multiple of 64 values (every head size here: 64, 128, 256),
/// compiled for AVX-512: 4 accumulators of 16 lanes over steps of 64, the 4 added pairwise
/// ((a0 + a2) + (a1 + a3)), then `_mm512_reduce_add_ps`'s tree (upper 8 + lower 8, upper 4 + lower
/// 4, then lanes 0 + 2, 1 + 3, and their sum).
fn dot_f16(k: &[f32], q: &[f32]) -> f32 {
    let mut acc = [[0f32; 16]; 4];
    for (kc, qc) in k.chunks_exact(64).zip(q.chunks_exact(64)) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, a) in lanes.iter_mut().enumerate() {
                *a = kc[16 * j + l].mul_add(qc[16 * j + l], *a);
            }
        }
    }
    let x: [f32; 16] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let t8: [f32; 8] = std::array::from_fn(|i| x[i + 8] + x[i]);
    let t4: [f32; 4] = std::array::from_fn(|i| t8[i + 4] + t8[i]);
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

/// One task of [`super::attention`] in ggml's arithmetic; returns [task tokens, task heads,
/// head_dim]. The caller checked: f16 KV (not rotated, so a decoded row is the head's columns)
/// and a head size that is a multiple of 64.
pub(super) fn attend_task(c: &HeadContext<'_>, task: Task) -> Vec<f32> {
    let p = c.p;
    let (hd, vd) = (p.head_dim, p.v_dim());
    let q_width = p.n_head * hd;
    let kv_head = task.h0 / (p.n_head / p.n_head_kv);
    let cols = super::rows::HeadCols::new(c.kv.kv_type, kv_head * hd, hd);
    let vcols = super::rows::HeadCols::new(c.kv.kv_type, kv_head * vd, vd);
    let pos_of = |t: usize| c.pos0 + t;
    let lo_of = |t: usize| p.window.map_or(0, |w| (pos_of(t) + 1).saturating_sub(w));
    let (span_lo, span_hi) = (lo_of(task.t0), pos_of(task.t0 + task.n_tokens - 1));
    // [span, head_dim] the task's K and V rows, as stored (f16 values).
    let (mut keys, mut values, mut tile) = (Vec::new(), Vec::new(), Vec::new());
    for (first, last) in blocks(span_lo, span_hi, c.kv.block_size) {
        decode_tile(&c.kv, false, cols, first, last, &mut tile);
        keys.extend_from_slice(&tile);
        decode_tile(&c.kv, true, vcols, first, last, &mut tile);
        values.extend_from_slice(&tile);
    }
    let n_queries = task.n_tokens * task.n_heads;
    let mut out = vec![0f32; n_queries * vd];
    for (i, out) in out.chunks_exact_mut(vd).enumerate() {
        let (t, h) = (task.t0 + i / task.n_heads, task.h0 + i % task.n_heads);
        let q: Vec<f32> = c.q[t * q_width + h * hd..t * q_width + (h + 1) * hd].iter().map(|&x| round_f16(x)).collect();
        let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
        // [v_dim] Σ v · expf(s − M), every element an f16 value.
        let mut acc = vec![0f32; vd];
        for pos in lo_of(t)..=pos_of(t) {
            let row = (pos - span_lo) * hd..(pos - span_lo + 1) * hd;
            let vrow = (pos - span_lo) * vd..(pos - span_lo + 1) * vd;
            let dot = dot_f16(&keys[row], &q);
            // ggml folds the cap into the scale: cap · tanh(dot · (scale / cap)).
            let score = match p.softcap {
                None => dot * p.scale,
                Some(cap) => cap * (dot * (p.scale / cap)).tanh(),
            };
            let (mut ms, mut vs) = (1f32, 1f32);
            if score > max {
                ms = (max - score).exp();
                max = score;
                acc.iter_mut().for_each(|a| *a = round_f16(*a * ms));
            } else {
                vs = (score - max).exp();
            }
            acc.iter_mut().zip(&values[vrow]).for_each(|(a, &v)| *a = round_f16(v.mul_add(vs, *a)));
            sum = sum.mul_add(ms, vs);
        }
        // ggml's correction for a sink, once the f16 sums are back in f32.
        if let Some(sink) = c.sinks.map(|sinks| sinks[h]) {
            let (mut ms, mut vs) = (1f32, 1f32);
            if sink > max {
                ms = (max - sink).exp();
                acc.iter_mut().for_each(|a| *a *= ms);
            } else {
                vs = (sink - max).exp();
            }
            sum = sum.mul_add(ms, vs);
        }
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        out.iter_mut().zip(&acc).for_each(|(o, &a)| *o = a * inv);
    }
    out
}
