//! Graph → dispatch list, at compile time (replay per step is in `replay.rs`).

use crate::device::Gpu;
use crate::fusion::{fusion_plan, Fusion, HeadsChain, MatMulPart, HEAD_CONSTANTS};
use crate::kernel_params::{
    uniform_bytes, ActQuantParams, AttentionParams, ElementwiseParams, EmbedParams, ExpertParams, HeadsParams,
    KernelParams, MatMulParams, NormParams, RopeParams, StoreKvParams,
};
use crate::replay::{make_bind_group, KvBinding};
use crate::shader::{PipelineCache, PipelineKey, ShaderFile};
use crate::tally::TallyCounters;
use crate::weights::{segment_type_define, type_define, GpuWeight, JoinedVectors};
use crate::WgpuError;
use hearth_core::graph::{BufId, ExpertGating, GluActivation, Graph, Op, RopeMode, RopeYarn, WeightId};
use hearth_core::kv::ValueRows;
use hearth_core::quant::GgmlType;
use std::collections::HashMap;
use wgpu::util::DeviceExt;

/// Workgroups per grid dimension (WebGPU's guaranteed minimum).
const MAX_GROUPS: u32 = 65535;

/// attention.wgsl's most splits of a query's keys (MAX_SPLITS): 32 of at least 128 keys with the
/// GPU shapes, 16 of at least 256 on a CPU adapter, which launches the grid's empty split
/// workgroups at a cost.
fn attention_max_splits(gpu_shapes: bool) -> usize {
    if gpu_shapes {
        32
    } else {
        16
    }
}

/// The most tokens of a step that get a workgroup per split (longer steps loop over the splits
/// in a workgroup per head).
pub(crate) const GRID_SPLIT_TOKENS: usize = 16;

/// attention.wgsl's most query heads a workgroup computes (MAX_GROUP) and most values of them
/// (its q_sh).
const ATTENTION_MAX_GROUP: usize = 8;
const ATTENTION_GROUP_VALUES: usize = 1024;

/// How many query heads of one KV head an attention workgroup computes: the largest count that
/// divides the heads sharing a KV head and fits the workgroup (Qwen2.5-0.5B's 7, Gemma 3's 4).
fn attention_group(n_head: usize, n_head_kv: usize, head_dim: usize) -> usize {
    let sharing = n_head / n_head_kv.max(1);
    (1..=sharing.min(ATTENTION_MAX_GROUP))
        .rev()
        .find(|g| sharing.is_multiple_of(*g) && g * head_dim <= ATTENTION_GROUP_VALUES)
        .unwrap_or(1)
}

/// The widest router route_experts holds in workgroup memory (experts.wgsl MAX_EXPERTS).
pub(crate) const MAX_ROUTED_EXPERTS: usize = 1024;

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
#[derive(Clone)]
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
    /// Where it stores or reads values (None: it touches none).
    pub values: Option<ValueRows>,
    /// Attention only: its window (None = whole context).
    pub window: Option<Option<usize>>,
    /// Whether it subtracts or adds back key or value offsets (compiled with KV_OFFSET against
    /// a pool whose type subtracts them).
    pub offsets: bool,
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
    /// For profiles (native only): the kernel family and the weight bytes the dispatch reads.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub family: String,
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub weight_bytes: u64,
}

pub(crate) struct CompiledGraph {
    pub graph: Graph,
    /// One storage buffer per graph buffer, `[rows, cols]` f32.
    pub bufs: Vec<wgpu::Buffer>,
    /// [2 + 3 * n_tokens + 3 * n_seqs] u32 (layout in shaders/kv_cache.wgsl): token ids, each
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
    /// GPU timestamps around the dispatches, when profiling (`DeviceInfo::timestamps`), and the
    /// dispatches the last step timed (indices into `dispatches`; `usize::MAX`: the top-k).
    pub timestamps: Option<crate::profile::StepTimestamps>,
    pub timed: Vec<usize>,
    /// Per k: the top-k reduction of the logits (`sample.rs`), built on first use.
    pub top_k_plans: HashMap<crate::sample::TopKSpec, crate::sample::TopKPlan>,
    /// The other buffers made at compile time: the activation scratch and each dispatch's
    /// parameters.
    pub owned: Vec<wgpu::Buffer>,
    /// Per output of the graph (`Graph::outputs`): a staging buffer each step copies it to, in its
    /// own submit, for `Backend::read_output` to map.
    pub output_staging: Vec<(BufId, wgpu::Buffer)>,
}

struct Builder<'a> {
    gpu: &'a Gpu,
    pipelines: &'a mut PipelineCache,
    weights: &'a [GpuWeight],
    joined: &'a mut JoinedVectors,
    graph: &'a Graph,
    /// The expert counters tallied routers add their picks to.
    tallies: Option<&'a TallyCounters>,
    bufs: Vec<wgpu::Buffer>,
    step: wgpu::Buffer,
    /// Two scratch buffers for rounded activations, used in turn, so that rounding the next
    /// input never waits for the mat-muls still reading the last one.
    act_scratch: Vec<wgpu::Buffer>,
    /// The rounded activations in the scratch buffers: (input, rounding, slot). An entry holds
    /// until its input is written again or its slot is reused, so q/k/v (and gate/up) share one
    /// rounding of their input.
    rounded: Vec<(BufId, ActRounding, usize)>,
    /// The slot the next rounding writes.
    next_slot: usize,
    /// [n_tokens, n_head, attention_max_splits, head_dim + 2] f32 for the widest attention of a
    /// step of at most GRID_SPLIT_TOKENS tokens (longer steps merge their splits in the attention
    /// dispatch): each split's partial result, shared by the layers (each reduce reads it before
    /// the next layer's attention writes it).
    attention_partials: Option<wgpu::Buffer>,
    /// Ops left out of the dispatch list because only mat-muls read their output: (output, op),
    /// run as the prologue of that output's rounding; an entry holds until the output is written
    /// again.
    producers: Vec<(BufId, Op)>,
    /// Norm + Add pairs left to the rounding of the next norm's output (`SumBeforeRounding`),
    /// which the mat-mul right after that norm makes.
    pending_sums: Vec<PendingSum>,
    dispatches: Vec<Dispatch>,
    /// The expert mat-muls' grouping of a step's pairs by expert (group_experts), made once per
    /// router output and shared by its gate, up and down products.
    expert_groups: Option<ExpertGroups>,
    /// Buffers the dispatches read that no other field holds, kept for the graph's life: each
    /// dispatch's parameters, the heads' ids and groupings, expert groupings a longer step outgrew.
    kept: Vec<wgpu::Buffer>,
    /// The heads' ids made so far, by (pairs, heads): every layer's per-head products share them.
    head_ids: HashMap<(usize, usize), wgpu::Buffer>,
    /// The heads' pairs grouped by head (order, tiles), by (tokens, heads), likewise shared.
    head_groups: HashMap<(usize, usize), (wgpu::Buffer, wgpu::Buffer)>,
}

/// A norm whose residual add is computed and written by the next rounding (act_quant.wgsl SUM):
/// `out = residual + norm`.
struct PendingSum {
    norm: Op,
    residual: BufId,
    out: BufId,
}

/// How a mat-mul's activations are rounded first: as the CPU rounds them for the weight's dot type
/// (`GgmlType::vec_dot_type`), so that the GPU multiplies the same numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActRounding {
    /// F32 weights: activations as they are.
    None,
    /// F16 weights: each value rounded to f16, kept as f32 (quant.wgsl's mat-mul).
    F16,
    /// BF16 weights: each value rounded to bf16, kept as f32 (quant.wgsl's mat-mul).
    BF16,
    /// The quantized types: 8-bit codes and a scale per block (matmul_q8.wgsl).
    Q8 { define: &'static str },
}

impl ActRounding {
    pub(crate) fn of(ty: GgmlType) -> Self {
        match ty.vec_dot_type() {
            GgmlType::Q8_0 => ActRounding::Q8 { define: "Q8_0" },
            GgmlType::Q8_1 => ActRounding::Q8 { define: "Q8_1" },
            GgmlType::Q8_K => ActRounding::Q8 { define: "Q8_K" },
            GgmlType::F16 => ActRounding::F16,
            GgmlType::BF16 => ActRounding::BF16,
            _ => ActRounding::None,
        }
    }
}

