//! Causal attention over the paged KV cache, with GQA (query heads share KV heads) and sliding
//! windows.
//!
//! Keys and values are read straight from the pool's blocks through the sequence's block table,
//! in their stored type: each task decodes one block (16 positions) of its KV head's slice at a
//! time into a small f32 tile that stays in L1, and uses it for every query head and token of the
//! task. Nothing proportional to the context is copied per layer and step.
//!
//! The quantized types store every 32-value block rotated by H = `hadamard32` (orthonormal and
//! symmetric, so H = H⁻¹ = Hᵀ), and attention works in that rotated domain instead of undoing the
//! rotation row by row: a score is q · k = (H q) · (H k), so each query is rotated once per task
//! and dotted with the stored rows as decoded; the output is Σ p_j v_j = H (Σ p_j (H v_j)), so
//! the weighted sum runs over the stored rows and is rotated back once per query. The value
//! offset such a pool subtracted is added to the output once (the weights sum to 1). Same result
//! as decoding every row back to its unrotated values in real arithmetic; in f32 the two differ by
//! rounding only (see tests.rs for the measured error).
//!
//! One path for every query, in f32: scores, an exact two-pass softmax, then the weighted sum of
//! V, each over the positions in order. A query's result depends only on its sequence and
//! position — never on how many other queries share the step, nor on how the work is split into
//! tasks — so continuous batching, chunked prefill and speculative verification cannot change
//! outputs. (ggml's CPU kernel instead switches between an f16 path for small batches and f32 for
//! large ones; our goldens and perplexity stay within their tolerances of llama.cpp either way,
//! see tests/.)

mod ggml_f16;
mod rows;
mod simd;
#[cfg(test)]
mod tests;

use crate::fma::with_fma;
use crate::{CpuError, Numerics, GGML_FA_TILE_Q};
use hearth_core::graph::AttentionParams;
use hearth_core::kv::{hadamard32, KvType};
use rows::{decode_tile, HeadCols};
use std::cell::RefCell;

#[cfg(not(target_arch = "wasm32"))]
use rayon::prelude::*;

/// One layer's K/V of one sequence, as stored in the pool. `KvStore::paged` builds it and
/// checks that the block table covers the positions attention will read.
#[derive(Clone, Copy)]
pub struct PagedKv<'a> {
    /// The layer's K and V pools: [n_blocks, block_size, row] stored rows.
    pub k: &'a [u8],
    pub v: &'a [u8],
    /// Bytes of one stored K / V row.
    pub k_row: usize,
    pub v_row: usize,
    pub kv_type: KvType,
    pub block_size: usize,
    /// Block of positions `i * block_size..` at index i.
    pub block_table: &'a [u32],
    /// Added back to every decoded value: [n_head_kv * head_dim] (only for a pool that
    /// subtracted it at store time).
    pub v_offset: Option<&'a [f32]>,
}

/// Tokens per task in a multi-token step: bounds the task's scores to
/// TOKENS_PER_TASK * heads * context floats while sharing each decoded tile among them.
const TOKENS_PER_TASK: usize = 16;

/// One unit of parallel work: tokens `t0..t0 + n_tokens` of the sequence and query heads
/// `h0..h0 + n_heads`, all of which read the same KV head.
#[derive(Clone, Copy)]
struct Task {
    t0: usize,
    n_tokens: usize,
    h0: usize,
    n_heads: usize,
}

/// One sequence's queries: q, out: [n_tokens, n_head * head_dim]. Token t sits at position
/// pos0 + t and sees positions max(0, p - window + 1)..=p, all of which `kv` covers. `sinks`
/// ([n_head], the layer's [`AttentionParams::sinks`] values) join each head's softmax.
///
/// With [`Numerics::LlamaCpp`], f16 KV, fewer than 64 tokens and a head size that is a multiple of
/// 64, each task runs ggml's f16 flash attention instead (ggml_f16.rs).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    kv: PagedKv<'_>,
    p: &AttentionParams,
    sinks: Option<&[f32]>,
    pos0: usize,
    n_tokens: usize,
    numerics: Numerics,
    out: &mut [f32],
) -> Result<(), CpuError> {
    let hd = p.head_dim;
    if p.n_head.checked_rem(p.n_head_kv) != Some(0) || hd == 0 {
        return Err(CpuError::BadKv(format!(
            "attention with {} query heads over {} KV heads of {hd}",
            p.n_head, p.n_head_kv
        )));
    }
    let q_width = p.n_head * hd;
    let (vd, out_width) = (p.v_dim(), p.n_head * p.v_dim());
    if q.len() < n_tokens * q_width || out.len() < n_tokens * out_width {
        return Err(CpuError::BadKv(format!("attention of {n_tokens} tokens over query rows of {} values", q.len())));
    }
    if sinks.is_some_and(|s| s.len() != p.n_head) {
        return Err(CpuError::BadKv(format!("attention sinks for {} query heads", p.n_head)));
    }
    let tasks = split_tasks(p, n_tokens);
    let head = HeadContext { q, kv, p, sinks, pos0 };
    let ggml_f16 = numerics == Numerics::LlamaCpp
        && kv.kv_type == KvType::F16
        && n_tokens < GGML_FA_TILE_Q
        && hd.is_multiple_of(64);
    let task = |t: &Task| if ggml_f16 { ggml_f16::attend_task(&head, *t) } else { with_fma!(attend_task(&head, *t)) };
    // [task tokens, task heads, head_dim] per task.
    #[cfg(not(target_arch = "wasm32"))]
    let results: Vec<Vec<f32>> = tasks.par_iter().map(task).collect();
    #[cfg(target_arch = "wasm32")]
    let results: Vec<Vec<f32>> = tasks.iter().map(task).collect();
    for (t, result) in tasks.iter().zip(&results) {
        for (i, rows) in result.chunks_exact(t.n_heads * vd).enumerate() {
            let start = (t.t0 + i) * out_width + t.h0 * vd;
            out[start..start + rows.len()].copy_from_slice(rows);
        }
    }
    Ok(())
}

