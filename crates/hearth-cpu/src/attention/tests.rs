//! The paged attention against the implementation it replaced — gather the span into f32 rows
//! (`KvStore::gather`), then attend over them (`reference_attention`, the old kernel verbatim) —
//! on random K/V/Q, for every KV type, across block boundaries, with GQA, sliding windows
//! (released blocks included), soft-capping, value offsets and multi-token steps.
//!
//! f32 and f16 must match bit for bit. q8_0 and q4_0 attend in the rotated domain the blocks are
//! stored in (see mod.rs) while the gather un-rotates every row first: the same in real
//! arithmetic, so they must agree to f32 rounding. Measured over every case below (outputs up to
//! ~3; `HEARTH_PRINT_ATTENTION_ERROR=1 cargo test --release -p hearth-cpu --lib attention --
//! --nocapture` prints each): NMSE at most 6.1e-13 and absolute error at most 2.7e-6, both at
//! 1,030 positions (the error grows with the span; 1e-14..1e-13 and ~1e-6 below 100). The bounds,
//! 1e-11 and 1e-5, leave 16x and 3.7x of margin and stay far below what the quantization itself
//! changes.

use super::attention;
use super::simd::dot;
use crate::fma::with_fma;
use crate::kv_store::KvStore;
use hearth_core::backend::KvLayout;
use hearth_core::graph::{AttentionParams, SeqStep};
use hearth_core::kv::{KvGroup, KvType, NO_BLOCK};
use rayon::prelude::*;
use std::cell::RefCell;

const BLOCK_SIZE: usize = 16;

#[path = "../../tests/common/mod.rs"]
mod common;
use common::Rng;

/// The old kernel's span: a sequence's keys and values from position `first_pos` on.
struct KvSpan<'a> {
    k: &'a [f32],
    v: &'a [f32],
    first_pos: usize,
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The attention kernel before paging, unchanged: over contiguous f32 rows.
fn reference_attention(q: &[f32], kv: KvSpan<'_>, p: &AttentionParams, pos0: usize, n_tokens: usize, out: &mut [f32]) {
    let hd = p.head_dim;
    let q_width = p.n_head * hd;
    let task = |(index, out_head): (usize, &mut [f32])| with_fma!(reference_head(q, &kv, p, pos0, index, out_head));
    out[..n_tokens * q_width].par_chunks_exact_mut(hd).enumerate().for_each(task);
}

#[inline(always)]
fn reference_head(q: &[f32], kv: &KvSpan<'_>, p: &AttentionParams, pos0: usize, index: usize, out: &mut [f32]) {
    let hd = p.head_dim;
    let q_width = p.n_head * hd;
    let kv_width = p.n_head_kv * hd;
    let (t, h) = (index / p.n_head, index % p.n_head);
    let col = h / (p.n_head / p.n_head_kv) * hd;
    let pos = pos0 + t;
    let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let q = &q[t * q_width + h * hd..t * q_width + (h + 1) * hd];
    let row = |j: usize| (j - kv.first_pos) * kv_width + col..(j - kv.first_pos) * kv_width + col + hd;
    let mut scores = SCORES.with_borrow_mut(std::mem::take);
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for j in lo..=pos {
        let s = dot(q, &kv.k[row(j)]) * p.scale;
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
        out.iter_mut().zip(&kv.v[row(j)]).for_each(|(o, v)| *o += w * v);
    }
    let inv = 1.0 / sum;
    out.iter_mut().for_each(|o| *o *= inv);
    SCORES.with_borrow_mut(|s| *s = scores);
}

#[derive(Clone, Copy, Debug)]
struct Case {
    kv_type: KvType,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    window: Option<usize>,
    softcap: Option<f32>,
    offsets: bool,
    /// The step's tokens sit at positions pos0..pos0 + n_tokens.
    pos0: usize,
    n_tokens: usize,
}

