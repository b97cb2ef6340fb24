//! CPU compute kernels: the quantized dot products and activation quantizers of the mat-vec hot path.
//!
//! [`vec_dot`] dispatches once-detected x86_64 AVX2+FMA+F16C implementations (llama.cpp's AVX2 kernel
//! structure) and falls back to the scalar reference in `hearth_core::quant` for every other type or
//! CPU. Row sizes are validated by the caller at load time; a mismatch here is a bug, caught by
//! `debug_assert!` in debug builds and answered with NaN (never UB, never a panic) in release builds.

#[cfg(target_arch = "x86_64")]
mod x86;

use hearth_core::quant::{self, GgmlType};
use std::sync::OnceLock;

/// Instruction sets a kernel can be run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// The portable reference (`hearth_core::quant`).
    Scalar,
    /// x86_64 with AVX2, FMA and F16C.
    Avx2,
}

/// The best instruction set of this CPU, detected once.
pub fn detected_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    })
}

/// Whether [`vec_dot_with`] has a SIMD kernel for weights of type `ty` under `isa`.
pub fn has_simd_vec_dot(isa: Isa, ty: GgmlType) -> bool {
    match isa {
        Isa::Scalar => false,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::supports(ty),
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 => {
            let _ = ty;
            false
        }
    }
}

fn sizes_ok(ty: GgmlType, n: usize, weights: &[u8], activation: &[u8]) -> bool {
    matches!(ty.row_bytes(n), Ok(b) if b == weights.len())
        && matches!(ty.vec_dot_type().row_bytes(n), Ok(b) if b == activation.len())
}

/// Dot product of a weight row of type `ty` with an activation row already converted by
/// [`quantize_activation`] to `ty.vec_dot_type()`; both hold `n` elements.
#[inline]
pub fn vec_dot(ty: GgmlType, n: usize, weights: &[u8], activation: &[u8]) -> f32 {
    vec_dot_with(detected_isa(), ty, n, weights, activation)
}

/// [`vec_dot`] with an explicit instruction set (for tests and benchmarks). Asking for an ISA
/// the CPU lacks runs the scalar reference instead.
pub fn vec_dot_with(isa: Isa, ty: GgmlType, n: usize, weights: &[u8], activation: &[u8]) -> f32 {
    if !sizes_ok(ty, n, weights, activation) {
        debug_assert!(false, "vec_dot: {ty} row of {n} with {} weight / {} activation bytes", weights.len(), activation.len());
        return f32::NAN;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && detected_isa() == Isa::Avx2 && x86::supports(ty) {
        // SAFETY: AVX2/FMA/F16C are present (detected above) and the row sizes were checked.
        return unsafe { x86::vec_dot(ty, n, weights.as_ptr(), activation.as_ptr()) };
    }
    let _ = isa;
    quant::vec_dot(ty, n, weights, activation).unwrap_or(f32::NAN)
}

/// Converts an f32 activation row to `ty` (Q8_0, Q8_1, Q8_K, F16, BF16 or F32), bit-identical to
/// `hearth_core::quant::quantize_row` (ggml's `quantize_row_*_ref`). This runs once per row of
/// activations (not per weight row), so the scalar reference is used: it is not on the hot path. `dst` must be
/// `ty.row_bytes(src.len())` bytes; otherwise (a caller bug) it is left untouched.
pub fn quantize_activation(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q8_1 => quantize_q8_legacy_simd_rounding(ty, src, dst),
        _ => {
            let result = quant::quantize_row(ty, src, dst);
            debug_assert!(result.is_ok(), "quantize_activation: {result:?}");
        }
    }
}

/// Q8_0/Q8_1 exactly as llama.cpp's SIMD quantizers compute them (x86 AVX2 and ARM NEON alike):
/// multiply by `127 / amax` and round half to even. ggml's scalar reference divides and rounds
/// half away from zero instead; the two differ on rare ties, and since llama.cpp runs the SIMD
/// form, so do we — on every platform, so the CPU backend gives the same numbers everywhere.
fn quantize_q8_legacy_simd_rounding(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    const QK: usize = 32;
    let bytes = ty.block_bytes();
    debug_assert_eq!(src.len() / QK * bytes, dst.len());
    for (x, block) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(bytes)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        block[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        let mut sum = 0i32;
        for (q, &v) in block[bytes - QK..].iter_mut().zip(x) {
            let r = (v * id).round_ties_even() as i8;
            sum += r as i32;
            *q = r as u8;
        }
        if ty == GgmlType::Q8_1 {
            block[2..4].copy_from_slice(&half::f16::from_f32(sum as f32 * d).to_le_bytes());
        }
    }
}
