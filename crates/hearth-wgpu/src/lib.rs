//! WebGPU backend over wgpu: the same code natively (Vulkan, Metal, DX12) and in the browser.
//!
//! Weights stay in their GGUF encoding on the device (`array<u32>` storage buffers, decoded in
//! the shaders); `compile` turns a [`Graph`] into a list of dispatches with their pipelines and
//! bind groups, so a step's `submit` only writes the step words (token ids, per-token sequence and
//! position, per-sequence block tables), records one compute pass and submits once; `take` reads
//! back the logits or the device's top-k candidates. `release_graph` destroys a graph's buffers.
//! The KV pool is paged (`kv.rs`): per layer `[n_blocks, block_size, row]` in f32, f16, q8_0 or
//! q4_0, read through block tables. Kernels live in the top-level `shaders/`.

mod compile;
mod device;
mod fusion;
mod kernel_params;
mod kv;
mod profile;
mod replay;
mod sample;
mod shader;
mod tally;
mod weights;

use compile::CompiledGraph;
use device::Gpu;
use hearth_core::backend::{
    Backend, BackendCounters, Capability, ExpertTallies, GraphId, GraphSlots, KvId, KvLayout, LogitsFuture, Readback,
    TopK, WeightData,
};
use hearth_core::graph::{BufId, Graph, StepInput, WeightDesc, WeightId};
use hearth_core::kv::BlockCopy;
use hearth_core::{CoreError, DeviceFault, Result};
use kv::GpuKv;
use shader::PipelineCache;
use tally::TallyCounters;
use weights::GpuWeight;

pub use device::{DeviceInfo, FaultWatch, KernelShapes, WgpuOptions};

/// Errors of this crate; they reach callers as [`CoreError::Device`] (device lost, out of
/// memory), [`CoreError::Unsupported`] or [`CoreError::Backend`].
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
    /// The device is gone (driver reset, tab in the background too long, GPU process crash):
    /// every later step fails; open a new backend.
    #[error("the GPU device was lost: {0}")]
    DeviceLost(String),
    /// A GPU allocation (weights, KV pool, activations) failed.
    #[error("the GPU is out of memory: {0}")]
    OutOfMemory(String),
}

impl From<WgpuError> for CoreError {
    fn from(e: WgpuError) -> Self {
        let backend = "wgpu".to_string();
        match e {
            WgpuError::DeviceLost(message) => CoreError::Device { backend, kind: DeviceFault::Lost, message },
            WgpuError::OutOfMemory(message) => CoreError::Device { backend, kind: DeviceFault::OutOfMemory, message },
            WgpuError::Unsupported(what) => CoreError::Unsupported { backend, what },
            other => CoreError::Backend { backend, message: other.to_string() },
        }
    }
}

/// See [`WgpuBackend::watch`].
#[derive(Clone)]
pub struct GpuWatch {
    faults: FaultWatch,
    queue: wgpu::Queue,
    device: wgpu::Device,
}

impl GpuWatch {
    /// The device's recorded fault: [`WgpuError::DeviceLost`], [`WgpuError::OutOfMemory`], or
    /// another uncaptured error as [`WgpuError::Execution`].
    pub fn check(&self) -> std::result::Result<(), WgpuError> {
        self.faults.check()
    }

    /// Destroys the device, as a driver reset or a browser reclaiming the GPU would (tests of
    /// device-loss handling): later steps fail and [`GpuWatch::check`] reports the loss.
    pub fn destroy_device(&self) {
        self.device.destroy();
    }

    /// Makes the device talk to the browser (an empty submission and a work-done callback), so
    /// that a pending device-lost notification is delivered; `check` afterwards reports it.
    pub fn probe(&self) {
        self.queue.on_submitted_work_done(|| {});
        self.queue.submit(std::iter::empty());
    }

