//! The per-row top-k reduction a step can return instead of its logits
//! ([`crate::backend::Readback::TopK`]). This host version is the reference: a GPU backend's
//! reduction must return the same ids and the same values, bit for bit.

use crate::backend::{Readback, TopK};
use std::cmp::Ordering;

/// Largest candidates this crate's sampler asks a backend for; larger `top_k` (or none) reads
/// the whole logits row back.
pub const MAX_CANDIDATES: usize = 64;

/// NaN ranks with (and is reported as) `-inf`, so the top 1 is exactly [`super::argmax`].
fn rank_value(logit: f32) -> f32 {
    if logit.is_nan() {
        f32::NEG_INFINITY
    } else {
        logit
    }
}

/// Larger logit first, then lower id: a total order once NaN is `-inf`.
fn before(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.partial_cmp(&a.1).unwrap_or(Ordering::Equal).then(a.0.cmp(&b.0))
}

/// What [`crate::backend::Backend::take`] returns for `readback` when a backend reads
/// the logits back (`[n_rows, n_vocab]`) and reduces them on the host: the reference behaviour.
pub fn reduce_rows(readback: Readback, logits: &[f32], n_vocab: usize, out: &mut TopK) {
    if let Some(k) = readback.top_k() {
        top_k_rows(logits, n_vocab, k, out);
    }
    if matches!(readback, Readback::TopKAndLogSumExp(_)) {
        log_sum_exp_rows(logits, n_vocab, &mut out.log_sum_exp);
    }
}

/// `out[r] = log Σ_j exp(logits[r, j])` for each `[n_vocab]` row, NaN counted as `-inf`: `-inf`
/// for a row without a logit above `-inf`, `+inf` for a row holding `+inf`. The largest logit is
/// taken out first (so nothing overflows) and the exponentials are summed in f64.
pub fn log_sum_exp_rows(logits: &[f32], n_vocab: usize, out: &mut Vec<f32>) {
    out.clear();
    if n_vocab == 0 {
        return;
    }
    for row in logits.chunks_exact(n_vocab) {
        let max = row.iter().map(|&l| rank_value(l)).fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            out.push(max);
            continue;
        }
        let sum: f64 = row.iter().map(|&l| (rank_value(l) - max).exp() as f64).sum();
        out.push(max + (sum.ln() as f32));
    }
}

/// Fills `out` with the `min(k, n_vocab)` largest logits of each `[n_vocab]` row of `logits`
/// (`[n_rows, n_vocab]`), most likely first, equal logits by lowest id.
pub fn top_k_rows(logits: &[f32], n_vocab: usize, k: usize, out: &mut TopK) {
    let k = k.min(n_vocab);
    out.k = k;
    out.ids.clear();
    out.logits.clear();
    out.log_sum_exp.clear();
    if k == 0 {
        return;
    }
    if k == 1 {
        // Greedy decoding on the CPU: one pass, no scratch.
        for row in logits.chunks_exact(n_vocab) {
            let id = super::argmax(row);
            out.ids.push(id);
            out.logits.push(rank_value(row[id as usize]));
        }
        return;
    }
    let mut row_candidates: Vec<(u32, f32)> = Vec::with_capacity(n_vocab);
    for row in logits.chunks_exact(n_vocab) {
        row_candidates.clear();
        row_candidates.extend(row.iter().enumerate().map(|(id, &l)| (id as u32, rank_value(l))));
        if k < row_candidates.len() {
            row_candidates.select_nth_unstable_by(k - 1, before);
        }
        let best = &mut row_candidates[..k];
        best.sort_unstable_by(before);
        out.ids.extend(best.iter().map(|c| c.0));
        out.logits.extend(best.iter().map(|c| c.1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::argmax;

    #[test]
    fn log_sum_exp_rows_against_a_direct_sum() {
        let (nan, inf) = (f32::NAN, f32::INFINITY);
        let n = 5;
        let logits = [
            1.0, 2.0, 3.0, -1.0, 0.5, // plain
            1000.0, 999.0, -inf, nan, 998.0, // large values, -inf and NaN left out
            -inf, nan, -inf, -inf, nan, // nothing above -inf
            1.0, inf, 2.0, -inf, 0.0, // +inf
        ];
        let mut got = Vec::new();
        log_sum_exp_rows(&logits, n, &mut got);
        let direct = |row: &[f32], shift: f64| {
            shift + row.iter().filter(|l| l.is_finite()).map(|&l| (l as f64 - shift).exp()).sum::<f64>().ln()
        };
        assert!((got[0] as f64 - direct(&logits[..5], 0.0)).abs() < 1e-6, "{}", got[0]);
        assert!((got[1] as f64 - direct(&logits[5..10], 1000.0)).abs() < 1e-4, "{}", got[1]);
        assert_eq!(got[2], f32::NEG_INFINITY);
        assert_eq!(got[3], f32::INFINITY);
        // Only asked for with TopKAndLogSumExp; a TopK reduction clears it.
        let mut top = TopK::default();
        reduce_rows(Readback::TopKAndLogSumExp(2), &logits, n, &mut top);
        assert_eq!(top.log_sum_exp, got);
        assert_eq!(top.top_probability(0), Some((3.0 - got[0]).exp()));
        reduce_rows(Readback::TopK(2), &logits, n, &mut top);
        assert!(top.log_sum_exp.is_empty());
        assert_eq!(top.top_probability(0), None);
    }

    #[test]
    fn ties_nan_and_short_rows() {
        let nan = f32::NAN;
        let inf = f32::NEG_INFINITY;
        let logits = [1.0, 3.0, 3.0, nan, -2.0, /* row 2 */ nan, inf, inf, nan, inf];
        let mut out = TopK::default();
        top_k_rows(&logits, 5, 4, &mut out);
        assert_eq!(out.k, 4);
        assert_eq!(out.ids, [1, 2, 0, 4, /* row 2 */ 0, 1, 2, 3]);
        assert_eq!(out.logits[..4], [3.0, 3.0, 1.0, -2.0]);
        assert!(out.logits[4..].iter().all(|&l| l == inf));
        for (r, row) in logits.chunks(5).enumerate() {
            top_k_rows(row, 5, 1, &mut out);
            assert_eq!(out.ids[0], argmax(row), "row {r}");
        }
        top_k_rows(&logits, 5, 9, &mut out);
        assert_eq!(out.k, 5, "k is clamped to the vocabulary");
        assert_eq!(out.n_rows(), 2);
    }
}
