//! Causal attention over the KV cache, with GQA (query heads share KV heads) and sliding windows.
//!
//! One path for every query, in f32: scores, an exact two-pass softmax, then the weighted sum of
//! V. A query's result depends only on its sequence and position — never on how many other
//! queries share the step — so continuous batching, chunked prefill and speculative
//! verification cannot change outputs. (ggml's CPU kernel instead switches between an f16 path
//! for small batches and f32 for large ones; our goldens and perplexity stay within their
//! tolerances of llama.cpp either way, see tests/.)

use crate::fma::with_fma;
use hearth_core::graph::AttentionParams;
use std::cell::RefCell;

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
    let head = HeadContext { q, kv, p, pos0 };
    let task = |(index, out_head): (usize, &mut [f32])| with_fma!(attend_head(&head, index, out_head));
    #[cfg(not(target_arch = "wasm32"))]
    out[..n_tokens * q_width].par_chunks_exact_mut(hd).enumerate().for_each(task);
    #[cfg(target_arch = "wasm32")]
    out[..n_tokens * q_width].chunks_exact_mut(hd).enumerate().for_each(task);
}

struct HeadContext<'a> {
    q: &'a [f32],
    kv: KvSpan<'a>,
    p: &'a AttentionParams,
    pos0: usize,
}

thread_local! {
    /// Scores of one query head over its keys (reused: attention runs per head and token).
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// One query head of one token: `index` = token * n_head + head; out_head: [head_dim].
#[inline(always)]
fn attend_head(c: &HeadContext<'_>, index: usize, out: &mut [f32]) {
    let p = c.p;
    let hd = p.head_dim;
    let q_width = p.n_head * hd;
    let kv_width = p.n_head_kv * hd;
    let (t, h) = (index / p.n_head, index % p.n_head);
    let col = h / (p.n_head / p.n_head_kv) * hd;
    let pos = c.pos0 + t;
    let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let q = &c.q[t * q_width + h * hd..t * q_width + (h + 1) * hd];
    // Row of position j in the span.
    let row = |data: &'_ [f32], j: usize| -> std::ops::Range<usize> {
        let start = (j - c.kv.first_pos) * kv_width + col;
        let _ = data;
        start..start + hd
    };
    // The buffer is taken out of the thread-local so that the loops below stay in this function,
    // which is inlined into its caller's AVX2 context (code inside a `with` closure is compiled
    // without it: scalar, not vectorised, in the profile).
    let mut scores = SCORES.with_borrow_mut(std::mem::take);
    {
        let scores = &mut scores;
        scores.clear();
        let mut max = f32::NEG_INFINITY;
        for j in lo..=pos {
            let s = dot(q, &c.kv.k[row(c.kv.k, j)]) * p.scale;
            let s = match p.softcap {
                Some(cap) => cap * (s / cap).tanh(),
                None => s,
            };
            max = max.max(s);
            scores.push(s);
        }
        let mut sum = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        out.iter_mut().for_each(|o| *o = 0.0);
        for (j, &w) in (lo..=pos).zip(scores.iter()) {
            out.iter_mut().zip(&c.kv.v[row(c.kv.v, j)]).for_each(|(o, v)| *o += w * v);
        }
        let inv = 1.0 / sum;
        out.iter_mut().for_each(|o| *o *= inv);
    }
    SCORES.with_borrow_mut(|s| *s = scores);
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators let the compiler vectorise without reassociation flags; the
    // order is fixed, so every build and batch gives the same result.
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in chunks * 8..a.len().min(b.len()) {
        s += a[i] * b[i];
    }
    s
}
