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

mod rows;
mod softmax;
#[cfg(test)]
mod tests;

use crate::CpuError;
use hearth_core::graph::AttentionParams;
use hearth_core::kv::{hadamard32, KvType};
use rows::{decode_tile, HeadCols};
use softmax::exp_and_sum;
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
/// pos0 + t and sees positions max(0, p - window + 1)..=p, all of which `kv` covers.
pub fn attention(q: &[f32], kv: PagedKv<'_>, p: &AttentionParams, pos0: usize, n_tokens: usize, out: &mut [f32]) -> Result<(), CpuError> {
    let hd = p.head_dim;
    if p.n_head.checked_rem(p.n_head_kv) != Some(0) || hd == 0 {
        return Err(CpuError::BadKv(format!("attention with {} query heads over {} KV heads of {hd}", p.n_head, p.n_head_kv)));
    }
    let q_width = p.n_head * hd;
    if q.len() < n_tokens * q_width || out.len() < n_tokens * q_width {
        return Err(CpuError::BadKv(format!("attention of {n_tokens} tokens over query rows of {} values", q.len())));
    }
    let tasks = split_tasks(p, n_tokens);
    let head = HeadContext { q, kv, p, pos0 };
    let task = |t: &Task| attend_task_dispatch(&head, *t);
    // [task tokens, task heads, head_dim] per task.
    #[cfg(not(target_arch = "wasm32"))]
    let results: Vec<Vec<f32>> = tasks.par_iter().map(task).collect();
    #[cfg(target_arch = "wasm32")]
    let results: Vec<Vec<f32>> = tasks.iter().map(task).collect();
    for (t, result) in tasks.iter().zip(&results) {
        for (i, rows) in result.chunks_exact(t.n_heads * hd).enumerate() {
            let start = (t.t0 + i) * q_width + t.h0 * hd;
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
    /// [decoded columns, KEYS] up to KEYS rows of `tile`, transposed.
    keys_t: Vec<f32>,
    /// [task tokens, task heads, decoded columns] the queries placed at their head's columns of
    /// the decoded blocks and rotated like the stored rows (quantized types only).
    rotated_queries: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The blocks of positions `lo..=hi`: (first, last) position of each, in order.
fn blocks(lo: usize, hi: usize, block_size: usize) -> impl Iterator<Item = (usize, usize)> {
    (lo / block_size..=hi / block_size).map(move |b| ((b * block_size).max(lo), (b * block_size + block_size - 1).min(hi)))
}

/// `attend_task` through a copy compiled with AVX2 and FMA when the CPU has them. (Not
/// `with_fma!`: its closure, which holds the body, stops being inlined into the FMA copy once the
/// body grows, and then every `mul_add` is a libm call.)
fn attend_task_dispatch(c: &HeadContext<'_>, task: Task) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if crate::fma::available() {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fused(c: &HeadContext<'_>, task: Task) -> Vec<f32> {
            attend_task(c, task)
        }
        // SAFETY: AVX2 and FMA are present (checked above).
        return unsafe { fused(c, task) };
    }
    attend_task(c, task)
}

/// One task; returns [task tokens, task heads, head_dim].
#[inline(always)]
fn attend_task(c: &HeadContext<'_>, task: Task) -> Vec<f32> {
    let p = c.p;
    let hd = p.head_dim;
    let q_width = p.n_head * hd;
    let kv_head = task.h0 / (p.n_head / p.n_head_kv);
    let cols = HeadCols::new(c.kv.kv_type, kv_head * hd, hd);
    let width = cols.width();
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
    // [task tokens, task heads, width] weighted sums of V rows as decoded (still rotated for the
    // quantized types); width == head_dim for the others.
    let mut acc = vec![0f32; n_queries * width];
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

    // Scores, block by block of K, each block transposed once into [width, KEYS] micro-tiles
    // so that a score is one FMA chain over the columns in order (see `score_tile`).
    let (scale, softcap) = (p.scale, p.softcap);
    let query_of = |i: usize| -> &[f32] { if rotated { &s.rotated_queries[i * width..(i + 1) * width] } else { query(i) } };
    for (first, last) in blocks(span_lo, span_hi, c.kv.block_size) {
        decode_tile(&c.kv, false, cols, first, last, &mut s.tile);
        for key0 in (first..=last).step_by(KEYS) {
            let key1 = (key0 + KEYS - 1).min(last);
            transpose_keys(&s.tile[(key0 - first) * width..(key1 + 1 - first) * width], width, &mut s.keys_t);
            for g in (0..n_queries).step_by(QUERY_ROWS) {
                let rows = QUERY_ROWS.min(n_queries - g);
                let t_of = |r: usize| task.t0 + (g + r) / task.n_heads;
                // Rows sorted by token: the group sees some key of this tile iff its last token
                // reaches key0 and its first token's window reaches key1.
                if pos_of(t_of(rows - 1)) < key0 || lo_of(t_of(0)) > key1 {
                    continue;
                }
                // Missing rows repeat the first (their scores are dropped).
                // (Not `array::from_fn`: it is not inlined into the FMA copy.)
                let pick = |r: usize| query_of(g + if r < rows { r } else { 0 });
                let queries: [&[f32]; QUERY_ROWS] = [pick(0), pick(1), pick(2), pick(3)];
                let tile_scores = score_tile(queries, &s.keys_t, width);
                for (r, row_scores) in tile_scores.iter().enumerate().take(rows) {
                    let (i, t) = (g + r, t_of(r));
                    let (lo, hi) = (lo_of(t).max(key0), pos_of(t).min(key1));
                    let mut max = s.max[i];
                    for j in lo..=hi {
                        let score = row_scores[j - key0] * scale;
                        let score = match softcap {
                            Some(cap) => cap * (score / cap).tanh(),
                            None => score,
                        };
                        max = max.max(score);
                        s.scores[i * span + j - span_lo] = score;
                    }
                    s.max[i] = max;
                }
            }
        }
    }
    // Softmax weights, each query over its positions in order.
    for i in 0..n_queries {
        let t = task.t0 + i / task.n_heads;
        s.sum[i] = exp_and_sum(&mut s.scores[i * span + lo_of(t) - span_lo..=i * span + pos_of(t) - span_lo], s.max[i]);
    }
    // Weighted sum of V, block by block: per query and column, one FMA chain over the
    // positions in order.
    for (first, last) in blocks(span_lo, span_hi, c.kv.block_size) {
        decode_tile(&c.kv, true, cols, first, last, &mut s.tile);
        for (i, acc) in acc.chunks_exact_mut(width).enumerate() {
            let t = task.t0 + i / task.n_heads;
            let (lo, hi) = (lo_of(t).max(first), pos_of(t).min(last));
            if lo > hi {
                continue;
            }
            let weights = &s.scores[i * span + lo - span_lo..=i * span + hi - span_lo];
            accumulate_values(acc, weights, &s.tile[(lo - first) * width..(hi + 1 - first) * width]);
        }
    }
    for (acc, &sum) in acc.chunks_exact_mut(width).zip(&s.sum) {
        if rotated {
            hadamard32(acc);
        }
        let inv = 1.0 / sum;
        acc.iter_mut().for_each(|o| *o *= inv);
    }
    SCRATCH.with_borrow_mut(|scratch| *scratch = s);
    let mut out = if width == hd { acc } else { acc.chunks_exact(width).flat_map(|row| &row[cols.skip..cols.skip + hd]).copied().collect() };
    if let Some(offset) = c.kv.v_offset {
        // [head_dim] of the task's KV head, added once per query: Σ p_j (v_j + o) / Σ p_j = … + o.
        let offset = &offset[kv_head * hd..(kv_head + 1) * hd];
        for out in out.chunks_exact_mut(hd) {
            out.iter_mut().zip(offset).for_each(|(o, b)| *o += b);
        }
    }
    out
}

/// Keys per score micro-tile, and queries scored against it at once: QUERY_ROWS x KEYS
/// accumulators (8 AVX2 registers) over the columns.
const KEYS: usize = 16;
const QUERY_ROWS: usize = 4;

/// a * b + c, fused (one rounding) where the target has FMA in its baseline or the caller's
/// `with_fma!` copy runs (x86_64 without FMA: libm's correctly rounded `fmaf`, same bits, slow);
/// unfused elsewhere (wasm has no FMA, and a software one per multiply would cost more than the
/// whole kernel). Either way every query's chains are the same, whatever the batch.
#[inline(always)]
fn madd(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    return a.mul_add(b, c);
    #[cfg(not(target_arch = "x86_64"))]
    return a * b + c;
}

/// rows: [n <= KEYS, width] keys into keys_t: [width, KEYS], zero past row n. 8x8 blocks go
/// through AVX shuffles when the CPU has AVX2 (element by element, the transpose cost a decode
/// step with few queries per task, e.g. Gemma's 256-wide heads, more than its scores).
#[inline(always)]
fn transpose_keys(rows: &[f32], width: usize, keys_t: &mut Vec<f32>) {
    keys_t.clear();
    keys_t.resize(width * KEYS, 0.0);
    let n = (rows.len() / width).min(KEYS);
    #[allow(unused_mut)]
    let (mut simd_rows, mut simd_cols) = (0, 0);
    #[cfg(target_arch = "x86_64")]
    if crate::fma::available() {
        (simd_rows, simd_cols) = (n / 8 * 8, width / 8 * 8);
        for j0 in (0..simd_rows).step_by(8) {
            for d0 in (0..simd_cols).step_by(8) {
                // SAFETY: AVX is present (checked above); rows j0..j0 + 8 < n and columns
                // d0..d0 + 8 <= width are inside `rows`, and keys_t[(d0 + i) * KEYS + j0..][..8]
                // inside keys_t (j0 + 8 <= n <= KEYS, d0 + i < width).
                unsafe { transpose_8x8(rows.as_ptr().add(j0 * width + d0), width, keys_t.as_mut_ptr().add(d0 * KEYS + j0)) };
            }
        }
    }
    for (j, row) in rows.chunks_exact(width).take(n).enumerate() {
        let first_col = if j < simd_rows { simd_cols } else { 0 };
        for (d, &x) in row.iter().enumerate().skip(first_col) {
            keys_t[d * KEYS + j] = x;
        }
    }
}

/// dst[i * KEYS + r] = src[r * src_stride + i] for r, i < 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_8x8(src: *const f32, src_stride: usize, dst: *mut f32) {
    use std::arch::x86_64::*;
    let r = |i: usize| _mm256_loadu_ps(src.add(i * src_stride));
    let (r0, r1, r2, r3, r4, r5, r6, r7) = (r(0), r(1), r(2), r(3), r(4), r(5), r(6), r(7));
    // Pairs of rows interleaved, then 4-row column pieces per 128-bit half, then halves joined.
    let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
    let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
    let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
    let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
    let (s0, s1) = (_mm256_shuffle_ps::<0x44>(t0, t2), _mm256_shuffle_ps::<0xEE>(t0, t2));
    let (s2, s3) = (_mm256_shuffle_ps::<0x44>(t1, t3), _mm256_shuffle_ps::<0xEE>(t1, t3));
    let (s4, s5) = (_mm256_shuffle_ps::<0x44>(t4, t6), _mm256_shuffle_ps::<0xEE>(t4, t6));
    let (s6, s7) = (_mm256_shuffle_ps::<0x44>(t5, t7), _mm256_shuffle_ps::<0xEE>(t5, t7));
    let columns = [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ];
    for (i, column) in columns.into_iter().enumerate() {
        _mm256_storeu_ps(dst.add(i * KEYS), column);
    }
}