/// Whether the kernels can run `op` with these weights (`Backend::supports`): its matrices are of a
/// type `shaders/quant.wgsl` decodes, its vectors (norm weights, biases, offsets, RoPE factors)
/// F32 in one binding, and attention heads at most 512 wide. Shapes are `Graph::validate`'s.
pub(crate) fn supports(weights: &[GpuWeight], op: &Op) -> Result<(), String> {
    let weight = |id: &WeightId| weights.get(id.0 as usize).ok_or_else(|| format!("unknown weight {}", id.0));
    let matrix = |id: &WeightId, role: &str| -> Result<(), String> {
        let w = weight(id)?;
        match type_define(w.desc.ty) {
            Some(_) => Ok(()),
            None => Err(format!(
                "{role} of weight '{}' stored as {} (the WebGPU kernels decode {})",
                w.desc.name,
                w.desc.ty.name(),
                GgmlType::WEIGHT_TYPES.map(|t| t.name()).join(", ")
            )),
        }
    };
    let vectors = |ids: &[Option<WeightId>]| -> Result<(), String> {
        ids.iter().flatten().try_for_each(|id| weight(id)?.as_f32_vector().map(|_| ()).map_err(|e| e.to_string()))
    };
    match op {
        Op::Embed { table, .. } => matrix(table, "an embedding lookup"),
        Op::MatMul { w, bias, .. } => {
            matrix(w, "a mat-mul")?;
            vectors(&[*bias])
        }
        Op::RmsNorm { weight: w, .. } => vectors(&[*w]),
        Op::Rope { params, .. } => vectors(&[params.freq_factors]),
        Op::StoreKv { k_offset, v_offset, .. } => vectors(&[*k_offset, *v_offset]),
        Op::Attention { params, .. } => {
            attention_heads_fit(params)?;
            vectors(&[params.v_offset, params.sinks])
        }
        Op::Glu { activation, .. } => glu_define(*activation).map(|_| ()).map_err(|e| e.to_string()),
        Op::Add { .. } | Op::Scale { .. } | Op::LastRows { .. } | Op::Concat { .. } => Ok(()),
        Op::MatMulHeads { w, .. } => {
            matrix(w, "a per-head mat-mul")?;
            expert_bindings_supported(weight(w)?)
        }
        Op::RouteExperts { routing, .. } if routing.groups.is_some_and(|g| g.n_group > ROUTE_GROUPS) => {
            Err(format!("{:?} (route_experts scores at most {ROUTE_GROUPS} groups)", routing.groups))
        }
        Op::RouteExperts { routing, .. } => vectors(&[routing.selection_bias]),
        Op::CombineExperts { .. } => Ok(()),
        Op::MatMulExperts { w, bias, .. } => {
            matrix(w, "an expert mat-mul")?;
            vectors(&[*bias])?;
            let w = weight(w)?;
            if w.desc.n_experts() > MAX_ROUTED_EXPERTS {
                return Err(format!(
                    "expert weight '{}' of {} experts (the WebGPU router holds at most {MAX_ROUTED_EXPERTS})",
                    w.desc.name,
                    w.desc.n_experts()
                ));
            }
            expert_bindings_supported(w)
        }
    }
}

/// Whether attention.wgsl holds the heads: a thread owns up to 4 of a value head's 128-value
/// stripes (MAX_HEAD_DIM values), and a workgroup a query head in workgroup memory
/// (ATTENTION_GROUP_VALUES values: MLA's 576-value keys over 512-value latents fit).
fn attention_heads_fit(p: &hearth_core::graph::AttentionParams) -> Result<(), String> {
    if p.v_dim() > MAX_HEAD_DIM || p.head_dim > ATTENTION_GROUP_VALUES {
        return Err(format!(
            "attention heads of {} values, {} per value head (at most {ATTENTION_GROUP_VALUES} and {MAX_HEAD_DIM})",
            p.head_dim,
            p.v_dim()
        ));
    }
    Ok(())
}

/// Expert groups route_experts scores, a thread each (experts.wgsl ROUTE_WG).
pub(crate) const ROUTE_GROUPS: usize = 64;

/// Where an expert mat-mul's expert ids come from.
#[derive(Clone, Copy)]
enum ExpertIds {
    /// A router's output: [n_tokens, n_used] u32.
    Routed(BufId),
    /// Slot h of every token is head h (Op::MatMulHeads): ids the compiler writes once.
    Heads,
}

/// The shader define of a gated activation (elementwise.wgsl's and act_quant.wgsl's); the clamped
/// SwiGLU's constants are gpt-oss's, written in activation_fns.wgsl.
fn glu_define(activation: GluActivation) -> Result<&'static str, WgpuError> {
    match activation {
        GluActivation::Silu => Ok("SWIGLU"),
        GluActivation::GeluTanh => Ok("GEGLU"),
        clamped if clamped == GluActivation::GPT_OSS => Ok("SWIGLU_OAI"),
        GluActivation::ClampedSilu { .. } => {
            Err(WgpuError::Unsupported(format!("a clamped SwiGLU other than gpt-oss's ({activation:?})")))
        }
    }
}

/// The RoPE's YaRN parameters for the kernels: ext_factor 0 (and mscale 1) without YaRN.
fn rope_yarn_or_none(p: &hearth_core::graph::RopeParams) -> RopeYarn {
    p.yarn.unwrap_or(RopeYarn { ext_factor: 0.0, corr_low: 0.0, corr_high: 0.0, mscale: 1.0 })
}

/// Most bindings an expert weight's experts may take (matmul_q8.wgsl's W0, W1, W2).
const MAX_EXPERT_BINDINGS: usize = 3;

/// Whether the kernels bind expert weight `w`: whole experts in at most three bindings for the
/// quantized types, one for F32/F16/BF16 (quant.wgsl).
fn expert_bindings_supported(w: &GpuWeight) -> Result<(), String> {
    let limit = match ActRounding::of(w.desc.ty) {
        ActRounding::Q8 { .. } => MAX_EXPERT_BINDINGS,
        _ => 1,
    };
    match w.expert_bindings() {
        Some((bindings, _)) if bindings.len() <= limit => Ok(()),
        Some((bindings, _)) => Err(format!(
            "expert weight '{}' of {} bytes in {} storage bindings (the kernels bind at most {limit} for {})",
            w.desc.name,
            w.bytes(),
            bindings.len(),
            w.desc.ty.name()
        )),
        None => {
            Err(format!("expert weight '{}' of {} bytes: one expert exceeds a storage binding", w.desc.name, w.bytes()))
        }
    }
}

/// The widest attention head `shaders/attention.wgsl` holds in its workgroup memory.
pub(crate) const MAX_HEAD_DIM: usize = 512;

