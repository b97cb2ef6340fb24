//! Mixture-of-experts ops: the router's choice of experts, the chosen experts' mat-muls, and the
//! weighted sum of their outputs, computed as llama.cpp's `build_moe_ffn` does. Expert ids live
//! in the f32 activation buffers as bit patterns (`f32::from_bits`), exact and never computed on.

use crate::matmul::{self, QuantizedActivations};
use crate::weights::CpuWeight;
use crate::{CpuError, Numerics};
use hearth_core::graph::{BufId, ExpertGating, ExpertGroups, ExpertRouting};

/// ggml's floor for the sum of the chosen experts' probabilities before dividing by it.
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// For each token's row of `logits` ([n_tokens, n_expert]): its `routing.n_used` experts, of
/// highest selection score first (ties to the lower id), into `ids` ([n_tokens, n_used], as bit
/// patterns), and their weights into `weights` ([n_tokens, n_used]). `selection_bias` is the
/// routing's, read.
pub(crate) fn route(
    logits: &[f32],
    n_expert: usize,
    routing: &ExpertRouting,
    selection_bias: Option<&[f32]>,
    scratch: &mut ExpertScratch,
    ids: &mut [f32],
    weights: &mut [f32],
) {
    let k = routing.n_used;
    let ExpertScratch { probs, selection, order, chosen, group_scores, .. } = scratch;
    probs.resize(n_expert, 0.0);
    selection.resize(n_expert, 0.0);
    order.resize(n_expert, 0);
    for ((row, ids), weights) in
        logits.chunks_exact(n_expert).zip(ids.chunks_exact_mut(k)).zip(weights.chunks_exact_mut(k))
    {
        match routing.gating {
            ExpertGating::Softmax => softmax(row, probs),
            ExpertGating::Sigmoid => probs.iter_mut().zip(row).for_each(|(p, &l)| *p = 1.0 / (1.0 + (-l).exp())),
            ExpertGating::SoftmaxOfChosen => probs.copy_from_slice(row),
        }
        match selection_bias {
            Some(bias) => selection.iter_mut().zip(probs.iter().zip(bias)).for_each(|(s, (p, b))| *s = p + b),
            None => selection.copy_from_slice(probs),
        }
        if let Some(groups) = routing.groups {
            mask_groups(selection, groups, group_scores, order);
            order.resize(n_expert, 0);
        }
        order.iter_mut().enumerate().for_each(|(i, o)| *o = i);
        // A stable sort, so equal scores keep the lower id first; NaN (from NaN logits) sorts
        // last rather than panicking.
        order.sort_by(|&a, &b| selection[b].partial_cmp(&selection[a]).unwrap_or(std::cmp::Ordering::Equal));
        for ((id, w), &e) in ids.iter_mut().zip(weights.iter_mut()).zip(order.iter()) {
            *id = f32::from_bits(e as u32);
            *w = probs[e];
        }
        if routing.gating == ExpertGating::SoftmaxOfChosen {
            chosen.clear();
            chosen.extend_from_slice(weights);
            softmax(chosen, weights);
        }
        if routing.normalize {
            let sum = weights.iter().sum::<f32>().max(MIN_WEIGHT_SUM);
            weights.iter_mut().for_each(|w| *w /= sum);
        }
        if routing.scale != 1.0 {
            weights.iter_mut().for_each(|w| *w *= routing.scale);
        }
    }
}

/// Sets the selection scores of all but the `groups.n_used` best groups to -∞: a group's score is
/// the sum of its two best (ties to the lower group). `scores` and `order` are scratch (left
/// n_group long).
fn mask_groups(selection: &mut [f32], groups: ExpertGroups, scores: &mut Vec<f32>, order: &mut Vec<usize>) {
    let per_group = selection.len() / groups.n_group;
    let score = |g: &[f32]| {
        let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &s in g {
            if s > first {
                (first, second) = (s, first);
            } else if s > second {
                second = s;
            }
        }
        first + second
    };
    scores.clear();
    scores.extend(selection.chunks_exact(per_group).map(score));
    order.clear();
    order.extend(0..groups.n_group);
    order.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap_or(std::cmp::Ordering::Equal));
    for &g in &order[groups.n_used..] {
        selection[g * per_group..(g + 1) * per_group].fill(f32::NEG_INFINITY);
    }
}

/// ggml's softmax of a row: exponentials of the shifted values summed in f64, then scaled by the
/// reciprocal of the sum.
fn softmax(row: &[f32], out: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for (o, &v) in out.iter_mut().zip(row) {
        *o = (v - max).exp();
        sum += *o as f64;
    }
    let inv = (1.0 / sum) as f32;
    out.iter_mut().for_each(|o| *o *= inv);
}

