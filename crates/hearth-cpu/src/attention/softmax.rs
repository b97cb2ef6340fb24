//! The softmax's exponentials and their sum: a single running sum, kept in memory around each
//! `expf` call (one add's latency plus a store and reload per score), was a third of a long
//! prompt's attention time; eight independent lanes hide that latency.

/// weights[j] = exp(weights[j] - max); returns their sum. Lane l of 8 partial sums takes the
/// values at l, l + 8, ...; the lanes are then added pairwise in a fixed order. Values and sum
/// depend only on the inputs (the query's own scores), never on the batch.
#[inline(always)]
pub(super) fn exp_and_sum(weights: &mut [f32], max: f32) -> f32 {
    const LANES: usize = 8;
    let mut lanes = [0f32; LANES];
    let mut chunks = weights.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (w, lane) in chunk.iter_mut().zip(&mut lanes) {
            *w = exp(*w - max);
            *lane += *w;
        }
    }
    for (w, lane) in chunks.into_remainder().iter_mut().zip(&mut lanes) {
        *w = exp(*w - max);
        *lane += *w;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

/// e^x: libm's `expf`, as before. (ggml's `ggml_v_expf` polynomial, which vectorises, was
/// tried: within ~1 ulp, but those ulps moved Qwen2.5-0.5B's f16-KV perplexity on the 4-chunk
/// test text from 6.21 to 6.18 and pushed the q8_0-vs-f16 gate of tests/perplexity.rs to +0.72%,
/// past its 0.5%. With the lane sums above, libm's `expf` measured as fast within this shared
/// machine's noise.)
#[inline(always)]
fn exp(x: f32) -> f32 {
    x.exp()
}

#[cfg(test)]
mod tests {
    use super::exp_and_sum;

    /// The exponentials against f64's, over the range a softmax sees, and the sum against theirs.
    #[test]
    fn exponentials_and_sum_match_f64() {
        let mut weights: Vec<f32> = (0..2000).map(|i| -(i as f32) * 0.0437).collect();
        weights.push(-87.0);
        weights.push(-1e30);
        let inputs = weights.clone();
        let sum = exp_and_sum(&mut weights, 0.0);
        let mut exact_sum = 0f64;
        for (&x, &w) in inputs.iter().zip(&weights) {
            let exact = (x as f64).exp();
            exact_sum += exact;
            // ~1 ulp relative while normal; flushed to 0 below 2^-126.
            let tolerance = if exact < 2f64.powi(-126) { 2f64.powi(-126) } else { exact * 3e-7 };
            assert!((w as f64 - exact).abs() <= tolerance, "exp({x}) = {w}, expected {exact}");
        }
        assert!((sum as f64 - exact_sum).abs() <= exact_sum * 1e-6, "sum {sum} vs {exact_sum}");
    }
}
