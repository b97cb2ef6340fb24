//! Per step: write the step and block-table words, record one compute pass, submit once, read
//! the logits back. Dispatches that touch the KV pool get their pipeline (the storage type is a
//! shader define) and bind group once per pool, on the first step against it.

use crate::compile::{CompiledGraph, Dispatch, Res};
use crate::device::Gpu;
use crate::kv::GpuKv;
use crate::shader::PipelineCache;
use crate::WgpuError;
use hearth_core::backend::KvId;
use hearth_core::graph::StepInput;

/// What a graph needs to run against one KV pool.
pub(crate) struct KvBinding {
    /// [tables_words] u32 (layout in shaders/attention.wgsl), written every step.
    tables: wgpu::Buffer,
    /// Per dispatch: pipeline and bind group of the KV-touching ones.
    resolved: Vec<Option<(wgpu::ComputePipeline, wgpu::BindGroup)>>,
}

pub(crate) fn make_bind_group(
    device: &wgpu::Device,
    pipeline: &wgpu::ComputePipeline,
    entries: &[(u32, Res)],
    kv: Option<(&GpuKv, &wgpu::Buffer)>,
) -> Result<wgpu::BindGroup, WgpuError> {
    let mut resolved = Vec::with_capacity(entries.len());
    for (binding, res) in entries {
        let buffer = match (res, kv) {
            (Res::Buf(b), _) => b,
            (Res::Tables, Some((_, tables))) => tables,
            (Res::KvK(layer), Some((kv, _))) => kv.k.get(*layer).ok_or(WgpuError::UnknownId { what: "KV layer", id: *layer as u32 })?,
            (Res::KvV(layer), Some((kv, _))) => kv.v.get(*layer).ok_or(WgpuError::UnknownId { what: "KV layer", id: *layer as u32 })?,
            _ => return Err(WgpuError::Execution("KV binding without a KV pool".into())),
        };
        resolved.push(wgpu::BindGroupEntry { binding: *binding, resource: buffer.as_entire_binding() });
    }
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let group = device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &pipeline.get_bind_group_layout(0), entries: &resolved });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(WgpuError::Execution(format!("bind group: {e}")));
    }
    Ok(group)
}

/// Checks that a KV-touching dispatch fits the pool: the layer exists, rows have the pool's
/// widths, and attention never looks further back than its group keeps blocks.
fn check_fit(d: &Dispatch, kv: &GpuKv) -> Result<(), WgpuError> {
    let Some(need) = &d.kv_need else { return Ok(()) };
    let l = &kv.layout;
    let group = l.group_of(need.layer).filter(|_| need.layer < l.n_layers);
    let misfit = match group {
        None => Some("layer not in the pool".to_string()),
        Some(_) if need.k_width.is_some_and(|w| w != l.k_width) || need.v_width.is_some_and(|w| w != l.v_width) => {
            Some(format!("rows of {:?}/{:?} values, the pool's are {}/{}", need.k_width, need.v_width, l.k_width, l.v_width))
        }
        Some(g) => match (need.window, l.groups[g].window) {
            (Some(attention), Some(kept)) if attention.is_none_or(|a| a > kept) => {
                Some(format!("attention window {attention:?} is wider than the {kept} positions its group keeps"))
            }
            _ => None,
        },
    };
    match misfit {
        Some(why) => Err(WgpuError::Unsupported(format!("graph does not fit the KV pool on layer {}: {why}", need.layer))),
        None => Ok(()),
    }
}

impl CompiledGraph {
    /// Bind groups made at compile time (those of dispatches that do not touch the KV pool).
    pub fn bind_groups_created(&self) -> u64 {
        self.dispatches.iter().filter(|d| d.bind_group.is_some()).count() as u64
    }

