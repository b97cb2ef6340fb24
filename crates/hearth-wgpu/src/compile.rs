//! Graph → dispatch list, at compile time (replay per step is in `replay.rs`).

use crate::device::Gpu;
use crate::shader::{PipelineCache, PipelineKey, ShaderFile};
use crate::weights::{type_define, GpuWeight};
use crate::replay::{make_bind_group, KvBinding};
use crate::WgpuError;
use hearth_core::graph::{BufId, Graph, Op, RopeMode, WeightId};
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

/// A bound resource; the KV pool (its layer buffers and the block tables of this graph for it)
/// is known only at execute time.
pub(crate) enum Res {
    Buf(wgpu::Buffer),
    Tables,
    KvK(usize),
    KvV(usize),
    /// StoreKv's key or value offset (subtracted on store; a value offset is added back by
    /// attention): bound, with the KV_OFFSET define, only against a pool whose type subtracts
    /// offsets (the pool's type is known at binding time, not at compile time).
    KvOffset(wgpu::Buffer),
}

/// What a KV-touching dispatch requires of the pool it runs against.
pub(crate) struct KvNeed {
    pub layer: usize,
    pub k_width: Option<usize>,
    pub v_width: Option<usize>,
    /// Attention only: its window (None = whole context).
    pub window: Option<Option<usize>>,
}

pub(crate) struct Dispatch {
    /// Without the KV storage-type define, which KV-touching dispatches get per pool.
    pub key: PipelineKey,
    /// Built at compile time unless the dispatch touches the KV pool.
    pub pipeline: Option<wgpu::ComputePipeline>,
    pub entries: Vec<(u32, Res)>,
    pub kv_need: Option<KvNeed>,
    pub bind_group: Option<wgpu::BindGroup>,
    pub groups: [u32; 3],
}

