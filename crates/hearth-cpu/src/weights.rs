//! Weights as the CPU sees them: bytes borrowed from the memory map when possible, plus an f32
//! copy of small vectors (norm weights, biases) that every step reads whole.

use crate::CpuError;
use hearth_core::backend::WeightData;
use hearth_core::gguf::ByteSource;
use hearth_core::graph::WeightDesc;
use hearth_core::quant::{dequantize_row, GgmlType};
use hearth_core::Result;
use std::sync::Arc;

enum Bytes {
    /// Borrowed from a source that can lend its bytes (mmap); the Arc keeps them alive.
    Lent { source: Arc<dyn ByteSource>, offset: u64, len: usize },
    Owned(Vec<u8>),
}

pub(crate) struct CpuWeight {
    pub desc: WeightDesc,
    bytes: Bytes,
    /// Dequantized copy for 1-D weights (norms, biases).
    pub f32: Option<Vec<f32>>,
    pub row_bytes: usize,
}

impl CpuWeight {
    pub fn new(desc: WeightDesc, data: WeightData) -> Result<Self> {
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
        let mut w = CpuWeight { desc, bytes, f32: None, row_bytes };
        if w.desc.dims.len() == 1 || matches!(w.desc.ty, GgmlType::F32) && w.desc.n_rows() == 1 {
            let mut v = vec![0f32; row_len * w.desc.n_rows()];
            dequantize_row(w.desc.ty, w.bytes(), &mut v)?;
            w.f32 = Some(v);
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
        own + self.f32.as_ref().map_or(0, |v| v.len() as u64 * 4)
    }
}
