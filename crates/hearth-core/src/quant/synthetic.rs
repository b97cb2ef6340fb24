//! Random weights in a type's GGUF layout: conformance tests, and models with a real model's
//! shapes and types but none of its bytes (`hearth models synth`, for machines the real files
//! cannot reach).

use super::GgmlType;
use crate::{CoreError, Result};

/// Uniform in [-1, 1) from 24 random bits.
fn unit(bits: u64) -> f32 {
    (bits >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// Byte offsets of the f16 scales (and mins) in a block of `ty`, ggml's layouts.
fn scale_offsets(ty: GgmlType) -> Option<&'static [usize]> {
    Some(match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => return None,
    })
}

/// GGUF bytes of `n_values` random values of `ty` (a multiple of its block length), drawn from
/// `next_u64`: floats uniform in [-1, 1); quantized blocks with random codes and every f16 scale
/// (and min) a small finite value, so products stay in a sane range.
pub fn random_bytes(ty: GgmlType, n_values: usize, next_u64: &mut dyn FnMut() -> u64) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    match ty {
        GgmlType::F32 => (0..n_values).for_each(|_| bytes.extend_from_slice(&unit(next_u64()).to_le_bytes())),
        GgmlType::F16 => {
            (0..n_values).for_each(|_| bytes.extend_from_slice(&half::f16::from_f32(unit(next_u64())).to_le_bytes()))
        }
        GgmlType::BF16 => {
            (0..n_values).for_each(|_| bytes.extend_from_slice(&half::bf16::from_f32(unit(next_u64())).to_le_bytes()))
        }
        GgmlType::MXFP4 => {
            check_whole_blocks(ty, n_values)?;
            for _ in 0..n_values / ty.block_len() {
                // A power-of-two scale of 2^-8..2^-5 (so values stay within ±0.375), random codes.
                bytes.push(120 + (next_u64() % 4) as u8);
                bytes.extend((0..16).map(|_| next_u64() as u8));
            }
        }
        _ => {
            let offsets = scale_offsets(ty).ok_or_else(|| CoreError::Unsupported {
                backend: "synthetic weights".into(),
                what: format!("weight type {}", ty.name()),
            })?;
            check_whole_blocks(ty, n_values)?;
            let (block_bytes, blocks) = (ty.block_bytes(), n_values / ty.block_len());
            bytes = (0..blocks * block_bytes).map(|_| next_u64() as u8).collect();
            for block in bytes.chunks_exact_mut(block_bytes) {
                for &at in offsets {
                    let d = half::f16::from_f32(0.002 + 0.02 * unit(next_u64()).abs());
                    block[at..at + 2].copy_from_slice(&d.to_le_bytes());
                }
            }
        }
    }
    Ok(bytes)
}

fn check_whole_blocks(ty: GgmlType, n_values: usize) -> Result<()> {
    if !n_values.is_multiple_of(ty.block_len()) {
        return Err(CoreError::BadTensor {
            tensor: "synthetic".into(),
            reason: format!("{n_values} values are not whole {} blocks", ty.name()),
        });
    }
    Ok(())
}