pub(crate) struct CompiledGraph {
    pub graph: Graph,
    /// One storage buffer per graph buffer, `[rows, cols]` f32.
    pub bufs: Vec<wgpu::Buffer>,
    /// [2 + 3 * n_tokens + 3 * n_seqs] u32 (layout in shaders/attention.wgsl): token ids, each
    /// token's sequence and position, each sequence's pos0 / token count / first token; written
    /// once per step.
    pub step: wgpu::Buffer,
    pub staging: wgpu::Buffer,
    pub logits_len: usize,
    pub dispatches: Vec<Dispatch>,
    /// Per KV pool id: block-table buffer, pipelines and bind groups of the KV-touching dispatches.
    pub kv_bindings: HashMap<u32, KvBinding>,
    /// Rows of the smallest embedding table (token ids are checked on the host).
    pub embed_rows: Option<usize>,
    /// Host copies of the step and table words (reused, so a step allocates nothing).
    pub step_words: Vec<u32>,
    pub table_words: Vec<u32>,
    /// Per k: the top-k reduction of the logits (`sample.rs`), built on first use.
    pub top_k_plans: HashMap<crate::sample::TopKSpec, crate::sample::TopKPlan>,
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
        let params = self.gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(key.entry),
            contents: bytemuck::cast_slice(params),
            usage: wgpu::BufferUsages::STORAGE,
        });
        entries.insert(0, (0, Res::Buf(params)));
        let (pipeline, bind_group) = match kv_need {
            Some(_) => (None, None),
            None => {
                let pipeline = self.pipelines.get(&self.gpu.device, &key)?;
                let group = make_bind_group(&self.gpu.device, &pipeline, &entries, None)?;
                (Some(pipeline), Some(group))
            }
        };
        self.dispatches.push(Dispatch { key, pipeline, entries, kv_need, bind_group, groups });
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
                let mut defines = self.gpu.info.defines();
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
                defines.extend(self.gpu.info.defines());
                if ty == "F16" && self.gpu.info.shader_f16 {
                    defines.push("F16_NATIVE");
                }
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
                if rows != n {
                    return Err(self.bad(format!("{rows} rows for {n} tokens")));
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
            Op::StoreKv { layer, k, v, k_offset, v_offset } => {
                for (src, is_k, offset) in [(*k, true, k_offset), (*v, false, v_offset)] {
                    let (rows, cols) = self.shape(src)?;
                    if rows != n {
                        return Err(self.bad(format!("{rows} rows for {n} tokens")));
                    }
                    // One invocation per stored unit (1, 2 or 32 values, by storage type): sized
                    // for the smallest, extra invocations return at once.
                    let (gx, gy) = fold((rows * cols).div_ceil(256));
                    let cache = if is_k { Res::KvK(*layer) } else { Res::KvV(*layer) };
                    let mut entries = vec![(1, Res::Buf(self.step.clone())), (2, Res::Tables), (3, self.buf(src)), (4, cache)];
                    if let Some(o) = offset {
                        entries.push((5, Res::KvOffset(self.vector(*o, cols)?)));
                    }
                    let need = if is_k {
                        KvNeed { layer: *layer, k_width: Some(cols), v_width: None, window: None }
                    } else {
                        KvNeed { layer: *layer, k_width: None, v_width: Some(cols), window: None }
                    };
                    let params = [rows as u32, cols as u32, gx, *layer as u32];
                    self.push(PipelineKey::new(ShaderFile::Attention, "store_kv", &["STORE_KV"]), &params, entries, [gx, gy, 1], Some(need))?;
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
                let mut entries = vec![
                    (1, Res::Buf(self.step.clone())),
                    (2, Res::Tables),
                    (3, self.buf(*q)),
                    (4, Res::KvK(p.layer)),
                    (5, Res::KvV(p.layer)),
                    (6, self.buf(*out)),
                ];
                if let Some(o) = p.v_offset {
                    entries.push((7, Res::KvOffset(self.vector(o, kv_width)?)));
                }
                let params = [
                    rows as u32,
                    p.n_head as u32,
                    p.n_head_kv as u32,
                    p.head_dim as u32,
                    p.scale.to_bits(),
                    p.window.unwrap_or(0) as u32,
                    p.softcap.unwrap_or(0.0).to_bits(),
                    gx,
                    p.layer as u32,
                ];
                let need = KvNeed { layer: p.layer, k_width: Some(kv_width), v_width: Some(kv_width), window: Some(p.window) };
                let mut defines = vec!["ATTENTION"];
                defines.extend(self.gpu.info.defines());
                self.push(PipelineKey::new(ShaderFile::Attention, "attention", &defines), &params, entries, [gx, gy, 1], Some(need))?;
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
            Op::LastRows { x, out } => {
                let (rows, cols) = self.shape(*x)?;
                let n_seqs = self.graph.n_seqs;
                if self.shape(*out)? != (n_seqs, cols) || rows != n || x == out {
                    return Err(self.bad("output must have one row per sequence, of the input's width".into()));
                }
                let (gx, gy) = fold((n_seqs * cols).div_ceil(256));
                let entries = vec![(1, self.buf(*x)), (3, self.buf(*out)), (4, Res::Buf(self.step.clone()))];
                let params = [(n_seqs * cols) as u32, gx, cols as u32];
                self.push(PipelineKey::new(ShaderFile::Elementwise, "last_rows", &["LAST_ROWS"]), &params, entries, [gx, gy, 1], None)?;
            }
        }
        Ok(())
    }
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
    if graph.n_seqs == 0 || graph.n_seqs > graph.n_tokens {
        return Err(WgpuError::BadGraph { index: 0, op: "graph", reason: format!("{} sequences for {} tokens", graph.n_seqs, graph.n_tokens) });
    }
    let step_len = 2 + 3 * graph.n_tokens + 3 * graph.n_seqs;
    let step = storage("step", step_len * 4, wgpu::BufferUsages::COPY_DST);
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
        kv_bindings: HashMap::new(),
        embed_rows,
        step_words: Vec::with_capacity(step_len),
        table_words: Vec::new(),
        top_k_plans: HashMap::new(),
    })
}