/// Tasks of at most TOKENS_PER_TASK tokens and one KV head's query heads, the latter split
/// further when there are fewer tasks than threads (decode of a model with few KV heads).
fn split_tasks(p: &AttentionParams, n_tokens: usize) -> Vec<Task> {
    let group = p.n_head / p.n_head_kv;
    let token_chunks = n_tokens.div_ceil(TOKENS_PER_TASK);
    #[cfg(not(target_arch = "wasm32"))]
    let threads = rayon::current_num_threads();
    #[cfg(target_arch = "wasm32")]
    let threads: usize = 1;
    let splits = threads.div_ceil(token_chunks * p.n_head_kv).clamp(1, group);
    let heads_per_task = group.div_ceil(splits);
    let mut tasks = Vec::new();
    for t0 in (0..n_tokens).step_by(TOKENS_PER_TASK) {
        for kv_head in 0..p.n_head_kv {
            for h0 in (kv_head * group..(kv_head + 1) * group).step_by(heads_per_task) {
                let n_heads = heads_per_task.min((kv_head + 1) * group - h0);
                tasks.push(Task { t0, n_tokens: TOKENS_PER_TASK.min(n_tokens - t0), h0, n_heads });
            }
        }
    }
    tasks
}

struct HeadContext<'a> {
    q: &'a [f32],
    kv: PagedKv<'a>,
    p: &'a AttentionParams,
    /// [n_head] the sink logit of each query head (gpt-oss), if any.
    sinks: Option<&'a [f32]>,
    pos0: usize,
}