/// What the expert mat-muls of a compiled graph reuse from step to step, so that a step allocates
/// only when it routes more rows to an expert than any step before.
#[derive(Default)]
pub(crate) struct ExpertScratch {
    /// [n_expert] a token's router probabilities, and the experts in their order.
    probs: Vec<f32>,
    /// [n_expert] the scores that choose: the probabilities plus the selection bias, masked to
    /// the chosen groups.
    selection: Vec<f32>,
    order: Vec<usize>,
    /// [n_used] a token's chosen logits (`ExpertGating::SoftmaxOfChosen`).
    chosen: Vec<f32>,
    /// [n_group] a token's group scores.
    group_scores: Vec<f32>,
    /// [n_tokens, n_head] ids of heads in order (`matmul_heads`), and for which (n_tokens, n_head).
    head_ids: ((usize, usize), Vec<f32>),
    /// Per expert, the (token, slot) pairs routed to it.
    rows_of: Vec<Vec<usize>>,
    /// [pairs, k] the pairs' input rows; [pairs, n] their products.
    gathered: Vec<f32>,
    products: Vec<f32>,
    activations: QuantizedActivations,
}

/// out[t, s] = x[t, s] · W[ids[t, s]]ᵀ (+ bias[ids[t, s]]) for the expert weight `w`
/// ([n_expert][n, k]) and its optional `bias` ([n_expert][n]); `x` holds `k` values per token
/// (read by every slot) or `n_used * k` (a slice per slot), and `out` `n_used * n`. The (token, slot) rows of each expert are gathered and go through one mat-mul,
/// whose every row equals its one-row product bit for bit, so a token's result does not depend
/// on which other tokens share its step.
pub(crate) fn matmul(
    w: &CpuWeight,
    x: &[f32],
    ids: &[f32],
    n_used: usize,
    bias: Option<&[f32]>,
    scratch: &mut ExpertScratch,
    out: &mut [f32],
) -> Result<(), CpuError> {
    let n_tokens = ids.len() / n_used;
    let (k, n) = (w.desc.row_len(), w.desc.n_rows());
    let x_cols = x.len() / n_tokens.max(1);
    let n_expert = w.desc.n_experts();
    let ExpertScratch { rows_of, gathered, products, activations, .. } = scratch;
    rows_of.resize_with(n_expert, Vec::new);
    rows_of.iter_mut().for_each(Vec::clear);
    for (pair, id) in ids.iter().enumerate() {
        let e = id.to_bits() as usize;
        let rows = rows_of.get_mut(e).ok_or_else(|| CpuError::BadStep(format!("expert id {e} of {n_expert}")))?;
        rows.push(pair);
    }
    for (e, pairs) in rows_of.iter().enumerate().filter(|(_, p)| !p.is_empty()) {
        let expert = w.expert(e).ok_or_else(|| CpuError::BadStep(format!("expert {e} of '{}'", w.desc.name)))?;
        gathered.clear();
        for &pair in pairs {
            let (t, s) = (pair / n_used, pair % n_used);
            let start = if x_cols == k { t * x_cols } else { t * x_cols + s * k };
            gathered.extend_from_slice(&x[start..start + k]);
        }
        products.resize(pairs.len() * n, 0.0);
        // llama.cpp's batch-dependent roundings (compat.rs) are its dense mat-mul's; its expert
        // mat-muls round as ours do, one (token, slot) row at a time. Each expert's rows are
        // new input: the rounding held for the last expert is stale.
        activations.invalidate();
        matmul::matmul(expert, gathered, BufId(u32::MAX), k, None, activations, Numerics::Hearth, products);
        // The bias after the product, as ggml's `add_id` adds it.
        let bias = bias.and_then(|b| b.get(e * n..(e + 1) * n));
        for (&pair, row) in pairs.iter().zip(products.chunks_exact(n)) {
            let out = &mut out[pair * n..(pair + 1) * n];
            match bias {
                Some(b) => out.iter_mut().zip(row).zip(b).for_each(|((o, &p), &b)| *o = p + b),
                None => out.copy_from_slice(row),
            }
        }
    }
    Ok(())
}

/// Each head's own mat-mul (Op::MatMulHeads): out[t, h] = x[t, h] · W[h]ᵀ for `n_tokens` rows,
/// the expert mat-mul with slot h routed to expert h (the ids made once per token count).
pub(crate) fn matmul_heads(
    w: &CpuWeight,
    x: &[f32],
    n_tokens: usize,
    scratch: &mut ExpertScratch,
    out: &mut [f32],
) -> Result<(), CpuError> {
    let n_head = w.desc.n_experts();
    let (shape, mut ids) = std::mem::take(&mut scratch.head_ids);
    if shape != (n_tokens, n_head) {
        ids.clear();
        ids.extend((0..n_tokens * n_head).map(|i| f32::from_bits((i % n_head) as u32)));
    }
    let result = matmul(w, x, &ids, n_head, None, scratch, out);
    scratch.head_ids = ((n_tokens, n_head), ids);
    result
}

