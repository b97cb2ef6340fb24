//! The softmax's exponentials and their sum, vectorised: libm's `expf` per score (a call, and a
//! sum chained through memory around it) was a third of a long prompt's attention time.

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

/// e^x for x <= 0 (a score minus its query's maximum; NaN-free). On x86_64: ggml's `ggml_v_expf`
/// polynomial (ARM's optimized routines; ~1 ulp of libm), which vectorises — the same function
/// as `ops::ggml_v_expf`, copied here as ops.rs is outside this module, but with the final
/// scaling by 2^n done in f32 where exact. Elsewhere libm's `expf` (wasm has no FMA, and the
/// polynomial's fused steps in software would cost more than the call).
#[inline(always)]
fn exp(x: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
        let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // log2(e)
        // n = round(x * log2(e)), an integer in f32.
        let n = z - r;
        // b = x - n*ln2_hi - n*ln2_lo, each step fused.
        let b = (-n).mul_add(f32::from_bits(0x35bf_be8e), (-n).mul_add(f32::from_bits(0x3f31_7200), x));
        let u = b * b;
        let c5 = f32::from_bits(0x3c07_2010);
        let c4 = f32::from_bits(0x3d2b_9f17);
        let c3 = f32::from_bits(0x3e2a_af33);
        let c2 = f32::from_bits(0x3eff_fedb);
        let c1 = f32::from_bits(0x3f7f_fff6);
        // e^b, b in [-ln2/2, ln2/2]: j in [0.7, 1.5].
        let j = c5.mul_add(b, c4).mul_add(u, c3.mul_add(b, c2)).mul_add(u, c1.mul_add(b, 1.0));
        // j * 2^n, exact while 2^n is a normal f32 (n >= -126); below that the weight is under
        // 2^-125 of the maximum's (1), so 0 (as ggml's polynomial gives for n < -192).
        let two_n = f32::from_bits(((n.max(-127.0) as i32 + 127) as u32) << 23);
        if n < -126.0 {
            0.0
        } else {
            j * two_n
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
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
