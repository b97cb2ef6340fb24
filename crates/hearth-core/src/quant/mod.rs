//! GGML tensor types: block layouts, reference dequantization and quantized dot products.
//!
//! A row of `n` weights of type `T` is `n / T::block_len()` blocks of `T::block_bytes()` bytes.
//! Matrix-vector products follow llama.cpp: the activation row is first converted to the weight
//! type's [`GgmlType::vec_dot_type`] (Q8_0, Q8_1, Q8_K, F16, BF16 or F32) and then dotted block by
//! block with integer arithmetic where the format allows. These functions are the scalar reference;
//! `hearth-cpu` has SIMD versions that are tested against them.

mod float;
mod kquants;
mod legacy;
pub mod synthetic;

/// The Q8_K activation quantizer without size checks, for backends that compile it for their ISA.
pub use kquants::quantize_q8_k as quantize_q8_k_blocks;
pub use legacy::{e8m0_half, MXFP4_VALUES};

use crate::error::{CoreError, Result};

/// GGML tensor type ids, as stored in GGUF tensor infos.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    BF16,
    MXFP4,
}

/// Elements per super-block of the K-quants.
pub const QK_K: usize = 256;

impl GgmlType {
    pub const ALL: [GgmlType; 16] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::BF16,
        GgmlType::MXFP4,
    ];

    /// Every type a weight may be stored as (all but the activation-only Q8_1 and Q8_K).
    pub const WEIGHT_TYPES: [GgmlType; 14] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::MXFP4,
    ];

    /// The id GGUF uses for this type (ggml's `enum ggml_type`).
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::BF16 => 30,
            GgmlType::MXFP4 => 39,
        }
    }

    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::Q8_K => "Q8_K",
            GgmlType::BF16 => "BF16",
            GgmlType::MXFP4 => "MXFP4",
        }
    }

    /// Elements per block.
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => 32,
            GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::MXFP4 => 32,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K => QK_K,
            GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q8_K => QK_K,
        }
    }

    /// Bytes per block (ggml's `type_size`).
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q8_1 => 36,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::Q8_K => 292,
            GgmlType::MXFP4 => 17,
        }
    }

    /// Bytes of a row of `n` elements; `n` must be a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Result<usize> {
        if !n.is_multiple_of(self.block_len()) {
            return Err(CoreError::InvalidArgument(format!(
                "a row of {n} elements is not a whole number of {} blocks ({} elements each)",
                self.name(),
                self.block_len()
            )));
        }
        Ok(n / self.block_len() * self.block_bytes())
    }

    /// The format the activation row is converted to before a dot product with a row of `self`.
    pub fn vec_dot_type(self) -> GgmlType {
        match self {
            GgmlType::F32 => GgmlType::F32,
            GgmlType::F16 => GgmlType::F16,
            GgmlType::BF16 => GgmlType::BF16,
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::MXFP4 => GgmlType::Q8_0,
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => GgmlType::Q8_1,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K => GgmlType::Q8_K,
            GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q8_K => GgmlType::Q8_K,
        }
    }

    /// Whether this type may be the weight side of a mat-vec (Q8_1/Q8_K are activation-only).
    pub fn is_weight_type(self) -> bool {
        GgmlType::WEIGHT_TYPES.contains(&self)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn check_row(ty: GgmlType, n: usize, bytes: usize, what: &str) -> Result<()> {
    let need = ty.row_bytes(n)?;
    if bytes != need {
        return Err(CoreError::InvalidArgument(format!(
            "{what}: a {ty} row of {n} elements is {need} bytes, got {bytes}"
        )));
    }
    Ok(())
}

/// Dequantizes one row: `src` holds `dst.len()` elements of type `ty`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    check_row(ty, dst.len(), src.len(), "dequantize_row")?;
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => float::dequantize(ty, src, dst),
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => legacy::dequantize(ty, src, dst),
        GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::MXFP4 => legacy::dequantize(ty, src, dst),
        _ => kquants::dequantize(ty, src, dst),
    }
    Ok(())
}

/// Converts an f32 row to `ty` (activations: Q8_0, Q8_1, Q8_K, F16, BF16, F32; the KV cache:
/// also Q4_0;
/// and for test fixtures of every type that has a quantizer here).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    check_row(ty, src.len(), dst.len(), "quantize_row")?;
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => float::quantize(ty, src, dst),
        GgmlType::Q8_0 | GgmlType::Q8_1 => legacy::quantize(ty, src, dst),
        GgmlType::Q4_0 => legacy::quantize_q4_0(src, dst),
        GgmlType::Q8_K => kquants::quantize_q8_k(src, dst),
        other => {
            return Err(CoreError::UnsupportedTensorType {
                ty: other.to_string(),
                what: "quantize_row (only activation formats are quantized at run time)".into(),
            })
        }
    }
    Ok(())
}

/// Reference dot product of a weight row of type `ty` with an activation row already converted to
/// `ty.vec_dot_type()`. Both hold `n` elements.
pub fn vec_dot(ty: GgmlType, n: usize, weights: &[u8], activation: &[u8]) -> Result<f32> {
    check_row(ty, n, weights.len(), "vec_dot weights")?;
    check_row(ty.vec_dot_type(), n, activation.len(), "vec_dot activation")?;
    Ok(match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => float::vec_dot(ty, weights, activation),
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => legacy::vec_dot(ty, weights, activation),
        GgmlType::Q8_0 | GgmlType::MXFP4 => legacy::vec_dot(ty, weights, activation),
        GgmlType::Q8_1 | GgmlType::Q8_K => {
            return Err(CoreError::UnsupportedTensorType { ty: ty.to_string(), what: "weights".into() })
        }
        _ => kquants::vec_dot(ty, weights, activation),
    })
}
