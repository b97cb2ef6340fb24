//! Weights as the CPU sees them: bytes borrowed from the memory map when possible, plus an f32
//! copy of small vectors (norm weights, biases) that every step reads whole. With AVX-512 VNNI,
//! Q4_K matrices are repacked into tiles of 16 interleaved rows (kernels/q4k_x16.rs) at their
//! first mat-mul, an owned copy; their mapped pages are then released. A weight with an expert
//! dimension is split at upload into one dense weight per expert, so that every kernel (and the
//! x16 repacking) runs on one expert's matrix unchanged.

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
    /// An expert weight's bytes are its experts' ([`CpuWeight::expert`]).
    InExperts,
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
    /// Dequantized copy of a weight read as a vector (norms, biases, an expert stack's biases),
    /// made by the first read ([`CpuWeight::values`]).
    values: OnceLock<Option<Vec<f32>>>,
    pub row_bytes: usize,
    /// An expert weight's matrices, each a dense weight over its slice of the data
    /// ([`WeightDesc::expert_range`]): `[n_rows, row_len]` each. Empty for a dense weight.
    experts: Vec<CpuWeight>,
}

impl CpuWeight {
    /// `repack`: whether a Q4_K matrix may be repacked into x16 tiles (done where this CPU runs
    /// their kernel, at the first mat-mul).
    pub fn new(desc: WeightDesc, data: WeightData, repack: bool) -> Result<Self> {
        let row_len = desc.row_len();
        let row_bytes = desc.row_bytes()?;
        let expected = desc.n_bytes()?;
        if data.len != expected {
            return Err(CpuError::BadWeight {
                name: desc.name.clone(),
                reason: format!("{} bytes given, {:?} {} needs {expected}", data.len, desc.dims, desc.ty),
            }
            .into());
        }
        if desc.n_experts() > 1 {
            // Each expert lent from the map, or read into a copy of its own.
            let experts = (0..desc.n_experts())
                .map(|e| {
                    let range = desc.expert_range(e)?;
                    let slice = WeightData {
                        source: data.source.clone(),
                        offset: data.offset + range.start as u64,
                        len: range.len(),
                    };
                    CpuWeight::new(desc.expert(e), slice, repack)
                })
                .collect::<Result<Vec<_>>>()?;
            return Ok(CpuWeight {
                desc,
                bytes: Bytes::InExperts,
                repack,
                x16: OnceLock::new(),
                values: OnceLock::new(),
                row_bytes,
                experts,
            });
        }
        let bytes = if data.source.slice(data.offset, data.len).is_some() {
            Bytes::Lent { source: data.source.clone(), offset: data.offset, len: data.len }
        } else {
            let mut buf = vec![0u8; data.len];
            data.source.read_at(data.offset, &mut buf)?;
            Bytes::Owned(buf)
        };
        let w = CpuWeight {
            desc,
            bytes,
            repack,
            x16: OnceLock::new(),
            values: OnceLock::new(),
            row_bytes,
            experts: Vec::new(),
        };
        if w.desc.dims.len() == 1 {
            // Norms and biases are read every step: decoded now, and any decoding error with them.
            let mut v = vec![0f32; row_len];
            dequantize_row(w.desc.ty, w.bytes(), &mut v)?;
            let _ = w.values.set(Some(v));
        }
        Ok(w)
    }

    /// All of this dense weight's values, decoded to f32 on the first call; an error for an expert
    /// stack (whose experts are weights of their own) or a type without a decoder.
    pub fn values(&self) -> Result<&[f32], CpuError> {
        let values = self.values.get_or_init(|| {
            let mut v = vec![0f32; self.desc.row_len() * self.desc.n_rows()];
            (self.experts.is_empty() && dequantize_row(self.desc.ty, self.bytes(), &mut v).is_ok()).then_some(v)
        });
        values.as_deref().ok_or_else(|| CpuError::BadWeight {
            name: self.desc.name.clone(),
            reason: format!("{:?} {} read as a vector", self.desc.dims, self.desc.ty),
        })
    }

