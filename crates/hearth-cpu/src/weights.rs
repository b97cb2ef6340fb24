//! Weights as the CPU sees them: bytes borrowed from the memory map when possible, plus an f32
//! copy of small vectors (norm weights, biases) that every step reads whole. With AVX-512 VNNI,
//! Q4_K matrices are repacked into tiles of 16 interleaved rows (kernels/q4k_x16.rs) at their
//! first mat-mul, an owned copy; their mapped pages are then released.

use crate::kernels::q4k_x16;
use crate::CpuError;
use hearth_core::backend::WeightData;
use hearth_core::gguf::ByteSource;
use hearth_core::graph::WeightDesc;
use hearth_core::quant::{dequantize_row, GgmlType};
use hearth_core::Result;
use std::sync::{Arc, OnceLock};

enum Bytes {
    /// Borrowed from a source that can lend its bytes (mmap); the Arc keeps them alive.
    Lent {
        source: Arc<dyn ByteSource>,
        offset: u64,
        len: usize,
    },
    Owned(Vec<u8>),
}

/// Q4_K rows repacked into x16 tiles (kernels/q4k_x16.rs).
pub(crate) struct X16Tiles {
    /// The tiles of the first `tiled_rows` rows; the rest stay rows.
    pub tiles: Vec<u8>,
    /// A multiple of 16.
    pub tiled_rows: usize,
}

pub(crate) struct CpuWeight {
    pub desc: WeightDesc,
    bytes: Bytes,
    /// Whether a Q4_K matrix may be repacked.
    repack: bool,
    /// The x16 tiles, made by the first mat-mul that reads this weight ([`CpuWeight::x16`]): an
    /// embedding table that is only looked up row by row is never repacked. None inside: not
    /// repacked (another type, repacking off, or a CPU without the kernel).
    x16: OnceLock<Option<X16Tiles>>,
    /// Dequantized copy for 1-D weights (norms, biases).
    pub f32: Option<Vec<f32>>,
    pub row_bytes: usize,
}

impl CpuWeight {
    /// `repack`: whether a Q4_K matrix may be repacked into x16 tiles (done where this CPU runs
    /// their kernel, at the first mat-mul).
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
        let mut w = CpuWeight { desc, bytes, repack, x16: OnceLock::new(), f32: None, row_bytes };
        if w.desc.dims.len() == 1 || matches!(w.desc.ty, GgmlType::F32) && w.desc.n_rows() == 1 {
            let mut v = vec![0f32; row_len * w.desc.n_rows()];
            dequantize_row(w.desc.ty, w.bytes(), &mut v)?;
            w.f32 = Some(v);
        }
        Ok(w)
    }

    /// This weight's x16 tiles, repacked on the first call (on the calling thread's rayon pool)
    /// where it is a Q4_K matrix, repacking is on and this CPU has the x16 kernel.
    pub fn x16(&self) -> Option<&X16Tiles> {
        self.x16
            .get_or_init(|| {
                let tiled_rows = self.desc.n_rows() / q4k_x16::TILE_ROWS * q4k_x16::TILE_ROWS;
                let wanted =
                    self.repack && self.desc.ty == GgmlType::Q4_K && self.desc.dims.len() >= 2 && tiled_rows > 0;
                if !wanted || !crate::kernels::q4k_x16_available() {
                    return None;
                }
                let tiles = repack(self.bytes(), self.desc.row_len(), self.row_bytes, tiled_rows);
                // The mapped pages just read would otherwise count twice in this process's
                // memory; the few rows still read as rows (embedding lookups, the llama.cpp-
                // numerics path) fault back in from the file.
                if let Bytes::Lent { source, offset, len } = &self.bytes {
                    source.release(*offset, *len);
                }
                Some(X16Tiles { tiles, tiled_rows })
            })
            .as_ref()
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            // The range was checked in `new`; an empty slice can only mean a source that stopped
            // lending, which the mmap and memory sources never do.
            Bytes::Lent { source, offset, len } => source.slice(*offset, *len).unwrap_or(&[]),
            Bytes::Owned(v) => v,
        }
    }

    pub fn row(&self, i: usize) -> &[u8] {
        let b = self.bytes();
        &b[i * self.row_bytes..(i + 1) * self.row_bytes]
    }

    /// Rows j0..j1, contiguous.
    pub fn rows(&self, j0: usize, j1: usize) -> &[u8] {
        &self.bytes()[j0 * self.row_bytes..j1 * self.row_bytes]
    }

    pub fn owned_bytes(&self) -> u64 {
        let own = match &self.bytes {
            Bytes::Lent { .. } => 0,
            Bytes::Owned(v) => v.len() as u64,
        };
        let x16 = self.x16.get().and_then(Option::as_ref).map_or(0, |x| x.tiles.len() as u64);
        own + x16 + self.f32.as_ref().map_or(0, |v| v.len() as u64 * 4)
    }
}

/// The first `tiled_rows` rows of `bytes` (Q4_K rows of `row_len` elements, `row_bytes` each)
/// repacked into x16 tiles.
fn repack(bytes: &[u8], row_len: usize, row_bytes: usize, tiled_rows: usize) -> Vec<u8> {
    let tile_bytes = q4k_x16::tile_bytes(row_len);
    let mut tiles = vec![0u8; tiled_rows / q4k_x16::TILE_ROWS * tile_bytes];
    let source_rows = bytes[..tiled_rows * row_bytes].chunks_exact(q4k_x16::TILE_ROWS * row_bytes);
    let repack_tile = |(dst, rows): (&mut [u8], &[u8])| q4k_x16::repack_tile(row_len, rows, dst);
    #[cfg(not(target_arch = "wasm32"))]
    {
        use rayon::prelude::*;
        tiles.par_chunks_exact_mut(tile_bytes).zip(source_rows.collect::<Vec<_>>()).for_each(repack_tile);
    }
    #[cfg(target_arch = "wasm32")]
    tiles.chunks_exact_mut(tile_bytes).zip(source_rows).for_each(repack_tile);
    tiles
}