/// Runs `case` both ways on random data; returns (paged, reference) outputs.
fn run(case: Case, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng(seed);
    let hd = case.head_dim;
    let width = case.n_head_kv * hd;
    let n_pos = case.pos0 + case.n_tokens;
    let n_blocks = n_pos.div_ceil(BLOCK_SIZE) + 3;
    let group = KvGroup { layers: vec![0], window: case.window, n_blocks };
    let layout = KvLayout {
        n_layers: 1,
        k_width: width,
        v_width: width,
        values: hearth_core::kv::ValueRows::Stored,
        kv_type: case.kv_type,
        block_size: BLOCK_SIZE,
        groups: vec![group],
    };
    let mut kv = KvStore::new(layout).expect("pool");
    // A shuffled block table, so that logical order is not pool order.
    let mut table: Vec<u32> = (0..n_blocks as u32).collect();
    for i in (1..table.len()).rev() {
        table.swap(i, rng.next_u32() as usize % (i + 1));
    }
    table.truncate(n_pos.div_ceil(BLOCK_SIZE));
    let tables = vec![table];
    // Keys with a few large channels (like Qwen's), values around an offset.
    let mut k = rng.vec(n_pos * width, 1.0);
    k.iter_mut().step_by(7).for_each(|x| *x *= 12.0);
    let v = rng.vec(n_pos * width, 2.0);
    let (k_offset, v_offset) = (rng.vec(width, 3.0), rng.vec(width, 1.5));
    let (k_offset, v_offset) = if case.offsets { (Some(&k_offset[..]), Some(&v_offset[..])) } else { (None, None) };
    let all = SeqStep { n_tokens: n_pos, pos0: 0, block_tables: &tables };
    kv.store(0, &[all], &k, Some(&v), k_offset, v_offset).expect("store");

    let lo = case.window.map_or(0, |w| (case.pos0 + 1).saturating_sub(w));
    // A sliding window releases the blocks wholly below it; attention must not read them.
    let mut released = tables.clone();
    released[0].iter_mut().take(lo / BLOCK_SIZE).for_each(|b| *b = NO_BLOCK);
    let step = SeqStep { n_tokens: case.n_tokens, pos0: case.pos0, block_tables: &released };
    let params = AttentionParams {
        layer: 0,
        n_head: case.n_head,
        n_head_kv: case.n_head_kv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        window: case.window,
        softcap: case.softcap,
        v_offset: None,
        sinks: None,
        v_head_dim: None,
        values: hearth_core::kv::ValueRows::Stored,
    };
    let q = rng.vec(case.n_tokens * case.n_head * hd, 1.5);
    let n_out = case.n_tokens * case.n_head * hd;

    let mut paged_out = vec![f32::NAN; n_out];
    let paged = kv.paged(0, &step, lo, case.pos0 + case.n_tokens - 1, v_offset).expect("paged view");
    attention(&q, paged, &params, None, case.pos0, case.n_tokens, crate::Numerics::Hearth, &mut paged_out)
        .expect("attention");

    let (mut k_rows, mut v_rows) = (Vec::new(), Vec::new());
    kv.gather(0, &step, lo, case.pos0 + case.n_tokens - 1, &mut k_rows, &mut v_rows, v_offset).expect("gather");
    let mut reference_out = vec![f32::NAN; n_out];
    reference_attention(
        &q,
        KvSpan { k: &k_rows, v: &v_rows, first_pos: lo },
        &params,
        case.pos0,
        case.n_tokens,
        &mut reference_out,
    );
    (paged_out, reference_out)
}

/// Runs `case` and checks it against the gather oracle: bit for bit for the unrotated types,
/// within f32 rounding (see the module comment) for the rotated ones.
fn assert_matches_gather(case: Case, seed: u64) {
    let (paged, reference) = run(case, seed);
    assert!(reference.iter().all(|x| x.is_finite()), "{case:?}: reference not finite");
    if !case.kv_type.rotates() {
        for (i, (a, b)) in paged.iter().zip(&reference).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{case:?} seed {seed}: value {i}: paged {a} vs gathered {b}");
        }
        return;
    }
    let (mut err, mut norm, mut max_abs) = (0f64, 0f64, 0f64);
    for (&a, &b) in paged.iter().zip(&reference) {
        let d = (a as f64 - b as f64).abs();
        err += d * d;
        norm += b as f64 * b as f64;
        max_abs = max_abs.max(d);
    }
    let nmse = err / norm;
    if std::env::var_os("HEARTH_PRINT_ATTENTION_ERROR").is_some() {
        eprintln!(
            "{:?} pos0 {} n_tokens {}: nmse {nmse:.3e} max abs {max_abs:.3e}",
            case.kv_type, case.pos0, case.n_tokens
        );
    }
    assert!(
        nmse <= 1e-11 && max_abs <= 1e-5,
        "{case:?} seed {seed}: NMSE {nmse:e}, max abs error {max_abs:e} vs the gather"
    );
}

const KV_TYPES: [KvType; 4] = [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0];

fn base(kv_type: KvType) -> Case {
    Case {
        kv_type,
        n_head: 14,
        n_head_kv: 2,
        head_dim: 64,
        window: None,
        softcap: None,
        offsets: false,
        pos0: 0,
        n_tokens: 1,
    }
}

