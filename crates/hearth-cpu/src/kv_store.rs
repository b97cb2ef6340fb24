//! The paged KV pool in host memory: per layer, K and V as `[n_blocks, block_size, row]` in the
//! pool's storage type (f32, f16, q8_0 or q4_0 rows). Attention reads a sequence's rows in place
//! through its block table ([`KvStore::paged`]), decoding them block by block.

use crate::attention::PagedKv;
use crate::CpuError;
use hearth_core::backend::KvLayout;
use hearth_core::graph::SeqStep;
use hearth_core::kv::{hadamard32, BlockCopy, ValueRows};
use hearth_core::quant::{quantize_row, GgmlType};

struct LayerKv {
    group: usize,
    k: Vec<u8>,
    v: Vec<u8>,
}

pub struct KvStore {
    pub layout: KvLayout,
    ty: GgmlType,
    k_row: usize,
    v_row: usize,
    layers: Vec<LayerKv>,
}

impl KvStore {
    pub fn new(layout: KvLayout) -> Result<Self, CpuError> {
        let ty = layout.kv_type.ggml_type();
        let row = |w: usize| {
            layout.kv_type.row_bytes(w).ok_or_else(|| {
                CpuError::BadKv(format!("KV type {} cannot store rows of {w} values", layout.kv_type.name()))
            })
        };
        layout.check_values().map_err(CpuError::BadKv)?;
        let k_row = row(layout.k_width)?;
        let v_row = match layout.values {
            ValueRows::Stored => row(layout.v_width)?,
            ValueRows::KeyPrefix => 0,
        };
        let mut layers = Vec::with_capacity(layout.n_layers);
        for layer in 0..layout.n_layers {
            let group = layout
                .group_of(layer)
                .ok_or_else(|| CpuError::BadKv(format!("layer {layer} is in no KV block group")))?;
            let positions = layout.groups[group].n_blocks * layout.block_size;
            layers.push(LayerKv { group, k: vec![0u8; positions * k_row], v: vec![0u8; positions * v_row] });
        }
        Ok(KvStore { layout, ty, k_row, v_row, layers })
    }

    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(|l| (l.k.len() + l.v.len()) as u64).sum()
    }

    pub fn group_of(&self, layer: usize) -> Option<usize> {
        self.layers.get(layer).map(|l| l.group)
    }

    /// Slot (block * block_size + offset) of position `pos` of a sequence in group `g`.
    fn slot(&self, seq: &SeqStep<'_>, g: usize, pos: usize) -> usize {
        let bs = self.layout.block_size;
        seq.block_tables[g][pos / bs] as usize * bs + pos % bs
    }

    /// Writes k, v: [n_tokens, width] of a step into `layer` at every token's position (v None
    /// where the values are the start of the key rows). A quantized pool stores k − `k_offset`
    /// and v − `v_offset` (see `Op::StoreKv`).
    pub fn store(
        &mut self,
        layer: usize,
        seqs: &[SeqStep<'_>],
        k: &[f32],
        v: Option<&[f32]>,
        k_offset: Option<&[f32]>,
        v_offset: Option<&[f32]>,
    ) -> Result<(), CpuError> {
        if v.is_some() != (self.layout.values == ValueRows::Stored) {
            return Err(CpuError::BadKv(format!(
                "a KV store on layer {layer} {} values, the pool's are {:?}",
                if v.is_some() { "with" } else { "without" },
                self.layout.values
            )));
        }
        let (kw, vw) = (self.layout.k_width, self.layout.v_width);
        let g = self.layers[layer].group;
        let rotate = self.layout.kv_type.rotates();
        let k_offset = self.offset(k_offset, kw)?;
        let v_offset = self.offset(v_offset, vw)?;
        let (mut k_rot, mut v_rot) = (Vec::new(), Vec::new());
        let mut t = 0;
        for seq in seqs {
            for pos in seq.pos0..seq.pos0 + seq.n_tokens {
                let slot = self.slot(seq, g, pos);
                let (mut k_src, mut v_src) =
                    (&k[t * kw..(t + 1) * kw], v.map_or(&[][..], |v| &v[t * vw..(t + 1) * vw]));
                if rotate {
                    k_rot.clear();
                    match k_offset {
                        Some(o) => k_rot.extend(k_src.iter().zip(o).map(|(k, o)| k - o)),
                        None => k_rot.extend_from_slice(k_src),
                    }
                    hadamard32(&mut k_rot);
                    v_rot.clear();
                    match v_offset {
                        Some(o) => v_rot.extend(v_src.iter().zip(o).map(|(v, o)| v - o)),
                        None => v_rot.extend_from_slice(v_src),
                    }
                    hadamard32(&mut v_rot);
                    (k_src, v_src) = (&k_rot, &v_rot);
                }
                let l = &mut self.layers[layer];
                quantize_row(self.ty, k_src, &mut l.k[slot * self.k_row..(slot + 1) * self.k_row])
                    .map_err(|e| CpuError::BadKv(e.to_string()))?;
                if v.is_some() {
                    quantize_row(self.ty, v_src, &mut l.v[slot * self.v_row..(slot + 1) * self.v_row])
                        .map_err(|e| CpuError::BadKv(e.to_string()))?;
                }
                t += 1;
            }
        }
        Ok(())
    }

    /// The offset a store subtracts: only a quantized pool does, and it must fit the rows.
    fn offset<'a>(&self, offset: Option<&'a [f32]>, width: usize) -> Result<Option<&'a [f32]>, CpuError> {
        match offset.filter(|_| self.layout.kv_type.subtracts_offsets()) {
            Some(o) if o.len() != width => {
                Err(CpuError::BadKv(format!("KV offset of {} values for rows of {width}", o.len())))
            }
            o => Ok(o),
        }
    }

    /// `layer`'s K/V of a sequence for attention over positions `lo..=hi`, after checking that
    /// its block table maps every one of them into the pool. A quantized pool adds `v_offset`
    /// back to the values it decodes.
    pub fn paged<'a>(
        &'a self,
        layer: usize,
        seq: &SeqStep<'a>,
        lo: usize,
        hi: usize,
        v_offset: Option<&'a [f32]>,
    ) -> Result<PagedKv<'a>, CpuError> {
        let bs = self.layout.block_size;
        let l = self
            .layers
            .get(layer)
            .ok_or_else(|| CpuError::BadKv(format!("attention on layer {layer} outside the KV pool")))?;
        let n_blocks = self.layout.groups[l.group].n_blocks;
        let table = seq.block_tables.get(l.group).map_or(&[][..], |t| &t[..]);
        for b in lo / bs..=hi / bs {
            if table.get(b).is_none_or(|&block| block as usize >= n_blocks) {
                return Err(CpuError::BadKv(format!(
                    "positions {lo}..={hi} of layer {layer}: block {b} of the sequence is not in the pool"
                )));
            }
        }
        let v_offset = self.offset(v_offset, self.layout.v_width)?;
        // Value columns are read from a row by their index, so values at the start of the key
        // rows are the key rows read as values.
        let (v, v_row) = match self.layout.values {
            ValueRows::Stored => (&l.v[..], self.v_row),
            ValueRows::KeyPrefix => (&l.k[..], self.k_row),
        };
        Ok(PagedKv {
            k: &l.k,
            v,
            k_row: self.k_row,
            v_row,
            kv_type: self.layout.kv_type,
            block_size: bs,
            block_table: table,
            v_offset,
        })
    }

    /// Test oracle (the gather attention used before it read the pages in place): positions
    /// `lo..=hi` of a sequence in `layer` as contiguous f32 rows: k_out: [n, k_width]
    /// (as stored: minus the key offset, which attention cannot see), v_out: [n, v_width] (with
    /// the value offset `v_offset` added back).
    #[cfg(test)]
    #[allow(clippy::too_many_arguments)]
    pub fn gather(
        &self,
        layer: usize,
        seq: &SeqStep<'_>,
        lo: usize,
        hi: usize,
        k_out: &mut Vec<f32>,
        v_out: &mut Vec<f32>,
        v_offset: Option<&[f32]>,
    ) -> Result<(), CpuError> {
        use hearth_core::quant::dequantize_row;
        let (kw, vw) = (self.layout.k_width, self.layout.v_width);
        let g = self.layers[layer].group;
        let n = hi + 1 - lo;
        k_out.resize(n * kw, 0.0);
        v_out.resize(n * vw, 0.0);
        let l = &self.layers[layer];
        let (v, v_row) = match self.layout.values {
            ValueRows::Stored => (&l.v, self.v_row),
            ValueRows::KeyPrefix => (&l.k, self.k_row),
        };
        // The bytes of a row's first vw values (whole blocks: KvLayout::check_values).
        let v_bytes = self.layout.kv_type.row_bytes(vw).unwrap_or(0);
        for (i, pos) in (lo..=hi).enumerate() {
            let slot = self.slot(seq, g, pos);
            dequantize_row(self.ty, &l.k[slot * self.k_row..(slot + 1) * self.k_row], &mut k_out[i * kw..(i + 1) * kw])
                .map_err(|e| CpuError::BadKv(e.to_string()))?;
            dequantize_row(self.ty, &v[slot * v_row..slot * v_row + v_bytes], &mut v_out[i * vw..(i + 1) * vw])
                .map_err(|e| CpuError::BadKv(e.to_string()))?;
        }
        if self.layout.kv_type.rotates() {
            // The rotation is its own inverse.
            hadamard32(k_out);
            hadamard32(v_out);
        }
        if let Some(o) = self.offset(v_offset, vw)? {
            v_out.chunks_exact_mut(vw).for_each(|row| row.iter_mut().zip(o).for_each(|(v, o)| *v += o));
        }
        Ok(())
    }

    pub fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<(), CpuError> {
        let bs = self.layout.block_size;
        for c in copies {
            let n_blocks = self.layout.groups.get(c.group).map_or(0, |g| g.n_blocks);
            if c.src as usize >= n_blocks || c.dst as usize >= n_blocks || c.n_positions > bs {
                return Err(CpuError::BadKv(format!("block copy {c:?} outside the pool")));
            }
            for l in self.layers.iter_mut().filter(|l| l.group == c.group) {
                // A pool without value rows has an empty `v`, copied as nothing (row 0).
                for (data, row) in [(&mut l.k, self.k_row), (&mut l.v, self.v_row)] {
                    let (src, dst) = (c.src as usize * bs * row, c.dst as usize * bs * row);
                    data.copy_within(src..src + c.n_positions * row, dst);
                }
            }
        }
        Ok(())
    }
}
