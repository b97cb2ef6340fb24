//! Weights on the device: each tensor's GGUF bytes in storage buffers (the types whose blocks
//! are not whole words with their scales moved out, `SplitScales`), split into row ranges when
//! the tensor is larger than one storage binding may be. A weight with an expert dimension is one
//! chunk when all its experts fit one binding (its experts' matrices one after another, as one
//! matrix of n_expert × rows rows: the expert mat-mul picks an expert's rows by an id it reads on
//! the device); otherwise it is chunked per expert, no chunk holding rows of two experts, and the
//! expert mat-mul refuses it.

use crate::device::Gpu;
use crate::WgpuError;
use hearth_core::backend::WeightData;
use hearth_core::graph::{WeightDesc, WeightId};
use hearth_core::quant::GgmlType;
use std::collections::HashMap;

/// Rows `row0 .. row0 + rows` of a weight's expert `expert` (0 for a dense weight, and for every
/// expert in one chunk), in their own buffer (bytes padded to 4).
pub(crate) struct WeightChunk {
    /// The (first) expert whose rows the chunk holds.
    #[cfg_attr(not(test), expect(dead_code, reason = "the kernels bind whole experts by their chunk's position"))]
    pub expert: usize,
    pub row0: usize,
    pub rows: usize,
    pub buffer: wgpu::Buffer,
}

pub(crate) struct GpuWeight {
    pub desc: WeightDesc,
    pub row_bytes: usize,
    /// By expert, then by row.
    pub chunks: Vec<WeightChunk>,
}

impl GpuWeight {
    /// The chunks of expert `e`'s matrix `[n_rows, row_len]` (all of a dense weight's for 0) when
    /// the experts are chunked apart.
    #[cfg(test)]
    pub fn expert_chunks(&self, e: usize) -> &[WeightChunk] {
        let first = self.chunks.partition_point(|c| c.expert < e);
        let end = self.chunks.partition_point(|c| c.expert <= e);
        &self.chunks[first..end]
    }

    /// The buffers holding the experts' matrices, whole experts each, and how many experts a
    /// buffer holds (the last may hold fewer): when every expert fits a binding.
    pub fn expert_bindings(&self) -> Option<(Vec<&wgpu::Buffer>, usize)> {
        let n_rows = self.desc.n_rows();
        let per_binding = self.chunks.first()?.rows / n_rows;
        let whole = self.chunks.iter().all(|c| c.row0 == 0 && c.rows.is_multiple_of(n_rows));
        (whole && per_binding > 0).then(|| (self.chunks.iter().map(|c| &c.buffer).collect(), per_binding))
    }

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

/// The shader define of a weight type (quant.wgsl decodes every one).
pub(crate) fn type_define(ty: GgmlType) -> Option<&'static str> {
    ty.is_weight_type().then(|| ty.name())
}

/// matmul_q8.wgsl's defines for a quantized weight type in sibling segments 0, 1 and 2.
const SEGMENT_TYPE_DEFINES: [(GgmlType, [&str; 3]); 11] = [
    (GgmlType::Q4_0, ["T0_Q4_0", "T1_Q4_0", "T2_Q4_0"]),
    (GgmlType::Q4_1, ["T0_Q4_1", "T1_Q4_1", "T2_Q4_1"]),
    (GgmlType::Q5_0, ["T0_Q5_0", "T1_Q5_0", "T2_Q5_0"]),
    (GgmlType::Q5_1, ["T0_Q5_1", "T1_Q5_1", "T2_Q5_1"]),
    (GgmlType::Q8_0, ["T0_Q8_0", "T1_Q8_0", "T2_Q8_0"]),
    (GgmlType::Q2_K, ["T0_Q2_K", "T1_Q2_K", "T2_Q2_K"]),
    (GgmlType::Q3_K, ["T0_Q3_K", "T1_Q3_K", "T2_Q3_K"]),
    (GgmlType::Q4_K, ["T0_Q4_K", "T1_Q4_K", "T2_Q4_K"]),
    (GgmlType::Q5_K, ["T0_Q5_K", "T1_Q5_K", "T2_Q5_K"]),
    (GgmlType::Q6_K, ["T0_Q6_K", "T1_Q6_K", "T2_Q6_K"]),
    (GgmlType::MXFP4, ["T0_MXFP4", "T1_MXFP4", "T2_MXFP4"]),
];

