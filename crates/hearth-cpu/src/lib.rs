//! CPU backend: the reference every other backend is tested against, and the fallback when there
//! is no GPU. Weights stay in the model's memory map (no copy); matrix products quantize the
//! activations to the weight's 8-bit dot type first, as llama.cpp does, so results agree with it
//! closely; work is split over a rayon pool natively.

mod attention;
mod compat;
mod exec;
mod experts;
mod fma;
pub mod kernels;
mod kv_store;
mod matmul;
mod ops;
mod weights;

use hearth_core::backend::{
    Backend, BackendCounters, Capability, ExpertTallies, GraphId, GraphSlots, KvId, KvLayout, Readback, TopK,
    WeightData,
};
use hearth_core::graph::{BufId, BufType, Graph, Op, StepInput, WeightDesc, WeightId};
use hearth_core::kv::BlockCopy;
use hearth_core::{CoreError, Result};
use weights::CpuWeight;

/// Attention of one sequence's queries over a [`KvStore::paged`] view (for benchmarks; the
/// backend runs it from `Op::Attention`).
pub use attention::{attention as paged_attention, PagedKv};
pub use compat::Numerics;
use compat::GGML_FA_TILE_Q;
pub use exec::DebugOptions;
pub use kv_store::KvStore;

/// Errors of this crate; they reach callers as [`CoreError::Backend`].
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("unknown {what} id {id}")]
    UnknownId { what: &'static str, id: u32 },
    #[error("bad step input: {0}")]
    BadStep(String),
    #[error("KV pool: {0}")]
    BadKv(String),
    #[error("token id {token} is outside the embedding table of {rows} rows")]
    TokenOutOfRange { token: u32, rows: usize },
    #[error("weight '{name}': {reason}")]
    BadWeight { name: String, reason: String },
    #[error("could not start the thread pool: {0}")]
    ThreadPool(String),
}

impl From<CpuError> for CoreError {
    fn from(e: CpuError) -> Self {
        CoreError::Backend { backend: "cpu".into(), message: e.to_string() }
    }
}

pub(crate) struct CompiledGraph {
    graph: Graph,
    bufs: Vec<Vec<f32>>,
    /// The last mat-mul input converted to 8-bit blocks (reused by the next mat-mul on it).
    activations: matmul::QuantizedActivations,
    /// The expert mat-muls' gathered rows and products, reused by every step.
    experts: experts::ExpertScratch,
    /// The routers whose picks count as load: (router, its experts, its ids buffer).
    tallied_routers: Vec<(usize, usize, BufId)>,
}

pub struct CpuBackend {
    weights: Vec<CpuWeight>,
    kvs: Vec<KvStore>,
    graphs: GraphSlots<CompiledGraph>,
    /// The step `submit` ran, whose output `take` reads: its graph and what to read back.
    pending: Option<(GraphId, Readback)>,
    counters: BackendCounters,
    /// Tokens each router sent to each expert, counted from its ids after every step.
    tallies: ExpertTallies,
    debug: exec::DebugOptions,
    numerics: Numerics,
    /// Whether Q4_K matrices are repacked at their first mat-mul (see weights.rs).
    repack: bool,
    #[cfg(not(target_arch = "wasm32"))]
    pool: std::sync::Arc<rayon::ThreadPool>,
}

/// One rayon pool per thread count for the whole process: a draft model and its target (or several
/// engines) then share the cores instead of two pools of spinning workers fighting over them.
#[cfg(not(target_arch = "wasm32"))]
fn shared_pool(threads: Option<usize>) -> std::result::Result<std::sync::Arc<rayon::ThreadPool>, CpuError> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock, Weak};
    static POOLS: OnceLock<Mutex<HashMap<usize, Weak<rayon::ThreadPool>>>> = OnceLock::new();
    let n = threads.filter(|&n| n > 0).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut pools = POOLS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(pool) = pools.get(&n).and_then(Weak::upgrade) {
        return Ok(pool);
    }
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("hearth-cpu-{i}"))
            .build()
            .map_err(|e| CpuError::ThreadPool(e.to_string()))?,
    );
    pools.insert(n, Arc::downgrade(&pool));
    Ok(pool)
}