    /// Waits until the GPU finished everything submitted so far (weight uploads included), then
    /// checks for faults: in a browser an allocation failure is only reported asynchronously.
    pub async fn settle(&self) -> std::result::Result<(), WgpuError> {
        let signal = replay::MapSignal::default();
        let sink = signal.clone();
        self.queue.on_submitted_work_done(move || replay::fill(&sink, Ok(())));
        replay::MapDone(signal).await?;
        self.check()
    }
}

pub struct WgpuBackend {
    gpu: Gpu,
    weights: Vec<GpuWeight>,
    /// Vectors of `weights` joined on the device for fused kernels.
    joined: weights::JoinedVectors,
    kvs: Vec<GpuKv>,
    graphs: GraphSlots<CompiledGraph>,
    pipelines: PipelineCache,
    counters: BackendCounters,
    /// The submitted step whose output is being mapped.
    pending: Option<PendingStep>,
    /// The expert counters, from the first graph with a tallied router on.
    tallies: Option<TallyCounters>,
    /// Device time per kernel family since the last `kernel_profile` (when profiling).
    profile: std::collections::BTreeMap<String, hearth_core::backend::KernelTime>,
}

struct PendingStep {
    graph: GraphId,
    signal: replay::MapSignal,
    readback: Readback,
    /// The top-k reduction recorded into the step, if the device reduces (else `take` reduces the
    /// logits on the host).
    top_k: Option<sample::TopKSpec>,
}

/// Whether any WebGPU adapter can be opened here (for `--backend auto`).
#[cfg(not(target_arch = "wasm32"))]
pub fn adapter_available() -> bool {
    device::request_adapter().is_ok()
}

/// Whether any WebGPU adapter can be opened here (`navigator.gpu.requestAdapter()`).
pub async fn adapter_available_async() -> bool {
    device::request_adapter_async().await.is_ok()
}

