//! WebGPU backend over wgpu: the same code natively (Vulkan, Metal, DX12) and in the browser.
//!
//! Weights stay in their GGUF encoding on the device (`array<u32>` storage buffers, decoded in
//! the shaders); `compile` turns a [`Graph`] into a list of dispatches with their pipelines and
//! bind groups, so `execute` only writes the step words (token ids, per-token sequence and
//! position, per-sequence block tables), records one compute pass, submits once and reads the
//! logits back. The KV pool is paged (`kv.rs`): per layer `[n_blocks, block_size, row]` in f32,
//! f16 or q8_0, read through block tables. Kernels live in the top-level `shaders/`.

mod compile;
mod device;
mod kv;
mod replay;
mod shader;
mod weights;

use compile::CompiledGraph;
use device::Gpu;
use hearth_core::backend::{Backend, BackendCounters, GraphId, KvId, KvLayout, WeightData};
use hearth_core::graph::{Graph, StepInput, WeightDesc, WeightId};
use hearth_core::kv::BlockCopy;
use hearth_core::{CoreError, Result};
use kv::GpuKv;
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
    #[error("bad step input: {0}")]
    BadStep(String),
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
        let max_binding = self.gpu.info.max_storage_binding.min(self.gpu.info.max_buffer_size);
        self.kvs.push(GpuKv::new(&self.gpu.device, max_binding, layout)?);
        Ok(KvId(self.kvs.len() as u32 - 1))
    }

    fn copy_kv_blocks(&mut self, kv: KvId, copies: &[BlockCopy]) -> Result<()> {
        let kv = self.kvs.get(kv.0 as usize).ok_or(WgpuError::UnknownId { what: "kv cache", id: kv.0 })?;
        if copies.is_empty() {
            return Ok(());
        }
        let mut encoder = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kv block copies") });
        kv.encode_copies(&mut encoder, copies)?;
        self.gpu.queue.submit([encoder.finish()]);
        self.counters.submits += 1;
        Ok(())
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
        let made = compiled.ensure_kv_binding(&self.gpu, &mut self.pipelines, kv, kv_store)?;
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
        replay::read_back(&self.gpu, &compiled.bufs[index], compiled.graph.bufs[index].rows * compiled.graph.bufs[index].cols).ok()
    }

    fn counters(&self) -> BackendCounters {
        self.counters_now()
    }

    fn memory_bytes(&self) -> u64 {
        let w: u64 = self.weights.iter().map(|w| w.bytes()).sum();
        let kv: u64 = self.kvs.iter().map(GpuKv::bytes).sum();
        let acts: u64 = self.graphs.iter().flat_map(|g| g.bufs.iter()).map(|b| b.size()).sum();
        w + kv + acts
    }
}
