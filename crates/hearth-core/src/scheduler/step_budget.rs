//! How many prompt tokens a step may carry while other requests are decoding.
//!
//! A prompt chunk batched with running decodes lengthens that step, and every running stream
//! waits for it: that is the inter-token stall chunked prefill exists to bound. The scheduler
//! learns, online, what a step costs as a function of its rows (`ms ≈ fixed + per_row · rows`:
//! the weights are read once per step, each row adds its own compute), and lets prompt tokens in
//! only up to what keeps the step within `max_stall` times the decode-only step. The same rule
//! fits a CPU (rows are expensive: small chunks) and a GPU (rows are nearly free until the device
//! is busy: large chunks), without per-device constants.
//!
//! Chunk sizes never change results: every op is row-independent and attention gives the same
//! values whether a key arrived in this step or an earlier one (tests/kv_paging.rs, tests/scheduler.rs).

/// Prompt chunks end on multiples of this many positions (the KV block size), except at the
/// prompt's end; also the smallest chunk a step carries, so prompts always progress.
pub const PROMPT_GRANULE: usize = 16;

/// Weight of a new observation; older ones decay by `1 - NEW_WEIGHT` per step, so the fit
/// follows a machine whose speed drifts (other load, thermal) within a few dozen steps.
const NEW_WEIGHT: f64 = 0.1;

/// Exponentially weighted least-squares fit of step time against rows in the step.
#[derive(Clone, Debug, Default)]
pub struct StepCostModel {
    weight: f64,
    sum_rows: f64,
    sum_ms: f64,
    sum_rows_sq: f64,
    sum_rows_ms: f64,
}

impl StepCostModel {
    /// Records that a step of `rows` rows (decode rows + prompt tokens) took `ms`.
    pub fn observe(&mut self, rows: usize, ms: f64) {
        if !ms.is_finite() || ms < 0.0 || rows == 0 {
            return;
        }
        let keep = 1.0 - NEW_WEIGHT;
        let x = rows as f64;
        self.weight = self.weight * keep + NEW_WEIGHT;
        self.sum_rows = self.sum_rows * keep + NEW_WEIGHT * x;
        self.sum_ms = self.sum_ms * keep + NEW_WEIGHT * ms;
        self.sum_rows_sq = self.sum_rows_sq * keep + NEW_WEIGHT * x * x;
        self.sum_rows_ms = self.sum_rows_ms * keep + NEW_WEIGHT * x * ms;
    }

    /// `(fixed_ms, per_row_ms)`, once steps of clearly different sizes have been seen and the
    /// fit makes physical sense (each row costs something, the fixed part is not negative).
    pub fn fit(&self) -> Option<(f64, f64)> {
        if self.weight <= 0.0 {
            return None;
        }
        let mean_rows = self.sum_rows / self.weight;
        let mean_ms = self.sum_ms / self.weight;
        let var_rows = self.sum_rows_sq / self.weight - mean_rows * mean_rows;
        // Rows must vary by more than a couple (decode-only steps of one batch size say nothing
        // about the cost of a prompt token).
        if var_rows < 1.0 {
            return None;
        }
        let per_row = (self.sum_rows_ms / self.weight - mean_rows * mean_ms) / var_rows;
        if per_row.is_nan() || per_row <= 0.0 {
            return None;
        }
        let fixed = (mean_ms - per_row * mean_rows).max(0.0);
        Some((fixed, per_row))
    }

    /// Prompt tokens a step with `decode_rows` decoding requests may add so that it takes at
    /// most `max_stall` times as long as those decodes alone: a multiple of [`PROMPT_GRANULE`],
    /// at least one granule, at most `ceiling`. Before the fit exists, one granule.
    pub fn prompt_budget(&self, decode_rows: usize, max_stall: f64, ceiling: usize) -> usize {
        let ceiling = ceiling.max(PROMPT_GRANULE);
        let tokens = match self.fit() {
            Some((fixed, per_row)) => {
                let decode_ms = fixed + per_row * decode_rows as f64;
                let allowed_extra_ms = (max_stall - 1.0).max(0.0) * decode_ms;
                (allowed_extra_ms / per_row).min(ceiling as f64) as usize
            }
            None => 0,
        };
        (tokens / PROMPT_GRANULE * PROMPT_GRANULE).clamp(PROMPT_GRANULE, ceiling)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_of(fixed: f64, per_row: f64, rows: &[usize]) -> StepCostModel {
        let mut m = StepCostModel::default();
        for _ in 0..20 {
            for &r in rows {
                m.observe(r, fixed + per_row * r as f64);
            }
        }
        m
    }

    #[test]
    fn the_fit_recovers_a_linear_cost() {
        let (fixed, per_row) = model_of(25.0, 2.5, &[1, 61, 16, 4, 128]).fit().expect("identified");
        assert!((fixed - 25.0).abs() < 1e-6 && (per_row - 2.5).abs() < 1e-9, "{fixed} {per_row}");
    }

    #[test]
    fn steps_of_one_size_do_not_identify_the_cost_of_a_row() {
        assert!(model_of(25.0, 2.5, &[8]).fit().is_none());
        assert!(StepCostModel::default().fit().is_none());
        assert_eq!(StepCostModel::default().prompt_budget(8, 2.0, 256), PROMPT_GRANULE);
    }

    #[test]
    fn the_budget_keeps_the_step_within_the_stall_factor() {
        // CPU-like: 25 ms to read the weights, 2.5 ms per row.
        let cpu = model_of(25.0, 2.5, &[1, 61, 16]);
        let decode_rows = 16;
        let decode_ms = 25.0 + 2.5 * decode_rows as f64;
        for max_stall in [1.25, 1.5, 2.0, 3.0] {
            let budget = cpu.prompt_budget(decode_rows, max_stall, 256);
            assert_eq!(budget % PROMPT_GRANULE, 0);
            let step_ms = 25.0 + 2.5 * (decode_rows + budget) as f64;
            assert!(
                budget == PROMPT_GRANULE || step_ms <= max_stall * decode_ms + 1e-9,
                "stall {max_stall}: budget {budget}"
            );
            // The largest such multiple of the granule.
            let one_more = 25.0 + 2.5 * (decode_rows + budget + PROMPT_GRANULE) as f64;
            assert!(
                budget == 256 || one_more > max_stall * decode_ms,
                "stall {max_stall}: budget {budget} is not the largest"
            );
        }
        // A stall factor of 1 still lets one granule through so prompts progress.
        assert_eq!(cpu.prompt_budget(decode_rows, 1.0, 256), PROMPT_GRANULE);
        // GPU-like: rows nearly free, so whole prompt chunks fit.
        let gpu = model_of(8.0, 0.01, &[1, 61, 16]);
        assert_eq!(gpu.prompt_budget(4, 1.5, 256), 256);
    }

    #[test]
    fn nonsense_timings_are_ignored() {
        let mut m = model_of(25.0, 2.5, &[1, 61]);
        let before = m.fit();
        m.observe(10, f64::NAN);
        m.observe(10, -3.0);
        m.observe(0, 50.0);
        assert_eq!(m.fit(), before);
    }
}
