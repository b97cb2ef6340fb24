//! F32, F16 and BF16 rows: plain little-endian floats.

use super::GgmlType;
use half::{bf16, f16};

pub(super) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        _ => unreachable!("float::dequantize called with {ty}"),
    }
}

pub(super) fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    match ty {
        GgmlType::F32 => {
            for (s, c) in src.iter().zip(dst.chunks_exact_mut(4)) {
                c.copy_from_slice(&s.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (s, c) in src.iter().zip(dst.chunks_exact_mut(2)) {
                c.copy_from_slice(&f16::from_f32(*s).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (s, c) in src.iter().zip(dst.chunks_exact_mut(2)) {
                c.copy_from_slice(&bf16::from_f32(*s).to_le_bytes());
            }
        }
        _ => unreachable!("float::quantize called with {ty}"),
    }
}

/// Both rows are of the same float type (the activation was converted to the weight's type).
pub(super) fn vec_dot(ty: GgmlType, w: &[u8], a: &[u8]) -> f32 {
    let width = ty.block_bytes();
    let mut wf = [0f32; 1];
    let mut af = [0f32; 1];
    let mut sum = 0f64;
    for (wc, ac) in w.chunks_exact(width).zip(a.chunks_exact(width)) {
        dequantize(ty, wc, &mut wf);
        dequantize(ty, ac, &mut af);
        sum += wf[0] as f64 * af[0] as f64;
    }
    sum as f32
}
