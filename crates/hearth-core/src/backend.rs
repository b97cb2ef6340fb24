//! The seam between model code and compute. Coarse on purpose: a backend receives whole weights
//! and whole [`Graph`]s, never individual tensor ops from the model, so it is free to fuse, record
//! command buffers once, or capture CUDA graphs. Backends know nothing about architectures.

use crate::error::Result;
use crate::gguf::ByteSource;
use crate::graph::{Graph, StepInput, WeightDesc, WeightId};
use crate::kv::{BlockCopy, KvGroup, KvType};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What [`Backend::logits_ready`] returns when the logits are not available yet: resolves once
/// they can be taken. `'static` (owns what it waits on) so it can be awaited while the caller
/// holds `&mut` to the backend; not `Send` (a browser's WebGPU objects live on one thread).
pub type LogitsFuture = Pin<Box<dyn Future<Output = Result<()>>>>;

/// Where a weight's bytes are: a range of the model's source, so a backend can read it in place
/// (CPU + mmap) or stream it to device memory without a second host copy.
#[derive(Clone)]
pub struct WeightData {
    pub source: Arc<dyn ByteSource>,
    pub offset: u64,
    pub len: usize,
}

/// Shape of the paged KV storage a backend allocates: for each block group, `n_blocks` blocks of
/// `block_size` positions, each holding, for every layer of the group, K rows of `k_width` and V
/// rows of `v_width` values stored as `kv_type`. Which block holds which positions is decided by
/// [`crate::kv::KvManager`] and passed per step as block tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub k_width: usize,
    pub v_width: usize,
    pub kv_type: KvType,
    pub block_size: usize,
    pub groups: Vec<KvGroup>,
}

impl KvLayout {
    /// The block group holding `layer`'s K/V.
    pub fn group_of(&self, layer: usize) -> Option<usize> {
        self.groups.iter().position(|g| g.layers.contains(&layer))
    }

    /// Bytes of one block of group `g` over all its layers (K and V).
    pub fn block_bytes(&self, g: usize) -> usize {
        let row = self.kv_type.row_bytes(self.k_width).unwrap_or(0) + self.kv_type.row_bytes(self.v_width).unwrap_or(0);
        self.groups[g].layers.len() * self.block_size * row
    }

    /// Bytes of the whole pool.
    pub fn total_bytes(&self) -> u64 {
        (0..self.groups.len()).map(|g| (self.block_bytes(g) * self.groups[g].n_blocks) as u64).sum()
    }

    /// Bytes one position of context takes in every layer (windowed layers included).
    pub fn bytes_per_token(&self) -> usize {
        (0..self.groups.len()).map(|g| self.block_bytes(g) / self.block_size).sum()
    }
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
    /// GPU backends: bytes copied from the device to the host for step outputs (logits or
    /// top-k candidates).
    pub bytes_read_back: u64,
}

/// What a step brings back to the host: every logit, or per output row only the `k` largest
/// (greedy decoding needs the top 1). Candidates are what top-k sampling draws from anyway, so a
/// sampler without penalties or logit bias loses nothing by asking for them, and a GPU backend
/// then reads back `8 * k` bytes per row instead of `4 * n_vocab`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Readback {
    Logits,
    TopK(usize),
    /// [`Readback::TopK`] plus each row's `log Σ exp(logit)` ([`TopK::log_sum_exp`]): the
    /// candidates' probabilities under the softmax of the whole row, for 4 more bytes per row. A
    /// drafter needs them for its confidence (the top candidate's probability), which otherwise
    /// took a readback of the whole vocabulary per draft token.
    TopKAndLogSumExp(usize),
}

impl Readback {
    /// The k of a candidates readback; `None` for the logits.
    pub fn top_k(self) -> Option<usize> {
        match self {
            Readback::Logits => None,
            Readback::TopK(k) | Readback::TopKAndLogSumExp(k) => Some(k),
        }
    }

    /// This readback with its k replaced (the kind kept).
    pub fn with_k(self, k: usize) -> Readback {
        match self {
            Readback::Logits => Readback::Logits,
            Readback::TopK(_) => Readback::TopK(k),
            Readback::TopKAndLogSumExp(_) => Readback::TopKAndLogSumExp(k),
        }
    }
}

/// The largest logits of each output row, most likely first; equal logits ordered by lowest
/// token id; NaN counts as `-inf` (and is reported as `-inf`). `ids` and `logits` are
/// `[n_rows, k]`, row-major. [`crate::sampling::top_k_rows`] computes it on the host (the
/// reference every backend must match exactly).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopK {
    pub k: usize,
    pub ids: Vec<u32>,
    pub logits: Vec<f32>,
    /// `[n_rows]`: `log Σ exp(logit)` over each whole row, NaN counted as `-inf` (see
    /// [`crate::sampling::log_sum_exp_rows`], the reference). Filled only for
    /// [`Readback::TopKAndLogSumExp`], empty otherwise. Backends agree with the host reference
    /// to float rounding, not bit for bit.
    pub log_sum_exp: Vec<f32>,
}

impl TopK {
    pub fn n_rows(&self) -> usize {
        self.ids.len().checked_div(self.k).unwrap_or(0)
    }

