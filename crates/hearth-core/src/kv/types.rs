//! Storage types and group descriptions of the paged KV cache.

use crate::error::{CoreError, Result};
use crate::quant::GgmlType;

/// Block-table entry of a block released by the sliding window (never read again).
pub const NO_BLOCK: u32 = u32::MAX;

/// How K/V values are stored. f16 is llama.cpp's default; q8_0 halves it again at a small
/// quality cost; q4_0 quarters it (measured in docs/BENCHMARKS.md before recommending it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvType {
    F32,
    #[default]
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    pub fn parse(name: &str) -> Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            "q4_0" | "q4" => Ok(KvType::Q4_0),
            other => {
                Err(CoreError::InvalidArgument(format!("unknown KV type '{other}' (expected f32, f16, q8_0 or q4_0)")))
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// The GGML block format of one stored row.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            KvType::F32 => GgmlType::F32,
            KvType::F16 => GgmlType::F16,
            KvType::Q8_0 => GgmlType::Q8_0,
            KvType::Q4_0 => GgmlType::Q4_0,
        }
    }

    /// Quantized types store each 32-value block rotated by [`hadamard32`]: the rotation spreads
    /// a block's outlier channels (Qwen's keys have a few huge ones) over all 32 values, so the
    /// block scale no longer drowns the small ones. Dot products are unchanged (orthonormal).
    pub fn rotates(self) -> bool {
        matches!(self, KvType::Q8_0 | KvType::Q4_0)
    }

    /// Quantized types store keys and values minus the graph's per-layer offsets (`Op::StoreKv`;
    /// softmax cannot see the first, attention adds the second back); exact types (f32, the
    /// oracle, and f16) store them as they are.
    pub fn subtracts_offsets(self) -> bool {
        matches!(self, KvType::Q8_0 | KvType::Q4_0)
    }

    /// Bytes of one stored row of `width` values; `None` if a quantized type does not divide it.
    pub fn row_bytes(self, width: usize) -> Option<usize> {
        self.ggml_type().row_bytes(width).ok()
    }
}

/// Where a layer's values live in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ValueRows {
    /// A value row per position beside the key row (attention's usual cache).
    #[default]
    Stored,
    /// The first `v_width` values of each key row are the values, and the pool stores no value
    /// rows: MLA's key row starts with the latent that is also its value (DeepSeek-V2-Lite: 576
    /// values a position instead of 576 + 512). One KV head; `v_width` a multiple of 32, so a
    /// quantized row's value blocks are whole blocks of the key row.
    KeyPrefix,
}

impl ValueRows {
    /// Whether values of `v_width` can be the start of key rows of `k_width`: no wider, in whole
    /// 32-value blocks (quantized rows store and rotate a block at a time).
    pub fn key_prefix_fits(v_width: usize, k_width: usize) -> bool {
        v_width <= k_width && v_width.is_multiple_of(32)
    }
}

/// One block group: the layers that share block tables, and its pool size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvGroup {
    /// Layers whose K/V live in this group's blocks.
    pub layers: Vec<usize>,
    /// Sliding window of these layers (None: they see the whole context).
    pub window: Option<usize>,
    pub n_blocks: usize,
}

/// In-place orthonormal Walsh-Hadamard transform of each 32-value block of `row` (its own
/// inverse): butterflies of stride 1, 2, 4, 8, 16, then a 1/sqrt(32) scale.
#[inline]
pub fn hadamard32(row: &mut [f32]) {
    const SCALE: f32 = 0.176_776_69; // 1 / sqrt(32)
    for block in row.chunks_exact_mut(32) {
        let mut h = 1;
        while h < 32 {
            for i in (0..32).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (block[j], block[j + h]);
                    block[j] = a + b;
                    block[j + h] = a - b;
                }
            }
            h *= 2;
        }
        block.iter_mut().for_each(|v| *v *= SCALE);
    }
}