impl WgpuBackend {
    /// Opens the device, blocking (native only; in a browser use [`WgpuBackend::new_async`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new(options: WgpuOptions) -> std::result::Result<Self, WgpuError> {
        Ok(Self::with_gpu(device::open(&options)?))
    }

    /// Opens the device without blocking (the browser resolves adapter and device on its event
    /// loop). Requests the adapter's own limits (largest storage binding and buffer) and
    /// `shader-f16` when offered; [`WgpuBackend::info`] says what was granted.
    pub async fn new_async(options: WgpuOptions) -> std::result::Result<Self, WgpuError> {
        Ok(Self::with_gpu(device::open_async(&options).await?))
    }

    fn with_gpu(gpu: Gpu) -> Self {
        WgpuBackend {
            gpu,
            weights: Vec::new(),
            joined: Default::default(),
            kvs: Vec::new(),
            graphs: GraphSlots::default(),
            pipelines: PipelineCache::default(),
            counters: BackendCounters::default(),
            profile: Default::default(),
            tallies: None,
            pending: None,
        }
    }

    /// A handle on device loss and uncaptured errors (allocation failures in a browser), to
    /// check after the backend has moved into an engine.
    pub fn watch(&self) -> GpuWatch {
        GpuWatch { faults: self.gpu.faults.clone(), queue: self.gpu.queue.clone(), device: self.gpu.device.clone() }
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

    fn variant(&self) -> Option<String> {
        Some(format!("{} on {} ({})", self.gpu.info.variant(), self.gpu.info.adapter_name, self.gpu.info.backend))
    }

    fn supports(&self, what: Capability<'_>) -> std::result::Result<(), String> {
        match what {
            Capability::Op { op, .. } => compile::supports(&self.weights, op),
            // Every KV storage type has a store and attention kernel (kv.rs).
            Capability::Kv(_) => Ok(()),
        }
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
        let mut encoder =
            self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kv block copies") });
        kv.encode_copies(&mut encoder, copies)?;
        self.gpu.queue.submit([encoder.finish()]);
        self.counters.submits += 1;
        Ok(())
    }

    fn compile(&mut self, graph: &Graph) -> Result<GraphId> {
        graph.validate(|id| self.weights.get(id.0 as usize).map(|w| &w.desc))?;
        TallyCounters::prepare(&mut self.tallies, &self.gpu, graph)?;
        let tallies = self.tallies.as_ref();
        let compiled =
            compile::compile(&self.gpu, &mut self.pipelines, &self.weights, &mut self.joined, tallies, graph)?;
        self.counters.bind_groups_created += compiled.bind_groups_created();
        self.counters.graphs_compiled += 1;
        Ok(self.graphs.insert(compiled))
    }

    fn release_graph(&mut self, graph: GraphId) {
        if self.pending.as_ref().is_some_and(|p| p.graph == graph) {
            self.pending = None;
        }
        if let Some(compiled) = self.graphs.remove(graph) {
            // Free the device memory now rather than when the last handle drops.
            compiled.destroy();
            self.counters.graphs_released += 1;
        }
    }

    fn submit(&mut self, graph: GraphId, kv: KvId, input: StepInput<'_>, readback: Readback) -> Result<()> {
        self.gpu.faults.check()?;
        self.pending = None;
        let kv_store = self.kvs.get(kv.0 as usize).ok_or(WgpuError::UnknownId { what: "kv cache", id: kv.0 })?;
        let compiled = self.graphs.get_mut(graph).ok_or(WgpuError::UnknownId { what: "graph", id: graph.0 })?;
        let made = compiled.ensure_kv_binding(&self.gpu, &mut self.pipelines, kv, kv_store)?;
        self.counters.bind_groups_created += made;
        // Wider reductions than the shader is meant for read the logits (take reduces them).
        let top_k = sample::TopKSpec::for_readback(readback);
        if let Some(spec) = top_k {
            self.counters.bind_groups_created += compiled.ensure_top_k(&self.gpu, &mut self.pipelines, spec)?;
        }
        let n_ops = compiled.graph.ops.len() as u64;
        let submitted = compiled.submit(&self.gpu, kv_store, kv, input, top_k)?;
        self.pending = Some(PendingStep { graph, signal: submitted.signal, readback, top_k });
        self.counters.bytes_read_back += submitted.bytes_read_back;
        self.counters.dispatches += submitted.dispatches;
        self.counters.submits += 1;
        self.counters.steps_executed += 1;
        self.counters.ops_executed += n_ops;
        Ok(())
    }

    fn ready(&mut self) -> Option<LogitsFuture> {
        let signal = &self.pending.as_ref()?.signal;
        // Natively the map completes while we wait for the device here.
        #[cfg(not(target_arch = "wasm32"))]
        if let Err(e) = replay::wait_idle(&self.gpu) {
            return Some(Box::pin(std::future::ready(Err(e.into()))));
        }
        if replay::map_outcome(signal).is_some() {
            return None;
        }
        let done = replay::MapDone(signal.clone());
        Some(Box::pin(async move { done.await.map_err(CoreError::from) }))
    }

    fn take(&mut self, logits: &mut Vec<f32>, top: &mut TopK) -> Result<()> {
        let step = self.pending.take().ok_or(WgpuError::Execution("take without a submitted step".into()))?;
        let compiled = self.graphs.get(step.graph).ok_or(WgpuError::UnknownId { what: "graph", id: step.graph.0 })?;
        let copied = match step.top_k {
            Some(spec) => compiled.take_top_k(spec, &step.signal, top),
            None => compiled.take_logits(&step.signal, logits),
        };
        // A fault (device lost, out of memory) makes the step's output meaningless.
        self.gpu.faults.check()?;
        copied?;
        if step.top_k.is_none() {
            let n_vocab = compiled.graph.desc(compiled.graph.logits).cols;
            hearth_core::sampling::reduce_rows(step.readback, logits, n_vocab, top);
        }
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(timestamps) = &compiled.timestamps {
            let timed = compiled.timed.iter().map(|&i| match compiled.dispatches.get(i) {
                Some(d) => (d.family.as_str(), d.weight_bytes),
                None => ("top_k", 0),
            });
            timestamps.accumulate(&self.gpu, timed, &mut self.profile)?;
        }
        Ok(())
    }

    fn kernel_profile(&mut self) -> Option<Vec<hearth_core::backend::KernelTime>> {
        self.gpu.info.timestamps.then(|| std::mem::take(&mut self.profile).into_values().collect())
    }

    #[cfg(target_arch = "wasm32")]
    fn read_buffer(&self, _graph: GraphId, _name: &str) -> Option<Vec<f32>> {
        None // a readback cannot be waited for synchronously in a browser
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn read_buffer(&self, graph: GraphId, name: &str) -> Option<Vec<f32>> {
        let compiled = self.graphs.get(graph)?;
        let index = compiled.graph.bufs.iter().position(|b| b.name == name)?;
        let desc = &compiled.graph.bufs[index];
        if desc.dtype != hearth_core::graph::BufType::F32 {
            return None;
        }
        replay::read_back(&self.gpu, &compiled.bufs[index], desc.len()).ok()
    }

    fn write_buffer(&mut self, graph: GraphId, buf: BufId, words: &[u32]) -> Result<()> {
        let compiled = self.graphs.get(graph).ok_or(WgpuError::UnknownId { what: "graph", id: graph.0 })?;
        let desc = compiled.graph.bufs.get(buf.0 as usize).ok_or(WgpuError::UnknownId { what: "buffer", id: buf.0 })?;
        if desc.len() != words.len() {
            return Err(WgpuError::BadStep(format!(
                "buffer '{}' holds {} words, {} were given",
                desc.name,
                desc.len(),
                words.len()
            ))
            .into());
        }
        self.gpu.queue.write_buffer(&compiled.bufs[buf.0 as usize], 0, bytemuck::cast_slice(words));
        Ok(())
    }

    #[cfg(target_arch = "wasm32")]
    fn read_output(&mut self, _graph: GraphId, _buf: BufId, _words: &mut Vec<u32>) -> Result<()> {
        Err(WgpuError::Unsupported("a buffer cannot be read back synchronously in a browser".into()).into())
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn read_output(&mut self, graph: GraphId, buf: BufId, words: &mut Vec<u32>) -> Result<()> {
        let compiled = self.graphs.get(graph).ok_or(WgpuError::UnknownId { what: "graph", id: graph.0 })?;
        let len = compiled.graph.bufs.get(buf.0 as usize).map_or(0, |d| d.len());
        let Some((_, staging)) = compiled.output_staging.iter().find(|(b, _)| *b == buf) else {
            return Err(WgpuError::BadStep(format!("buffer {} is not an output of the graph", buf.0)).into());
        };
        replay::read_staging(&self.gpu, staging, len, words)?;
        self.gpu.faults.check()?;
        self.counters.bytes_read_back += (len * 4) as u64;
        Ok(())
    }

    fn counters(&self) -> BackendCounters {
        self.counters_now()
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn expert_tallies(&mut self) -> Result<ExpertTallies> {
        match &mut self.tallies {
            Some(counters) => {
                self.counters.bytes_read_back += (tally::TALLY_SLOTS * 4) as u64;
                Ok(counters.read(&self.gpu)?)
            }
            None => Ok(ExpertTallies::default()),
        }
    }

    #[cfg(target_arch = "wasm32")]
    fn expert_tallies(&mut self) -> Result<ExpertTallies> {
        Err(WgpuError::Unsupported("expert tallies cannot be read synchronously in a browser".into()).into())
    }

    fn memory_bytes(&self) -> u64 {
        let w: u64 = self.weights.iter().map(|w| w.bytes()).sum();
        let kv: u64 = self.kvs.iter().map(GpuKv::bytes).sum();
        let graphs: u64 = self.graphs.iter().map(CompiledGraph::bytes).sum();
        w + kv + graphs
    }
}