/// A task's working memory, reused across tasks of a thread.
#[derive(Default)]
struct Scratch {
    /// [task tokens, task heads, span] scores, then softmax weights, of each query over the
    /// task's span of positions.
    scores: Vec<f32>,
    /// [task tokens, task heads] running maximum, then sum of exponentials.
    max: Vec<f32>,
    sum: Vec<f32>,
    /// [positions of one block, decoded columns] K or V rows of the task's KV head, as stored
    /// (rotated, for the quantized types).
    tile: Vec<f32>,
    /// [task tokens, task heads, decoded columns] the queries placed at their head's columns of
    /// the decoded blocks and rotated like the stored rows (quantized types only).
    rotated_queries: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The blocks of positions `lo..=hi`: (first, last) position of each, in order.
fn blocks(lo: usize, hi: usize, block_size: usize) -> impl Iterator<Item = (usize, usize)> {
    (lo / block_size..=hi / block_size)
        .map(move |b| ((b * block_size).max(lo), (b * block_size + block_size - 1).min(hi)))
}

/// One task; returns [task tokens, task heads, v_dim].
#[inline(always)]
fn attend_task(c: &HeadContext<'_>, task: Task) -> Vec<f32> {
    let p = c.p;
    let (hd, vd) = (p.head_dim, p.v_dim());
    let q_width = p.n_head * hd;
    let kv_head = task.h0 / (p.n_head / p.n_head_kv);
    let cols = HeadCols::new(c.kv.kv_type, kv_head * hd, hd);
    let width = cols.width();
    // The head's value columns, and their decoded width.
    let vcols = HeadCols::new(c.kv.kv_type, kv_head * vd, vd);
    let vwidth = vcols.width();
    // Token t sees positions lo(t)..=pos(t); the task's span covers all of its tokens.
    let pos_of = |t: usize| c.pos0 + t;
    let lo_of = |t: usize| p.window.map_or(0, |w| (pos_of(t) + 1).saturating_sub(w));
    let (span_lo, span_hi) = (lo_of(task.t0), pos_of(task.t0 + task.n_tokens - 1));
    let span = span_hi + 1 - span_lo;
    let n_queries = task.n_tokens * task.n_heads;
    let query = |i: usize| {
        let (t, h) = (task.t0 + i / task.n_heads, task.h0 + i % task.n_heads);
        &c.q[t * q_width + h * hd..t * q_width + (h + 1) * hd]
    };
    // [task tokens, task heads, vwidth] weighted sums of V rows as decoded (still rotated for the
    // quantized types); vwidth == v_dim for the others.
    let mut acc = vec![0f32; n_queries * vwidth];
    // The scratch is taken out of the thread-local so that the loops below stay in this
    // function, which is inlined into its caller's AVX2 context (code inside a `with` closure is
    // compiled without it: scalar, not vectorised, in the profile).
    let mut s = SCRATCH.with_borrow_mut(std::mem::take);
    s.scores.resize(n_queries * span, 0.0);
    s.max.clear();
    s.max.resize(n_queries, f32::NEG_INFINITY);
    s.sum.clear();
    s.sum.resize(n_queries, 0.0);
    let rotated = c.kv.kv_type.rotates();
    if rotated {
        // H q over the decoded columns: zero outside the head, so q_ext · k_row = q · k_head.
        s.rotated_queries.clear();
        s.rotated_queries.resize(n_queries * width, 0.0);
        for (i, q) in s.rotated_queries.chunks_exact_mut(width).enumerate() {
            q[cols.skip..cols.skip + hd].copy_from_slice(query(i));
            hadamard32(q);
        }
    }

    // Scores, block by block of K. (Locals, so that the loop does not reload them after every
    // store of a score.)
    let (scale, softcap) = (p.scale, p.softcap);
    for (first, last) in blocks(span_lo, span_hi, c.kv.block_size) {
        decode_tile(&c.kv, false, cols, first, last, &mut s.tile);
        for i in 0..n_queries {
            let t = task.t0 + i / task.n_heads;
            let (lo, hi) = (lo_of(t).max(first), pos_of(t).min(last));
            // Both [width]: the unrotated types decode exactly the head's columns.
            let q = if rotated { &s.rotated_queries[i * width..(i + 1) * width] } else { query(i) };
            if lo > hi {
                continue;
            }
            let scores = &mut s.scores[i * span + lo - span_lo..=i * span + hi - span_lo];
            simd::dots(q, &s.tile[(lo - first) * width..(hi - first + 1) * width], width, scores);
            s.max[i] = match softcap {
                None => simd::scale_and_max(scores, scale, s.max[i]),
                Some(cap) => scores.iter_mut().fold(s.max[i], |max, score| {
                    *score = cap * (*score * scale / cap).tanh();
                    max.max(*score)
                }),
            };
        }
    }
    // Softmax weights, each query over its positions in order: the exponentials first, then
    // their sum in order. (In one loop, every `exp` call waited for the running sum, spilled
    // around the call: a third of prefill attention's time at 1k context.)
    // A sink joins the maximum and the sum, as a score with no value would.
    for i in 0..n_queries {
        let t = task.t0 + i / task.n_heads;
        let sink = c.sinks.map(|sinks| sinks[task.h0 + i % task.n_heads]);
        let max = sink.map_or(s.max[i], |sink| s.max[i].max(sink));
        let weights = &mut s.scores[i * span + lo_of(t) - span_lo..=i * span + pos_of(t) - span_lo];
        weights.iter_mut().for_each(|w| *w = (*w - max).exp());
        s.sum[i] = weights.iter().fold(0f32, |sum, &w| sum + w) + sink.map_or(0.0, |sink| (sink - max).exp());
    }
    // Weighted sum of V, block by block.
    for (first, last) in blocks(span_lo, span_hi, c.kv.block_size) {
        decode_tile(&c.kv, true, vcols, first, last, &mut s.tile);
        for (i, acc) in acc.chunks_exact_mut(vwidth).enumerate() {
            let t = task.t0 + i / task.n_heads;
            let (lo, hi) = (lo_of(t).max(first), pos_of(t).min(last));
            if lo <= hi {
                let weights = &s.scores[i * span + lo - span_lo..=i * span + hi - span_lo];
                simd::weighted_sum(acc, weights, &s.tile[(lo - first) * vwidth..(hi - first + 1) * vwidth]);
            }
        }
    }
    for (acc, &sum) in acc.chunks_exact_mut(vwidth).zip(&s.sum) {
        if rotated {
            hadamard32(acc);
        }
        let inv = 1.0 / sum;
        acc.iter_mut().for_each(|o| *o *= inv);
    }
    SCRATCH.with_borrow_mut(|scratch| *scratch = s);
    let mut out = if vwidth == vd {
        acc
    } else {
        acc.chunks_exact(vwidth).flat_map(|row| &row[vcols.skip..vcols.skip + vd]).copied().collect()
    };
    if let Some(offset) = c.kv.v_offset {
        // [v_dim] of the task's KV head, added once per query: Σ p_j (v_j + o) / Σ p_j = … + o.
        let offset = &offset[kv_head * vd..(kv_head + 1) * vd];
        for out in out.chunks_exact_mut(vd) {
            out.iter_mut().zip(offset).for_each(|(o, b)| *o += b);
        }
    }
    out
}