/// Dot products of QUERY_ROWS queries ([width] each) with the KEYS keys of keys_t: [width, KEYS]:
/// each one FMA chain over the columns in order, so a score depends on its query and key only.
#[inline(always)]
fn score_tile(queries: [&[f32]; QUERY_ROWS], keys_t: &[f32], width: usize) -> [[f32; KEYS]; QUERY_ROWS] {
    let mut acc = [[0f32; KEYS]; QUERY_ROWS];
    let queries = queries.map(|q| &q[..width]);
    for (d, keys) in keys_t[..width * KEYS].chunks_exact(KEYS).enumerate() {
        for (acc, q) in acc.iter_mut().zip(&queries) {
            let q = q[d];
            for (a, &k) in acc.iter_mut().zip(keys) {
                *a = madd(q, k, *a);
            }
        }
    }
    acc
}

/// acc: [width] += Σ_j weights[j] * values[j] (values: [weights.len(), width]), one FMA chain
/// per column over j in order: 64 columns at a time (8 AVX2 registers, enough independent
/// chains to hide the FMA latency), then 32, then one; the chains are the same either way.
#[inline(always)]
fn accumulate_values(acc: &mut [f32], weights: &[f32], values: &[f32]) {
    let width = acc.len();
    let wide = width / 64 * 64;
    accumulate_columns::<64>(acc, weights, values, 0, wide);
    let narrow = wide + (width - wide) / 32 * 32;
    accumulate_columns::<32>(acc, weights, values, wide, narrow);
    for (c, a) in acc.iter_mut().enumerate().skip(narrow) {
        for (&w, row) in weights.iter().zip(values.chunks_exact(width)) {
            *a = madd(w, row[c], *a);
        }
    }
}

/// Columns c0..c1 (a multiple of COLS) of `accumulate_values`, COLS at a time in registers.
#[inline(always)]
fn accumulate_columns<const COLS: usize>(acc: &mut [f32], weights: &[f32], values: &[f32], c0: usize, c1: usize) {
    let width = acc.len();
    for c in (c0..c1).step_by(COLS) {
        let mut sum = [0f32; COLS];
        sum.copy_from_slice(&acc[c..c + COLS]);
        for (&w, row) in weights.iter().zip(values.chunks_exact(width)) {
            for (a, &v) in sum.iter_mut().zip(&row[c..c + COLS]) {
                *a = madd(w, v, *a);
            }
        }
        acc[c..c + COLS].copy_from_slice(&sum);
    }
}
