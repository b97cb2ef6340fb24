//! Per step: write the step and block-table words, record one compute pass, submit once, read
//! the logits back. Dispatches that touch the KV pool get their pipeline (the storage type is a
//! shader define) and bind group once per pool, on the first step against it.

use crate::compile::{CompiledGraph, Dispatch, Res};
use crate::device::Gpu;
use crate::kv::GpuKv;
use crate::sample::TopKSpec;
use crate::shader::PipelineCache;
use crate::WgpuError;
use hearth_core::backend::{KvId, TopK};
use hearth_core::graph::StepInput;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// The result of one `map_async` of a staging buffer, filled by wgpu's callback: natively during
/// `device.poll`, in a browser when the JS promise resolves on the event loop.
#[derive(Default)]
pub(crate) struct MapSlot {
    result: Option<Result<(), String>>,
    waker: Option<Waker>,
}

pub(crate) type MapSignal = Arc<Mutex<MapSlot>>;

/// Starts mapping `staging[..bytes]` for reading; the returned signal fills when it is mapped.
pub(crate) fn start_map(staging: &wgpu::Buffer, bytes: u64) -> MapSignal {
    let signal = MapSignal::default();
    let sink = signal.clone();
    staging.slice(0..bytes).map_async(wgpu::MapMode::Read, move |r| fill(&sink, r.map_err(|e| e.to_string())));
    signal
}

/// Completes `signal` (from a wgpu callback) and wakes whoever awaits it.
pub(crate) fn fill(signal: &MapSignal, result: Result<(), String>) {
    if let Ok(mut slot) = signal.lock() {
        slot.result = Some(result);
        if let Some(waker) = slot.waker.take() {
            waker.wake();
        }
    }
}

/// The outcome of a started map: `None` while it is still pending.
pub(crate) fn map_outcome(signal: &MapSignal) -> Option<Result<(), WgpuError>> {
    let slot = signal.lock().ok()?;
    slot.result.clone().map(|r| r.map_err(WgpuError::ReadBack))
}

/// Resolves when the map behind `signal` completed (successfully or not).
pub(crate) struct MapDone(pub MapSignal);

impl Future for MapDone {
    type Output = Result<(), WgpuError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = match self.0.lock() {
            Ok(slot) => slot,
            Err(_) => return Poll::Ready(Err(WgpuError::ReadBack("map state poisoned".into()))),
        };
        match slot.result.clone() {
            Some(r) => Poll::Ready(r.map_err(WgpuError::ReadBack)),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Natively: validation errors of what was recorded since `push`, synchronously. In a browser a
/// scope can only be popped on the event loop, so no scope is pushed; errors reach the device's
/// uncaptured-error handler ([`crate::device::FaultWatch`]) and fail the step that reads them.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn validation_scope(device: &wgpu::Device) -> Option<wgpu::ErrorScopeGuard> {
    Some(device.push_error_scope(wgpu::ErrorFilter::Validation))
}

#[cfg(target_arch = "wasm32")]
pub(crate) fn validation_scope(_device: &wgpu::Device) -> Option<wgpu::ErrorScopeGuard> {
    None
}

pub(crate) fn pop_scope(scope: Option<wgpu::ErrorScopeGuard>) -> Option<wgpu::Error> {
    #[cfg(not(target_arch = "wasm32"))]
    return scope.and_then(|s| pollster::block_on(s.pop()));
    #[cfg(target_arch = "wasm32")]
    {
        drop(scope);
        None
    }
}

/// What a graph needs to run against one KV pool.
pub(crate) struct KvBinding {
    /// [tables_words] u32 (layout in shaders/kv_cache.wgsl), written every step.
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
            (Res::KvOffset(b), None) => b,
            (Res::KvOffset(b), Some((kv, _))) if kv.layout.kv_type.subtracts_offsets() => b,
            (Res::KvOffset(_), Some(_)) => continue,
            (Res::Tables, Some((_, tables))) => tables,
            (Res::KvK(layer), Some((kv, _))) => {
                kv.k.get(*layer).ok_or(WgpuError::UnknownId { what: "KV layer", id: *layer as u32 })?
            }
            (Res::KvV(layer), Some((kv, _))) => {
                kv.v.get(*layer).ok_or(WgpuError::UnknownId { what: "KV layer", id: *layer as u32 })?
            }
            _ => return Err(WgpuError::Execution("KV binding without a KV pool".into())),
        };
        resolved.push(wgpu::BindGroupEntry { binding: *binding, resource: buffer.as_entire_binding() });
    }
    let scope = validation_scope(device);
    let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &resolved,
    });
    if let Some(e) = pop_scope(scope) {
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
        Some(_)
            if need.k_width.is_some_and(|w| w != l.k_width)
                || need.v_width.is_some_and(|w| w != l.v_width)
                || need.values.is_some_and(|v| v != l.values) =>
        {
            Some(format!(
                "rows of {:?}/{:?} values ({:?}), the pool's are {}/{} ({:?})",
                need.k_width, need.v_width, need.values, l.k_width, l.v_width, l.values
            ))
        }
        Some(g) => match (need.window, l.groups[g].window) {
            (Some(attention), Some(kept)) if attention.is_none_or(|a| a > kept) => {
                Some(format!("attention window {attention:?} is wider than the {kept} positions its group keeps"))
            }
            _ => None,
        },
    };
    match misfit {
        Some(why) => {
            Err(WgpuError::Unsupported(format!("graph does not fit the KV pool on layer {}: {why}", need.layer)))
        }
        None => Ok(()),
    }
}