    /// Row `r`'s candidates: (ids, logits), most likely first.
    pub fn row(&self, r: usize) -> (&[u32], &[f32]) {
        let range = r * self.k..(r + 1) * self.k;
        (&self.ids[range.clone()], &self.logits[range])
    }

    /// The softmax probability of row `r`'s best candidate over the whole row, when the step was
    /// read back with [`Readback::TopKAndLogSumExp`]: 0 when the best logit or the sum is not finite.
    pub fn top_probability(&self, r: usize) -> Option<f32> {
        let lse = *self.log_sum_exp.get(r)?;
        let best = *self.logits.get(r * self.k)?;
        Some(if best.is_finite() && lse.is_finite() { (best - lse).exp() } else { 0.0 })
    }
}

pub trait Backend: Send {
    /// Short name for logs and `--json` output ("cpu", "wgpu", "cuda").
    fn name(&self) -> &str;

    /// Which kernel variant this backend runs, when it has several (the wgpu backend's
    /// `shader-f16` / subgroup kernels): for `hearth bench` and runtime stats.
    fn variant(&self) -> Option<String> {
        None
    }

    /// Makes a weight available to graphs. Called once per tensor at load time.
    fn upload_weight(&mut self, desc: WeightDesc, data: WeightData) -> Result<WeightId>;

    /// Allocates the paged KV pool; the bookkeeping (block tables, rollback, prefix cache) lives in
    /// [`crate::kv::KvManager`].
    fn alloc_kv(&mut self, layout: KvLayout) -> Result<KvId>;

    /// Copies the first positions of blocks (copy-on-write of a shared partial block) before the
    /// next step writes into the copies.
    fn copy_kv_blocks(&mut self, kv: KvId, copies: &[BlockCopy]) -> Result<()>;

    /// Prepares a graph for repeated execution.
    fn compile(&mut self, graph: &Graph) -> Result<GraphId>;

    /// Frees what `compile` made for a graph (a batching scheduler sees many step shapes and
    /// keeps only the recent ones). The id is invalid afterwards.
    fn release_graph(&mut self, graph: GraphId) {
        let _ = graph;
    }

    /// Runs a compiled graph for one step against `kv`, writing the logits ([n_out, n_vocab],
    /// row-major; n_out = the number of sequences for `LogitsMode::Last`, of tokens for `All`)
    /// into `logits`. Backends check `input` with [`StepInput::validate`] first.
    fn execute(&mut self, graph: GraphId, kv: KvId, input: StepInput<'_>, logits: &mut Vec<f32>) -> Result<()>;

    // The split step: `submit`, await `logits_ready` (when it is `Some`), then `take_logits`.
    // This is how a step runs in the browser, where a GPU readback completes only on the JS event
    // loop and must not be waited for by blocking. [`crate::runner::Runner::step_async`] drives
    // it; the defaults run `execute` inside `submit`, so synchronous backends (CPU) need nothing.

    /// Starts a step. The default runs it to completion with [`Backend::execute`], writing the
    /// logits into `logits` right away. A backend that overrides it starts the work, returns, and
    /// writes `logits` only in [`Backend::take_logits`].
    fn submit(&mut self, graph: GraphId, kv: KvId, input: StepInput<'_>, logits: &mut Vec<f32>) -> Result<()> {
        self.execute(graph, kv, input, logits)
    }

    /// `None` when the submitted step's logits can be taken now; otherwise a future to await
    /// first.
    fn logits_ready(&mut self) -> Option<LogitsFuture> {
        None
    }

    /// Writes the logits of the submitted step ([n_out, n_vocab], as for `execute`) into
    /// `logits`, or reports the step's failure. The default: `submit` already wrote them.
    fn take_logits(&mut self, logits: &mut Vec<f32>) -> Result<()> {
        let _ = logits;
        Ok(())
    }

    /// [`Backend::submit`] with a choice of what to read back. `Readback::TopK(k)` asks for the
    /// candidates of every output row (`k` ≤ n_vocab; the caller clamps), taken with
    /// [`Backend::take_output`]. The default reads back the logits and reduces them on the host,
    /// which is the reference behaviour; a GPU backend records the reduction into the step.
    fn submit_for(&mut self, graph: GraphId, kv: KvId, input: StepInput<'_>, readback: Readback, logits: &mut Vec<f32>) -> Result<()> {
        let _ = readback;
        self.submit(graph, kv, input, logits)
    }

    /// [`Backend::take_logits`] for a step started with [`Backend::submit_for`]: for
    /// `Readback::Logits` fills `logits`; for `TopK(k)` fills `top_k` (`logits` is then scratch
    /// the default may use). `n_vocab`: the width of a logits row.
    fn take_output(&mut self, readback: Readback, n_vocab: usize, logits: &mut Vec<f32>, top_k: &mut TopK) -> Result<()> {
        self.take_logits(logits)?;
        crate::sampling::reduce_rows(readback, logits, n_vocab, top_k);
        Ok(())
    }

    /// Copies a buffer of the last execution of `graph` by name (debug taps, op conformance tests).
    fn read_buffer(&self, graph: GraphId, name: &str) -> Option<Vec<f32>>;

    fn counters(&self) -> BackendCounters;

    /// Bytes of host memory the backend holds for weights and KV (for `hearth bench`).
    fn memory_bytes(&self) -> u64;
}
