//! Sampling support on the device: the per-row top-k reduction of a step's logits
//! (`shaders/sampling.wgsl`), recorded into the step's compute pass so a decode step reads back
//! `[n_rows, k]` (token id, logit) pairs instead of `[n_rows, n_vocab]` logits.

use crate::compile::Res;
use crate::device::Gpu;
use crate::kernel_params::{uniform_bytes, TopKParams};
use crate::replay::{make_bind_group, map_outcome, MapSignal};
use crate::shader::{PipelineCache, PipelineKey, ShaderFile};
use crate::WgpuError;
use hearth_core::backend::{Readback, TopK};
use wgpu::util::DeviceExt;

/// Logits per first-pass workgroup: 16 per thread of 256. Qwen's 151,936-entry vocabulary is 38
/// chunks, Gemma's 262,144 is 64; the merge pass then scans 38·k or 64·k candidates.
const CHUNK_LEN: usize = 4096;

/// Widest k reduced on the device (bounds the merge pass's work); wider asks read the logits and reduce on the host.
pub(crate) const MAX_K: usize = 256;

/// What a step's top-k reduction computes: the k best of each row, and with `log_sum_exp` each
/// row's log-sum-exp (`Readback::TopKAndLogSumExp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TopKSpec {
    pub k: usize,
    pub log_sum_exp: bool,
}

impl TopKSpec {
    /// The reduction recorded on the device for `readback`; `None` for the logits, or a k wider
    /// than [`MAX_K`] (then the logits are read back and reduced on the host).
    pub fn for_readback(readback: Readback) -> Option<Self> {
        let k = readback.top_k().filter(|&k| k <= MAX_K)?;
        Some(TopKSpec { k, log_sum_exp: matches!(readback, Readback::TopKAndLogSumExp(_)) })
    }
}

struct Pass {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    groups: [u32; 3],
}

/// A graph's top-k reduction for one k: built on the first step that asks for it, replayed after.
pub(crate) struct TopKPlan {
    k: usize,
    log_sum_exp: bool,
    n_rows: usize,
    chunks: Pass,
    merge: Pass,
    /// [n_rows, k, 2] u32 (token id, logit bits), best first; then, with `log_sum_exp`, [n_rows]
    /// f32 bits.
    out: wgpu::Buffer,
    /// Host-mappable copy of `out`.
    staging: wgpu::Buffer,
    /// Every buffer this plan made (freed with its graph).
    pub owned: Vec<wgpu::Buffer>,
}