/// A step on its way: the read-back's signal, its size and the dispatches recorded.
pub(crate) struct Submitted {
    pub signal: MapSignal,
    pub bytes_read_back: u64,
    pub dispatches: u64,
}

impl CompiledGraph {
    /// Every buffer this graph made (activations, step words, staging, scratch, parameters,
    /// block tables, top-k reductions); not the weights or the KV pool it binds.
    fn owned_buffers(&self) -> impl Iterator<Item = &wgpu::Buffer> {
        let tables = self.kv_bindings.values().map(|b| &b.tables);
        let top_k = self.top_k_plans.values().flat_map(|p| p.owned.iter());
        let outputs = self.output_staging.iter().map(|(_, staging)| staging);
        self.bufs.iter().chain([&self.step, &self.staging]).chain(&self.owned).chain(tables).chain(top_k).chain(outputs)
    }

    /// Device bytes this graph holds.
    pub fn bytes(&self) -> u64 {
        self.owned_buffers().map(wgpu::Buffer::size).sum()
    }

    /// Frees this graph's device memory now (its bind groups and pipelines go with the value).
    pub fn destroy(self) {
        self.owned_buffers().for_each(wgpu::Buffer::destroy);
    }

    /// Bind groups made at compile time (those of dispatches that do not touch the KV pool).
    pub fn bind_groups_created(&self) -> u64 {
        self.dispatches.iter().filter(|d| d.bind_group.is_some()).count() as u64
    }

    /// Builds, once per KV pool, what the KV-touching dispatches need; returns the bind groups
    /// created.
    pub fn ensure_kv_binding(
        &mut self,
        gpu: &Gpu,
        pipelines: &mut PipelineCache,
        kv_id: KvId,
        kv: &GpuKv,
    ) -> Result<u64, WgpuError> {
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
            if kv.layout.kv_type.subtracts_offsets() && d.kv_need.as_ref().is_some_and(|need| need.offsets) {
                key.defines.push("KV_OFFSET");
            }
            key.defines.sort_unstable();
            let pipeline = pipelines.get(&gpu.device, &key)?;
            let group = make_bind_group(&gpu.device, &pipeline, &d.entries, Some((kv, &tables)))?;
            resolved.push(Some((pipeline, group)));
            made += 1;
        }
        self.kv_bindings.insert(kv_id.0, KvBinding { tables, resolved });
        Ok(made)
    }

    /// The STEP words (layout in shaders/kv_cache.wgsl) of a validated input.
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

    /// Builds, once per k, the top-k reduction of this graph's logits; returns the bind groups
    /// created.
    pub fn ensure_top_k(&mut self, gpu: &Gpu, pipelines: &mut PipelineCache, spec: TopKSpec) -> Result<u64, WgpuError> {
        if self.top_k_plans.contains_key(&spec) {
            return Ok(0);
        }
        let desc = &self.graph.bufs[self.graph.logits.0 as usize];
        let plan = crate::sample::TopKPlan::new(
            gpu,
            pipelines,
            &self.bufs[self.graph.logits.0 as usize],
            desc.rows,
            desc.cols,
            spec,
        )?;
        self.top_k_plans.insert(spec, plan);
        Ok(crate::sample::TopKPlan::BIND_GROUPS)
    }

    /// Records and submits one step and starts mapping what it reads back: the logits, or with
    /// `top_k = Some(k)` (after [`CompiledGraph::ensure_top_k`]) the top-k reduction recorded in
    /// the same pass. Returns the signal [`CompiledGraph::take_logits`] / [`CompiledGraph::take_top_k`]
    /// wait for, and the bytes being read back.
    pub fn submit(
        &mut self,
        gpu: &Gpu,
        kv: &GpuKv,
        kv_id: KvId,
        input: StepInput<'_>,
        top_k: Option<TopKSpec>,
    ) -> Result<Submitted, WgpuError> {
        if let Some(spec) = top_k.filter(|spec| !self.top_k_plans.contains_key(spec)) {
            return Err(WgpuError::Execution(format!("{spec:?} reduction not built")));
        }
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
        let plan = top_k.and_then(|k| self.top_k_plans.get(&k));
        let scope = validation_scope(&gpu.device);
        let mut encoder = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        let mut dispatches = 0;
        {
            let mut pass = encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("step"), timestamp_writes: None });
            self.timed.clear();
            for (index, (d, kv_resolved)) in self.dispatches.iter().zip(&binding.resolved).enumerate() {
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
                if let Some(t) = &self.timestamps {
                    t.write(&mut pass, self.timed.len() as u32, false);
                }
                pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
                if let Some(t) = &self.timestamps {
                    t.write(&mut pass, self.timed.len() as u32, true);
                    self.timed.push(index);
                }
                dispatches += 1;
            }
            if let Some(plan) = plan {
                if let Some(t) = &self.timestamps {
                    t.write(&mut pass, self.timed.len() as u32, false);
                }
                dispatches += plan.encode(&mut pass);
                if let Some(t) = &self.timestamps {
                    t.write(&mut pass, self.timed.len() as u32, true);
                    self.timed.push(usize::MAX);
                }
            }
        }
        if let Some(t) = &self.timestamps {
            t.resolve(&mut encoder, self.timed.len() as u32);
        }
        let (staging, bytes) = match plan {
            Some(plan) => {
                plan.copy_out(&mut encoder);
                (plan.staging(), plan.bytes())
            }
            None => {
                let logits_buf = &self.bufs[self.graph.logits.0 as usize];
                encoder.copy_buffer_to_buffer(logits_buf, 0, &self.staging, 0, (self.logits_len * 4) as u64);
                (&self.staging, (self.logits_len * 4) as u64)
            }
        };
        for (buf, staging) in &self.output_staging {
            encoder.copy_buffer_to_buffer(&self.bufs[buf.0 as usize], 0, staging, 0, staging.size());
        }
        gpu.queue.submit([encoder.finish()]);
        if let Some(e) = pop_scope(scope) {
            return Err(WgpuError::Execution(e.to_string()));
        }
        Ok(Submitted { signal: start_map(staging, bytes), bytes_read_back: bytes, dispatches })
    }

    /// Copies the top-k candidates of a step submitted with `top_k = Some(k)` and unmaps.
    pub fn take_top_k(&self, spec: TopKSpec, signal: &MapSignal, top: &mut TopK) -> Result<(), WgpuError> {
        let plan = self.top_k_plans.get(&spec).ok_or(WgpuError::Execution(format!("{spec:?} reduction not built")))?;
        plan.take(signal, top)
    }

    /// Copies the logits of the submitted step out of the mapped staging buffer and unmaps it.
    pub fn take_logits(&self, signal: &MapSignal, logits: &mut Vec<f32>) -> Result<(), WgpuError> {
        copy_mapped(&self.staging, self.logits_len, signal, logits)
    }
}

