//! Weights as the CPU sees them: bytes borrowed from the memory map when possible, plus an f32
//! copy of small vectors (norm weights, biases) that every step reads whole. With AVX-512 VNNI,
//! Q4_K matrices are repacked at load into tiles of 16 interleaved rows (kernels/q4k_x16.rs), an
//! owned copy in place of the mapped bytes.

use crate::kernels::q4k_x16;
use crate::CpuError;
use hearth_core::backend::WeightData;
use hearth_core::gguf::ByteSource;
use hearth_core::graph::WeightDesc;
use hearth_core::quant::{dequantize_row, GgmlType};
use hearth_core::Result;
use std::borrow::Cow;
use std::sync::Arc;

enum Bytes {
    /// Borrowed from a source that can lend its bytes (mmap); the Arc keeps them alive.
    Lent { source: Arc<dyn ByteSource>, offset: u64, len: usize },
    Owned(Vec<u8>),
}

/// How a weight's rows are laid out in its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// As in the GGUF file: one row after the other.
    Rows,
    /// Q4_K: the first `tiled_rows` rows (a multiple of 16) in x16 tiles (kernels/q4k_x16.rs),
    /// then the remaining rows as rows.
    Q4kX16 { tiled_rows: usize },
}

pub(crate) struct CpuWeight {
    pub desc: WeightDesc,
    bytes: Bytes,
    pub layout: Layout,
    /// Dequantized copy for 1-D weights (norms, biases).
    pub f32: Option<Vec<f32>>,
    pub row_bytes: usize,
}

impl CpuWeight {
    /// `repack`: whether a Q4_K matrix may be repacked into x16 tiles (done where this CPU runs
    /// their kernel).
    pub fn new(desc: WeightDesc, data: WeightData, repack: bool) -> Result<Self> {
        let row_len = desc.row_len();
        let row_bytes = desc.ty.row_bytes(row_len)?;
        let expected = row_bytes * desc.n_rows();
        if data.len != expected {
            return Err(CpuError::BadWeight {
                name: desc.name.clone(),
                reason: format!("{} bytes given, {:?} {} needs {expected}", data.len, desc.dims, desc.ty),
            }
            .into());
        }
        let bytes = if data.source.slice(data.offset, data.len).is_some() {
            Bytes::Lent { source: data.source.clone(), offset: data.offset, len: data.len }
        } else {
            let mut buf = vec![0u8; data.len];
            data.source.read_at(data.offset, &mut buf)?;
            Bytes::Owned(buf)
        };
        let mut w = CpuWeight { desc, bytes, layout: Layout::Rows, f32: None, row_bytes };
        if w.desc.dims.len() == 1 || matches!(w.desc.ty, GgmlType::F32) && w.desc.n_rows() == 1 {
            let mut v = vec![0f32; row_len * w.desc.n_rows()];
            dequantize_row(w.desc.ty, w.bytes(), &mut v)?;
            w.f32 = Some(v);
        }
        let tiled_rows = w.desc.n_rows() / q4k_x16::TILE_ROWS * q4k_x16::TILE_ROWS;
        if repack && w.desc.ty == GgmlType::Q4_K && w.desc.dims.len() >= 2 && tiled_rows > 0 && crate::kernels::q4k_x16_available() {
            w.bytes = Bytes::Owned(repacked(w.bytes(), row_len, row_bytes, tiled_rows));
            w.layout = Layout::Q4kX16 { tiled_rows };
        }
        Ok(w)
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            // The range was checked in `new`; an empty slice can only mean a source that stopped
            // lending, which the mmap and memory sources never do.
            Bytes::Lent { source, offset, len } => source.slice(*offset, *len).unwrap_or(&[]),
            Bytes::Owned(v) => v,
        }
    }

    /// Row i as the GGUF stores it (rebuilt from its tile when repacked).
    pub fn row(&self, i: usize) -> Cow<'_, [u8]> {
        match self.layout {
            Layout::Q4kX16 { tiled_rows } if i < tiled_rows => {
                let tile = i / q4k_x16::TILE_ROWS;
                let mut row = vec![0u8; self.row_bytes];
                q4k_x16::unpack_row(self.desc.row_len(), self.tiles(tile * q4k_x16::TILE_ROWS, (tile + 1) * q4k_x16::TILE_ROWS), i % q4k_x16::TILE_ROWS, &mut row);
                Cow::Owned(row)
            }
            _ => Cow::Borrowed(self.rows(i, i + 1)),
        }
    }

    /// Rows j0..j1 as rows, contiguous: any rows of [`Layout::Rows`], the untiled last rows of a
    /// repacked weight.
    pub fn rows(&self, j0: usize, j1: usize) -> &[u8] {
        let start = match self.layout {
            Layout::Rows => 0,
            Layout::Q4kX16 { tiled_rows } => {
                debug_assert!(j0 >= tiled_rows, "rows {j0}..{j1} of a repacked weight are in tiles");
                self.tiles_bytes(tiled_rows) - tiled_rows * self.row_bytes
            }
        };
        &self.bytes()[start + j0 * self.row_bytes..start + j1 * self.row_bytes]
    }

    /// The x16 tiles of rows j0..j1 (multiples of 16 within the tiled rows) of a repacked weight.
    pub fn tiles(&self, j0: usize, j1: usize) -> &[u8] {
        debug_assert!(j0 % q4k_x16::TILE_ROWS == 0 && j1 % q4k_x16::TILE_ROWS == 0);
        &self.bytes()[self.tiles_bytes(j0)..self.tiles_bytes(j1)]
    }

    /// Bytes of the tiles of the first `rows` rows.
    fn tiles_bytes(&self, rows: usize) -> usize {
        rows / q4k_x16::TILE_ROWS * q4k_x16::tile_bytes(self.desc.row_len())
    }

    pub fn owned_bytes(&self) -> u64 {
        let own = match &self.bytes {
            Bytes::Lent { .. } => 0,
            Bytes::Owned(v) => v.len() as u64,
        };
        own + self.f32.as_ref().map_or(0, |v| v.len() as u64 * 4)
    }
}

/// `bytes` (Q4_K rows of `row_len` elements, `row_bytes` each) with the first `tiled_rows` rows
/// repacked into x16 tiles, the rest copied after them.
fn repacked(bytes: &[u8], row_len: usize, row_bytes: usize, tiled_rows: usize) -> Vec<u8> {
    let tile_bytes = q4k_x16::tile_bytes(row_len);
    let tiles_len = tiled_rows / q4k_x16::TILE_ROWS * tile_bytes;
    let mut out = vec![0u8; tiles_len + bytes.len() - tiled_rows * row_bytes];
    let (tiles, rest) = out.split_at_mut(tiles_len);
    rest.copy_from_slice(&bytes[tiled_rows * row_bytes..]);
    let source_rows = bytes.chunks_exact(q4k_x16::TILE_ROWS * row_bytes);
    let repack = |(dst, rows): (&mut [u8], &[u8])| q4k_x16::repack_tile(row_len, rows, dst);
    #[cfg(not(target_arch = "wasm32"))]
    {
        use rayon::prelude::*;
        tiles.par_chunks_exact_mut(tile_bytes).zip(source_rows.collect::<Vec<_>>()).for_each(repack);
    }
    #[cfg(target_arch = "wasm32")]
    tiles.chunks_exact_mut(tile_bytes).zip(source_rows).for_each(repack);
    out
}
