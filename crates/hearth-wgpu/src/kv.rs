//! The paged KV pool on the device: per layer, K and V buffers `[n_blocks, block_size,
//! row_words]` u32 in the layout's storage type (see `shaders/kv_cache.wgsl` for the row
//! formats), block copies (copy-on-write), and the per-step block-table words the kernels read.

use crate::WgpuError;
use hearth_core::backend::KvLayout;
use hearth_core::graph::StepInput;
use hearth_core::kv::{BlockCopy, KvType, ValueRows};

/// Shader define of a storage type, and u32 words of one stored row of `width` values.
pub(crate) fn kv_format(ty: KvType, width: usize) -> Result<(&'static str, usize), WgpuError> {
    let unsupported = || WgpuError::Unsupported(format!("KV type {} with rows of {width} values", ty.name()));
    match ty {
        KvType::F32 => Ok(("KV_F32", width)),
        KvType::F16 if width.is_multiple_of(2) => Ok(("KV_F16", width / 2)),
        // Quants (4 a word), then width/32 f16 scales (2 a word).
        KvType::Q8_0 if width.is_multiple_of(32) => Ok(("KV_Q8_0", width / 4 + (width / 32).div_ceil(2))),
        // Quants (8 a word), then width/32 f16 scales (2 a word).
        KvType::Q4_0 if width.is_multiple_of(32) => Ok(("KV_Q4_0", width / 8 + (width / 32).div_ceil(2))),
        _ => Err(unsupported()),
    }
}

pub(crate) struct GpuKv {
    pub layout: KvLayout,
    /// Define selecting the storage type in the kernels.
    pub define: &'static str,
    /// Bytes of one stored K / V row (multiples of 4).
    k_row_bytes: u64,
    v_row_bytes: u64,
    /// Per layer: [n_blocks of its group, block_size, k/v row] u32 (`v` empty where the values
    /// are the start of the key rows).
    pub k: Vec<wgpu::Buffer>,
    pub v: Vec<wgpu::Buffer>,
    /// One block of the widest row: a buffer cannot be copied onto itself, so block copies go
    /// through here.
    scratch: wgpu::Buffer,
}