    /// Builds, once per KV pool, what the KV-touching dispatches need; returns the bind groups
    /// created.
    pub fn ensure_kv_binding(&mut self, gpu: &Gpu, pipelines: &mut PipelineCache, kv_id: KvId, kv: &GpuKv) -> Result<u64, WgpuError> {
        if self.kv_bindings.contains_key(&kv_id.0) {
            return Ok(0);
        }
        let words = kv.tables_words(self.graph.n_tokens, self.graph.n_seqs);
        let tables = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("block tables"),
            size: (words.max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut resolved = Vec::with_capacity(self.dispatches.len());
        let mut made = 0;
        for d in &self.dispatches {
            if d.kv_need.is_none() {
                resolved.push(None);
                continue;
            }
            check_fit(d, kv)?;
            let mut key = d.key.clone();
            key.defines.push(kv.define);
            key.defines.sort_unstable();
            let pipeline = pipelines.get(&gpu.device, &key)?;
            let group = make_bind_group(&gpu.device, &pipeline, &d.entries, Some((kv, &tables)))?;
            resolved.push(Some((pipeline, group)));
            made += 1;
        }
        self.kv_bindings.insert(kv_id.0, KvBinding { tables, resolved });
        Ok(made)
    }

    /// The STEP words (layout in shaders/attention.wgsl) of a validated input.
    fn fill_step(&mut self, input: &StepInput<'_>) {
        let s = &mut self.step_words;
        s.clear();
        s.push(input.tokens.len() as u32);
        s.push(input.seqs.len() as u32);
        s.extend_from_slice(input.tokens);
        s.extend(input.token_positions().map(|(seq, _)| seq as u32));
        s.extend(input.token_positions().map(|(_, pos)| pos as u32));
        let mut first = 0;
        for seq in input.seqs {
            s.extend_from_slice(&[seq.pos0 as u32, seq.n_tokens as u32, first as u32]);
            first += seq.n_tokens;
        }
    }

    pub fn execute(&mut self, gpu: &Gpu, kv: &GpuKv, kv_id: KvId, input: StepInput<'_>, logits: &mut Vec<f32>) -> Result<(), WgpuError> {
        // Token ids are checked against the embedding tables below.
        input.validate(&self.graph, &kv.layout, usize::MAX).map_err(WgpuError::BadStep)?;
        if let Some(rows) = self.embed_rows {
            if let Some(&token) = input.tokens.iter().find(|&&t| t as usize >= rows) {
                return Err(WgpuError::TokenOutOfRange { token, rows });
            }
        }
        self.fill_step(&input);
        let binding = self.kv_bindings.get(&kv_id.0).ok_or(WgpuError::Execution("KV bindings missing".into()))?;
        kv.fill_tables(self.graph.n_tokens, &input, &mut self.table_words)?;
        gpu.queue.write_buffer(&self.step, 0, bytemuck::cast_slice(&self.step_words));
        gpu.queue.write_buffer(&binding.tables, 0, bytemuck::cast_slice(&self.table_words));
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut encoder = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("step"), timestamp_writes: None });
            for (d, kv_resolved) in self.dispatches.iter().zip(&binding.resolved) {
                let (pipeline, group) = match (&d.pipeline, &d.bind_group, kv_resolved) {
                    (Some(p), Some(g), _) => (p, g),
                    (_, _, Some((p, g))) => (p, g),
                    _ => return Err(WgpuError::Execution("dispatch without a pipeline".into())),
                };
                if d.groups.contains(&0) {
                    continue;
                }
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, group, &[]);
                pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
            }
        }
        let logits_buf = &self.bufs[self.graph.logits.0 as usize];
        encoder.copy_buffer_to_buffer(logits_buf, 0, &self.staging, 0, (self.logits_len * 4) as u64);
        gpu.queue.submit([encoder.finish()]);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(WgpuError::Execution(e.to_string()));
        }
        map_read(gpu, &self.staging, self.logits_len, logits)
    }
}

/// Maps `staging` (MAP_READ), copies `len` f32 out and unmaps.
fn map_read(gpu: &Gpu, staging: &wgpu::Buffer, len: usize, out: &mut Vec<f32>) -> Result<(), WgpuError> {
    let slice = staging.slice(0..(len * 4) as u64);
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        // The receiver lives until recv below returns.
        let _ = tx.send(r);
    });
    gpu.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| WgpuError::ReadBack(e.to_string()))?;
    rx.recv().map_err(|e| WgpuError::ReadBack(e.to_string()))?.map_err(|e| WgpuError::ReadBack(e.to_string()))?;
    {
        let view = slice.get_mapped_range().map_err(|e| WgpuError::ReadBack(e.to_string()))?;
        out.clear();
        out.extend_from_slice(bytemuck::cast_slice(&view[..]));
    }
    staging.unmap();
    Ok(())
}

/// Copies `len` f32 of a storage buffer to the host (debug taps, tests).
pub(crate) fn read_back(gpu: &Gpu, buffer: &wgpu::Buffer, len: usize) -> Result<Vec<f32>, WgpuError> {
    let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("read_back"),
        size: (len.max(1) * 4) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("read_back") });
    encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, (len * 4) as u64);
    gpu.queue.submit([encoder.finish()]);
    let mut out = Vec::new();
    map_read(gpu, &staging, len, &mut out)?;
    Ok(out)
}