#[test]
fn decode_matches_gather_at_every_kind_of_context_length() {
    for kv_type in KV_TYPES {
        // Within the first block, exactly at block ends, just past them, and long.
        for pos0 in [0, 5, 15, 16, 17, 31, 32, 100, 257, 1030] {
            for offsets in [false, true] {
                assert_matches_gather(Case { pos0, offsets, ..base(kv_type) }, 1 + pos0 as u64);
            }
        }
    }
}

#[test]
fn multi_token_steps_match_gather() {
    for kv_type in KV_TYPES {
        // Prefill from 0, a chunk continuing a context, and more tokens than one task holds.
        for (pos0, n_tokens) in [(0, 1), (0, 7), (0, 40), (23, 9), (60, 37), (16, 16)] {
            assert_matches_gather(Case { pos0, n_tokens, offsets: true, ..base(kv_type) }, 7 + n_tokens as u64);
        }
    }
}

#[test]
fn gqa_shapes_match_gather() {
    for kv_type in KV_TYPES {
        // MHA, GQA 2..8, MQA, and head_dim 80/96 whose heads straddle 32-value blocks.
        for (n_head, n_head_kv, head_dim) in [(4, 4, 32), (8, 4, 64), (16, 2, 64), (8, 1, 128), (6, 2, 80), (4, 1, 96)]
        {
            for (pos0, n_tokens) in [(40, 1), (10, 21)] {
                let case = Case { n_head, n_head_kv, head_dim, pos0, n_tokens, offsets: true, ..base(kv_type) };
                assert_matches_gather(case, 100 + n_head as u64 * 10 + n_head_kv as u64);
            }
        }
    }
}

#[test]
fn sliding_window_and_softcap_match_gather() {
    for kv_type in KV_TYPES {
        for window in [1, 5, 16, 33, 512] {
            for (pos0, n_tokens) in [(3, 1), (70, 1), (600, 1), (40, 30)] {
                let case = Case {
                    n_head: 4,
                    n_head_kv: 1,
                    head_dim: 64,
                    window: Some(window),
                    pos0,
                    n_tokens,
                    ..base(kv_type)
                };
                assert_matches_gather(case, 300 + window as u64);
            }
        }
        let case = Case { softcap: Some(50.0), pos0: 90, n_tokens: 3, ..base(kv_type) };
        assert_matches_gather(case, 400);
    }
}

#[test]
fn a_block_missing_from_the_table_is_an_error() {
    let layout = KvLayout {
        n_layers: 1,
        k_width: 64,
        v_width: 64,
        values: hearth_core::kv::ValueRows::Stored,
        kv_type: KvType::Q8_0,
        block_size: BLOCK_SIZE,
        groups: vec![KvGroup { layers: vec![0], window: None, n_blocks: 4 }],
    };
    let kv = KvStore::new(layout).expect("pool");
    for table in [vec![0, 1], vec![0, NO_BLOCK, 2], vec![0, 9, 2]] {
        let tables = vec![table];
        let step = SeqStep { n_tokens: 1, pos0: 40, block_tables: &tables };
        assert!(kv.paged(0, &step, 0, 40, None).is_err());
    }
    // Layers outside the pool too.
    let tables = vec![vec![0, 1, 2]];
    let step = SeqStep { n_tokens: 1, pos0: 40, block_tables: &tables };
    assert!(kv.paged(1, &step, 0, 40, None).is_err());
}

#[test]
fn row_decoding_matches_dequantize_row() {
    // The AVX2 decoders (taken when the CPU has them) against the portable reference, on every
    // block of random rows quantized by the pool's own quantizer, scales of all magnitudes.
    use super::rows::decode;
    use hearth_core::quant::{dequantize_row, quantize_row};
    let mut rng = Rng(5);
    let width = 256;
    for kv_type in KV_TYPES {
        for scale in [1e-3f32, 1.0, 300.0] {
            let values = rng.vec(width, scale);
            let ty = kv_type.ggml_type();
            let mut row = vec![0u8; kv_type.row_bytes(width).expect("row bytes")];
            quantize_row(ty, &values, &mut row).expect("quantize");
            let mut expected = vec![0f32; width];
            dequantize_row(ty, &row, &mut expected).expect("dequantize");
            // The whole row, and a slice of whole blocks inside it.
            for (c0, c1) in [(0, width), (64, 160)] {
                let mut got = vec![f32::NAN; c1 - c0];
                decode(kv_type, &row, c0, c1, &mut got);
                for (i, (a, b)) in got.iter().zip(&expected[c0..c1]).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{kv_type:?} scale {scale}: value {}", c0 + i);
                }
            }
        }
    }
}
