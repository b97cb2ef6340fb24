//! Placeholder until the SIMD kernels land: the scalar reference of hearth-core.
use hearth_core::quant::{self, GgmlType};
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    quant::vec_dot(ty, n, w, a).unwrap_or(f32::NAN)
}
pub fn quantize_activation(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    let _ = quant::quantize_row(ty, src, dst);
}
