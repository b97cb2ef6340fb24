//! The seam between model code and compute. Coarse on purpose: a backend receives whole weights
//! and whole [`Graph`]s, never individual tensor ops from the model, so it is free to fuse, record
//! command buffers once, or capture CUDA graphs. Backends know nothing about architectures.

use crate::error::Result;
use crate::gguf::ByteSource;
use crate::graph::{Graph, StepInput, WeightDesc, WeightId};
use std::sync::Arc;

/// Where a weight's bytes are: a range of the model's source, so a backend can read it in place
/// (CPU + mmap) or stream it to device memory without a second host copy.
#[derive(Clone)]
pub struct WeightData {
    pub source: Arc<dyn ByteSource>,
    pub offset: u64,
    pub len: usize,
}

/// Shape of the KV cache a backend allocates: per layer, `capacity` positions of
/// `n_head_kv * head_dim` values for K and for V.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub capacity: usize,
    pub k_width: usize,
    pub v_width: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphId(pub u32);

/// Counters a backend keeps so tests and `hearth bench` can see per-step overhead.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendCounters {
    pub graphs_compiled: u64,
    pub steps_executed: u64,
    pub ops_executed: u64,
    /// GPU backends: compute pipelines built (should stop growing after warm-up).
    pub pipelines_created: u64,
    /// GPU backends: bind groups built (should stop growing after warm-up).
    pub bind_groups_created: u64,
    /// GPU backends: command buffer submissions.
    pub submits: u64,
}

pub trait Backend: Send {
    /// Short name for logs and `--json` output ("cpu", "wgpu", "cuda").
    fn name(&self) -> &str;

    /// Makes a weight available to graphs. Called once per tensor at load time.
    fn upload_weight(&mut self, desc: WeightDesc, data: WeightData) -> Result<WeightId>;

    /// Allocates KV storage; the bookkeeping (length, rollback) lives in [`crate::kv_cache::KvCache`].
    fn alloc_kv(&mut self, layout: KvLayout) -> Result<KvId>;

    /// Prepares a graph for repeated execution.
    fn compile(&mut self, graph: &Graph) -> Result<GraphId>;

    /// Runs a compiled graph for one step against `kv`, writing the logits ([n_out, n_vocab],
    /// row-major) into `logits`.
    fn execute(&mut self, graph: GraphId, kv: KvId, input: StepInput<'_>, logits: &mut Vec<f32>) -> Result<()>;

    /// Copies a buffer of the last execution of `graph` by name (debug taps, op conformance tests).
    fn read_buffer(&self, graph: GraphId, name: &str) -> Option<Vec<f32>>;

    fn counters(&self) -> BackendCounters;

    /// Bytes of host memory the backend holds for weights and KV (for `hearth bench`).
    fn memory_bytes(&self) -> u64;
}