/// matmul_q8.wgsl's define for the weight type of sibling segment `segment` (T0_Q4_K, T1_Q6_K, ...).
pub(crate) fn segment_type_define(segment: usize, ty: GgmlType) -> Option<&'static str> {
    let (_, defines) = SEGMENT_TYPE_DEFINES.iter().find(|(t, _)| *t == ty)?;
    defines.get(segment).copied()
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
    let row_bytes = desc.row_bytes().map_err(|e| bad(e.to_string()))?;
    let n_rows = desc.n_rows();
    let expected = desc.n_bytes().map_err(|e| bad(e.to_string()))?;
    if data.len != expected {
        return Err(bad(format!("{} bytes given, {:?} {} needs {expected}", data.len, desc.dims, desc.ty.name())));
    }
    let rows_per_chunk = max_binding as usize / row_bytes.max(1);
    if rows_per_chunk == 0 {
        return Err(bad(format!("one row of {row_bytes} bytes exceeds the binding limit {max_binding}")));
    }
    let split = split_scales(desc.ty);
    let mut chunks = Vec::new();
    let mut pieces = Pieces::new(UPLOAD_PIECE);
    for (expert, row0, rows) in chunk_rows(desc.n_experts(), n_rows, rows_per_chunk) {
        // `rows` may span several whole experts, which lie one after another in the file.
        let expert_at = desc.expert_range(expert).map_err(|e| bad(e.to_string()))?.start;
        let offset = data.offset + (expert_at + row0 * row_bytes) as u64;
        let len = rows * row_bytes;
        let padded = len.div_ceil(4) * 4;
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(&desc.name),
            size: padded as u64,
            // COPY_SRC: vectors are copied end to end (`JoinedVectors`).
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let chunk = ChunkSource { source: &data, offset, rows, row_bytes };
        let mut write = |at: u64, bytes: &[u8]| queue.write_buffer(&buffer, at, bytes);
        match split {
            Some(split) => pieces.write_split(&mut write, &chunk, split),
            None => pieces.write_raw(&mut write, &chunk, padded),
        }
        .map_err(bad)?;
        chunks.push(WeightChunk { expert, row0, rows, buffer });
    }
    Ok(GpuWeight { desc, row_bytes, chunks })
}

/// (first expert, first row, rows) of each chunk: as many whole experts a chunk as fit
/// `rows_per_chunk` (> 0) rows, all of them in one when they fit; else (an expert larger than a
/// binding) every expert's `n_rows` rows in chunks of at most `rows_per_chunk`, expert after
/// expert.
fn chunk_rows(n_experts: usize, n_rows: usize, rows_per_chunk: usize) -> Vec<(usize, usize, usize)> {
    if n_experts > 1 && n_rows <= rows_per_chunk {
        let per_chunk = rows_per_chunk / n_rows;
        return (0..n_experts).step_by(per_chunk).map(|e| (e, 0, per_chunk.min(n_experts - e) * n_rows)).collect();
    }
    (0..n_experts)
        .flat_map(move |e| {
            (0..n_rows).step_by(rows_per_chunk).map(move |row0| (e, row0, rows_per_chunk.min(n_rows - row0)))
        })
        .collect()
}

/// The device layout of the weight types whose GGUF blocks are not whole u32 words (Q4_0, Q5_0,
/// Q8_0: 18, 22, 34 bytes; Q3_K: 110; Q6_K: 210; MXFP4: 17): each block's scale (an f16; MXFP4's
/// a u8 exponent) is moved out, so that every load is one aligned word. A chunk holds every
/// block's other bytes (its body: 4, 5, 8, 27, 52 or 4 words) in block order, then the blocks'
/// scales, two f16 per word (block b's in the low half of word b / 2 when b is even) or four u8
/// (block b's in byte b % 4 of word b / 4); its size is the GGUF bytes' own. matmul_q8.wgsl and
/// quant.wgsl read it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SplitScales {
    /// Bytes of a GGUF block.
    pub block_bytes: usize,
    /// Where the block's scale sits in it.
    pub scale_at: usize,
    /// Bytes of the scale: 2 (f16) or 1 (MXFP4's exponent).
    pub scale_bytes: usize,
}