impl Builder<'_> {
    /// `[rows, cols]` of a buffer of the validated graph.
    fn shape(&self, b: BufId) -> (usize, usize) {
        let d = self.graph.desc(b);
        (d.rows, d.cols)
    }

    fn weight(&self, id: WeightId) -> Result<&GpuWeight, WgpuError> {
        self.weights.get(id.0 as usize).ok_or(WgpuError::UnknownId { what: "weight", id: id.0 })
    }

    /// A vector weight (its length checked by `Graph::validate`), which must be F32 in one chunk.
    fn vector(&self, id: WeightId) -> Result<wgpu::Buffer, WgpuError> {
        Ok(self.weight(id)?.as_f32_vector()?.clone())
    }

    fn buf(&self, b: BufId) -> Res {
        Res::Buf(self.bufs[b.0 as usize].clone())
    }

    fn push<P: KernelParams>(
        &mut self,
        key: PipelineKey,
        params: &P,
        mut entries: Vec<(u32, Res)>,
        groups: [u32; 3],
        kv_need: Option<KvNeed>,
    ) -> Result<(), WgpuError> {
        let params = self.gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(key.entry),
            contents: &uniform_bytes(params),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        self.kept.push(params.clone());
        entries.insert(0, (0, Res::Buf(params)));
        let (pipeline, bind_group) = match kv_need {
            Some(_) => (None, None),
            None => {
                let pipeline = self.pipelines.get(&self.gpu.device, &key)?;
                let group = make_bind_group(&self.gpu.device, &pipeline, &entries, None)?;
                (Some(pipeline), Some(group))
            }
        };
        let family = crate::profile::family(&key);
        // Weights are bound at binding 1 of embed and the mat-muls, and at 6 and 8 for sibling
        // segments; an embedding reads one row a token.
        let weight_bytes = match key.entry {
            "matmul" | "matmul_q8" => entries
                .iter()
                .filter_map(|(b, r)| match r {
                    Res::Buf(w) if [1, 6, 8].contains(b) => Some(w.size()),
                    _ => None,
                })
                .sum(),
            _ => 0,
        };
        self.dispatches.push(Dispatch { key, pipeline, entries, kv_need, bind_group, groups, family, weight_bytes });
        Ok(())
    }

    /// `x` ([rows, k]) rounded as `rounding` asks, in a scratch buffer: the one already made for
    /// this input if it still holds, else a new act_quant dispatch into the next slot, which runs
    /// `x`'s producer as its prologue when that op was left out for it (`Fusion::Prologue`).
    fn rounded_activation(&mut self, x: BufId, rounding: ActRounding, k: usize) -> Result<wgpu::Buffer, WgpuError> {
        if let Some(&(_, _, slot)) = self.rounded.iter().find(|(b, r, _)| *b == x && *r == rounding) {
            return Ok(self.act_scratch[slot].clone());
        }
        let scratch = self.reserve_rounding(x, rounding)?;
        let (rows, _) = self.shape(x);
        let mut defines = vec![match rounding {
            ActRounding::Q8 { define, .. } => define,
            ActRounding::BF16 => "BF16",
            ActRounding::F16 | ActRounding::None => "F16",
        }];
        let mut entries = vec![(2, Res::Buf(scratch.clone()))];
        let (mut eps, mut first_eps) = (0f32, 0f32);
        // 256-value chunks per workgroup: a sum written first needs its whole row in one.
        let mut chunks = 1;
        match self.producers.iter().find(|(out, _)| *out == x).map(|(_, op)| op.clone()) {
            Some(Op::RmsNorm { x: input, weight, eps: e, .. }) => {
                defines.push("NORM");
                if let Some(w) = weight {
                    defines.push("WEIGHT");
                    entries.push((4, Res::Buf(self.vector(w)?)));
                }
                eps = e;
                match self.pending_sums.iter().position(|p| p.out == input) {
                    Some(at) => {
                        let sum = self.pending_sums.remove(at);
                        let Op::RmsNorm { x: first_input, weight: first_weight, eps: e, .. } = sum.norm else {
                            return Err(WgpuError::Execution("a pending sum without its norm".into()));
                        };
                        defines.push("SUM");
                        entries.extend([(1, self.buf(first_input)), (5, self.buf(input))]);
                        if sum.residual != input {
                            defines.push("SUM_RESIDUAL");
                            entries.push((6, self.buf(sum.residual)));
                        }
                        if let Some(w) = first_weight {
                            defines.push("SUM_WEIGHT");
                            entries.push((7, Res::Buf(self.vector(w)?)));
                        }
                        first_eps = e;
                        chunks = k.div_ceil(256);
                    }
                    None => entries.push((1, self.buf(input))),
                }
            }
            Some(Op::Glu { activation, gate, up, .. }) => {
                defines.push(glu_define(activation)?);
                entries.extend([(1, self.buf(gate)), (3, self.buf(up))]);
            }
            _ => entries.push((1, self.buf(x))),
        }
        if rows > MAX_GROUPS as usize {
            return Err(WgpuError::Unsupported(format!("{rows} activation rows (at most {MAX_GROUPS})")));
        }
        // A workgroup per `chunks` × 256 values of a row; the scales follow the codes
        // (rows * k / 4 words).
        self.push(
            PipelineKey::new(ShaderFile::ActQuant, "act_quant", &defines),
            &ActQuantParams { k: k as u32, scales_at: (rows * k / 4) as u32, eps, chunks: chunks as u32, first_eps },
            entries,
            [k.div_ceil(256 * chunks) as u32, rows as u32, 1],
            None,
        )?;
        Ok(scratch)
    }

    /// The next scratch slot, to hold `x` rounded as `rounding` (by whoever writes it).
    fn reserve_rounding(&mut self, x: BufId, rounding: ActRounding) -> Result<wgpu::Buffer, WgpuError> {
        let slot = self.next_slot;
        self.next_slot = (slot + 1) % self.act_scratch.len().max(1);
        let scratch =
            self.act_scratch.get(slot).cloned().ok_or(WgpuError::Execution("no activation scratch".into()))?;
        self.rounded.retain(|&(_, _, s)| s != slot);
        self.rounded.push((x, rounding, slot));
        Ok(scratch)
    }

    /// One mat-mul, or sibling mat-muls on the same input (`Fusion::Siblings`) in one dispatch,
    /// with an Add folded into its epilogue (`Fusion::AddInEpilogue`).
    fn matmul(
        &mut self,
        first: MatMulPart,
        x: BufId,
        fusion: Fusion,
        siblings: [Option<MatMulPart>; 2],
    ) -> Result<(), WgpuError> {
        let wt = self.weight(first.w)?;
        let (k, n_out) = (wt.desc.row_len(), wt.desc.n_rows());
        let (rows, _) = self.shape(x);
        let row_bytes = wt.row_bytes as u32;
        let chunks: Vec<(u32, usize, wgpu::Buffer)> =
            wt.chunks.iter().map(|c| (c.row0 as u32, c.rows, c.buffer.clone())).collect();
        let rounding = ActRounding::of(wt.desc.ty);
        let x_used = match rounding {
            ActRounding::None => self.bufs[x.0 as usize].clone(),
            _ => self.rounded_activation(x, rounding, k)?,
        };
        // The siblings' weights (one chunk each, `fusion_plan` checked) and biases.
        let parts: Vec<MatMulPart> = std::iter::once(first).chain(siblings.into_iter().flatten()).collect();
        let types = parts.iter().map(|part| Ok(self.weight(part.w)?.desc.ty)).collect::<Result<Vec<_>, WgpuError>>()?;
        let (file, entry, rows_per_group, mut defines) = self.matmul_kernel(&types, rounding)?;
        let bias = match parts.as_slice() {
            [only] => only.bias.map(|b| self.vector(b)).transpose()?,
            _ if first.bias.is_some() => {
                let biases: Vec<WeightId> = parts.iter().flat_map(|part| part.bias).collect();
                Some(self.joined.get(self.gpu, self.weights, &biases, 0)?)
            }
            _ => None,
        };
        if bias.is_some() {
            defines.push("BIAS");
        }
        let tile = if rows == 1 {
            defines.push("DECODE");
            1
        } else {
            8
        };
        // The 8-bit activations' scales follow their codes (act_quant.wgsl).
        let scales_at = (rows * k / 4) as u32;
        // An Add folded into the epilogue writes its own output; an in-place one reads the
        // residual from there (a buffer cannot be bound both read-only and read-write).
        let (out, residual) = match fusion {
            Fusion::AddInEpilogue { residual, out: sum } if residual == sum => {
                defines.push("RESIDUAL_IN_PLACE");
                (sum, None)
            }
            Fusion::AddInEpilogue { residual, out: sum } => {
                defines.push("RESIDUAL");
                (sum, Some(residual))
            }
            _ => (first.out, None),
        };
        // Per further segment: its first workgroup, rows, row bytes and output width, then its
        // weight and output bindings.
        let mut segment_params = Vec::new();
        let mut segment_entries = Vec::new();
        let mut groups = n_out.div_ceil(rows_per_group);
        for (part, (w_binding, out_binding)) in parts.iter().skip(1).zip([(6, 7), (8, 9)]) {
            let w = self.weight(part.w)?;
            let [chunk] = w.chunks.as_slice() else {
                return Err(WgpuError::Execution(format!("sibling weight '{}' in several chunks", w.desc.name)));
            };
            segment_params.push([groups as u32, w.desc.n_rows() as u32, w.row_bytes as u32, w.desc.n_rows() as u32]);
            segment_entries.extend([(w_binding, Res::Buf(chunk.buffer.clone())), (out_binding, self.buf(part.out))]);
            groups += w.desc.n_rows().div_ceil(rows_per_group);
        }
        match parts.len() {
            1 => {}
            2 => defines.extend(["SEGMENTS", "WEIGHTS1"]),
            _ => defines.extend(["SEGMENTS", "WEIGHTS1", "SEGMENT3", "WEIGHTS2"]),
        }
        for (row0, chunk_rows, buffer) in chunks {
            let chunk_groups = if parts.len() > 1 { groups } else { chunk_rows.div_ceil(rows_per_group) };
            let (gx, gy) = fold(chunk_groups);
            let mut entries = vec![(1, Res::Buf(buffer)), (2, Res::Buf(x_used.clone())), (3, self.buf(out))];
            if let Some(b) = &bias {
                entries.push((4, Res::Buf(b.clone())));
            }
            if let Some(r) = residual {
                entries.push((5, self.buf(r)));
            }
            entries.extend(segment_entries.iter().map(|(b, r)| (*b, r.clone())));
            let segment = |s: usize| segment_params.get(s).copied().unwrap_or_default();
            let [seg1_first_group, seg1_rows, seg1_row_bytes, seg1_n] = segment(0);
            let [seg2_first_group, seg2_rows, seg2_row_bytes, seg2_n] = segment(1);
            let params = MatMulParams {
                row0,
                rows: chunk_rows as u32,
                row_len: k as u32,
                row_bytes,
                n: n_out as u32,
                n_tokens: rows as u32,
                groups_x: gx,
                scales_at,
                seg1_first_group,
                seg1_rows,
                seg1_row_bytes,
                seg1_n,
                seg2_first_group,
                seg2_rows,
                seg2_row_bytes,
                seg2_n,
                ..MatMulParams::default()
            };
            self.push(
                PipelineKey::new(file, entry, &defines),
                &params,
                entries,
                [gx, gy, rows.div_ceil(tile) as u32],
                None,
            )?;
        }
        Ok(())
    }

    /// A heads chain (`HeadsChain`) in one dispatch: a workgroup per (token, head) of the
    /// queries, keys and values.
    fn heads(&mut self, chain: &HeadsChain) -> Result<(), WgpuError> {
        let n = self.graph.n_tokens;
        let p = &chain.rope;
        let hd = p.head_dim;
        let heads = |b: BufId| self.shape(b).1 / hd;
        let (n_q, n_k, n_v) = (heads(chain.q), heads(chain.k), heads(chain.v));
        let constants =
            chain.constants(self.graph, self.weights).ok_or(WgpuError::Execution("heads chain constants".into()))?;
        let c = self.joined.get(self.gpu, self.weights, &constants.parts, (HEAD_CONSTANTS * 4) as u64)?;
        let (gx, gy) = fold(n * (n_q + n_k + n_v));
        let mut defines = vec!["HEADS", "SECOND"];
        if p.mode == RopeMode::Neox {
            defines.push("NEOX");
        }
        for (present, define) in [(chain.q_norm, "Q_NORM"), (chain.k_norm, "K_NORM"), (p.freq_factors, "FREQ_FACTORS")]
        {
            if present.is_some() {
                defines.push(define);
            }
        }
        let entries = vec![
            (1, Res::Buf(self.step.clone())),
            (2, Res::Tables),
            (3, self.buf(chain.k)),
            (4, Res::KvK(chain.layer)),
            (6, self.buf(chain.v)),
            (7, Res::KvV(chain.layer)),
            (9, self.buf(chain.q)),
            (10, Res::Buf(c)),
        ];
        let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
        let yarn = rope_yarn_or_none(p);
        let params = HeadsParams {
            n_tokens: n as u32,
            n_q_heads: n_q as u32,
            n_k_heads: n_k as u32,
            n_v_heads: n_v as u32,
            head_dim: hd as u32,
            n_rot: p.n_rot as u32,
            theta_scale,
            freq_scale: p.freq_scale,
            yarn_ext: yarn.ext_factor,
            yarn_low: yarn.corr_low,
            yarn_high: yarn.corr_high,
            mscale: yarn.mscale,
            layer: chain.layer as u32,
            groups_x: gx,
            eps: chain.eps,
            q_scale: chain.q_scale,
            k_scale: chain.k_scale,
            q_norm_at: constants.q_norm,
            k_norm_at: constants.k_norm,
            freq_factors_at: constants.freq_factors,
            k_offset_at: constants.k_offset,
            v_offset_at: constants.v_offset,
        };
        let need = KvNeed {
            layer: chain.layer,
            k_width: Some(n_k * hd),
            v_width: Some(n_v * hd),
            values: Some(ValueRows::Stored),
            window: None,
            offsets: chain.k_offset.is_some() || chain.v_offset.is_some(),
        };
        self.push(
            PipelineKey::new(ShaderFile::KvStore, "prepare_heads", &defines),
            &params,
            entries,
            [gx, gy, 1],
            Some(need),
        )
    }

    fn elementwise(
        &mut self,
        entry: &'static str,
        define: &'static str,
        a: BufId,
        b: Option<BufId>,
        out: BufId,
        factor: f32,
    ) -> Result<(), WgpuError> {
        let (rows, cols) = self.shape(out);
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
        let params = ElementwiseParams { len: len as u32, groups_x: gx, factor, ..ElementwiseParams::default() };
        self.push(PipelineKey::new(ShaderFile::Elementwise, entry, &defines), &params, entries, [gx, gy, 1], None)
    }

    /// The dispatches of `op`, with what `fusion_plan` folded into it (an Add into a mat-mul's
    /// epilogue, the next RoPE into this one).
    fn op(&mut self, op: &Op, fusion: Fusion) -> Result<(), WgpuError> {
        let n = self.graph.n_tokens;
        match op {
            Op::Embed { table, out } => {
                let w = self.weight(*table)?;
                let ty = type_define(w.desc.ty)
                    .ok_or_else(|| WgpuError::Unsupported(format!("embedding type {}", w.desc.ty.name())))?;
                let row_len = w.desc.row_len();
                let row_bytes = w.row_bytes as u32;
                let chunks: Vec<(u32, u32, wgpu::Buffer)> =
                    w.chunks.iter().map(|c| (c.row0 as u32, c.rows as u32, c.buffer.clone())).collect();
                for (row0, rows, buffer) in chunks {
                    let entries = vec![(1, Res::Buf(buffer)), (2, Res::Buf(self.step.clone())), (3, self.buf(*out))];
                    let params = EmbedParams { row0, rows, row_len: row_len as u32, row_bytes };
                    self.push(
                        PipelineKey::new(ShaderFile::Quant, "embed", &["EMBED", ty]),
                        &params,
                        entries,
                        [row_len.div_ceil(64) as u32, n as u32, 1],
                        None,
                    )?;
                }
            }
            Op::RmsNorm { x, weight, eps, group, out } => {
                let (rows, cols) = self.shape(*x);
                let n_groups = rows * cols / group;
                let (gx, gy) = fold(n_groups);
                let mut defines = self.gpu.info.defines();
                let mut entries = vec![];
                // An Add folded in writes the sum to its own output.
                let (out, residual) = match fusion {
                    Fusion::AddInEpilogue { residual, out: sum } => (sum, Some(residual)),
                    _ => (*out, None),
                };
                if *x == out {
                    defines.push("INPLACE");
                } else {
                    entries.push((1, self.buf(*x)));
                }
                if let Some(w) = weight {
                    defines.push("WEIGHT");
                    entries.push((2, Res::Buf(self.vector(*w)?)));
                }
                entries.push((3, self.buf(out)));
                match residual {
                    Some(r) if r == out => defines.push("RESIDUAL_IN_PLACE"),
                    Some(r) => {
                        defines.push("RESIDUAL");
                        entries.push((4, self.buf(r)));
                    }
                    None => {}
                }
                let params = NormParams { n_groups: n_groups as u32, groups_x: gx, group: *group as u32, eps: *eps };
                self.push(
                    PipelineKey::new(ShaderFile::Norm, "rms_norm", &defines),
                    &params,
                    entries,
                    [gx, gy, 1],
                    None,
                )?;
            }
            Op::MatMul { w, x, bias, out } => {
                let siblings = match fusion {
                    Fusion::Siblings { others } => others,
                    _ => [None; 2],
                };
                self.matmul(MatMulPart { w: *w, bias: *bias, out: *out }, *x, fusion, siblings)?;
            }
            Op::Rope { x, params: p } => {
                let (rows, cols) = self.shape(*x);
                if p.n_rot == 0 {
                    return Ok(());
                }
                let n_heads = cols / p.head_dim;
                // The second buffer rotated in this dispatch (k after q), if any.
                let second = match fusion {
                    Fusion::RopeWithNext { other } => Some((other, self.shape(other).1)),
                    _ => None,
                };
                let heads2 = second.map_or(0, |(_, cols2)| cols2 / p.head_dim);
                let total = rows * (n_heads + heads2) * (p.n_rot / 2);
                let (gx, gy) = fold(total.div_ceil(64));
                let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
                let yarn = rope_yarn_or_none(p);
                let mut defines = vec![];
                if p.mode == RopeMode::Neox {
                    defines.push("NEOX");
                }
                let mut entries = vec![(1, Res::Buf(self.step.clone()))];
                if let Some(f) = p.freq_factors {
                    defines.push("FREQ_FACTORS");
                    entries.push((2, Res::Buf(self.vector(f)?)));
                }
                entries.push((3, self.buf(*x)));
                if let Some((b, _)) = second {
                    defines.push("SECOND");
                    entries.push((4, self.buf(b)));
                }
                let params = RopeParams {
                    n_tokens: rows as u32,
                    n_heads: n_heads as u32,
                    head_dim: p.head_dim as u32,
                    n_rot: p.n_rot as u32,
                    theta_scale,
                    freq_scale: p.freq_scale,
                    yarn_ext: yarn.ext_factor,
                    yarn_low: yarn.corr_low,
                    yarn_high: yarn.corr_high,
                    mscale: yarn.mscale,
                    cols: cols as u32,
                    groups_x: gx,
                    n_heads2: heads2 as u32,
                    cols2: second.map_or(0, |(_, cols2)| cols2 as u32),
                };
                self.push(PipelineKey::new(ShaderFile::Rope, "rope", &defines), &params, entries, [gx, gy, 1], None)?;
            }
            Op::StoreKv { layer, k, v, k_offset, v_offset } => {
                // Keys and values in one dispatch (kv_store.wgsl SECOND), both or neither with an
                // offset, as the offset define covers both.
                // Without values (they are the start of the keys), the keys alone.
                let parts: Vec<Vec<(BufId, bool, Option<WeightId>)>> = match v {
                    Some(v) if k_offset.is_some() == v_offset.is_some() => {
                        vec![vec![(*k, true, *k_offset), (*v, false, *v_offset)]]
                    }
                    Some(v) => vec![vec![(*k, true, *k_offset)], vec![(*v, false, *v_offset)]],
                    None => vec![vec![(*k, true, *k_offset)]],
                };
                let values = if v.is_some() { ValueRows::Stored } else { ValueRows::KeyPrefix };
                for part in parts {
                    let mut units = 0;
                    let mut widths = Vec::new();
                    let mut entries = vec![(1, Res::Buf(self.step.clone())), (2, Res::Tables)];
                    let offsets = part.iter().any(|(_, _, offset)| offset.is_some());
                    let mut need = KvNeed {
                        layer: *layer,
                        k_width: None,
                        v_width: None,
                        values: Some(values),
                        window: None,
                        offsets,
                    };
                    for (i, &(src, is_k, offset)) in part.iter().enumerate() {
                        let (rows, cols) = self.shape(src);
                        // One invocation per stored unit (1, 2 or 32 values, by storage type): sized
                        // for the smallest, extra invocations return at once.
                        units += rows * cols;
                        widths.push(cols as u32);
                        let cache = if is_k { Res::KvK(*layer) } else { Res::KvV(*layer) };
                        let at = 3 * i as u32;
                        entries.extend([(3 + at, self.buf(src)), (4 + at, cache)]);
                        if let Some(o) = offset {
                            entries.push((5 + at, Res::KvOffset(self.vector(o)?)));
                        }
                        if is_k {
                            need.k_width = Some(cols);
                        } else {
                            need.v_width = Some(cols);
                        }
                    }
                    let (gx, gy) = fold(units.div_ceil(256));
                    let defines: &[&str] = if widths.len() == 2 { &["SECOND"] } else { &[] };
                    let params = StoreKvParams {
                        n_tokens: n as u32,
                        width: widths[0],
                        groups_x: gx,
                        layer: *layer as u32,
                        width2: widths.get(1).copied().unwrap_or(0),
                    };
                    self.push(
                        PipelineKey::new(ShaderFile::KvStore, "store_kv", defines),
                        &params,
                        entries,
                        [gx, gy, 1],
                        Some(need),
                    )?;
                }
            }
            Op::Attention { q, params: p, out } => {
                let (rows, _) = self.shape(*q);
                attention_heads_fit(p).map_err(WgpuError::Unsupported)?;
                // A workgroup per split where the step is short enough for the splits to be
                // what fills the device, then a reduce; else one per head looping over them and
                // merging them itself (attention.wgsl MERGED).
                let merged = rows > GRID_SPLIT_TOKENS;
                let grid_splits = if merged { 1 } else { attention_max_splits(self.gpu.info.gpu_shapes) };
                let group = attention_group(p.n_head, p.n_head_kv, p.head_dim);
                let (gx, gy) = fold(rows * (p.n_head / group) * grid_splits);
                let kv_width = p.n_head_kv * p.head_dim;
                let v_width = p.n_head_kv * p.v_dim();
                // Values at the start of the key rows are read from the key rows (bound twice,
                // read-only both times), addressed with the keys' row width.
                let (values, v_row_width) = match p.values {
                    ValueRows::Stored => (Res::KvV(p.layer), v_width),
                    ValueRows::KeyPrefix => (Res::KvK(p.layer), kv_width),
                };
                let mut entries = vec![
                    (1, Res::Buf(self.step.clone())),
                    (2, Res::Tables),
                    (3, self.buf(*q)),
                    (4, Res::KvK(p.layer)),
                    (5, values),
                ];
                let mut defines = self.gpu.info.defines();
                let partials = if merged {
                    defines.push("MERGED");
                    entries.push((6, self.buf(*out)));
                    if let Some(o) = p.v_offset {
                        entries.push((7, Res::KvOffset(self.vector(o)?)));
                    }
                    if let Some(sinks) = p.sinks {
                        defines.push("SINKS");
                        entries.push((8, Res::Buf(self.vector(sinks)?)));
                    }
                    None
                } else {
                    let partials =
                        self.attention_partials.clone().ok_or(WgpuError::Execution("no attention partials".into()))?;
                    entries.push((6, Res::Buf(partials.clone())));
                    Some(partials)
                };
                let mut params = AttentionParams {
                    n_tokens: rows as u32,
                    n_head: p.n_head as u32,
                    n_head_kv: p.n_head_kv as u32,
                    head_dim: p.head_dim as u32,
                    scale: p.scale,
                    window: p.window.unwrap_or(0) as u32,
                    softcap: p.softcap.unwrap_or(0.0),
                    groups_x: gx,
                    layer: p.layer as u32,
                    grid_splits: grid_splits as u32,
                    group: group as u32,
                    scales_at: 0,
                    v_head_dim: p.v_dim() as u32,
                    v_row_width: v_row_width as u32,
                };
                let need = KvNeed {
                    layer: p.layer,
                    k_width: Some(kv_width),
                    v_width: Some(v_width),
                    values: Some(p.values),
                    window: Some(p.window),
                    offsets: merged && p.v_offset.is_some(),
                };
                self.push(
                    PipelineKey::new(ShaderFile::Attention, "attention", &defines),
                    &params,
                    entries,
                    [gx, gy, 1],
                    Some(need),
                )?;
                let Some(partials) = partials else { return Ok(()) };
                // The splits merged, a workgroup per token, into the output or, for the mat-muls
                // that read it, straight into its 8-bit rounding (act_quant.wgsl's layout: the
                // scales after the codes).
                let (gx, gy) = fold(rows);
                params.groups_x = gx;
                // The device's defines too: the reduce plans the splits as attention does.
                let mut defines = self.gpu.info.defines();
                defines.push("REDUCE");
                let mut entries = vec![(1, Res::Buf(self.step.clone())), (6, Res::Buf(partials))];
                match fusion {
                    Fusion::RoundsOutput { rounding: rounding @ ActRounding::Q8 { define } } => {
                        let scratch = self.reserve_rounding(*out, rounding)?;
                        defines.push(match define {
                            "Q8_K" => "ROUND_Q8_K",
                            "Q8_1" => "ROUND_Q8_1",
                            _ => "ROUND_Q8_0",
                        });
                        entries.push((4, Res::Buf(scratch)));
                        params.scales_at = (rows * p.n_head * p.v_dim() / 4) as u32;
                    }
                    _ => entries.push((3, self.buf(*out))),
                }
                if let Some(o) = p.v_offset {
                    entries.push((7, Res::KvOffset(self.vector(o)?)));
                }
                if let Some(sinks) = p.sinks {
                    defines.push("SINKS");
                    entries.push((8, Res::Buf(self.vector(sinks)?)));
                }
                let need = KvNeed {
                    layer: p.layer,
                    k_width: None,
                    v_width: None,
                    values: None,
                    window: None,
                    offsets: p.v_offset.is_some(),
                };
                self.push(
                    PipelineKey::new(ShaderFile::Attention, "attention_reduce", &defines),
                    &params,
                    entries,
                    [gx, gy, 1],
                    Some(need),
                )?;
            }
            Op::Add { a, b, out } => self.elementwise("add", "ADD", *a, Some(*b), *out, 0.0)?,
            Op::Glu { activation, gate, up, out } => {
                self.elementwise(activation.name(), glu_define(*activation)?, *gate, Some(*up), *out, 0.0)?;
            }
            Op::Scale { x, factor } => {
                self.elementwise("scale", "SCALE", *x, None, *x, *factor)?;
            }
            Op::LastRows { x, out } => {
                let (_, cols) = self.shape(*x);
                let n_seqs = self.graph.n_seqs;
                let (gx, gy) = fold((n_seqs * cols).div_ceil(256));
                let entries = vec![(1, self.buf(*x)), (3, self.buf(*out)), (4, Res::Buf(self.step.clone()))];
                let params = ElementwiseParams {
                    len: (n_seqs * cols) as u32,
                    groups_x: gx,
                    cols: cols as u32,
                    ..ElementwiseParams::default()
                };
                self.push(
                    PipelineKey::new(ShaderFile::Elementwise, "last_rows", &["LAST_ROWS"]),
                    &params,
                    entries,
                    [gx, gy, 1],
                    None,
                )?;
            }
            Op::RouteExperts { logits, routing, ids, weights, tally } => {
                let (rows, n_expert) = self.shape(*logits);
                let mut defines = vec![
                    "ROUTE",
                    match routing.gating {
                        ExpertGating::Softmax => "SOFTMAX",
                        ExpertGating::Sigmoid => "SIGMOID",
                        ExpertGating::SoftmaxOfChosen => "SOFTMAX_OF_CHOSEN",
                    },
                ];
                if routing.normalize {
                    defines.push("NORMALIZE");
                }
                if n_expert > MAX_ROUTED_EXPERTS {
                    return Err(WgpuError::Unsupported(format!(
                        "a router of {n_expert} experts (route_experts holds at most {MAX_ROUTED_EXPERTS})"
                    )));
                }
                let (gx, gy) = fold(rows);
                let mut params = ExpertParams {
                    n_tokens: rows as u32,
                    n_expert: n_expert as u32,
                    n_used: routing.n_used as u32,
                    scale: routing.scale,
                    groups_x: gx,
                    ..ExpertParams::default()
                };
                let mut entries = vec![(1, self.buf(*logits)), (2, self.buf(*ids)), (3, self.buf(*weights))];
                if let (Some(router), Some(counters)) = (tally, self.tallies) {
                    defines.push("TALLY");
                    params.tally_base = counters.base(*router);
                    entries.push((4, Res::Buf(counters.buffer.clone())));
                }
                if let Some(bias) = routing.selection_bias {
                    defines.push("SELECTION_BIAS");
                    entries.push((5, Res::Buf(self.vector(bias)?)));
                }
                if let Some(groups) = routing.groups {
                    defines.push("GROUPS");
                    (params.n_group, params.n_group_used) = (groups.n_group as u32, groups.n_used as u32);
                }
                self.push(
                    PipelineKey::new(ShaderFile::Experts, "route_experts", &defines),
                    &params,
                    entries,
                    [gx, gy, 1],
                    None,
                )?;
            }
            Op::MatMulExperts { w, x, ids, bias, out } => {
                self.matmul_experts(*w, *x, ExpertIds::Routed(*ids), *bias, *out)?
            }
            Op::MatMulHeads { w, x, out } => self.matmul_experts(*w, *x, ExpertIds::Heads, None, *out)?,
            Op::Concat { a, b, groups, out } => {
                let (rows, cols) = self.shape(*out);
                let len = rows * cols;
                let (gx, gy) = fold(len.div_ceil(256));
                let params = ElementwiseParams {
                    len: len as u32,
                    groups_x: gx,
                    group_a: (self.shape(*a).1 / groups) as u32,
                    group_b: (self.shape(*b).1 / groups) as u32,
                    ..ElementwiseParams::default()
                };
                let entries = vec![(1, self.buf(*a)), (2, self.buf(*b)), (3, self.buf(*out))];
                self.push(
                    PipelineKey::new(ShaderFile::Elementwise, "concat", &["CONCAT", "BINARY"]),
                    &params,
                    entries,
                    [gx, gy, 1],
                    None,
                )?;
            }
            Op::CombineExperts { x, weights, out } => {
                let (rows, cols) = self.shape(*out);
                let (_, n_used) = self.shape(*weights);
                let (gx, gy) = fold((rows * cols).div_ceil(256));
                let params = ExpertParams {
                    n_tokens: rows as u32,
                    n_expert: 0,
                    n_used: n_used as u32,
                    scale: 1.0,
                    cols: cols as u32,
                    groups_x: gx,
                    ..ExpertParams::default()
                };
                let entries = vec![(4, self.buf(*x)), (5, self.buf(*weights)), (6, self.buf(*out))];
                self.push(
                    PipelineKey::new(ShaderFile::Experts, "combine_experts", &["COMBINE"]),
                    &params,
                    entries,
                    [gx, gy, 1],
                    None,
                )?;
            }
        }
        Ok(())
    }

    /// The kernel of a mat-mul with weights of `types` (sibling segments' in turn, all rounding
    /// their activations as `rounding`): its file, entry point, weight rows per workgroup
    /// (matmul_q8.wgsl: 4; quant.wgsl: one) and defines.
    fn matmul_kernel(
        &self,
        types: &[GgmlType],
        rounding: ActRounding,
    ) -> Result<(ShaderFile, &'static str, usize, Vec<&'static str>), WgpuError> {
        let unsupported = |ty: GgmlType| WgpuError::Unsupported(format!("mat-mul weight type {}", ty.name()));
        let mut defines = vec!["MATMUL"];
        let (file, entry, rows_per_group) = match rounding {
            ActRounding::Q8 { define } => {
                for (segment, &ty) in types.iter().enumerate() {
                    defines.push(segment_type_define(segment, ty).ok_or_else(|| unsupported(ty))?);
                }
                if define == "Q8_K" {
                    defines.push("SUPER_BLOCKS");
                }
                (ShaderFile::MatmulQ8, "matmul_q8", 4)
            }
            ActRounding::None | ActRounding::F16 | ActRounding::BF16 => {
                let &[ty] = types else {
                    return Err(WgpuError::Execution(format!("{} sibling mat-muls of f32 activations", types.len())));
                };
                defines.push(type_define(ty).ok_or_else(|| unsupported(ty))?);
                if ty == GgmlType::F16 && self.gpu.info.shader_f16 {
                    defines.push("F16_NATIVE");
                }
                (ShaderFile::Quant, "matmul", 1)
            }
        };
        defines.extend(self.gpu.info.defines());
        Ok((file, entry, rows_per_group, defines))
    }

    /// A mixture of experts' chosen experts' products: `out` [n_tokens, n_used * n] from `w`
    /// ([n_expert][n, k], every expert in one binding) and `x`, [n_tokens, k] read by every slot
    /// or [n_tokens, n_used * k] a slice per slot, one workgroup row per (token, slot) pair whose
    /// expert the kernel reads from `ids` (so the recorded step holds whatever the routing).
    fn matmul_experts(
        &mut self,
        w: WeightId,
        x: BufId,
        ids: ExpertIds,
        bias: Option<WeightId>,
        out: BufId,
    ) -> Result<(), WgpuError> {
        let wt = self.weight(w)?;
        let (k, n_out, n_expert) = (wt.desc.row_len(), wt.desc.n_rows(), wt.desc.n_experts());
        let (ty, row_bytes) = (wt.desc.ty, wt.row_bytes as u32);
        expert_bindings_supported(wt).map_err(WgpuError::Unsupported)?;
        let (bindings, experts_per_binding) =
            wt.expert_bindings().ok_or(WgpuError::Execution("expert bindings".into()))?;
        let bindings: Vec<wgpu::Buffer> = bindings.into_iter().cloned().collect();
        let (rows, x_cols) = self.shape(x);
        let n_used = match ids {
            ExpertIds::Routed(ids) => self.shape(ids).1,
            ExpertIds::Heads => n_expert,
        };
        let rounding = ActRounding::of(ty);
        let x_used = match rounding {
            ActRounding::None => self.bufs[x.0 as usize].clone(),
            _ => self.rounded_activation(x, rounding, x_cols)?,
        };
        let (file, entry, rows_per_group, mut defines) = self.matmul_kernel(&vec![ty; bindings.len()], rounding)?;
        defines.extend(["WEIGHTS1", "WEIGHTS2"].into_iter().take(bindings.len() - 1));
        let pairs = rows * n_used;
        // Longer steps multiply each expert's (or head's) pairs as tiles of one weight matrix.
        let grouped = matches!(rounding, ActRounding::Q8 { .. }) && rows >= GROUPED_EXPERTS_MIN_TOKENS;
        let grid_z = match ids {
            ExpertIds::Routed(_) if grouped => max_expert_tiles(pairs, n_expert),
            ExpertIds::Heads if grouped => n_expert * rows.div_ceil(EXPERT_TILE),
            _ => pairs,
        };
        if grid_z > MAX_GROUPS as usize {
            return Err(WgpuError::Unsupported(format!(
                "{pairs} (token, {}) pairs in a step ({grid_z} workgroups; at most {MAX_GROUPS})",
                match ids {
                    ExpertIds::Routed(_) => "expert",
                    ExpertIds::Heads => "head",
                }
            )));
        }
        let mut entries = vec![(2, Res::Buf(x_used)), (3, self.buf(out))];
        entries.extend([1, 6, 8].into_iter().zip(bindings.into_iter().map(Res::Buf)));
        match ids {
            ExpertIds::Routed(ids) if grouped => {
                let (order, tiles) = self.group_experts(ids, n_expert)?;
                defines.push("EXPERTS_GROUPED");
                entries.extend([(11, Res::Buf(order)), (12, Res::Buf(tiles))]);
            }
            ExpertIds::Routed(ids) => {
                defines.extend(["DECODE", "EXPERTS"]);
                entries.push((10, self.buf(ids)));
            }
            ExpertIds::Heads if grouped => {
                let (order, tiles) = self.head_groups(rows, n_expert);
                defines.push("EXPERTS_GROUPED");
                entries.extend([(11, Res::Buf(order)), (12, Res::Buf(tiles))]);
            }
            ExpertIds::Heads => {
                defines.extend(["DECODE", "EXPERTS"]);
                entries.push((10, Res::Buf(self.head_ids(pairs, n_expert))));
            }
        }
        if x_cols != k {
            defines.push("PER_SLOT");
        }
        if let Some(bias) = bias {
            defines.push("BIAS");
            entries.push((4, Res::Buf(self.vector(bias)?)));
        }
        let (gx, gy) = fold(n_out.div_ceil(rows_per_group));
        let params = MatMulParams {
            rows: n_out as u32,
            row_len: k as u32,
            row_bytes,
            n: n_out as u32,
            n_tokens: rows as u32,
            groups_x: gx,
            // The 8-bit activations' scales follow their codes (act_quant.wgsl).
            scales_at: (rows * x_cols / 4) as u32,
            n_used: n_used as u32,
            n_expert: n_expert as u32,
            experts_per_binding: experts_per_binding as u32,
            ..MatMulParams::default()
        };
        self.push(PipelineKey::new(file, entry, &defines), &params, entries, [gx, gy, grid_z as u32], None)
    }

    /// [pairs] u32 ids of head after head (pair i: head i % n_head): a buffer the graph keeps,
    /// written once here, for the heads' mat-muls (Op::MatMulHeads) read as experts.
    fn head_ids(&mut self, pairs: usize, n_head: usize) -> wgpu::Buffer {
        if let Some(buffer) = self.head_ids.get(&(pairs, n_head)) {
            return buffer.clone();
        }
        let ids: Vec<u32> = (0..pairs).map(|i| (i % n_head) as u32).collect();
        let buffer = self.gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("head ids"),
            contents: bytemuck::cast_slice(&ids),
            usage: wgpu::BufferUsages::STORAGE,
        });
        self.kept.push(buffer.clone());
        self.head_ids.insert((pairs, n_head), buffer.clone());
        buffer
    }

    /// The (token, head) pairs of `n_tokens` tokens grouped by head, as group_experts lays out
    /// an expert grouping (order: pair t * n_head + h at h * n_tokens + t; tiles: the count,
    /// then (head, first index in order, pairs) of at most EXPERT_TILE tokens each): written once
    /// here, as every token uses every head.
    fn head_groups(&mut self, n_tokens: usize, n_head: usize) -> (wgpu::Buffer, wgpu::Buffer) {
        if let Some(groups) = self.head_groups.get(&(n_tokens, n_head)) {
            return groups.clone();
        }
        let order: Vec<u32> = (0..n_head).flat_map(|h| (0..n_tokens).map(move |t| (t * n_head + h) as u32)).collect();
        let mut tiles = vec![0u32];
        for h in 0..n_head {
            for first in (0..n_tokens).step_by(EXPERT_TILE) {
                let pairs = EXPERT_TILE.min(n_tokens - first);
                tiles.extend([h as u32, (h * n_tokens + first) as u32, pairs as u32]);
            }
        }
        tiles[0] = ((tiles.len() - 1) / 3) as u32;
        let upload = |label: &str, words: &[u32]| {
            self.gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytemuck::cast_slice(words),
                usage: wgpu::BufferUsages::STORAGE,
            })
        };
        let groups = (upload("head order", &order), upload("head tiles", &tiles));
        self.kept.extend([groups.0.clone(), groups.1.clone()]);
        self.head_groups.insert((n_tokens, n_head), groups.clone());
        groups
    }

    /// The pairs of router output `ids` ([n_tokens, n_used] u32) grouped by expert: (order, tiles)
    /// as group_experts writes them, made by a dispatch the first time a product asks for them.
    fn group_experts(&mut self, ids: BufId, n_expert: usize) -> Result<(wgpu::Buffer, wgpu::Buffer), WgpuError> {
        if let Some(g) = self.expert_groups.as_ref().filter(|g| g.ids == Some(ids)) {
            return Ok((g.order.clone(), g.tiles.clone()));
        }
        let (rows, n_used) = self.shape(ids);
        let pairs = rows * n_used;
        if self.expert_groups.as_ref().is_none_or(|g| g.pairs < pairs) {
            let storage = |label: &str, words: usize| {
                self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size: (words.max(1) * 4) as u64,
                    usage: wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                })
            };
            let tiles_words = 1 + 3 * max_expert_tiles(pairs, MAX_ROUTED_EXPERTS);
            let made = ExpertGroups {
                order: storage("expert order", pairs),
                tiles: storage("expert tiles", tiles_words),
                pairs,
                ids: None,
            };
            // A smaller grouping made before stays alive with the graph (earlier dispatches use it).
            if let Some(old) = self.expert_groups.replace(made) {
                self.kept.extend([old.order, old.tiles]);
            }
        }
        let groups = self.expert_groups.as_mut().ok_or(WgpuError::Execution("expert groups".into()))?;
        groups.ids = Some(ids);
        let (order, tiles) = (groups.order.clone(), groups.tiles.clone());
        let params = ExpertParams {
            n_tokens: rows as u32,
            n_expert: n_expert as u32,
            n_used: n_used as u32,
            cols: EXPERT_TILE as u32,
            groups_x: 1,
            ..ExpertParams::default()
        };
        let entries = vec![(1, self.buf(ids)), (2, Res::Buf(order.clone())), (3, Res::Buf(tiles.clone()))];
        self.push(
            PipelineKey::new(ShaderFile::Experts, "group_experts", &["GROUP"]),
            &params,
            entries,
            [1, 1, 1],
            None,
        )?;
        Ok((order, tiles))
    }
}

