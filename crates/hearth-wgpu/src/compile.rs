//! Graph → dispatch list (at compile time) and replay (per step).

use crate::device::Gpu;
use crate::shader::{PipelineCache, PipelineKey, ShaderFile};
use crate::weights::{type_define, GpuWeight};
use crate::{GpuKv, WgpuError};
use hearth_core::backend::KvId;
use hearth_core::graph::{BufId, Graph, Op, RopeMode, StepInput, WeightId};
use hearth_core::quant::GgmlType;
use std::collections::HashMap;
use wgpu::util::DeviceExt;

/// Workgroups per grid dimension (WebGPU's guaranteed minimum).
const MAX_GROUPS: u32 = 65535;

/// A 1-D count of workgroups folded into (x, y) when wider than one dimension allows.
fn fold(n: usize) -> (u32, u32) {
    let n = n as u32;
    if n <= MAX_GROUPS {
        (n, 1)
    } else {
        (MAX_GROUPS, n.div_ceil(MAX_GROUPS))
    }
}

/// A bound resource; the KV cache is known only at execute time.
enum Res {
    Buf(wgpu::Buffer),
    KvK(usize),
    KvV(usize),
}

/// What a KV-reading dispatch requires of the cache it runs against.
struct KvNeed {
    layer: usize,
    k_width: Option<usize>,
    v_width: Option<usize>,
}

struct Dispatch {
    pipeline: wgpu::ComputePipeline,
    entries: Vec<(u32, Res)>,
    kv_need: Option<KvNeed>,
    bind_group: Option<wgpu::BindGroup>,
    groups: [u32; 3],
}

pub(crate) struct CompiledGraph {
    pub graph: Graph,
    /// One storage buffer per graph buffer, `[rows, cols]` f32.
    pub bufs: Vec<wgpu::Buffer>,
    /// [2 + n_tokens] u32: pos0, n_tokens, token ids; written once per step.
    step: wgpu::Buffer,
    staging: wgpu::Buffer,
    logits_len: usize,
    dispatches: Vec<Dispatch>,
    /// Bind groups of KV-reading dispatches, per KV cache (index = dispatch index).
    kv_groups: HashMap<u32, Vec<Option<wgpu::BindGroup>>>,
    /// Rows of the smallest embedding table (token ids are checked on the host).
    embed_rows: Option<usize>,
}


struct Builder<'a> {
    gpu: &'a Gpu,
    pipelines: &'a mut PipelineCache,
    weights: &'a [GpuWeight],
    graph: &'a Graph,
    bufs: Vec<wgpu::Buffer>,
    step: wgpu::Buffer,
    /// [rows, k] f32 scratch shared by every mat-mul: its activations as the CPU rounds them.
    act_scratch: Option<wgpu::Buffer>,
    dispatches: Vec<Dispatch>,
    index: usize,
}