pub(crate) fn split_scales(ty: GgmlType) -> Option<SplitScales> {
    let (block_bytes, scale_at, scale_bytes) = match ty {
        GgmlType::Q4_0 => (18, 0, 2),
        GgmlType::Q5_0 => (22, 0, 2),
        GgmlType::Q8_0 => (34, 0, 2),
        GgmlType::Q3_K => (110, 108, 2),
        GgmlType::Q6_K => (210, 208, 2),
        GgmlType::MXFP4 => (17, 0, 1),
        _ => return None,
    };
    Some(SplitScales { block_bytes, scale_at, scale_bytes })
}

impl SplitScales {
    /// Bytes of a block without its scale.
    pub fn body_bytes(self) -> usize {
        self.block_bytes - self.scale_bytes
    }

    /// Appends the bodies and the scales of `blocks` (whole GGUF blocks).
    fn split(self, blocks: &[u8], bodies: &mut Vec<u8>, scales: &mut Vec<u8>) {
        let scale_end = self.scale_at + self.scale_bytes;
        for block in blocks.chunks_exact(self.block_bytes) {
            bodies.extend_from_slice(&block[..self.scale_at]);
            bodies.extend_from_slice(&block[scale_end..]);
            scales.extend_from_slice(&block[self.scale_at..scale_end]);
        }
    }
}

/// The GGUF bytes of one chunk's rows.
struct ChunkSource<'a> {
    source: &'a WeightData,
    offset: u64,
    rows: usize,
    row_bytes: usize,
}

/// Where a chunk's bytes go: (byte offset in its buffer, bytes), a multiple of 4 each.
type WriteAt<'a> = dyn FnMut(u64, &[u8]) + 'a;

/// Host buffers reused across a weight's pieces of at most `piece` bytes, so that host memory
/// never holds more than one piece of the model (a source that cannot lend its bytes, in a
/// browser the file in JS memory, is read piece by piece).
struct Pieces {
    piece: usize,
    read: Vec<u8>,
    bodies: Vec<u8>,
    scales: Vec<u8>,
}

impl Pieces {
    fn new(piece: usize) -> Pieces {
        Pieces { piece, read: Vec::new(), bodies: Vec::new(), scales: Vec::new() }
    }

    /// `len` bytes from `offset`, lent by the source or read into `self.read`.
    fn bytes<'a>(read: &'a mut Vec<u8>, source: &'a WeightData, offset: u64, len: usize) -> Result<&'a [u8], String> {
        if let Some(s) = source.source.slice(offset, len) {
            return Ok(s);
        }
        read.clear();
        read.resize(len, 0);
        source.source.read_at(offset, read).map_err(|e| e.to_string())?;
        Ok(read)
    }

    /// The chunk's GGUF bytes unchanged, zero-padded to `padded`.
    fn write_raw(&mut self, write: &mut WriteAt, chunk: &ChunkSource, padded: usize) -> Result<(), String> {
        let len = chunk.rows * chunk.row_bytes;
        let mut done = 0;
        while done < padded {
            let piece = self.piece.min(padded - done);
            let from_source = piece.min(len.saturating_sub(done));
            let bytes = Self::bytes(&mut self.read, chunk.source, chunk.offset + done as u64, from_source)?;
            if bytes.len() == piece {
                write(done as u64, bytes);
            } else {
                self.bodies.clear();
                self.bodies.extend_from_slice(bytes);
                self.bodies.resize(piece, 0);
                write(done as u64, &self.bodies);
            }
            done += piece;
        }
        Ok(())
    }

