//! A model on a backend with its paged KV pool: runs steps over any number of sequences. The
//! single-sequence [`crate::engine::Session`] and the batching scheduler both drive this.

use crate::backend::{Backend, Capability, GraphId, KvId, KvLayout, Readback, TopK};
use crate::block_on::block_on;
use crate::engine::{EngineOptions, Instant};
use crate::error::{CoreError, Result};
use crate::gguf::GgufFile;
use crate::graph::{LogitsMode, SeqStep, StepInput};
use crate::kv::{KvGroup, KvManager, SeqId};
use crate::model::{Model, ModelConfig};
use std::collections::HashMap;
use std::time::Duration;

/// One sequence's tokens in a step.
#[derive(Clone, Copy, Debug)]
pub struct BatchEntry<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
}

/// A step the backend is running ([`Runner::begin_step`]): each entry's sequence, its length
/// before the step and the tokens the step appends to it.
#[must_use = "take the step with Runner::finish_step, or its KV positions stay reserved"]
pub struct PendingStep {
    entries: Vec<(SeqId, usize, Vec<u32>)>,
    readback: Readback,
}

/// What a step returned, as asked with a [`Readback`]: logits `[n_out, n_vocab]`, or each output
/// row's candidates.
#[derive(Clone, Copy, Debug)]
pub enum StepOutput<'a> {
    Logits(&'a [f32]),
    TopK(&'a TopK),
}

pub struct Runner {
    backend: Box<dyn Backend>,
    model: Model,
    kv_id: KvId,
    layout: KvLayout,
    kv: KvManager,
    /// Compiled graphs by (tokens, sequences, logits) with the step that last used them.
    graphs: HashMap<(usize, usize, LogitsMode), (GraphId, u64)>,
    steps: u64,
    logits: Vec<f32>,
    /// Candidates of the last step asked for with `Readback::TopK`.
    top_k: TopK,
    /// Time spent waiting for the backend to finish steps (the GPU's share of a step).
    device_wait: Duration,
    /// Positions one sequence may hold (RoPE range the model was trained on, or less).
    n_ctx: usize,
    tokens_scratch: Vec<u32>,
}

impl Runner {
    /// Loads the weights of `file` onto `backend` and allocates the KV pool the options ask for.
    pub fn load(
        file: &GgufFile,
        mut backend: Box<dyn Backend>,
        options: &EngineOptions,
        on_progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let model = Model::load(file, backend.as_mut(), options.logits_vocab, on_progress)?;
        check_support(backend.as_ref(), &model, options)?;
        let n_ctx = match options.n_ctx {
            0 => model.config.n_ctx_train.min(4096),
            n => n,
        };
        let block_size = options.kv_block_size.max(1);
        let groups = size_groups(&model, options, n_ctx, block_size)?;
        let layout = model.kv_layout(options.kv_type, block_size, groups.clone());
        if options.kv_type.row_bytes(layout.k_width).is_none() {
            return Err(CoreError::InvalidArgument(format!(
                "KV type {} needs rows that are a multiple of 32 values; this model's are {}",
                options.kv_type.name(),
                layout.k_width
            )));
        }
        backend
            .supports(Capability::Kv(&layout))
            .map_err(|what| CoreError::Unsupported { backend: backend.name().to_string(), what })?;
        // A sequence can never hold more positions than the global groups' pools.
        let pool_positions =
            groups.iter().filter(|g| g.window.is_none()).map(|g| g.n_blocks * block_size).min().unwrap_or(usize::MAX);
        let n_ctx = n_ctx.min(pool_positions);
        let kv_id = backend.alloc_kv(layout.clone())?;
        let kv = KvManager::new(block_size, groups, ROLLBACK_MARGIN)?;
        Ok(Runner {
            backend,
            model,
            kv_id,
            layout,
            kv,
            graphs: HashMap::new(),
            steps: 0,
            logits: Vec::new(),
            top_k: TopK::default(),
            device_wait: Duration::ZERO,
            n_ctx,
            tokens_scratch: Vec::new(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    /// The model's parameters, total and active per token.
    pub fn parameters(&self) -> crate::model::ParameterCount {
        self.model.parameters
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// Tokens routed to each expert so far ([`Backend::expert_tallies`]: waits for a GPU).
    pub fn expert_tallies(&mut self) -> Result<crate::backend::ExpertTallies> {
        self.backend.expert_tallies()
    }

    /// The backend's device time per kernel family since the last call ([`Backend::kernel_profile`]).
    pub fn kernel_profile(&mut self) -> Option<Vec<crate::backend::KernelTime>> {
        self.backend.kernel_profile()
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn kv(&self) -> &KvManager {
        &self.kv
    }

    pub fn kv_mut(&mut self) -> &mut KvManager {
        &mut self.kv
    }

    pub fn kv_layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Logits of the last successful step read back with `Readback::Logits`.
    pub fn last_logits(&self) -> &[f32] {
        &self.logits
    }

    /// Candidates of the last successful step read back with `Readback::TopK`.
    pub fn last_top_k(&self) -> &TopK {
        &self.top_k
    }

    /// Total time steps spent waiting for the backend to finish (natively, blocked on the GPU;
    /// zero for backends that compute inside `submit`, such as the CPU's). A step's host time is
    /// its wall time minus this share.
    pub fn device_wait(&self) -> Duration {
        self.device_wait
    }

    fn graph(&mut self, n_tokens: usize, n_seqs: usize, mode: LogitsMode) -> Result<GraphId> {
        self.steps += 1;
        if let Some((id, used)) = self.graphs.get_mut(&(n_tokens, n_seqs, mode)) {
            *used = self.steps;
            return Ok(*id);
        }
        if self.graphs.len() >= MAX_GRAPHS {
            // Batches of changing shapes: drop the least recently used graph.
            if let Some((&key, &(old, _))) = self.graphs.iter().min_by_key(|(_, (_, used))| *used) {
                self.backend.release_graph(old);
                self.graphs.remove(&key);
            }
        }
        let graph = self.model.build_graph(n_tokens, n_seqs, mode);
        let id = self.backend.compile(&graph)?;
        self.graphs.insert((n_tokens, n_seqs, mode), (id, self.steps));
        Ok(id)
    }

    /// The milliseconds of one step of `width` tokens of one sequence after a short context, for
    /// each of `widths`, in `mode` reading back one candidate a row: what a verification pass
    /// (`LogitsMode::All`) or a draft model's pass costs on this machine. Each is the faster of
    /// two runs (the first also compiles the step's graph). Runs on a sequence of its own, removed
    /// after; a width the context cannot hold is left out.
    pub async fn time_passes(&mut self, widths: &[usize], mode: LogitsMode) -> Result<Vec<(usize, f64)>> {
        let seq = self.kv.add_sequence();
        let result = self.time_passes_on(seq, widths, mode).await;
        self.kv.remove_sequence(seq);
        result
    }

    async fn time_passes_on(&mut self, seq: SeqId, widths: &[usize], mode: LogitsMode) -> Result<Vec<(usize, f64)>> {
        const CONTEXT: usize = 32;
        let n_vocab = self.model.config.n_vocab.max(1) as u32;
        let context: Vec<u32> = (0..CONTEXT as u32).map(|i| (i * 7919 + 13) % n_vocab).collect();
        let n_ctx = self.n_ctx();
        let mut costs = Vec::new();
        if CONTEXT >= n_ctx {
            return Ok(costs);
        }
        self.step_for_async(&[BatchEntry { seq, tokens: &context }], mode, Readback::TopK(1)).await?;
        for &width in widths.iter().filter(|&&w| (1..=CONTEXT).contains(&w) && CONTEXT + w <= n_ctx) {
            let mut fastest = f64::INFINITY;
            for _ in 0..2 {
                self.kv.truncate(seq, CONTEXT)?;
                let started = Instant::now();
                let tokens = &context[..width];
                self.step_for_async(&[BatchEntry { seq, tokens }], mode, Readback::TopK(1)).await?;
                fastest = fastest.min(started.elapsed().as_secs_f64() * 1e3);
            }
            costs.push((width, fastest));
        }
        Ok(costs)
    }

    /// Appends each entry's tokens to its sequence in one forward pass and returns the logits:
    /// `[batch.len(), n_vocab]` (the last token of each entry) or `[total tokens, n_vocab]`.
    /// On error no sequence changes. Synchronous: [`Runner::step_async`] polled once.
    pub fn step(&mut self, batch: &[BatchEntry<'_>], mode: LogitsMode) -> Result<&[f32]> {
        block_on(self.step_async(batch, mode))
    }

    /// [`Runner::step`] for backends whose logits arrive later (WebGPU in a browser): submits the
    /// step, awaits [`Backend::ready`], takes the logits. If this future is dropped before
    /// it finishes, the entries keep their reserved (uncommitted) positions: truncate them.
    pub async fn step_async(&mut self, batch: &[BatchEntry<'_>], mode: LogitsMode) -> Result<&[f32]> {
        self.step_for_async(batch, mode, Readback::Logits).await?;
        Ok(&self.logits)
    }

    /// [`Runner::step_async`] reading back what `readback` asks for: with `Readback::TopK(k)`
    /// each output row's `min(k, n_vocab)` largest logits (a GPU backend reduces them on the
    /// device and reads back only those). `TopK(0)` is taken as `TopK(1)`.
    pub async fn step_for_async(
        &mut self,
        batch: &[BatchEntry<'_>],
        mode: LogitsMode,
        readback: Readback,
    ) -> Result<StepOutput<'_>> {
        let step = self.begin_step(batch, mode, readback)?;
        self.finish_step(step).await
    }

    /// The first half of [`Runner::step_for_async`]: checks the batch, reserves its KV positions
    /// and submits the step. The caller may work on the CPU while the device runs it (a GPU
    /// backend's submit returns at once), then must take it with [`Runner::finish_step`].
    pub fn begin_step(
        &mut self,
        batch: &[BatchEntry<'_>],
        mode: LogitsMode,
        readback: Readback,
    ) -> Result<PendingStep> {
        let n_logits = self.model.config.n_logits;
        let readback = match readback.top_k() {
            Some(k) => readback.with_k(k.clamp(1, n_logits.max(1))),
            None => readback,
        };
        let lens = self.submit_step(batch, mode, readback)?;
        let entries = batch.iter().zip(lens).map(|(e, len)| (e.seq, len, e.tokens.to_vec())).collect();
        Ok(PendingStep { entries, readback })
    }

    /// The second half of [`Runner::step_for_async`]: awaits the submitted step, takes its
    /// output and commits its KV positions (on error, gives them back).
    pub async fn finish_step(&mut self, step: PendingStep) -> Result<StepOutput<'_>> {
        let waited = Instant::now();
        let result = match self.backend.ready() {
            Some(ready) => ready.await,
            None => Ok(()),
        };
        self.device_wait += waited.elapsed();
        // take also when waiting failed: the backend then drops the pending step.
        let taken = self.backend.take(&mut self.logits, &mut self.top_k);
        let result = result.and(taken);
        if let Err(err) = result {
            for (seq, len, _) in &step.entries {
                self.kv.truncate(*seq, *len)?;
            }
            return Err(err);
        }
        for (seq, _, tokens) in &step.entries {
            self.kv.commit(*seq, tokens)?;
        }
        Ok(match step.readback {
            Readback::Logits => StepOutput::Logits(&self.logits),
            Readback::TopK(_) | Readback::TopKAndLogSumExp(_) => StepOutput::TopK(&self.top_k),
        })
    }

    /// Gives back the positions reserved for `batch` (sequences back to `lens`).
    fn undo_reservations(&mut self, batch: &[BatchEntry<'_>], lens: &[usize]) -> Result<()> {
        for (e, &len) in batch.iter().zip(lens) {
            self.kv.truncate(e.seq, len)?;
        }
        Ok(())
    }

    /// Checks the batch, reserves KV positions and submits the step; returns each entry's length
    /// before the step. On error nothing stays reserved.
    fn submit_step(&mut self, batch: &[BatchEntry<'_>], mode: LogitsMode, readback: Readback) -> Result<Vec<usize>> {
        let n_vocab = self.model.config.n_vocab;
        for (i, e) in batch.iter().enumerate() {
            if e.tokens.is_empty() {
                return Err(CoreError::InvalidArgument("a step needs at least one token per sequence".into()));
            }
            if let Some(&bad) = e.tokens.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(CoreError::InvalidArgument(format!(
                    "token id {bad} is outside the vocabulary of {n_vocab}"
                )));
            }
            if batch[..i].iter().any(|o| o.seq == e.seq) {
                return Err(CoreError::InvalidArgument("a sequence appears twice in one step".into()));
            }
            let needed = self.kv.len(e.seq) + e.tokens.len();
            if needed > self.n_ctx {
                return Err(CoreError::ContextOverflow { needed, capacity: self.n_ctx });
            }
        }
        if batch.is_empty() {
            return Err(CoreError::InvalidArgument("a step needs at least one sequence".into()));
        }
        let lens: Vec<usize> = batch.iter().map(|e| self.kv.len(e.seq)).collect();
        let mut copies = Vec::new();
        let mut failed = None;
        for (i, e) in batch.iter().enumerate() {
            match self.kv.reserve(e.seq, e.tokens.len()) {
                Ok(plan) => copies.extend(plan.copies),
                Err(err) => {
                    failed = Some((i, err));
                    break;
                }
            }
        }
        // Copy-on-write blocks already replaced in the tables must be filled even if we stop.
        if !copies.is_empty() {
            self.backend.copy_kv_blocks(self.kv_id, &copies)?;
        }
        if let Some((i, err)) = failed {
            // Give back what earlier entries reserved.
            for (e, &len) in batch[..i].iter().zip(&lens) {
                self.kv.truncate(e.seq, len)?;
            }
            return Err(err);
        }
        let n_tokens: usize = batch.iter().map(|e| e.tokens.len()).sum();
        let graph = self.graph(n_tokens, batch.len(), mode)?;
        self.tokens_scratch.clear();
        batch.iter().for_each(|e| self.tokens_scratch.extend_from_slice(e.tokens));
        let seqs: Vec<SeqStep<'_>> = batch
            .iter()
            .zip(&lens)
            .map(|(e, &pos0)| SeqStep { n_tokens: e.tokens.len(), pos0, block_tables: self.kv.block_tables(e.seq) })
            .collect();
        let input = StepInput { tokens: &self.tokens_scratch, seqs: &seqs };
        let result = self.backend.submit(graph, self.kv_id, input, readback);
        drop(seqs);
        if let Err(err) = result {
            self.undo_reservations(batch, &lens)?;
            return Err(err);
        }
        Ok(lens)
    }
}

/// Compiled graphs kept at once (each holds activation buffers sized for its step).
pub const MAX_GRAPHS: usize = 24;

/// Asks `backend` about every op of the model's decode and prompt graphs (the same ops with other
/// row counts make up every other step), before anything is allocated or compiled.
fn check_support(backend: &dyn Backend, model: &Model, options: &EngineOptions) -> Result<()> {
    let chunk = options.prefill_chunk.max(2);
    for graph in [model.build_graph(1, 1, LogitsMode::Last), model.build_graph(chunk, 1, LogitsMode::All)] {
        for op in &graph.ops {
            backend
                .supports(Capability::Op { op, graph: &graph })
                .map_err(|what| CoreError::Unsupported { backend: backend.name().to_string(), what })?;
        }
    }
    Ok(())
}

/// Positions kept past a sliding window so that rolling back a rejected draft still finds keys.
pub const ROLLBACK_MARGIN: usize = 64;

/// Block counts per group: from `kv_memory` when given, else room for `max_sequences` full
/// contexts. Windowed groups only ever hold about a window per sequence.
fn size_groups(model: &Model, options: &EngineOptions, n_ctx: usize, block_size: usize) -> Result<Vec<KvGroup>> {
    let mut groups = model.kv_groups();
    let seqs = options.max_sequences.max(1);
    let ctx_blocks = n_ctx.div_ceil(block_size);
    let per_seq = |g: &KvGroup| match g.window {
        // During a step a sequence holds its window, the rollback margin and the step's new
        // tokens (a prompt chunk) before old blocks are released; +2 for partial blocks at the ends.
        Some(w) => ctx_blocks.min((w + ROLLBACK_MARGIN + options.prefill_chunk.max(1)).div_ceil(block_size) + 2),
        None => ctx_blocks,
    };
    let probe = model.kv_layout(
        options.kv_type,
        block_size,
        groups.iter().map(|g| KvGroup { n_blocks: 1, ..g.clone() }).collect(),
    );
    match options.kv_memory {
        None => groups.iter_mut().for_each(|g| g.n_blocks = seqs * per_seq(g)),
        Some(budget) => {
            // Windowed groups first (small, fixed per sequence), the rest of the budget to the
            // global groups.
            let mut left = budget as i128;
            for (i, g) in groups.iter_mut().enumerate() {
                if g.window.is_some() {
                    g.n_blocks = seqs * per_seq(g);
                    left -= (g.n_blocks * probe.block_bytes(i)) as i128;
                }
            }
            let global_bytes: usize =
                (0..groups.len()).filter(|&i| groups[i].window.is_none()).map(|i| probe.block_bytes(i)).sum();
            let global_blocks = (left.max(0) as usize).checked_div(global_bytes).unwrap_or(0);
            for g in groups.iter_mut().filter(|g| g.window.is_none()) {
                g.n_blocks = global_blocks;
            }
            if left <= 0 || groups.iter().any(|g| g.n_blocks == 0) {
                return Err(CoreError::InvalidArgument(format!(
                    "a KV memory budget of {budget} bytes holds less than one block of {block_size} tokens ({} bytes per token)",
                    probe.bytes_per_token()
                )));
            }
        }
    }
    Ok(groups)
}