impl GpuKv {
    pub fn new(device: &wgpu::Device, max_binding: u64, layout: KvLayout) -> Result<Self, WgpuError> {
        layout.check_values().map_err(WgpuError::Unsupported)?;
        let (define, k_words) = kv_format(layout.kv_type, layout.k_width)?;
        // A pool whose values are the start of its key rows has no value rows (nor buffers).
        let v_words = match layout.values {
            ValueRows::Stored => kv_format(layout.kv_type, layout.v_width)?.1,
            ValueRows::KeyPrefix => 0,
        };
        let (k_row_bytes, v_row_bytes) = (k_words as u64 * 4, v_words as u64 * 4);
        let bs = layout.block_size as u64;
        if bs == 0 {
            return Err(WgpuError::Unsupported("KV blocks of 0 positions".into()));
        }
        let buffer = |label: String, bytes: u64, usage: wgpu::BufferUsages| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&label),
                size: bytes.max(4),
                usage,
                mapped_at_creation: false,
            })
        };
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let (mut k, mut v) = (Vec::with_capacity(layout.n_layers), Vec::with_capacity(layout.n_layers));
        for layer in 0..layout.n_layers {
            let group = layout
                .group_of(layer)
                .ok_or_else(|| WgpuError::Unsupported(format!("layer {layer} is in no KV block group")))?;
            let positions = layout.groups[group].n_blocks as u64 * bs;
            let (kb, vb) = (positions * k_row_bytes, positions * v_row_bytes);
            if kb.max(vb) > max_binding {
                return Err(WgpuError::Unsupported(format!(
                    "KV layer of {} bytes exceeds the binding limit {max_binding}",
                    kb.max(vb)
                )));
            }
            k.push(buffer(format!("k_cache.{layer}"), kb, usage));
            if layout.values == ValueRows::Stored {
                v.push(buffer(format!("v_cache.{layer}"), vb, usage));
            }
        }
        let scratch = buffer(
            "kv block copy".into(),
            bs * k_row_bytes.max(v_row_bytes),
            wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        );
        Ok(GpuKv { layout, define, k_row_bytes, v_row_bytes, k, v, scratch })
    }

    pub fn bytes(&self) -> u64 {
        self.k.iter().chain(&self.v).map(|b| b.size()).sum()
    }

    /// Records the copies of positions 0..n_positions of block `src` into `dst`, for every
    /// layer of the copy's group, into `encoder`.
    pub fn encode_copies(&self, encoder: &mut wgpu::CommandEncoder, copies: &[BlockCopy]) -> Result<(), WgpuError> {
        let bs = self.layout.block_size;
        for c in copies {
            let n_blocks = self.layout.groups.get(c.group).map_or(0, |g| g.n_blocks);
            if c.src as usize >= n_blocks || c.dst as usize >= n_blocks || c.n_positions > bs {
                return Err(WgpuError::Unsupported(format!("block copy {c:?} outside the KV pool")));
            }
            if c.src == c.dst || c.n_positions == 0 {
                continue;
            }
            for layer in self.layout.groups[c.group].layers.iter().copied().filter(|&l| l < self.layout.n_layers) {
                for (buffer, row) in [(self.k.get(layer), self.k_row_bytes), (self.v.get(layer), self.v_row_bytes)] {
                    // No value buffers where the values are the start of the key rows.
                    let Some(buffer) = buffer else { continue };
                    let block = bs as u64 * row;
                    let len = c.n_positions as u64 * row;
                    encoder.copy_buffer_to_buffer(buffer, c.src as u64 * block, &self.scratch, 0, len);
                    encoder.copy_buffer_to_buffer(&self.scratch, 0, buffer, c.dst as u64 * block, len);
                }
            }
        }
        Ok(())
    }

    /// Table entries kept per sequence for group `g` in a graph of `n_tokens` tokens: all of a
    /// sequence's blocks are distinct, so never more than the pool; a windowed group's step
    /// touches at most the blocks around one window.
    fn table_cap(&self, g: usize, n_tokens: usize) -> usize {
        let group = &self.layout.groups[g];
        let bs = self.layout.block_size;
        match group.window {
            Some(w) => group.n_blocks.min((w + n_tokens).div_ceil(bs) + 1),
            None => group.n_blocks,
        }
    }

    /// u32 words of the TABLES buffer of a graph with `n_tokens` tokens of `n_seqs` sequences.
    pub fn tables_words(&self, n_tokens: usize, n_seqs: usize) -> usize {
        let header = 1 + 2 * self.layout.n_layers;
        header + (0..self.layout.groups.len()).map(|g| n_seqs * (self.table_cap(g, n_tokens) + 1)).sum::<usize>()
    }

    /// Fills `out` with the TABLES words of a step (layout in `shaders/kv_cache.wgsl`): the
    /// block size, each layer's table base and capacity, then per group and sequence the index of
    /// the first block the step touches and the blocks from there on.
    pub fn fill_tables(&self, n_tokens: usize, input: &StepInput<'_>, out: &mut Vec<u32>) -> Result<(), WgpuError> {
        let l = &self.layout;
        let bs = l.block_size;
        let n_seqs = input.seqs.len();
        out.clear();
        out.push(bs as u32);
        // Base of each group's tables.
        let mut bases = Vec::with_capacity(l.groups.len());
        let mut next = 1 + 2 * l.n_layers;
        for g in 0..l.groups.len() {
            bases.push(next);
            next += n_seqs * (self.table_cap(g, n_tokens) + 1);
        }
        for layer in 0..l.n_layers {
            let g = l.group_of(layer).unwrap_or(0);
            out.push(bases[g] as u32);
            out.push(self.table_cap(g, n_tokens) as u32);
        }
        for (g, group) in l.groups.iter().enumerate() {
            let cap = self.table_cap(g, n_tokens);
            for (i, s) in input.seqs.iter().enumerate() {
                let table = &s.block_tables[g];
                // As StepInput::validate: the first block any query of this step sees.
                let first = group.window.map_or(0, |w| (s.pos0 + 1).saturating_sub(w)) / bs;
                let end = (s.pos0 + s.n_tokens).div_ceil(bs);
                let blocks = table
                    .get(first..end)
                    .ok_or_else(|| WgpuError::Execution(format!("sequence {i}: block table of group {g} too short")))?;
                if blocks.len() > cap {
                    return Err(WgpuError::Unsupported(format!(
                        "sequence {i} touches {} blocks of group {g}, more than its {} (repeated blocks?)",
                        blocks.len(),
                        group.n_blocks
                    )));
                }
                out.push(first as u32);
                out.extend_from_slice(blocks);
                out.resize(out.len() + cap - blocks.len(), 0);
            }
        }
        Ok(())
    }
}