impl Builder<'_> {
    fn bad(&self, reason: String) -> WgpuError {
        WgpuError::BadGraph { index: self.index, op: self.graph.ops[self.index].name(), reason }
    }

    fn shape(&self, b: BufId) -> Result<(usize, usize), WgpuError> {
        self.graph.bufs.get(b.0 as usize).map(|d| (d.rows, d.cols)).ok_or_else(|| self.bad(format!("unknown buffer {}", b.0)))
    }

    fn same(&self, a: BufId, b: BufId) -> Result<(usize, usize), WgpuError> {
        let (sa, sb) = (self.shape(a)?, self.shape(b)?);
        if sa != sb {
            return Err(self.bad(format!("shapes {sa:?} and {sb:?} differ")));
        }
        Ok(sa)
    }

    fn weight(&self, id: WeightId) -> Result<&GpuWeight, WgpuError> {
        self.weights.get(id.0 as usize).ok_or(WgpuError::UnknownId { what: "weight", id: id.0 })
    }

    /// An F32 vector weight of exactly `len` values.
    fn vector(&self, id: WeightId, len: usize) -> Result<wgpu::Buffer, WgpuError> {
        let w = self.weight(id)?;
        if w.desc.dims.iter().product::<u64>() != len as u64 {
            return Err(self.bad(format!("weight '{}' {:?} should hold {len} values", w.desc.name, w.desc.dims)));
        }
        Ok(w.as_f32_vector()?.clone())
    }

    fn buf(&self, b: BufId) -> Res {
        Res::Buf(self.bufs[b.0 as usize].clone())
    }

    fn push(
        &mut self,
        key: PipelineKey,
        params: &[u32],
        mut entries: Vec<(u32, Res)>,
        groups: [u32; 3],
        kv_need: Option<KvNeed>,
    ) -> Result<(), WgpuError> {
        let pipeline = self.pipelines.get(&self.gpu.device, &key)?;
        let params = self.gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(key.entry),
            contents: bytemuck::cast_slice(params),
            usage: wgpu::BufferUsages::STORAGE,
        });
        entries.insert(0, (0, Res::Buf(params)));
        let bind_group = match kv_need {
            Some(_) => None,
            None => Some(make_bind_group(&self.gpu.device, &pipeline, &entries, None)?),
        };
        self.dispatches.push(Dispatch { pipeline, entries, kv_need, bind_group, groups });
        Ok(())
    }

    fn elementwise(&mut self, entry: &'static str, define: &'static str, a: BufId, b: Option<BufId>, out: BufId, extra: &[u32]) -> Result<(), WgpuError> {
        let (rows, cols) = self.shape(out)?;
        let len = rows * cols;
        let (gx, gy) = fold(len.div_ceil(256));
        let mut defines = vec![define];
        let mut entries = Vec::new();
        if a == out {
            defines.push("INPLACE");
        } else {
            entries.push((1, self.buf(a)));
        }
        if let Some(b) = b {
            defines.push("BINARY");
            entries.push((2, self.buf(b)));
        }
        entries.push((3, self.buf(out)));
        let mut params = vec![len as u32, gx];
        params.extend_from_slice(extra);
        self.push(PipelineKey::new(ShaderFile::Elementwise, entry, &defines), &params, entries, [gx, gy, 1], None)
    }

    fn op(&mut self, op: &Op) -> Result<(), WgpuError> {
        let n = self.graph.n_tokens;
        match op {
            Op::Embed { table, out } => {
                let w = self.weight(*table)?;
                let ty = type_define(w.desc.ty).ok_or_else(|| WgpuError::Unsupported(format!("embedding type {}", w.desc.ty.name())))?;
                let row_len = w.desc.row_len();
                if self.shape(*out)? != (n, row_len) {
                    return Err(self.bad(format!("output {:?} vs table rows of {row_len}", self.shape(*out)?)));
                }
                let row_bytes = w.row_bytes as u32;
                let chunks: Vec<(u32, u32, wgpu::Buffer)> = w.chunks.iter().map(|c| (c.row0 as u32, c.rows as u32, c.buffer.clone())).collect();
                for (row0, rows, buffer) in chunks {
                    let entries = vec![(1, Res::Buf(buffer)), (2, Res::Buf(self.step.clone())), (3, self.buf(*out))];
                    let params = [row0, rows, row_len as u32, row_bytes];
                    self.push(PipelineKey::new(ShaderFile::Quant, "embed", &["EMBED", ty]), &params, entries, [row_len.div_ceil(64) as u32, n as u32, 1], None)?;
                }
            }
            Op::RmsNorm { x, weight, eps, group, out } => {
                let (rows, cols) = self.same(*x, *out)?;
                if *group == 0 || cols % group != 0 {
                    return Err(self.bad(format!("group {group} does not divide {cols}")));
                }
                let n_groups = rows * cols / group;
                let (gx, gy) = fold(n_groups);
                let mut defines = vec![];
                let mut entries = vec![];
                if x == out {
                    defines.push("INPLACE");
                } else {
                    entries.push((1, self.buf(*x)));
                }
                if let Some(w) = weight {
                    defines.push("WEIGHT");
                    entries.push((2, Res::Buf(self.vector(*w, *group)?)));
                }
                entries.push((3, self.buf(*out)));
                let params = [n_groups as u32, gx, *group as u32, eps.to_bits()];
                self.push(PipelineKey::new(ShaderFile::Norm, "rms_norm", &defines), &params, entries, [gx, gy, 1], None)?;
            }
            Op::MatMul { w, x, bias, out } => {
                let wt = self.weight(*w)?;
                let ty = type_define(wt.desc.ty).ok_or_else(|| WgpuError::Unsupported(format!("mat-mul weight type {}", wt.desc.ty.name())))?;
                let (k, n_out) = (wt.desc.row_len(), wt.desc.n_rows());
                let (rows, xk) = self.shape(*x)?;
                if xk != k || self.shape(*out)? != (rows, n_out) || x == out {
                    return Err(self.bad(format!("x {:?}, out {:?}, weight '{}' {:?}", self.shape(*x)?, self.shape(*out)?, wt.desc.name, wt.desc.dims)));
                }
                let row_bytes = wt.row_bytes as u32;
                let chunks: Vec<(u32, usize, wgpu::Buffer)> = wt.chunks.iter().map(|c| (c.row0 as u32, c.rows, c.buffer.clone())).collect();
                let bias = bias.map(|b| self.vector(b, n_out)).transpose()?;
                // The CPU multiplies with activations rounded to the weight's dot type.
                let act = match wt.desc.ty.vec_dot_type() {
                    GgmlType::Q8_0 => Some(("Q8_0", 32)),
                    GgmlType::Q8_K => Some(("Q8_K", 256)),
                    GgmlType::F16 => Some(("F16", 1)),
                    _ => None,
                };
                let x_used = match act {
                    Some((define, block_len)) => {
                        let scratch = self.act_scratch.clone().ok_or_else(|| self.bad("no activation scratch".into()))?;
                        let n_blocks = rows * k / block_len;
                        let (gx, gy) = fold(n_blocks.div_ceil(64));
                        let entries = vec![(1, self.buf(*x)), (2, Res::Buf(scratch.clone()))];
                        self.push(PipelineKey::new(ShaderFile::ActQuant, "act_quant", &[define]), &[n_blocks as u32, block_len as u32, gx], entries, [gx, gy, 1], None)?;
                        Res::Buf(scratch)
                    }
                    None => self.buf(*x),
                };
                let mut defines = vec!["MATMUL", ty];
                if bias.is_some() {
                    defines.push("BIAS");
                }
                let tile = if rows == 1 {
                    defines.push("DECODE");
                    1
                } else {
                    8
                };
                let x_buffer = match x_used {
                    Res::Buf(b) => b,
                    _ => return Err(self.bad("activation is not a buffer".into())),
                };
                for (row0, chunk_rows, buffer) in chunks {
                    let (gx, gy) = fold(chunk_rows);
                    let mut entries = vec![(1, Res::Buf(buffer)), (2, Res::Buf(x_buffer.clone())), (3, self.buf(*out))];
                    if let Some(b) = &bias {
                        entries.push((4, Res::Buf(b.clone())));
                    }
                    let params = [row0, chunk_rows as u32, k as u32, row_bytes, n_out as u32, rows as u32, gx];
                    self.push(PipelineKey::new(ShaderFile::Quant, "matmul", &defines), &params, entries, [gx, gy, rows.div_ceil(tile) as u32], None)?;
                }
            }
            Op::Rope { x, params: p } => {
                let (rows, cols) = self.shape(*x)?;
                if p.head_dim == 0 || cols % p.head_dim != 0 || p.n_rot > p.head_dim || p.n_rot % 2 != 0 {
                    return Err(self.bad(format!("{cols} columns with head_dim {} n_rot {}", p.head_dim, p.n_rot)));
                }
                if p.n_rot == 0 {
                    return Ok(());
                }
                let n_heads = cols / p.head_dim;
                let total = rows * n_heads * (p.n_rot / 2);
                let (gx, gy) = fold(total.div_ceil(64));
                let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
                let mut defines = vec![];
                if p.mode == RopeMode::Neox {
                    defines.push("NEOX");
                }
                let mut entries = vec![(1, Res::Buf(self.step.clone()))];
                if let Some(f) = p.freq_factors {
                    defines.push("FREQ_FACTORS");
                    entries.push((2, Res::Buf(self.vector(f, p.n_rot / 2)?)));
                }
                entries.push((3, self.buf(*x)));
                let params = [rows as u32, n_heads as u32, p.head_dim as u32, p.n_rot as u32, theta_scale.to_bits(), p.freq_scale.to_bits(), cols as u32, gx];
                self.push(PipelineKey::new(ShaderFile::Rope, "rope", &defines), &params, entries, [gx, gy, 1], None)?;
            }
            Op::StoreKv { layer, k, v } => {
                for (src, is_k) in [(*k, true), (*v, false)] {
                    let (rows, cols) = self.shape(src)?;
                    let (gx, gy) = fold((rows * cols).div_ceil(256));
                    let cache = if is_k { Res::KvK(*layer) } else { Res::KvV(*layer) };
                    let entries = vec![(1, Res::Buf(self.step.clone())), (2, self.buf(src)), (3, cache)];
                    let need = if is_k {
                        KvNeed { layer: *layer, k_width: Some(cols), v_width: None }
                    } else {
                        KvNeed { layer: *layer, k_width: None, v_width: Some(cols) }
                    };
                    self.push(PipelineKey::new(ShaderFile::Attention, "store_kv", &["STORE_KV"]), &[rows as u32, cols as u32, gx], entries, [gx, gy, 1], Some(need))?;
                }
            }
            Op::Attention { q, params: p, out } => {
                let (rows, cols) = self.same(*q, *out)?;
                if p.n_head_kv == 0 || p.n_head % p.n_head_kv != 0 || cols != p.n_head * p.head_dim || q == out {
                    return Err(self.bad(format!("{cols} columns for {} heads of {}", p.n_head, p.head_dim)));
                }
                if p.head_dim > 512 {
                    return Err(WgpuError::Unsupported(format!("attention head_dim {} > 512", p.head_dim)));
                }
                let (gx, gy) = fold(rows * p.n_head);
                let kv_width = p.n_head_kv * p.head_dim;
                let entries = vec![(1, Res::Buf(self.step.clone())), (2, self.buf(*q)), (3, Res::KvK(p.layer)), (4, Res::KvV(p.layer)), (5, self.buf(*out))];
                let params = [
                    rows as u32,
                    p.n_head as u32,
                    p.n_head_kv as u32,
                    p.head_dim as u32,
                    p.scale.to_bits(),
                    p.window.unwrap_or(0) as u32,
                    p.softcap.unwrap_or(0.0).to_bits(),
                    gx,
                    // The CPU oracle (like ggml) switches to f32 numerics from 64 queries on.
                    u32::from(rows < 64),
                ];
                let need = KvNeed { layer: p.layer, k_width: Some(kv_width), v_width: Some(kv_width) };
                self.push(PipelineKey::new(ShaderFile::Attention, "attention", &["ATTENTION"]), &params, entries, [gx, gy, 1], Some(need))?;
            }
            Op::Add { a, b, out } | Op::SwiGlu { gate: a, up: b, out } | Op::GeGlu { gate: a, up: b, out } => {
                self.same(*a, *b)?;
                self.same(*a, *out)?;
                if b == out {
                    return Err(self.bad("out may alias the first operand, not the second".into()));
                }
                let (entry, define) = match op {
                    Op::Add { .. } => ("add", "ADD"),
                    Op::SwiGlu { .. } => ("swiglu", "SWIGLU"),
                    _ => ("geglu", "GEGLU"),
                };
                self.elementwise(entry, define, *a, Some(*b), *out, &[])?;
            }
            Op::Scale { x, factor } => {
                self.shape(*x)?;
                self.elementwise("scale", "SCALE", *x, None, *x, &[factor.to_bits()])?;
            }
            Op::LastRow { x, out } => {
                let (rows, cols) = self.shape(*x)?;
                if self.shape(*out)? != (1, cols) || rows == 0 || x == out {
                    return Err(self.bad("output must be one row of the input's width".into()));
                }
                let (gx, gy) = fold(cols.div_ceil(256));
                let entries = vec![(1, self.buf(*x)), (3, self.buf(*out))];
                let params = [cols as u32, gx, ((rows - 1) * cols) as u32];
                self.push(PipelineKey::new(ShaderFile::Elementwise, "last_row", &["LAST_ROW"]), &params, entries, [gx, gy, 1], None)?;
            }
        }
        Ok(())
    }
}