    /// This weight's x16 tiles, repacked on the first call (on the calling thread's rayon pool)
    /// where it is a Q4_K matrix, repacking is on and this CPU has the x16 kernel.
    pub fn x16(&self) -> Option<&X16Tiles> {
        self.x16
            .get_or_init(|| {
                let tiled_rows = self.desc.n_rows() / q4k_x16::TILE_ROWS * q4k_x16::TILE_ROWS;
                let wanted =
                    self.repack && self.desc.ty == GgmlType::Q4_K && self.desc.dims.len() >= 2 && tiled_rows > 0
                    // An expert weight's experts repack their own rows.
                    && self.experts.is_empty();
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

    /// Expert `e`'s matrix, a dense weight `[n_rows, row_len]`; a dense weight is its own expert 0.
    pub fn expert(&self, e: usize) -> Option<&CpuWeight> {
        match &self.bytes {
            Bytes::InExperts => self.experts.get(e),
            Bytes::Lent { .. } | Bytes::Owned(_) => (e == 0).then_some(self),
        }
    }

    /// The weight's bytes; empty for an expert weight, whose bytes are its experts'
    /// (`Graph::validate` gives no op one).
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            // The range was checked in `new`; an empty slice can only mean a source that stopped
            // lending, which the mmap and memory sources never do.
            Bytes::Lent { source, offset, len } => source.slice(*offset, *len).unwrap_or(&[]),
            Bytes::Owned(v) => v,
            Bytes::InExperts => &[],
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
            Bytes::InExperts => self.experts.iter().map(CpuWeight::owned_bytes).sum(),
        };
        let x16 = self.x16.get().and_then(Option::as_ref).map_or(0, |x| x.tiles.len() as u64);
        own + x16 + self.values.get().and_then(Option::as_ref).map_or(0, |v| v.len() as u64 * 4)
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

#[cfg(test)]
mod tests {
    use crate::CpuBackend;
    use hearth_core::backend::{Backend, WeightData};
    use hearth_core::gguf::{ByteSource, MemorySource};
    use hearth_core::graph::{Graph, Op, WeightDesc, WeightId};
    use hearth_core::quant::GgmlType;
    use hearth_core::CoreError;
    use std::sync::Arc;

    /// A source that reads but cannot lend its bytes (a browser's file): each expert is a copy.
    struct Unlent(MemorySource);

    impl ByteSource for Unlent {
        fn len(&self) -> u64 {
            self.0.len()
        }

        fn read_at(&self, offset: u64, buf: &mut [u8]) -> hearth_core::Result<()> {
            self.0.read_at(offset, buf)
        }
    }

    /// GGML [k = 64, n = 3, 4 experts] of Q8_0 (68 bytes a row, 204 an expert), 10 bytes into a
    /// file of other data.
    const SKIP: usize = 10;

    fn experts_desc() -> WeightDesc {
        WeightDesc { name: "blk.0.ffn_gate_exps.weight".into(), ty: GgmlType::Q8_0, dims: vec![64, 3, 4] }
    }

    fn file() -> Vec<u8> {
        (0..SKIP + 4 * 204 + 7).map(|i| (i * 7919 % 251) as u8).collect()
    }

    #[test]
    fn an_expert_weight_uploads_as_one_matrix_per_expert_the_files_slices() {
        let bytes = file();
        let lent: Arc<dyn ByteSource> = Arc::new(MemorySource::new(bytes.clone()));
        let unlent: Arc<dyn ByteSource> = Arc::new(Unlent(MemorySource::new(bytes.clone())));
        for (source, copied) in [(lent, 0), (unlent, 4 * 204)] {
            let mut backend = CpuBackend::new(Some(1)).expect("backend");
            let data = WeightData { source, offset: SKIP as u64, len: 4 * 204 };
            let id = backend.upload_weight(experts_desc(), data).expect("upload");
            let w = backend.weight(id).expect("uploaded");
            for e in 0..4 {
                let expert = w.expert(e).expect("expert");
                assert_eq!(expert.desc.dims, [64, 3], "expert {e}");
                assert_eq!(expert.desc.name, format!("blk.0.ffn_gate_exps.weight[{e}]"));
                for row in 0..3 {
                    let at = SKIP + e * 204 + row * 68;
                    assert_eq!(expert.row(row), &bytes[at..at + 68], "expert {e} row {row}");
                }
            }
            assert!(w.expert(4).is_none());
            // Lent experts cost nothing; read ones are one copy of the weight, not two.
            assert_eq!(backend.memory_bytes(), copied);
        }
    }

    #[test]
    fn a_dense_weight_is_its_own_only_expert() {
        let bytes = file();
        let mut backend = CpuBackend::new(Some(1)).expect("backend");
        let desc = WeightDesc { name: "w".into(), ty: GgmlType::Q8_0, dims: vec![64, 3] };
        let data = WeightData { source: Arc::new(MemorySource::new(bytes.clone())), offset: SKIP as u64, len: 204 };
        let id = backend.upload_weight(desc, data).expect("upload");
        let w = backend.weight(id).expect("uploaded");
        assert_eq!(w.expert(0).map(|e| e.rows(0, 3)), Some(&bytes[SKIP..SKIP + 204]));
        assert!(w.expert(1).is_none());
    }

    #[test]
    fn an_expert_weight_of_the_wrong_size_or_in_a_mat_mul_is_refused() {
        let source: Arc<dyn ByteSource> = Arc::new(MemorySource::new(file()));
        let mut backend = CpuBackend::new(Some(1)).expect("backend");
        let short = WeightData { source: source.clone(), offset: 0, len: 3 * 204 };
        let err = backend.upload_weight(experts_desc(), short).expect_err("one expert short").to_string();
        assert!(err.contains("needs 816"), "{err}");

        let id = backend.upload_weight(experts_desc(), WeightData { source, offset: 0, len: 4 * 204 }).expect("upload");
        let mut g = Graph::new(1, 1);
        let x = g.buf("x", 1, 64);
        g.logits = g.buf("out", 1, 3);
        g.push(Op::MatMul { w: id, x, bias: None, out: g.logits });
        let err = backend.compile(&g).expect_err("no op reads experts");
        assert!(matches!(err, CoreError::ExpertWeight { op: "mat_mul", n_experts: 4, .. }), "{err:?}");
        assert_eq!(id, WeightId(0), "the refused upload took no id");
    }
}
