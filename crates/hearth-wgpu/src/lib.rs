//! WebGPU backend over wgpu: the same code natively (Vulkan, Metal, DX12) and in the browser.
//!
//! Weights stay in their GGUF encoding on the device (`array<u32>` storage buffers, decoded in
//! the shaders); `compile` turns a [`Graph`] into a list of dispatches with their pipelines and
//! bind groups, so `execute` only writes the step buffer (pos0, token ids), records one compute
//! pass, submits once and reads the logits back. Kernels live in the top-level `shaders/`.

mod compile;
mod device;
mod shader;
mod weights;

use compile::CompiledGraph;
use device::Gpu;
use hearth_core::backend::{Backend, BackendCounters, GraphId, KvId, KvLayout, WeightData};
use hearth_core::graph::{Graph, StepInput, WeightDesc, WeightId};
use hearth_core::{CoreError, Result};
use shader::PipelineCache;
use weights::GpuWeight;

pub use device::{DeviceInfo, WgpuOptions};

/// Errors of this crate; they reach callers as [`CoreError::Backend`].
#[derive(Debug, thiserror::Error)]
pub enum WgpuError {
    #[error("no WebGPU adapter: {0}")]
    NoAdapter(String),
    #[error("could not open the device: {0}")]
    Device(String),
    #[error("shader {file}: {message}")]
    Shader { file: String, message: String },
    #[error("unknown {what} id {id}")]
    UnknownId { what: &'static str, id: u32 },
    #[error("graph op #{index} ({op}) is inconsistent: {reason}")]
    BadGraph { index: usize, op: &'static str, reason: String },
    #[error("not supported by the wgpu backend: {0}")]
    Unsupported(String),
    #[error("weight '{name}': {reason}")]
    BadWeight { name: String, reason: String },
    #[error("step has {got} tokens, the graph was built for {expected}")]
    TokenCount { expected: usize, got: usize },
    #[error("positions {start}..{end} exceed the KV capacity {capacity}")]
    KvOverflow { start: usize, end: usize, capacity: usize },
    #[error("token id {token} is outside the embedding table of {rows} rows")]
    TokenOutOfRange { token: u32, rows: usize },
    #[error("device error while running a step: {0}")]
    Execution(String),
    #[error("reading back a buffer failed: {0}")]
    ReadBack(String),
}

impl From<WgpuError> for CoreError {
    fn from(e: WgpuError) -> Self {
        CoreError::Backend { backend: "wgpu".into(), message: e.to_string() }
    }
}

/// KV storage: per layer, K and V as f32 `[capacity, width]` buffers.
pub(crate) struct GpuKv {
    pub layout: KvLayout,
    pub k: Vec<wgpu::Buffer>,
    pub v: Vec<wgpu::Buffer>,
}

pub struct WgpuBackend {
    gpu: Gpu,
    weights: Vec<GpuWeight>,
    kvs: Vec<GpuKv>,
    graphs: Vec<CompiledGraph>,
    pipelines: PipelineCache,
    counters: BackendCounters,
}

/// Whether any WebGPU adapter can be opened here (for `--backend auto`).
pub fn adapter_available() -> bool {
    device::request_adapter().is_ok()
}

impl WgpuBackend {
    pub fn new(options: WgpuOptions) -> std::result::Result<Self, WgpuError> {
        Ok(WgpuBackend {
            gpu: device::open(&options)?,
            weights: Vec::new(),
            kvs: Vec::new(),
            graphs: Vec::new(),
            pipelines: PipelineCache::default(),
            counters: BackendCounters::default(),
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.gpu.info
    }

    fn storage_buffer(&self, label: &str, bytes: u64, extra: wgpu::BufferUsages) -> wgpu::Buffer {
        self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.max(4).div_ceil(4) * 4,
            usage: wgpu::BufferUsages::STORAGE | extra,
            mapped_at_creation: false,
        })
    }

    fn counters_now(&self) -> BackendCounters {
        let mut c = self.counters.clone();
        c.pipelines_created = self.pipelines.created;
        c
    }
}

impl Backend for WgpuBackend {
    fn name(&self) -> &str {
        "wgpu"
    }

    fn upload_weight(&mut self, desc: WeightDesc, data: WeightData) -> Result<WeightId> {
        let w = weights::upload(&self.gpu.device, &self.gpu.queue, self.gpu.max_binding, desc, data)?;
        self.weights.push(w);
        Ok(WeightId(self.weights.len() as u32 - 1))
    }

    fn alloc_kv(&mut self, layout: KvLayout) -> Result<KvId> {
        let mut k = Vec::with_capacity(layout.n_layers);
        let mut v = Vec::with_capacity(layout.n_layers);
        for layer in 0..layout.n_layers {
            let kb = (layout.capacity * layout.k_width * 4) as u64;
            let vb = (layout.capacity * layout.v_width * 4) as u64;
            if kb.max(vb) > self.gpu.info.max_storage_binding {
                return Err(WgpuError::Unsupported(format!("KV layer of {} bytes exceeds the binding limit", kb.max(vb))).into());
            }
            k.push(self.storage_buffer(&format!("k_cache.{layer}"), kb, wgpu::BufferUsages::empty()));
            v.push(self.storage_buffer(&format!("v_cache.{layer}"), vb, wgpu::BufferUsages::empty()));
        }
        self.kvs.push(GpuKv { layout, k, v });
        Ok(KvId(self.kvs.len() as u32 - 1))
    }

    fn compile(&mut self, graph: &Graph) -> Result<GraphId> {
        let compiled = compile::compile(&self.gpu, &mut self.pipelines, &self.weights, graph)?;
        self.counters.bind_groups_created += compiled.bind_groups_created();
        self.graphs.push(compiled);
        self.counters.graphs_compiled += 1;
        Ok(GraphId(self.graphs.len() as u32 - 1))
    }

    fn execute(&mut self, graph: GraphId, kv: KvId, input: StepInput<'_>, logits: &mut Vec<f32>) -> Result<()> {
        let gi = graph.0 as usize;
        if gi >= self.graphs.len() {
            return Err(WgpuError::UnknownId { what: "graph", id: graph.0 }.into());
        }
        let kv_store = self.kvs.get(kv.0 as usize).ok_or(WgpuError::UnknownId { what: "kv cache", id: kv.0 })?;
        let compiled = &mut self.graphs[gi];
        let made = compiled.ensure_kv_bind_groups(&self.gpu.device, kv, kv_store)?;
        self.counters.bind_groups_created += made;
        let n_ops = compiled.graph.ops.len() as u64;
        compiled.execute(&self.gpu, kv_store, kv, input, logits)?;
        self.counters.submits += 1;
        self.counters.steps_executed += 1;
        self.counters.ops_executed += n_ops;
        Ok(())
    }

    fn read_buffer(&self, graph: GraphId, name: &str) -> Option<Vec<f32>> {
        let compiled = self.graphs.get(graph.0 as usize)?;
        let index = compiled.graph.bufs.iter().position(|b| b.name == name)?;
        compile::read_back(&self.gpu, &compiled.bufs[index], compiled.graph.bufs[index].rows * compiled.graph.bufs[index].cols).ok()
    }

    fn counters(&self) -> BackendCounters {
        self.counters_now()
    }

    fn memory_bytes(&self) -> u64 {
        let w: u64 = self.weights.iter().map(|w| w.bytes()).sum();
        let kv: u64 = self.kvs.iter().flat_map(|k| k.k.iter().chain(&k.v)).map(|b| b.size()).sum();
        let acts: u64 = self.graphs.iter().flat_map(|g| g.bufs.iter()).map(|b| b.size()).sum();
        w + kv + acts
    }
}