fn make_bind_group(
    device: &wgpu::Device,
    pipeline: &wgpu::ComputePipeline,
    entries: &[(u32, Res)],
    kv: Option<&GpuKv>,
) -> Result<wgpu::BindGroup, WgpuError> {
    let mut resolved = Vec::with_capacity(entries.len());
    for (binding, res) in entries {
        let buffer = match (res, kv) {
            (Res::Buf(b), _) => b,
            (Res::KvK(layer), Some(kv)) => kv.k.get(*layer).ok_or(WgpuError::UnknownId { what: "KV layer", id: *layer as u32 })?,
            (Res::KvV(layer), Some(kv)) => kv.v.get(*layer).ok_or(WgpuError::UnknownId { what: "KV layer", id: *layer as u32 })?,
            _ => return Err(WgpuError::Execution("KV binding without a KV cache".into())),
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

pub(crate) fn compile(gpu: &Gpu, pipelines: &mut PipelineCache, weights: &[GpuWeight], graph: &Graph) -> Result<CompiledGraph, WgpuError> {
    let storage = |label: &str, bytes: usize, extra: wgpu::BufferUsages| {
        gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (bytes.max(4).div_ceil(4) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | extra,
            mapped_at_creation: false,
        })
    };
    let bufs: Vec<wgpu::Buffer> = graph.bufs.iter().map(|b| storage(&b.name, b.rows * b.cols * 4, wgpu::BufferUsages::COPY_SRC)).collect();
    let step = storage("step", (2 + graph.n_tokens) * 4, wgpu::BufferUsages::COPY_DST);
    let logits = graph.bufs.get(graph.logits.0 as usize).ok_or(WgpuError::BadGraph { index: 0, op: "logits", reason: "unknown logits buffer".into() })?;
    let logits_len = logits.rows * logits.cols;
    let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("logits staging"),
        size: (logits_len.max(1) * 4) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let scratch_len = graph
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::MatMul { x, .. } => graph.bufs.get(x.0 as usize).map(|d| d.rows * d.cols),
            _ => None,
        })
        .max();
    let act_scratch = scratch_len.map(|len| storage("activation scratch", len * 4, wgpu::BufferUsages::empty()));
    let mut b = Builder { gpu, pipelines, weights, graph, bufs, step, act_scratch, dispatches: Vec::new(), index: 0 };
    let mut embed_rows: Option<usize> = None;
    for (index, op) in graph.ops.iter().enumerate() {
        b.index = index;
        if let Op::Embed { table, .. } = op {
            let rows = b.weight(*table)?.desc.n_rows();
            embed_rows = Some(embed_rows.map_or(rows, |r| r.min(rows)));
        }
        b.op(op)?;
    }
    Ok(CompiledGraph {
        graph: graph.clone(),
        bufs: b.bufs,
        step: b.step,
        staging,
        logits_len,
        dispatches: b.dispatches,
        kv_groups: HashMap::new(),
        embed_rows,
    })
}

