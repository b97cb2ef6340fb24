//! Weights on the device: the raw GGUF bytes of each tensor in storage buffers, split into row
//! ranges when the tensor is larger than one storage binding may be.

use crate::device::Gpu;
use crate::WgpuError;
use hearth_core::backend::WeightData;
use hearth_core::graph::{WeightDesc, WeightId};
use hearth_core::quant::GgmlType;
use std::collections::HashMap;

/// Rows `row0 .. row0 + rows` of a weight, in their own buffer (bytes padded to 4).
pub(crate) struct WeightChunk {
    pub row0: usize,
    pub rows: usize,
    pub buffer: wgpu::Buffer,
}

pub(crate) struct GpuWeight {
    pub desc: WeightDesc,
    pub row_bytes: usize,
    pub chunks: Vec<WeightChunk>,
}

impl GpuWeight {
    pub fn bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.buffer.size()).sum()
    }

    /// Weights read as plain `array<f32>` (norm weights, biases, RoPE factors) must be F32 and
    /// in one chunk.
    pub fn as_f32_vector(&self) -> Result<&wgpu::Buffer, WgpuError> {
        match (self.desc.ty, self.chunks.as_slice()) {
            (GgmlType::F32, [chunk]) => Ok(&chunk.buffer),
            _ => Err(WgpuError::Unsupported(format!(
                "weight '{}' ({}) used as an f32 vector",
                self.desc.name,
                self.desc.ty.name()
            ))),
        }
    }
}

/// Bytes per `write_buffer` when a weight is read from a source piece by piece (multiple of 4).
const UPLOAD_PIECE: usize = 16 << 20;

/// The weight types the kernels decode (`shaders/quant.wgsl`, `matmul_q8.wgsl`), each with its
/// shader define (the type's GGML name).
pub(crate) const KERNEL_TYPES: [GgmlType; 7] =
    [GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K];

/// The shader define of a type the kernels decode.
pub(crate) fn type_define(ty: GgmlType) -> Option<&'static str> {
    KERNEL_TYPES.contains(&ty).then(|| ty.name())
}

/// matmul_q8.wgsl's define for the weight type of sibling segment `segment` (T0_Q4_K, T1_Q6_K, ...).
pub(crate) fn segment_type_define(segment: usize, ty: GgmlType) -> Option<&'static str> {
    const TYPES: [GgmlType; 5] = [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K];
    const DEFINES: [[&str; 5]; 3] = [
        ["T0_Q4_0", "T0_Q5_0", "T0_Q8_0", "T0_Q4_K", "T0_Q6_K"],
        ["T1_Q4_0", "T1_Q5_0", "T1_Q8_0", "T1_Q4_K", "T1_Q6_K"],
        ["T2_Q4_0", "T2_Q5_0", "T2_Q8_0", "T2_Q4_K", "T2_Q6_K"],
    ];
    let at = TYPES.iter().position(|t| *t == ty)?;
    DEFINES.get(segment).map(|defines| defines[at])
}

pub(crate) fn upload(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    max_binding: u64,
    desc: WeightDesc,
    data: WeightData,
) -> Result<GpuWeight, WgpuError> {
    let bad = |reason: String| WgpuError::BadWeight { name: desc.name.clone(), reason };
    if desc.dims.is_empty() || desc.dims.contains(&0) {
        return Err(bad(format!("dims {:?}", desc.dims)));
    }
    let row_bytes = desc.ty.row_bytes(desc.row_len()).map_err(|e| bad(e.to_string()))?;
    let n_rows = desc.n_rows();
    let expected = row_bytes.checked_mul(n_rows).ok_or_else(|| bad("size overflows".into()))?;
    if data.len != expected {
        return Err(bad(format!("{} bytes given, {:?} {} needs {expected}", data.len, desc.dims, desc.ty.name())));
    }
    let rows_per_chunk = (max_binding as usize / row_bytes.max(1)).min(n_rows);
    if rows_per_chunk == 0 {
        return Err(bad(format!("one row of {row_bytes} bytes exceeds the binding limit {max_binding}")));
    }
    let mut chunks = Vec::new();
    let mut owned = Vec::new();
    let mut row0 = 0;
    while row0 < n_rows {
        let rows = rows_per_chunk.min(n_rows - row0);
        let offset = data.offset + (row0 * row_bytes) as u64;
        let len = rows * row_bytes;
        let padded = len.div_ceil(4) * 4;
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(&desc.name),
            size: padded as u64,
            // COPY_SRC: vectors are copied end to end (`JoinedVectors`).
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        match data.source.slice(offset, len) {
            Some(s) if s.len() == padded => queue.write_buffer(&buffer, 0, s),
            Some(s) => {
                owned.clear();
                owned.extend_from_slice(s);
                owned.resize(padded, 0);
                queue.write_buffer(&buffer, 0, &owned);
            }
            None => {
                // A source that cannot lend its bytes (in a browser: the file in JS memory) is
                // read in pieces, so host memory never holds more than one piece of the model.
                let mut done = 0;
                while done < padded {
                    let piece = UPLOAD_PIECE.min(padded - done);
                    let from_source = piece.min(len.saturating_sub(done));
                    owned.clear();
                    owned.resize(piece, 0);
                    data.source
                        .read_at(offset + done as u64, &mut owned[..from_source])
                        .map_err(|e| bad(e.to_string()))?;
                    queue.write_buffer(&buffer, done as u64, &owned);
                    done += piece;
                }
            }
        }
        chunks.push(WeightChunk { row0, rows, buffer });
        row0 += rows;
    }
    Ok(GpuWeight { desc, row_bytes, chunks })
}

/// F32 vectors joined end to end on the device (sibling mat-muls' biases, the heads kernel's
/// constants): made once per list of weights and size, and kept as long as the weights, so that
/// graphs compiled for other batch shapes share them.
#[derive(Default)]
pub(crate) struct JoinedVectors {
    made: HashMap<(Vec<WeightId>, u64), wgpu::Buffer>,
}

impl JoinedVectors {
    /// `parts` end to end in a buffer of at least `min_bytes` (zeros past them), bound as
    /// storage or as a uniform.
    pub fn get(
        &mut self,
        gpu: &Gpu,
        weights: &[GpuWeight],
        parts: &[WeightId],
        min_bytes: u64,
    ) -> Result<wgpu::Buffer, WgpuError> {
        let key = (parts.to_vec(), min_bytes);
        if let Some(b) = self.made.get(&key) {
            return Ok(b.clone());
        }
        let mut vectors = Vec::with_capacity(parts.len());
        for id in parts {
            let w = weights.get(id.0 as usize).ok_or(WgpuError::UnknownId { what: "weight", id: id.0 })?;
            vectors.push((w.as_f32_vector()?, (w.desc.row_len() * w.desc.n_rows() * 4) as u64));
        }
        let size = vectors.iter().map(|(_, bytes)| bytes).sum::<u64>().max(min_bytes).div_ceil(16) * 16;
        let joined = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("joined vectors"),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        let mut at = 0;
        for (buffer, bytes) in vectors {
            encoder.copy_buffer_to_buffer(buffer, 0, &joined, at, bytes);
            at += bytes;
        }
        gpu.queue.submit([encoder.finish()]);
        self.made.insert(key, joined.clone());
        Ok(joined)
    }
}