    /// The chunk in the `SplitScales` layout, a piece of whole rows at a time.
    fn write_split(&mut self, write: &mut WriteAt, chunk: &ChunkSource, split: SplitScales) -> Result<(), String> {
        let blocks_per_row = chunk.row_bytes / split.block_bytes;
        let body_bytes = split.body_bytes();
        let scales_at = chunk.rows * blocks_per_row * body_bytes;
        // Whole words of scales a piece, so that each piece's scales start on a word.
        let mut rows_per_piece = (self.piece / chunk.row_bytes).max(1);
        while !(rows_per_piece * blocks_per_row * split.scale_bytes).is_multiple_of(4) {
            rows_per_piece += 1;
        }
        let mut row = 0;
        while row < chunk.rows {
            let n = rows_per_piece.min(chunk.rows - row);
            let from = chunk.offset + (row * chunk.row_bytes) as u64;
            let bytes = Self::bytes(&mut self.read, chunk.source, from, n * chunk.row_bytes)?;
            self.bodies.clear();
            self.scales.clear();
            split.split(bytes, &mut self.bodies, &mut self.scales);
            let first_block = row * blocks_per_row;
            write((first_block * body_bytes) as u64, &self.bodies);
            self.scales.resize(self.scales.len().div_ceil(4) * 4, 0);
            write((scales_at + first_block * split.scale_bytes) as u64, &self.scales);
            row += n;
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_core::gguf::{ByteSource, MemorySource};
    use std::sync::Arc;

    /// A source that reads but cannot lend its bytes, as in a browser.
    struct Unlent(MemorySource);

    impl ByteSource for Unlent {
        fn len(&self) -> u64 {
            self.0.len()
        }

        fn read_at(&self, offset: u64, buf: &mut [u8]) -> hearth_core::Result<()> {
            self.0.read_at(offset, buf)
        }
    }

    /// A chunk written piece by piece into a host buffer: what the device buffer receives, the
    /// same from a source that lends its bytes and from one that does not.
    fn written(
        split: Option<SplitScales>,
        bytes: &[u8],
        skip: usize,
        rows: usize,
        row_bytes: usize,
        piece: usize,
    ) -> Vec<u8> {
        let lent = written_from(Arc::new(MemorySource::new(bytes.to_vec())), split, skip, rows, row_bytes, piece);
        let read =
            written_from(Arc::new(Unlent(MemorySource::new(bytes.to_vec()))), split, skip, rows, row_bytes, piece);
        assert_eq!(lent, read, "lent and read sources disagree");
        lent
    }

    fn written_from(
        source: Arc<dyn ByteSource>,
        split: Option<SplitScales>,
        skip: usize,
        rows: usize,
        row_bytes: usize,
        piece: usize,
    ) -> Vec<u8> {
        let len = source.len() as usize;
        let data = WeightData { source, offset: 0, len };
        let chunk = ChunkSource { source: &data, offset: skip as u64, rows, row_bytes };
        let padded = (rows * row_bytes).div_ceil(4) * 4;
        let mut out = vec![0xAAu8; padded];
        let mut write = |at: u64, b: &[u8]| {
            assert!(at.is_multiple_of(4) && b.len().is_multiple_of(4), "unaligned write of {} bytes at {at}", b.len());
            out[at as usize..at as usize + b.len()].copy_from_slice(b);
        };
        let mut pieces = Pieces::new(piece);
        match split {
            Some(split) => pieces.write_split(&mut write, &chunk, split),
            None => pieces.write_raw(&mut write, &chunk, padded),
        }
        .expect("write");
        out
    }

    #[test]
    fn experts_share_chunks_whole() {
        let per_expert = |e| [(e, 0, 2), (e, 2, 2), (e, 4, 1)];
        assert_eq!(chunk_rows(3, 5, 2), [per_expert(0), per_expert(1), per_expert(2)].concat());
        assert_eq!(chunk_rows(3, 5, 14), [(0, 0, 10), (2, 0, 5)], "two whole experts a chunk");
        assert_eq!(chunk_rows(3, 5, 5), [(0, 0, 5), (1, 0, 5), (2, 0, 5)], "one expert a chunk");
        assert_eq!(chunk_rows(3, 5, 15), [(0, 0, 15)], "every expert in one binding");
        assert_eq!(chunk_rows(1, 4, 4), [(0, 0, 4)], "a dense weight in one chunk");
        assert_eq!(chunk_rows(1, 4, 100), [(0, 0, 4)]);
        assert_eq!(chunk_rows(1, 5, 2), [(0, 0, 2), (0, 2, 2), (0, 4, 1)]);
    }

    /// A weight of GGML dims [k, 5, 3 experts] uploaded with room for 2 rows a binding: each
    /// expert's chunks on the device hold its own rows of the file, as a dense weight's would.
    #[test]
    fn an_expert_weight_uploads_per_expert() {
        let Some(gpu) = crate::device::open_for_test() else { return };
        let bytes: Vec<u8> = (0..2_000u32).map(|i| (i * 7919 % 251) as u8).collect();
        let skip = 12;
        // F32 rows are stored as they are; Q8_0's (34 bytes) with their scales moved out.
        for (ty, k) in [(GgmlType::F32, 4usize), (GgmlType::Q8_0, 32)] {
            let desc = WeightDesc { name: "blk.0.ffn_up_exps.weight".into(), ty, dims: vec![k as u64, 5, 3] };
            let row_bytes = desc.row_bytes().expect("row bytes");
            let len = desc.n_bytes().expect("bytes");
            let source: Arc<dyn ByteSource> = Arc::new(MemorySource::new(bytes.clone()));
            let data = WeightData { source, offset: skip as u64, len };
            let w = upload(&gpu.device, &gpu.queue, 2 * row_bytes as u64, desc.clone(), data).expect("upload");
            assert_eq!(w.chunks.len(), 9, "{ty:?}: three chunks an expert");
            for e in 0..3 {
                let chunks = w.expert_chunks(e);
                let rows: Vec<_> = chunks.iter().map(|c| (c.row0, c.rows)).collect();
                assert_eq!(rows, [(0, 2), (2, 2), (4, 1)], "{ty:?} expert {e}");
                for c in chunks {
                    let at = skip + desc.expert_range(e).expect("expert").start + c.row0 * row_bytes;
                    let want = written(split_scales(ty), &bytes, at, c.rows, row_bytes, UPLOAD_PIECE);
                    let words = crate::replay::read_back(&gpu, &c.buffer, want.len() / 4).expect("read back");
                    let got: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                    assert_eq!(got, want, "{ty:?} expert {e} rows {}..", c.row0);
                }
            }
            assert!(w.expert_chunks(3).is_empty());
        }
    }

    #[test]
    fn split_layout_holds_bodies_then_scales_whatever_the_pieces() {
        let bytes: Vec<u8> = (0..20_000u32).map(|i| (i * 7919 % 251) as u8).collect();
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q3_K, GgmlType::Q6_K, GgmlType::MXFP4] {
            let split = split_scales(ty).expect("split type");
            let (scale_bytes, scale_end) = (split.scale_bytes, split.scale_at + split.scale_bytes);
            // Odd and even blocks a row, pieces of one row and of several, a chunk after others.
            for (blocks_per_row, rows, skip_rows, piece) in
                [(3, 5, 1, 1), (3, 5, 0, 2 * 210 * 3), (2, 7, 2, 1 << 20), (1, 9, 0, 40)]
            {
                let row_bytes = blocks_per_row * split.block_bytes;
                let skip = skip_rows * row_bytes;
                let out = written(Some(split), &bytes, skip, rows, row_bytes, piece);
                let n_blocks = rows * blocks_per_row;
                let body = split.body_bytes();
                for b in 0..n_blocks {
                    let block = &bytes[skip + b * split.block_bytes..skip + (b + 1) * split.block_bytes];
                    let mut want = block[..split.scale_at].to_vec();
                    want.extend_from_slice(&block[scale_end..]);
                    assert_eq!(&out[b * body..(b + 1) * body], &want[..], "{ty:?} body {b}");
                    let at = n_blocks * body + scale_bytes * b;
                    assert_eq!(&out[at..at + scale_bytes], &block[split.scale_at..scale_end], "{ty:?} scale {b}");
                }
                assert!(out[n_blocks * split.block_bytes..].iter().all(|&x| x == 0), "{ty:?}: padding");
            }
        }
        // Raw types are written unchanged, zero-padded.
        let out = written(None, &bytes, 6, 3, 10, 8);
        assert_eq!(&out[..30], &bytes[6..36]);
        assert_eq!(&out[30..], &[0, 0]);
    }
}