impl CompiledGraph {
    pub fn bind_groups_created(&self) -> u64 {
        self.dispatches.iter().filter(|d| d.bind_group.is_some()).count() as u64
    }

    /// Creates (once per KV cache) the bind groups of the dispatches that read or write it.
    pub fn ensure_kv_bind_groups(&mut self, device: &wgpu::Device, kv_id: KvId, kv: &GpuKv) -> Result<u64, WgpuError> {
        if self.kv_groups.contains_key(&kv_id.0) {
            return Ok(0);
        }
        let mut groups = Vec::with_capacity(self.dispatches.len());
        let mut made = 0;
        for d in &self.dispatches {
            let Some(need) = &d.kv_need else {
                groups.push(None);
                continue;
            };
            let l = &kv.layout;
            if need.layer >= l.n_layers || need.k_width.is_some_and(|w| w != l.k_width) || need.v_width.is_some_and(|w| w != l.v_width) {
                return Err(WgpuError::Unsupported(format!("graph does not fit KV cache {:?} (layer {})", l, need.layer)));
            }
            groups.push(Some(make_bind_group(device, &d.pipeline, &d.entries, Some(kv))?));
            made += 1;
        }
        self.kv_groups.insert(kv_id.0, groups);
        Ok(made)
    }

    pub fn execute(&mut self, gpu: &Gpu, kv: &GpuKv, kv_id: KvId, input: StepInput<'_>, logits: &mut Vec<f32>) -> Result<(), WgpuError> {
        let n = self.graph.n_tokens;
        if input.tokens.len() != n {
            return Err(WgpuError::TokenCount { expected: n, got: input.tokens.len() });
        }
        let end = input.pos0 + n;
        if end > kv.layout.capacity {
            return Err(WgpuError::KvOverflow { start: input.pos0, end, capacity: kv.layout.capacity });
        }
        if let Some(rows) = self.embed_rows {
            if let Some(&token) = input.tokens.iter().find(|&&t| t as usize >= rows) {
                return Err(WgpuError::TokenOutOfRange { token, rows });
            }
        }
        let mut step = Vec::with_capacity(2 + n);
        step.push(input.pos0 as u32);
        step.push(n as u32);
        step.extend_from_slice(input.tokens);
        gpu.queue.write_buffer(&self.step, 0, bytemuck::cast_slice(&step));
        let kv_groups = self.kv_groups.get(&kv_id.0).ok_or(WgpuError::Execution("KV bind groups missing".into()))?;
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut encoder = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("step"), timestamp_writes: None });
            for (d, kv_group) in self.dispatches.iter().zip(kv_groups) {
                let Some(group) = d.bind_group.as_ref().or(kv_group.as_ref()) else {
                    return Err(WgpuError::Execution("dispatch without a bind group".into()));
                };
                if d.groups.contains(&0) {
                    continue;
                }
                pass.set_pipeline(&d.pipeline);
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