/// How a [`CpuBackend`] is set up. The library never reads the environment; binaries and dev tools
/// start from [`CpuOptions::from_env`].
#[derive(Clone, Debug)]
pub struct CpuOptions {
    /// Worker threads (None = all cores).
    pub threads: Option<usize>,
    /// The arithmetic where two roundings are both valid (default [`Numerics::Hearth`]); see
    /// compat.rs for what [`Numerics::LlamaCpp`] changes.
    pub numerics: Numerics,
    /// Whether Q4_K matrices are repacked into tiles of 16 interleaved rows (default true; it
    /// happens only where this CPU has AVX-512 VNNI, whose kernel reads them), each at its first
    /// mat-mul. A repacked weight is an owned copy, 2.8% larger than its rows; a memory-mapped
    /// model's pages it was read from are released (rows read later, by embedding lookups or
    /// `Numerics::LlamaCpp`, come back from the file), other sources keep both. Every mat-mul
    /// then reads the tiles without rearranging: speculative verification, batched decode and
    /// prompt reading get cheaper. Results are the same bit for bit.
    pub repack: bool,
    pub debug: exec::DebugOptions,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions { threads: None, numerics: Numerics::Hearth, repack: true, debug: exec::DebugOptions::default() }
    }
}

impl CpuOptions {
    /// The defaults with what the environment asks for: `HEARTH_NO_REPACK=1` (anything but empty
    /// or 0) keeps Q4_K weights as the file stores them; `HEARTH_DUMP_TAPS` and `HEARTH_OP_TIMES`
    /// turn on the debug aids of [`exec::DebugOptions`].
    pub fn from_env() -> Self {
        CpuOptions {
            repack: std::env::var("HEARTH_NO_REPACK").map_or(true, |v| matches!(v.as_str(), "" | "0")),
            debug: exec::DebugOptions::from_env(),
            ..CpuOptions::default()
        }
    }
}

impl CpuBackend {
    /// The backend with the default options and `threads` workers (None = all cores).
    pub fn new(threads: Option<usize>) -> Result<Self> {
        Self::with_options(CpuOptions { threads, ..CpuOptions::default() })
    }

    pub fn with_options(options: CpuOptions) -> Result<Self> {
        // wasm32 runs single-threaded (no rayon pool) until wasm threads are wired in.
        #[cfg(target_arch = "wasm32")]
        let _ = options.threads;
        Ok(CpuBackend {
            weights: Vec::new(),
            kvs: Vec::new(),
            graphs: GraphSlots::default(),
            pending: None,
            counters: BackendCounters::default(),
            tallies: ExpertTallies::default(),
            debug: options.debug,
            numerics: options.numerics,
            repack: options.repack,
            #[cfg(not(target_arch = "wasm32"))]
            pool: shared_pool(options.threads)?,
        })
    }

    pub fn threads(&self) -> usize {
        #[cfg(not(target_arch = "wasm32"))]
        return self.pool.current_num_threads();
        #[cfg(target_arch = "wasm32")]
        return 1;
    }

    fn weight(&self, id: WeightId) -> std::result::Result<&CpuWeight, CpuError> {
        self.weights.get(id.0 as usize).ok_or(CpuError::UnknownId { what: "weight", id: id.0 })
    }
}

