//! The seam between model code and compute. Coarse on purpose: a backend receives whole weights
//! and whole [`Graph`]s, never individual tensor ops from the model, so it is free to fuse, record
//! command buffers once, or capture CUDA graphs. Backends know nothing about architectures.

use crate::error::{CoreError, Result};
use crate::gguf::ByteSource;
use crate::graph::{BufId, Graph, Op, StepInput, WeightDesc, WeightId};
use crate::kv::{BlockCopy, KvGroup, KvType, ValueRows};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What [`Backend::ready`] returns when a step's output is not available yet: resolves once
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
/// rows of `v_width` values stored as `kv_type` (or no V rows, the values being the start of each
/// K row: [`ValueRows::KeyPrefix`]). Which block holds which positions is decided by
/// [`crate::kv::KvManager`] and passed per step as block tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub k_width: usize,
    pub v_width: usize,
    pub values: ValueRows,
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
        let row = self.kv_type.row_bytes(self.k_width).unwrap_or(0) + self.v_row_bytes().unwrap_or(0);
        self.groups[g].layers.len() * self.block_size * row
    }

    /// Bytes of one stored V row: `Some(0)` where the values are the start of the K rows, `None`
    /// where the storage type cannot hold rows of `v_width`.
    pub fn v_row_bytes(&self) -> Option<usize> {
        match self.values {
            ValueRows::Stored => self.kv_type.row_bytes(self.v_width),
            ValueRows::KeyPrefix => Some(0),
        }
    }

    /// Whether the values can be where `values` puts them ([`ValueRows::key_prefix_fits`]); a
    /// layout with stored values always can.
    pub fn check_values(&self) -> std::result::Result<(), String> {
        match self.values {
            ValueRows::Stored => Ok(()),
            ValueRows::KeyPrefix if ValueRows::key_prefix_fits(self.v_width, self.k_width) => Ok(()),
            ValueRows::KeyPrefix => Err(format!(
                "values of {} taken from the start of key rows of {} (they must be no wider, in whole 32-value blocks)",
                self.v_width, self.k_width
            )),
        }
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
    /// Graphs freed by [`Backend::release_graph`]: `graphs_compiled - graphs_released` are alive.
    pub graphs_released: u64,
    pub steps_executed: u64,
    pub ops_executed: u64,
    /// GPU backends: compute pipelines built (should stop growing after warm-up).
    pub pipelines_created: u64,
    /// GPU backends: bind groups built (should stop growing after warm-up).
    pub bind_groups_created: u64,
    /// GPU backends: command buffer submissions.
    pub submits: u64,
    /// GPU backends: compute dispatches (kernel launches) recorded for steps.
    pub dispatches: u64,
    /// GPU backends: bytes copied from the device to the host for step outputs (logits or
    /// top-k candidates).
    pub bytes_read_back: u64,
    /// Steps split across backends ([`crate::offload::ExpertOffload`]): the parts run, each a
    /// step of its own on its side (and a submit on a GPU); 0 where steps are not split.
    pub split_parts: u64,
}