/// Copies `len` 4-byte values out of `staging` once `signal` says it is mapped, then unmaps it.
fn copy_mapped<T: bytemuck::Pod>(
    staging: &wgpu::Buffer,
    len: usize,
    signal: &MapSignal,
    out: &mut Vec<T>,
) -> Result<(), WgpuError> {
    let Some(outcome) = map_outcome(signal) else {
        // Waiting failed before the map completed: cancel it, so the next step can map again.
        staging.unmap();
        return Err(WgpuError::ReadBack("the logits are not mapped yet".into()));
    };
    outcome?;
    {
        let slice = staging.slice(0..(len * 4) as u64);
        let view = slice.get_mapped_range().map_err(|e| WgpuError::ReadBack(e.to_string()))?;
        out.clear();
        out.extend_from_slice(bytemuck::cast_slice(&view[..]));
    }
    staging.unmap();
    Ok(())
}

/// Natively: waits until the device finished the submitted work (map callbacks run here).
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn wait_idle(gpu: &Gpu) -> Result<(), WgpuError> {
    gpu.device.poll(wgpu::PollType::wait_indefinitely()).map(|_| ()).map_err(|e| WgpuError::ReadBack(e.to_string()))
}

/// A mappable buffer `len` 4-byte values long, to read a storage buffer back through.
pub(crate) fn staging_for(gpu: &Gpu, len: usize) -> wgpu::Buffer {
    gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("read_back"),
        size: (len.max(1) * 4) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// Maps `staging`, which a submitted step copied `len` 4-byte values to, and copies them out
/// (natively only: it waits).
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn read_staging<T: bytemuck::Pod>(
    gpu: &Gpu,
    staging: &wgpu::Buffer,
    len: usize,
    out: &mut Vec<T>,
) -> Result<(), WgpuError> {
    let signal = start_map(staging, (len * 4) as u64);
    wait_idle(gpu)?;
    copy_mapped(staging, len, &signal, out)
}

/// Copies `len` f32 of a storage buffer to the host (debug taps, tests; natively only: it waits).
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn read_back(gpu: &Gpu, buffer: &wgpu::Buffer, len: usize) -> Result<Vec<f32>, WgpuError> {
    let staging = staging_for(gpu, len);
    let mut encoder = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("read_back") });
    encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, (len * 4) as u64);
    gpu.queue.submit([encoder.finish()]);
    let mut out = Vec::new();
    read_staging(gpu, &staging, len, &mut out)?;
    Ok(out)
}
