//! How close a backend's results must be to the CPU oracle's, and why. Each tier names the only
//! difference a correct backend may have from the oracle; a wider bound would hide real bugs (a
//! wrong block layout moves results by far more than any of these).
//!
//! Whole models are compared on a third tier, in the suite's model checks (models.rs): greedy tokens must
//! equal the CPU's wherever the CPU's top-1/top-2 logit margin is decisive, since an activation
//! rounded one 8-bit step the other way (after a last-bit difference in a sum) moves logits by a
//! few hundredths over the layers and can flip a near-tie, never a decisive step.

/// A bound on the normalised MSE (`Σ(got - want)² / Σ want²`) of a step's output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub max_nmse: f64,
    /// The reason the bound is what it is.
    pub why: &'static str,
}

impl Tolerance {
    /// Data movement (copies, row selection): bit for bit.
    pub const EXACT: Tolerance = Tolerance { max_nmse: 0.0, why: "the same values moved, no arithmetic" };
    /// Dequantization: the same products of a scale and a small integer, rounded once to f32.
    pub const DEQUANTIZE: Tolerance = Tolerance {
        max_nmse: 1e-12,
        why: "scale × quant in f32 on both sides; at most an f16→f32 rounding differs",
    };
    /// Element-wise ops and norms in f32: the same formula, sums of a row in another order.
    pub const ELEMENTWISE: Tolerance =
        Tolerance { max_nmse: 1e-10, why: "f32 arithmetic with row sums (norms) added in another order" };
    /// Products and RoPE: activations are rounded to the weight's dot type exactly as the CPU
    /// rounds them (8-bit blocks, f16), so only the order of the f32 additions differs.
    pub const SUM_ORDER: Tolerance =
        Tolerance { max_nmse: 1e-9, why: "the same roundings, f32 additions of long dot products in another order" };
    /// Attention: keys folded tile by tile with an online softmax against the CPU's two passes.
    pub const ATTENTION: Tolerance = Tolerance {
        max_nmse: 1e-8,
        why: "an online softmax over key tiles against two passes: exp and sums reordered",
    };
    /// Ops built on transcendental functions (GELU's tanh): a GPU's builtins are not libm's.
    /// 8-bit rounding of values that agree with the CPU's only to the last bits (attention's
    /// output before the output projection): a code may land one step apart.
    pub const ROUNDED_AFTER_REORDER: Tolerance = Tolerance {
        max_nmse: 1e-6,
        why: "activations within a few ulps of the CPU's rounded to 8 bits: a code may differ by one",
    };
    pub const TRANSCENDENTAL: Tolerance =
        Tolerance { max_nmse: 1e-6, why: "tanh and exp from the device's builtins, within a few ulps of libm" };

    /// Panics with the context when `got` is farther from `want` than the bound.
    pub fn assert_close(&self, what: &str, got: &[f32], want: &[f32]) {
        let e = crate::nmse(got, want);
        eprintln!("{what}: nmse {e:.3e}");
        assert!(
            e <= self.max_nmse,
            "{what}: nmse {e:.3e} > {:.0e} ({})\n got {:?}\nwant {:?}",
            self.max_nmse,
            self.why,
            &got[..got.len().min(8)],
            &want[..want.len().min(8)]
        );
    }
}