impl TopKPlan {
    /// Pipelines (cached) and two bind groups over `logits` ([n_rows, n_vocab] f32), `1 ≤ k ≤
    /// n_vocab`.
    pub fn new(
        gpu: &Gpu,
        pipelines: &mut PipelineCache,
        logits: &wgpu::Buffer,
        n_rows: usize,
        n_vocab: usize,
        spec: TopKSpec,
    ) -> Result<Self, WgpuError> {
        let TopKSpec { k, log_sum_exp } = spec;
        if k == 0 || k > n_vocab || k > MAX_K || n_rows == 0 {
            return Err(WgpuError::Unsupported(format!("top-{k} of {n_rows} rows of {n_vocab} logits")));
        }
        let n_chunks = n_vocab.div_ceil(CHUNK_LEN);
        if n_chunks > 65535 || n_rows > 65535 {
            return Err(WgpuError::Unsupported(format!(
                "top-k over {n_rows} rows of {n_vocab} logits (grid too large)"
            )));
        }
        let storage = |label: &str, bytes: usize, usage: wgpu::BufferUsages| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes.max(4) as u64,
                usage,
                mapped_at_creation: false,
            })
        };
        // [n_rows, n_chunks, k, 2] u32
        let candidates = storage("top-k chunk candidates", n_rows * n_chunks * k * 8, wgpu::BufferUsages::STORAGE);
        let out_bytes = n_rows * k * 8 + if log_sum_exp { n_rows * 4 } else { 0 };
        let out = storage("top-k", out_bytes, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC);
        let staging = storage("top-k staging", out_bytes, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
        // [n_rows, n_chunks, 2] f32: each chunk's (max, sum) for the log-sum-exp.
        let partial_sums =
            log_sum_exp.then(|| storage("top-k chunk sums", n_rows * n_chunks * 8, wgpu::BufferUsages::STORAGE));
        let params = TopKParams {
            n_rows: n_rows as u32,
            n_vocab: n_vocab as u32,
            chunk_len: CHUNK_LEN as u32,
            n_chunks: n_chunks as u32,
            k: k as u32,
        };
        let params = gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("top-k params"),
            contents: &uniform_bytes(&params),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let pass = |pipelines: &mut PipelineCache,
                    entry,
                    define,
                    mut entries: Vec<(u32, Res)>,
                    groups|
         -> Result<Pass, WgpuError> {
            let defines: &[&str] = if log_sum_exp { &[define, "TOPK_LSE"] } else { &[define] };
            if let Some(partial_sums) = &partial_sums {
                entries.push((4, Res::Buf(partial_sums.clone())));
            }
            let pipeline = pipelines.get(&gpu.device, &PipelineKey::new(ShaderFile::Sampling, entry, defines))?;
            let bind_group = make_bind_group(&gpu.device, &pipeline, &entries, None)?;
            Ok(Pass { pipeline, bind_group, groups })
        };
        let chunks = pass(
            pipelines,
            "top_k_chunks",
            "TOPK_CHUNKS",
            vec![(0, Res::Buf(params.clone())), (1, Res::Buf(logits.clone())), (2, Res::Buf(candidates.clone()))],
            [n_chunks as u32, n_rows as u32, 1],
        )?;
        let merge = pass(
            pipelines,
            "top_k_merge",
            "TOPK_MERGE",
            vec![(0, Res::Buf(params.clone())), (2, Res::Buf(candidates.clone())), (3, Res::Buf(out.clone()))],
            [n_rows as u32, 1, 1],
        )?;
        let owned = [Some(params), Some(candidates), Some(out.clone()), Some(staging.clone()), partial_sums]
            .into_iter()
            .flatten()
            .collect();
        Ok(TopKPlan { k, log_sum_exp, n_rows, chunks, merge, out, staging, owned })
    }

    /// Bind groups `new` made.
    pub const BIND_GROUPS: u64 = 2;

    /// Records both passes after the step's dispatches; returns how many dispatches that is.
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>) -> u64 {
        for p in [&self.chunks, &self.merge] {
            pass.set_pipeline(&p.pipeline);
            pass.set_bind_group(0, &p.bind_group, &[]);
            pass.dispatch_workgroups(p.groups[0], p.groups[1], p.groups[2]);
        }
        2
    }

    /// Bytes the step reads back.
    pub fn bytes(&self) -> u64 {
        (self.n_rows * self.k * 8 + if self.log_sum_exp { self.n_rows * 4 } else { 0 }) as u64
    }

    /// Records the copy of the result into the mappable buffer (after the compute pass).
    pub fn copy_out(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.copy_buffer_to_buffer(&self.out, 0, &self.staging, 0, self.bytes());
    }

    pub fn staging(&self) -> &wgpu::Buffer {
        &self.staging
    }

    /// Copies the mapped result into `top` and unmaps.
    pub fn take(&self, signal: &MapSignal, top: &mut TopK) -> Result<(), WgpuError> {
        let Some(outcome) = map_outcome(signal) else {
            // Waiting failed before the map completed: cancel it, so the next step can map again.
            self.staging.unmap();
            return Err(WgpuError::ReadBack("the top-k candidates are not mapped yet".into()));
        };
        outcome?;
        {
            let view = self
                .staging
                .slice(0..self.bytes())
                .get_mapped_range()
                .map_err(|e| WgpuError::ReadBack(e.to_string()))?;
            let words: &[u32] = bytemuck::cast_slice(&view[..]);
            let (pairs, sums) = words.split_at((self.n_rows * self.k * 2).min(words.len()));
            top.k = self.k;
            top.ids.clear();
            top.logits.clear();
            top.log_sum_exp.clear();
            top.ids.extend(pairs.chunks_exact(2).map(|pair| pair[0]));
            top.logits.extend(pairs.chunks_exact(2).map(|pair| f32::from_bits(pair[1])));
            top.log_sum_exp.extend(sums.iter().map(|&bits| f32::from_bits(bits)));
        }
        self.staging.unmap();
        Ok(())
    }
}