/// Adds the picks of the step `compiled` just ran to `tallies`, from each tallied router's ids.
fn tally_experts(compiled: &CompiledGraph, tallies: &mut ExpertTallies) {
    for &(router, n_expert, ids) in &compiled.tallied_routers {
        // A u32 buffer holds each id as its bit pattern.
        let picks = compiled.bufs[ids.0 as usize].iter().map(|v| v.to_bits());
        tallies.add_picks(router, n_expert, picks);
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn variant(&self) -> Option<String> {
        None
    }

    fn supports(&self, what: Capability<'_>) -> std::result::Result<(), String> {
        // Every weight type has a kernel and every KV type a store; only the activation-only
        // formats (Q8_1, Q8_K) cannot be the weight side of a product.
        let Capability::Op { op: Op::MatMul { w: id, .. } | Op::Embed { table: id, .. }, .. } = what else {
            return Ok(());
        };
        let w = self.weight(*id).map_err(|e| e.to_string())?;
        if w.desc.ty.is_weight_type() {
            Ok(())
        } else {
            Err(format!("weight '{}' of type {} (an activation format)", w.desc.name, w.desc.ty))
        }
    }

    fn upload_weight(&mut self, desc: WeightDesc, data: WeightData) -> Result<WeightId> {
        let repack = self.repack;
        #[cfg(not(target_arch = "wasm32"))]
        let w = self.pool.install(|| CpuWeight::new(desc, data, repack))?;
        #[cfg(target_arch = "wasm32")]
        let w = CpuWeight::new(desc, data, repack)?;
        self.weights.push(w);
        Ok(WeightId(self.weights.len() as u32 - 1))
    }

    fn alloc_kv(&mut self, layout: KvLayout) -> Result<KvId> {
        self.kvs.push(KvStore::new(layout)?);
        Ok(KvId(self.kvs.len() as u32 - 1))
    }

    fn release_graph(&mut self, graph: GraphId) {
        if self.graphs.remove(graph).is_some() {
            self.counters.graphs_released += 1;
        }
        if self.pending.is_some_and(|(g, _)| g == graph) {
            self.pending = None;
        }
    }

    fn copy_kv_blocks(&mut self, kv: KvId, copies: &[BlockCopy]) -> Result<()> {
        let kv = self.kvs.get_mut(kv.0 as usize).ok_or(CpuError::UnknownId { what: "kv cache", id: kv.0 })?;
        Ok(kv.copy_blocks(copies)?)
    }

    fn compile(&mut self, graph: &Graph) -> Result<GraphId> {
        graph.validate(|id| self.weights.get(id.0 as usize).map(|w| &w.desc))?;
        // Each buffer as 4-byte words, [rows, cols]: an f32 buffer's values, a u32 buffer's ids as
        // their bit patterns (`f32::to_bits`); every `BufType` is 4 bytes wide.
        let bufs = graph.bufs.iter().map(|b| vec![0f32; b.bytes().div_ceil(4)]).collect();
        let tallied_routers = graph
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::RouteExperts { logits, ids, tally: Some(router), .. } => {
                    Some((*router, graph.desc(*logits).cols, *ids))
                }
                _ => None,
            })
            .collect();
        let id = self.graphs.insert(CompiledGraph {
            graph: graph.clone(),
            bufs,
            activations: Default::default(),
            experts: Default::default(),
            tallied_routers,
        });
        self.counters.graphs_compiled += 1;
        Ok(id)
    }

    /// Runs the whole step here; `take` then reads its logits buffer.
    fn submit(&mut self, graph: GraphId, kv: KvId, input: StepInput<'_>, readback: Readback) -> Result<()> {
        self.pending = None;
        let compiled = self.graphs.get_mut(graph).ok_or(CpuError::UnknownId { what: "graph", id: graph.0 })?;
        let kv = self.kvs.get_mut(kv.0 as usize).ok_or(CpuError::UnknownId { what: "kv cache", id: kv.0 })?;
        let n_ops = compiled.graph.ops.len() as u64;
        // Token ids are checked against the embedding table by the embed op.
        input.validate(&compiled.graph, &kv.layout, usize::MAX).map_err(CpuError::BadStep)?;
        let ctx = exec::ExecContext { weights: &self.weights, input, debug: &self.debug, numerics: self.numerics };
        #[cfg(not(target_arch = "wasm32"))]
        self.pool.install(|| exec::run(compiled, kv, &ctx))?;
        #[cfg(target_arch = "wasm32")]
        exec::run(compiled, kv, &ctx)?;
        tally_experts(compiled, &mut self.tallies);
        self.pending = Some((graph, readback));
        self.counters.steps_executed += 1;
        self.counters.ops_executed += n_ops;
        Ok(())
    }

    fn ready(&mut self) -> Option<hearth_core::backend::LogitsFuture> {
        None
    }

    fn take(&mut self, logits: &mut Vec<f32>, top_k: &mut TopK) -> Result<()> {
        let (graph, readback) = self.pending.take().ok_or(CpuError::BadStep("take without a submitted step".into()))?;
        let compiled = self.graphs.get(graph).ok_or(CpuError::UnknownId { what: "graph", id: graph.0 })?;
        let out = &compiled.bufs[compiled.graph.logits.0 as usize];
        match readback {
            Readback::Logits => {
                logits.clear();
                logits.extend_from_slice(out);
            }
            Readback::TopK(_) | Readback::TopKAndLogSumExp(_) => {
                let n_vocab = compiled.graph.desc(compiled.graph.logits).cols;
                hearth_core::sampling::reduce_rows(readback, out, n_vocab, top_k);
            }
        }
        Ok(())
    }

    fn read_buffer(&self, graph: GraphId, name: &str) -> Option<Vec<f32>> {
        let compiled = self.graphs.get(graph)?;
        let index = compiled.graph.bufs.iter().position(|b| b.name == name)?;
        (compiled.graph.bufs[index].dtype == BufType::F32).then(|| compiled.bufs[index].clone())
    }

    fn write_buffer(&mut self, graph: GraphId, buf: BufId, words: &[u32]) -> Result<()> {
        let compiled = self.graphs.get_mut(graph).ok_or(CpuError::UnknownId { what: "graph", id: graph.0 })?;
        let target = compiled.bufs.get_mut(buf.0 as usize).ok_or(CpuError::UnknownId { what: "buffer", id: buf.0 })?;
        if target.len() != words.len() {
            return Err(CpuError::BadStep(format!(
                "buffer {} holds {} words, {} were given",
                buf.0,
                target.len(),
                words.len()
            ))
            .into());
        }
        target.iter_mut().zip(words).for_each(|(value, &word)| *value = f32::from_bits(word));
        Ok(())
    }

    fn read_output(&mut self, graph: GraphId, buf: BufId, words: &mut Vec<u32>) -> Result<()> {
        let compiled = self.graphs.get(graph).ok_or(CpuError::UnknownId { what: "graph", id: graph.0 })?;
        if !compiled.graph.outputs.contains(&buf) {
            return Err(CpuError::BadStep(format!("buffer {} is not an output of the graph", buf.0)).into());
        }
        words.clear();
        words.extend(compiled.bufs[buf.0 as usize].iter().map(|v| v.to_bits()));
        Ok(())
    }

    fn kernel_profile(&mut self) -> Option<Vec<hearth_core::backend::KernelTime>> {
        None // ops run as host code, not as timed device kernels
    }

    fn counters(&self) -> BackendCounters {
        self.counters.clone()
    }

    fn expert_tallies(&mut self) -> Result<ExpertTallies> {
        Ok(self.tallies.clone())
    }

    fn memory_bytes(&self) -> u64 {
        let kv: u64 = self.kvs.iter().map(|k| k.bytes()).sum();
        let weights: u64 = self.weights.iter().map(|w| w.owned_bytes()).sum();
        let acts: u64 = self.graphs.iter().flat_map(|g| g.bufs.iter()).map(|b| b.len() as u64 * 4).sum();
        kv + weights + acts
    }
}