/// out[t] = Σ_s weights[t, s] · x[t, s] for x: [n_tokens, n_used * cols], summed slot after
/// slot as llama.cpp adds its experts' weighted outputs.
pub(crate) fn combine(x: &[f32], weights: &[f32], n_used: usize, out: &mut [f32]) {
    let cols = out.len() / (weights.len() / n_used).max(1);
    for ((o, xs), ws) in out.chunks_exact_mut(cols).zip(x.chunks_exact(n_used * cols)).zip(weights.chunks_exact(n_used))
    {
        for (s, (slot, &w)) in xs.chunks_exact(cols).zip(ws).enumerate() {
            if s == 0 {
                o.iter_mut().zip(slot).for_each(|(o, &v)| *o = v * w);
            } else {
                o.iter_mut().zip(slot).for_each(|(o, &v)| *o += v * w);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids_of(ids: &[f32]) -> Vec<u32> {
        ids.iter().map(|v| v.to_bits()).collect()
    }

    /// Softmax, top-2, renormalised: the weights are the two probabilities over their sum, which
    /// is a softmax over the two logits alone.
    #[test]
    fn softmax_routing_picks_the_largest_and_renormalises() {
        let logits = [0.1f32, 2.0, -1.0, 1.5, 2.0, 0.0, 0.3, -3.0];
        let mut routing = ExpertRouting {
            n_used: 2,
            gating: ExpertGating::Softmax,
            normalize: true,
            scale: 1.0,
            selection_bias: None,
            groups: None,
        };
        let (mut ids, mut weights) = ([0f32; 2], [0f32; 2]);
        route(&logits, 8, &routing, None, &mut ExpertScratch::default(), &mut ids, &mut weights);
        // Experts 1 and 4 tie: the lower id first.
        assert_eq!(ids_of(&ids), [1, 4]);
        assert!((weights[0] - 0.5).abs() < 1e-6 && (weights[1] - 0.5).abs() < 1e-6, "{weights:?}");

        // Without renormalisation the weights are the softmax over all 8, scaled.
        routing.normalize = false;
        routing.scale = 2.5;
        route(&logits, 8, &routing, None, &mut ExpertScratch::default(), &mut ids, &mut weights);
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let p = (2.0f64).exp() / z * 2.5;
        assert!((weights[0] as f64 - p).abs() < 1e-6, "{weights:?} vs {p}");
    }

    #[test]
    fn sigmoid_routing_weighs_each_expert_on_its_own() {
        let logits = [0.0f32, 3.0, -2.0, 1.0];
        let routing = ExpertRouting {
            n_used: 3,
            gating: ExpertGating::Sigmoid,
            normalize: false,
            scale: 1.0,
            selection_bias: None,
            groups: None,
        };
        let (mut ids, mut weights) = ([0f32; 3], [0f32; 3]);
        route(&logits, 4, &routing, None, &mut ExpertScratch::default(), &mut ids, &mut weights);
        assert_eq!(ids_of(&ids), [1, 3, 0]);
        let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
        assert_eq!(weights, [sigmoid(3.0), sigmoid(1.0), sigmoid(0.0)]);
    }

    #[test]
    fn a_selection_bias_and_groups_choose_but_do_not_weigh() {
        // 8 experts in 4 groups of 2. Sigmoid probabilities order 0 > 2 > 4 > 6 > ...; the bias
        // lifts expert 7 past them all and expert 5 past 2.
        let logits = [4.0f32, -4.0, 3.0, -4.0, 2.0, -4.0, 1.0, -4.0];
        let bias = [0.0f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0];
        let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
        let mut routing = ExpertRouting { normalize: true, scale: 2.5, ..ExpertRouting::top(2, ExpertGating::Sigmoid) };
        routing.selection_bias = None;
        let (mut ids, mut weights) = ([0f32; 2], [0f32; 2]);
        route(&logits, 8, &routing, Some(&bias), &mut ExpertScratch::default(), &mut ids, &mut weights);
        assert_eq!(ids_of(&ids), [7, 0]);
        // The weights are the unbiased probabilities, renormalised and scaled.
        let (p7, p0) = (sigmoid(-4.0), sigmoid(4.0));
        assert!((weights[0] - p7 / (p7 + p0) * 2.5).abs() < 1e-6, "{weights:?}");
        // Groups {0,1} {2,3} {4,5} {6,7} score (with the bias) 0.98+0.02, 0.95+0.02, 0.88+0.02,
        // 0.73+2.02: with the two best groups, 3 and 0, expert 2 cannot be chosen.
        routing.groups = Some(ExpertGroups { n_group: 4, n_used: 2 });
        routing.n_used = 3;
        let (mut ids, mut weights) = ([0f32; 3], [0f32; 3]);
        route(&logits, 8, &routing, Some(&bias), &mut ExpertScratch::default(), &mut ids, &mut weights);
        assert_eq!(ids_of(&ids), [7, 0, 6]);
    }

    #[test]
    fn combine_sums_the_weighted_slots() {
        // 2 tokens, 2 slots of 3 values.
        let x = [1.0f32, 2.0, 3.0, 10.0, 20.0, 30.0, -1.0, 0.0, 1.0, 4.0, 4.0, 4.0];
        let weights = [0.75f32, 0.25, 0.5, 0.5];
        let mut out = [0f32; 6];
        combine(&x, &weights, 2, &mut out);
        assert_eq!(out, [3.25, 6.5, 9.75, 1.5, 2.0, 2.5]);
    }
}