/// Device time of one kernel family over profiled steps ([`Backend::kernel_profile`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelTime {
    /// The backend's name for the family ("matmul_q8 Q4_K", "attention").
    pub family: String,
    pub dispatches: u64,
    /// Device time, summed over the dispatches.
    pub nanos: u64,
    /// Weight bytes the dispatches read (for the family's share of memory bandwidth).
    pub weight_bytes: u64,
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

    /// One readback that serves both rows' needs (a step reads back one kind for all its rows):
    /// the whole rows if either needs them, else the larger k, with the log-sum-exp if either
    /// asks for it.
    pub fn union(self, other: Readback) -> Readback {
        match (self, other) {
            (Readback::Logits, _) | (_, Readback::Logits) => Readback::Logits,
            (Readback::TopK(a), Readback::TopK(b)) => Readback::TopK(a.max(b)),
            (Readback::TopK(a) | Readback::TopKAndLogSumExp(a), Readback::TopK(b) | Readback::TopKAndLogSumExp(b)) => {
                Readback::TopKAndLogSumExp(a.max(b))
            }
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

/// Tokens routed to each expert: `counts[router][expert]` for every router a graph tallies
/// ([`Op::RouteExperts`]'s `tally`: the model's layer), over all the steps a backend ran, rows of
/// every step counted (a speculative draft's rejected tokens too: their experts were computed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpertTallies {
    pub counts: Vec<Vec<u64>>,
}

impl ExpertTallies {
    /// Adds `n` picks of `expert` by router `router` of `n_expert` experts.
    pub fn add(&mut self, router: usize, n_expert: usize, expert: usize, n: u64) {
        if self.counts.len() <= router {
            self.counts.resize(router + 1, Vec::new());
        }
        let row = &mut self.counts[router];
        if row.len() < n_expert.max(expert + 1) {
            row.resize(n_expert.max(expert + 1), 0);
        }
        row[expert] += n;
    }

    /// Adds one pick per id in `ids` (a router's output) to router `router` of `n_expert` experts.
    pub fn add_picks(&mut self, router: usize, n_expert: usize, ids: impl IntoIterator<Item = u32>) {
        for id in ids {
            self.add(router, n_expert, id as usize, 1);
        }
    }

    /// Picks of every router's experts together.
    pub fn total(&self) -> u64 {
        self.counts.iter().flatten().sum()
    }
}

/// What [`Backend::supports`] is asked about. [`crate::runner::Runner::load`] asks for every op of
/// the model's graphs and for the KV layout before it allocates or compiles anything, so a model a
/// backend cannot run is refused with the reason (or run on another backend) instead of failing
/// half-way through `compile`.
#[derive(Clone, Copy, Debug)]
pub enum Capability<'a> {
    /// One op of `graph`, its weights given by the ids this backend returned from
    /// [`Backend::upload_weight`].
    Op { op: &'a Op, graph: &'a Graph },
    /// A KV pool of this layout (its storage type and row widths).
    Kv(&'a KvLayout),
}

/// The contract between model code and a compute backend. Every method is required: a backend
/// that leaves one out does not compile, so none can be half-implemented by a default.
///
/// A step runs in three calls, so that a browser can wait for a GPU readback on its event loop:
/// [`Backend::submit`] starts it, the future of [`Backend::ready`] (when there is one) resolves
/// once its output can be read, and [`Backend::take`] reads it. [`run_step`] chains the three
/// synchronously. A synchronous backend computes inside `submit` and returns `None` from `ready`.
pub trait Backend: Send {
    /// Short name for logs and `--json` output ("cpu", "wgpu", "cuda").
    fn name(&self) -> &str;

    /// Which kernel variant this backend runs, when it has several (the wgpu backend's
    /// `shader-f16` / subgroup kernels): for `hearth bench` and runtime stats.
    fn variant(&self) -> Option<String>;

    /// `Ok` when this backend can run `what`; otherwise the reason, which names the op and the
    /// weight or type it cannot handle ("mat_mul of weight 'blk.0.ffn_down.weight' (Q5_K)").
    fn supports(&self, what: Capability<'_>) -> std::result::Result<(), String>;

    /// Makes a weight available to graphs. Called once per tensor at load time. A weight with an
    /// expert dimension ([`WeightDesc::n_experts`] > 1) is stored so that each expert's matrix
    /// (`data`'s [`WeightDesc::expert_range`]) is addressed on its own.
    fn upload_weight(&mut self, desc: WeightDesc, data: WeightData) -> Result<WeightId>;

    /// Allocates the paged KV pool; the bookkeeping (block tables, rollback, prefix cache) lives in
    /// [`crate::kv::KvManager`].
    fn alloc_kv(&mut self, layout: KvLayout) -> Result<KvId>;

    /// Copies the first positions of blocks (copy-on-write of a shared partial block) before the
    /// next step writes into the copies.
    fn copy_kv_blocks(&mut self, kv: KvId, copies: &[BlockCopy]) -> Result<()>;

    /// Prepares a graph for repeated execution, after checking it with [`Graph::validate`].
    fn compile(&mut self, graph: &Graph) -> Result<GraphId>;

    /// Frees everything `compile` made for a graph (its activation buffers, bind groups, captured
    /// command streams). A batching scheduler sees many step shapes and keeps only the recent
    /// ones, so a backend that keeps released graphs grows without bound. The id is invalid
    /// afterwards and may be handed out again by a later `compile`.
    fn release_graph(&mut self, graph: GraphId);

    /// Starts a step of a compiled graph against `kv`. `readback` says what [`Backend::take`]
    /// will bring back: the logits `[n_out, n_vocab]` (n_out = the number of sequences for
    /// `LogitsMode::Last`, of tokens for `All`), or each output row's top-k candidates (`k` ≤
    /// n_vocab; the caller clamps), which a GPU backend reduces on the device. Backends check
    /// `input` with [`StepInput::validate`] first. At most one step is in flight.
    fn submit(&mut self, graph: GraphId, kv: KvId, input: StepInput<'_>, readback: Readback) -> Result<()>;

    /// `None` when the submitted step's output can be taken now; otherwise a future to await
    /// first.
    fn ready(&mut self) -> Option<LogitsFuture>;

    /// Writes the submitted step's output, as its `readback` asked: `logits` for
    /// `Readback::Logits`, `top_k` for the candidates (then `logits` is scratch the backend may
    /// use). Also called when waiting failed: the backend then drops the pending step and reports
    /// its failure.
    fn take(&mut self, logits: &mut Vec<f32>, top_k: &mut TopK) -> Result<()>;

    /// Copies an f32 buffer of the last execution of `graph` by name (debug taps, op conformance
    /// tests); `None` for a buffer of another type, or where a readback cannot be waited for (a
    /// browser).
    fn read_buffer(&self, graph: GraphId, name: &str) -> Option<Vec<f32>>;

    /// Sets buffer `buf` of `graph` for its next step to `words`: its `rows * cols` elements as
    /// 4-byte words (an f32's bits, or a u32). A step split across backends
    /// ([`crate::offload::ExpertOffload`]) hands each part what another backend computed so.
    fn write_buffer(&mut self, graph: GraphId, buf: BufId, words: &[u32]) -> Result<()>;

    /// Reads output `buf` of the last step of `graph` (one of [`Graph::outputs`], which the
    /// backend writes whole) into `words`, as [`Backend::write_buffer`] takes it. A
    /// GPU backend waits for its device here, so a browser build refuses it.
    fn read_output(&mut self, graph: GraphId, buf: BufId, words: &mut Vec<u32>) -> Result<()>;

    fn counters(&self) -> BackendCounters;

    /// The tokens routed to each expert by every step run so far (see [`ExpertTallies`]); empty
    /// for a model without experts. A GPU backend counts on the device and reads the counts back
    /// here, so this waits for the device: call it between steps, not per step. An error where
    /// the wait is impossible (a browser).
    fn expert_tallies(&mut self) -> Result<ExpertTallies>;

    /// Device time per kernel family over the steps taken since the last call, when the backend
    /// was opened to profile and can (the wgpu backend with `WgpuOptions::profile` on an adapter
    /// with timestamps inside passes); `None` otherwise.
    fn kernel_profile(&mut self) -> Option<Vec<KernelTime>>;

    /// Bytes the backend holds for weights, KV and compiled graphs (host memory for the CPU,
    /// device memory for a GPU): for `hearth bench`, and bounded however many graphs were
    /// compiled and released.
    fn memory_bytes(&self) -> u64;
}

/// One step, synchronously: [`Backend::submit`], wait for [`Backend::ready`], [`Backend::take`].
/// In a browser a WebGPU readback cannot be waited for by blocking: that is an error here, never a
/// hang (drive the three calls from async code instead, as [`crate::runner::Runner`] does).
pub fn run_step(
    backend: &mut dyn Backend,
    graph: GraphId,
    kv: KvId,
    input: StepInput<'_>,
    readback: Readback,
    logits: &mut Vec<f32>,
    top_k: &mut TopK,
) -> Result<()> {
    backend.submit(graph, kv, input, readback)?;
    let waited = match backend.ready() {
        Some(ready) => crate::block_on::block_on(ready),
        None => Ok(()),
    };
    // take also when waiting failed: the backend then drops the pending step.
    let taken = backend.take(logits, top_k);
    waited.and(taken)
}

/// Ids into a backend's list of compiled graphs, reusing released slots: a long batching session
/// compiles many graphs over time and keeps only a bounded number alive.
#[derive(Debug)]
pub struct GraphSlots<T> {
    slots: Vec<Option<T>>,
}

impl<T> Default for GraphSlots<T> {
    fn default() -> Self {
        GraphSlots { slots: Vec::new() }
    }
}

impl<T> GraphSlots<T> {
    /// Stores `graph` in the first free slot.
    pub fn insert(&mut self, graph: T) -> GraphId {
        match self.slots.iter().position(Option::is_none) {
            Some(i) => {
                self.slots[i] = Some(graph);
                GraphId(i as u32)
            }
            None => {
                self.slots.push(Some(graph));
                GraphId(self.slots.len() as u32 - 1)
            }
        }
    }

    /// Drops the graph of `id` (nothing when the slot is already free) and returns it.
    pub fn remove(&mut self, id: GraphId) -> Option<T> {
        self.slots.get_mut(id.0 as usize).and_then(Option::take)
    }

    pub fn get(&self, id: GraphId) -> Option<&T> {
        self.slots.get(id.0 as usize).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, id: GraphId) -> Option<&mut T> {
        self.slots.get_mut(id.0 as usize).and_then(Option::as_mut)
    }

    /// The live graphs.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten()
    }

    /// How many graphs are alive.
    pub fn live(&self) -> usize {
        self.iter().count()
    }
}

/// Which backend runs a model, as the CLI's `--backend` and the browser's `backend` option name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The best available here: a hardware GPU through WebGPU, else the CPU.
    Auto,
    Cpu,
    /// WebGPU (wgpu natively over Vulkan, Metal or DX12; the browser's `navigator.gpu`).
    Wgpu,
    Cuda,
}

impl BackendKind {
    pub const ALL: [BackendKind; 4] = [BackendKind::Auto, BackendKind::Cpu, BackendKind::Wgpu, BackendKind::Cuda];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Auto => "auto",
            BackendKind::Cpu => "cpu",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
        }
    }

    /// Parses a name; `webgpu` is the browser's spelling of `wgpu`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "auto" => Ok(BackendKind::Auto),
            "cpu" => Ok(BackendKind::Cpu),
            "wgpu" | "webgpu" => Ok(BackendKind::Wgpu),
            "cuda" => Ok(BackendKind::Cuda),
            other => {
                Err(CoreError::InvalidArgument(format!("unknown backend '{other}' (expected auto, cpu, wgpu or cuda)")))
            }
        }
    }
}

impl std::str::FromStr for BackendKind {
    type Err = CoreError;

    fn from_str(name: &str) -> Result<Self> {
        BackendKind::parse(name)
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