/// Steps of at least this many tokens multiply their experts grouped by expert
/// (matmul_q8.wgsl EXPERTS_GROUPED): in smaller ones a step's pairs rarely share an expert.
pub(crate) const GROUPED_EXPERTS_MIN_TOKENS: usize = 16;
/// Pairs of a tile of the grouped expert mat-mul (matmul_q8.wgsl's TILE_T).
const EXPERT_TILE: usize = 8;

/// A step's (token, slot) pairs sorted by expert (`order`: [n_pairs] u32) and cut into tiles
/// (`tiles`: the count, then (expert, first, pairs) each), for the router output `ids` they were
/// made from (`None` once it is written again).
struct ExpertGroups {
    order: wgpu::Buffer,
    tiles: wgpu::Buffer,
    pairs: usize,
    ids: Option<BufId>,
}

/// The most tiles `pairs` pairs over `n_expert` experts make: each expert's pairs in tiles of
/// EXPERT_TILE, the last one of each partial.
fn max_expert_tiles(pairs: usize, n_expert: usize) -> usize {
    pairs.div_ceil(EXPERT_TILE) + n_expert.min(pairs)
}

/// The dispatches of a graph `Graph::validate` accepted.
pub(crate) fn compile(
    gpu: &Gpu,
    pipelines: &mut PipelineCache,
    weights: &[GpuWeight],
    joined: &mut JoinedVectors,
    tallies: Option<&TallyCounters>,
    graph: &Graph,
) -> Result<CompiledGraph, WgpuError> {
    let storage = |label: &str, bytes: usize, extra: wgpu::BufferUsages| {
        gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (bytes.max(4).div_ceil(4) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | extra,
            mapped_at_creation: false,
        })
    };
    let bufs: Vec<wgpu::Buffer> = graph
        .bufs
        .iter()
        .map(|b| storage(&b.name, b.bytes(), wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST))
        .collect();
    let step_len = 2 + 3 * graph.n_tokens + 3 * graph.n_seqs;
    let step = storage("step", step_len * 4, wgpu::BufferUsages::COPY_DST);
    let logits = graph.desc(graph.logits);
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
            Op::MatMul { x, .. } | Op::MatMulExperts { x, .. } | Op::MatMulHeads { x, .. } => {
                graph.bufs.get(x.0 as usize).map(|d| d.rows * d.cols)
            }
            _ => None,
        })
        .max();
    // [rows, k] f32 for an f16 rounding; 8-bit codes and their scales take less.
    let act_scratch: Vec<wgpu::Buffer> = scratch_len
        .map(|len| (0..2).map(|_| storage("activation scratch", len * 4, wgpu::BufferUsages::empty())).collect())
        .unwrap_or_default();
    let partials_len = graph
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Attention { q, params, .. } => graph
                .bufs
                .get(q.0 as usize)
                .filter(|d| d.rows <= GRID_SPLIT_TOKENS)
                .map(|d| d.rows * params.n_head * attention_max_splits(gpu.info.gpu_shapes) * (params.v_dim() + 2)),
            _ => None,
        })
        .max();
    let largest = gpu.info.max_storage_binding.min(gpu.info.max_buffer_size);
    if let Some(len) = partials_len.filter(|len| (len * 4) as u64 > largest) {
        return Err(WgpuError::Unsupported(format!(
            "attention partials of {} bytes for a {}-token step exceed the device's largest storage binding, {} bytes",
            len * 4,
            graph.n_tokens,
            largest
        )));
    }
    let attention_partials =
        partials_len.map(|len| storage("attention partials", len * 4, wgpu::BufferUsages::empty()));
    let mut b = Builder {
        gpu,
        pipelines,
        weights,
        joined,
        graph,
        tallies,
        bufs,
        step,
        act_scratch,
        rounded: Vec::new(),
        next_slot: 0,
        attention_partials,
        producers: Vec::new(),
        pending_sums: Vec::new(),
        dispatches: Vec::new(),
        expert_groups: None,
        kept: Vec::new(),
        head_ids: HashMap::new(),
        head_groups: HashMap::new(),
    };
    let mut embed_rows: Option<usize> = None;
    let plan = fusion_plan(graph, weights, gpu.info.gpu_shapes);
    for (i, (op, fusion)) in graph.ops.iter().zip(plan).enumerate() {
        if let Op::Embed { table, .. } = op {
            let rows = b.weight(*table)?.desc.n_rows();
            embed_rows = Some(embed_rows.map_or(rows, |r| r.min(rows)));
        }
        // A rounding (or a left-out producer) stands for its buffer only until it is written again.
        for written in op.outputs() {
            b.rounded.retain(|&(x, _, _)| x != written);
            b.producers.retain(|(out, _)| *out != written);
            if let Some(groups) = b.expert_groups.as_mut().filter(|g| g.ids == Some(written)) {
                groups.ids = None;
            }
        }
        match (fusion, op.outputs().first().copied()) {
            (Fusion::Prologue, Some(out)) => b.producers.push((out, op.clone())),
            (Fusion::SumBeforeRounding { residual, out }, _) => {
                b.pending_sums.push(PendingSum { norm: op.clone(), residual, out })
            }
            (Fusion::Heads { store }, _) => {
                let chain = graph.ops.get(i..=store).and_then(|ops| HeadsChain::of(graph, weights, ops));
                b.heads(&chain.ok_or(WgpuError::Execution("heads chain".into()))?)?;
            }
            (Fusion::Folded, _) => {}
            _ => b.op(op, fusion)?,
        }
    }
    if !b.pending_sums.is_empty() {
        return Err(WgpuError::Execution("a sum left to a rounding that never ran".into()));
    }
    Ok(CompiledGraph {
        graph: graph.clone(),
        bufs: b.bufs,
        step: b.step,
        staging,
        logits_len,
        timestamps: gpu.info.timestamps.then(|| crate::profile::StepTimestamps::new(gpu, b.dispatches.len() + 1)),
        timed: Vec::new(),
        dispatches: b.dispatches,
        kv_bindings: HashMap::new(),
        embed_rows,
        step_words: Vec::with_capacity(step_len),
        table_words: Vec::new(),
        top_k_plans: HashMap::new(),
        output_staging: graph
            .outputs
            .iter()
            .map(|&b| (b, crate::replay::staging_for(gpu, graph.desc(b).len())))
            .collect(),
        owned: b
            .act_scratch
            .into_iter()
            .chain(b.attention_partials)
            .chain(b.expert_groups.into_iter().flat_map(|g| [g.order, g.tiles]))
            .chain(b.kept)
            .collect(),
    })
}
