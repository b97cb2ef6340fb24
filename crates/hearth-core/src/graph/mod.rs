//! The computation a model asks of a backend, recorded once and replayed per step.
//!
//! A [`Graph`] is a flat list of [`Op`]s over activation buffers whose shapes and element types
//! ([`BufType`]: f32 values, or u32 ids such as a router's chosen experts) are fixed when the
//! graph is built (one graph per token-count, e.g. 1 for decode, the chunk size for prefill). What
//! changes between steps — the token ids and the position of the first token — is passed in
//! [`StepInput`], so a backend can compile the graph once (pipelines, bind groups, a CUDA graph) and
//! replay it every token. Buffers carry names ("normed", "logits") so an intermediate can be dumped
//! and compared with another backend or with llama.cpp; the decoder shares its buffers across
//! layers, so a tap shows the last layer's values. [`Graph::validate`] (validate.rs) is the one
//! shape check every backend runs before compiling.

mod validate;

use crate::backend::KvLayout;
use crate::error::{CoreError, Result};
use crate::kv::ValueRows;
use crate::quant::GgmlType;

/// A model weight uploaded to a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightId(pub u32);

/// An activation buffer of a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufId(pub u32);

/// Shape and type of an uploaded weight. `dims` in GGML order: `dims[0]` is the row length,
/// `dims[1]` the rows of one matrix, and the dims beyond the second (GGUF's outermost) stack
/// matrices: a MoE layer's experts (`blk.N.ffn_gate_exps.weight`: `[n_embd, n_ff, n_expert]`), or
/// MLA's per-head `attn_k_b`/`attn_v_b`. The experts lie one after another in the data, each
/// `[n_rows, row_len]`; a dense weight is one expert.
#[derive(Clone, Debug)]
pub struct WeightDesc {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
}

impl WeightDesc {
    /// Values of a row.
    pub fn row_len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1) as usize
    }

    /// Rows of one expert's matrix (1 for a vector).
    pub fn n_rows(&self) -> usize {
        self.dims.get(1).copied().unwrap_or(1) as usize
    }

    /// Matrices the weight stacks: the product of the dims beyond the second; 1 for a dense weight.
    pub fn n_experts(&self) -> usize {
        self.dims.iter().skip(2).product::<u64>() as usize
    }

    /// Bytes of a row of `ty`; an error when `row_len` is not a whole number of its blocks.
    pub fn row_bytes(&self) -> Result<usize> {
        self.ty.row_bytes(self.row_len())
    }

    /// Bytes of one expert's matrix.
    pub fn expert_bytes(&self) -> Result<usize> {
        self.row_bytes()?
            .checked_mul(self.n_rows())
            .ok_or_else(|| CoreError::InvalidArgument(format!("weight '{}' {:?} overflows", self.name, self.dims)))
    }

    /// Bytes of the whole weight, every expert.
    pub fn n_bytes(&self) -> Result<usize> {
        self.expert_bytes()?
            .checked_mul(self.n_experts())
            .ok_or_else(|| CoreError::InvalidArgument(format!("weight '{}' {:?} overflows", self.name, self.dims)))
    }

    /// Where expert `e`'s matrix lies in the weight's data (`WeightData` starts at 0).
    pub fn expert_range(&self, e: usize) -> Result<std::ops::Range<usize>> {
        if e >= self.n_experts() {
            return Err(CoreError::InvalidArgument(format!(
                "expert {e} of weight '{}', which has {}",
                self.name,
                self.n_experts()
            )));
        }
        let bytes = self.expert_bytes()?;
        Ok(e * bytes..(e + 1) * bytes)
    }

    /// Expert `e`'s matrix as a dense weight of its own (`name[e]`, dims `[row_len, n_rows]`), for
    /// a backend that stores the experts apart.
    pub fn expert(&self, e: usize) -> WeightDesc {
        let mut dims = self.dims.clone();
        dims.truncate(2);
        WeightDesc { name: format!("{}[{e}]", self.name), ty: self.ty, dims }
    }
}

/// The element type of an activation buffer. Activations are f32; integers that ops exchange
/// (a router's top-k expert ids, which MoE mat-muls read to pick their matrices) are u32, so that
/// they stay exact and no backend mistakes them for values. Every type is 4 bytes wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufType {
    F32,
    U32,
}

impl BufType {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            BufType::F32 | BufType::U32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BufType::F32 => "f32",
            BufType::U32 => "u32",
        }
    }
}

impl std::fmt::Display for BufType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A row-major activation buffer `[rows, cols]` of `dtype` elements.
#[derive(Clone, Debug)]
pub struct BufDesc {
    pub name: String,
    pub dtype: BufType,
    pub rows: usize,
    pub cols: usize,
}

impl BufDesc {
    /// Elements: rows * cols.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes a backend allocates for it.
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype.size()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeMode {
    /// Rotate adjacent pairs (2i, 2i+1): llama.
    Normal,
    /// Rotate (i, i + n_rot/2): qwen2, qwen3, gemma3 (GPT-NeoX style).
    Neox,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    pub mode: RopeMode,
    pub head_dim: usize,
    /// Leading dims of each head that are rotated (the rest pass through).
    pub n_rot: usize,
    pub freq_base: f32,
    /// Linear position scaling: theta = (pos * freq_scale) * base^(-2i/n_rot).
    pub freq_scale: f32,
    /// Optional per-dimension divisors (llama 3 `rope_freqs.weight`, n_rot/2 entries).
    pub freq_factors: Option<WeightId>,
    /// YaRN's blend of interpolated and extrapolated angles, for models trained with it.
    pub yarn: Option<RopeYarn>,
}

/// YaRN's angles (ggml's `rope_yarn`): pair i's angle blends the interpolated angle
/// (`freq_scale * theta`) and the extrapolated one (`theta`) by `mix_i = ramp_i * ext_factor`,
/// `ramp_i = 1 - clamp((i - corr_low) / max(0.001, corr_high - corr_low), 0, 1)`; its cos and sin
/// are multiplied by `mscale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeYarn {
    pub ext_factor: f32,
    pub corr_low: f32,
    pub corr_high: f32,
    pub mscale: f32,
}

/// A YaRN file's `rope.scaling.yarn_log_multiplier` as llama.cpp reads it: `mscale_all_dims`
/// (the file holds a tenth of it) divides the magnitude scale of `mscale`, which is 1 except for
/// deepseek2 files, where it is `mscale_all_dims` itself (DeepSeek-V2's configuration).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnLogMultiplier {
    pub mscale: f32,
    pub mscale_all_dims: f32,
}

impl RopeYarn {
    /// As llama.cpp sets YaRN up (llama-context.cpp, ggml's `ggml_rope_yarn_corr_dims`) for `n_rot`
    /// rotated values, a context of `n_ctx_orig` positions stretched `factor` times (> 1), the
    /// correction range of `beta_fast` and `beta_slow` rotations, the file's `attn_factor` and,
    /// when given, its `yarn_log_multiplier`.
    pub fn new(
        n_rot: usize,
        n_ctx_orig: usize,
        freq_base: f32,
        factor: f32,
        [beta_fast, beta_slow]: [f32; 2],
        attn_factor: f32,
        log_multiplier: Option<YarnLogMultiplier>,
    ) -> Self {
        let corr_dim = |rotations: f32| {
            n_rot as f32 * (n_ctx_orig as f32 / (rotations * 2.0 * std::f32::consts::PI)).ln() / (2.0 * freq_base.ln())
        };
        let corr_low = corr_dim(beta_fast).floor().max(0.0);
        let corr_high = corr_dim(beta_slow).ceil().min(n_rot as f32 - 1.0);
        let get_mscale = |mscale: f32| if factor <= 1.0 { 1.0 } else { 0.1 * mscale * factor.ln() + 1.0 };
        // llama.cpp's attention factor, then ggml's magnitude correction in rope_yarn (which the
        // first cancels but for the log multiplier's).
        let mut attn = match log_multiplier.filter(|m| m.mscale_all_dims != 0.0) {
            Some(m) => get_mscale(m.mscale) / get_mscale(m.mscale_all_dims),
            None => get_mscale(1.0),
        };
        attn *= 1.0 / (1.0 + 0.1 * factor.ln());
        attn *= attn_factor;
        let mscale = attn * (1.0 + 0.1 * (1.0 / (1.0 / factor)).ln());
        RopeYarn { ext_factor: 1.0, corr_low, corr_high, mscale }
    }

    /// The blend of pair `i`: 1 keeps the extrapolated angle, 0 the interpolated one.
    pub fn mix(&self, i: usize) -> f32 {
        let y = (i as f32 - self.corr_low) / (self.corr_high - self.corr_low).max(0.001);
        (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct AttentionParams {
    pub layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Values per query and key head.
    pub head_dim: usize,
    /// Values per value head (and output head) where they differ from `head_dim`: MLA attends
    /// with keys of [latent, rotated part] over values of the latent alone. See
    /// [`AttentionParams::v_dim`].
    pub v_head_dim: Option<usize>,
    /// Where the values are read: their own rows, or the start of the key rows (MLA's latent,
    /// with one KV head; then `v_offset` is None).
    pub values: ValueRows,
    /// Multiplies Q·K before the softmax.
    pub scale: f32,
    /// Sliding window: a query at position p sees keys at positions > p - window.
    pub window: Option<usize>,
    /// Attention sinks (gpt-oss): [n_head] f32 logits, one per query head, that join each
    /// softmax's denominator as a key with no value would: weights e^(s_j - m) / (Σ e^(s_i - m)
    /// + e^(sink - m)), m the largest of the scores and the sink.
    pub sinks: Option<WeightId>,
    /// tanh soft-capping of the scores (gemma 2 style), if any. Not shift-invariant: a layer
    /// with a softcap must not be given a key offset.
    pub softcap: Option<f32>,
    /// The `v_offset` of this layer's `Op::StoreKv`: a pool that subtracted it from the stored
    /// values adds it back to the output ([n_head_kv * head_dim], each query head reading its
    /// KV head's slice).
    pub v_offset: Option<WeightId>,
}

impl AttentionParams {
    /// Values per value head and per output head.
    pub fn v_dim(&self) -> usize {
        self.v_head_dim.unwrap_or(self.head_dim)
    }
}

/// How a router's probabilities come from its logits (llama.cpp's `expert_gating_func`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertGating {
    /// Softmax over all experts (Mixtral, Qwen MoE, OLMoE, DeepSeek-V2).
    Softmax,
    /// A sigmoid per expert (DeepSeek-V3, Kimi).
    Sigmoid,
    /// The logits themselves choose, and a softmax over the chosen ones weighs them (gpt-oss:
    /// llama.cpp's `SOFTMAX_WEIGHT`).
    SoftmaxOfChosen,
}

/// The gate's activation in a gated FFN: out = act(gate) * up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GluActivation {
    /// silu(g) · u (SwiGLU: llama, qwen, the experts of every MoE but gpt-oss).
    Silu,
    /// gelu_tanh(g) · u (GeGLU: gemma).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`): x = min(g, limit), y = clamp(u, ±limit),
    /// out = x · σ(alpha · x) · (y + 1).
    ClampedSilu { alpha: f32, limit: f32 },
}

impl GluActivation {
    /// gpt-oss's constants, as llama.cpp hard-codes them.
    pub const GPT_OSS: GluActivation = GluActivation::ClampedSilu { alpha: 1.702, limit: 7.0 };

    pub fn name(self) -> &'static str {
        match self {
            GluActivation::Silu => "swiglu",
            GluActivation::GeluTanh => "geglu",
            GluActivation::ClampedSilu { .. } => "swiglu_oai",
        }
    }
}

/// How a token's experts and their weights are chosen from the router's logits, as llama.cpp's
/// `build_moe_ffn` does: probabilities by `gating`; selection scores, the probabilities plus
/// `selection_bias` where given; with `groups`, the scores of the groups not chosen set to -∞;
/// the `n_used` experts of highest score (ties to the lower id), their probabilities (unbiased)
/// as weights, divided by their sum when `normalize` (floored at 6.1e-5, as llama.cpp does), then
/// multiplied by `scale`.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertRouting {
    pub n_used: usize,
    pub gating: ExpertGating,
    pub normalize: bool,
    pub scale: f32,
    /// [n_expert] f32 added to the probabilities to choose experts only (DeepSeek-V3's
    /// `exp_probs_b`).
    pub selection_bias: Option<WeightId>,
    pub groups: Option<ExpertGroups>,
}

impl ExpertRouting {
    /// `n_used` experts by `gating`, weights as they are: no bias, no groups.
    pub fn top(n_used: usize, gating: ExpertGating) -> Self {
        ExpertRouting { n_used, gating, normalize: false, scale: 1.0, selection_bias: None, groups: None }
    }
}

/// DeepSeek-V3's expert groups: the experts in `n_group` equal runs of ids; a group's score is
/// the sum of its two best selection scores; only the experts of the `n_used` best groups (ties
/// to the lower group) are chosen from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertGroups {
    pub n_group: usize,
    pub n_used: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// out[t] = dequant(table row tokens[t]). out: [n_tokens, n_embd].
    Embed { table: WeightId, out: BufId },
    /// Each `group` consecutive values of x are RMS-normalised, then multiplied by `weight`
    /// (length `group`) when given. x, out: [rows, cols], cols % group == 0; `out` may be `x`.
    RmsNorm { x: BufId, weight: Option<WeightId>, eps: f32, group: usize, out: BufId },
    /// out = x · Wᵀ (+ bias). x: [rows, k], W: [n, k] (GGML dims [k, n]), out: [rows, n].
    MatMul { w: WeightId, x: BufId, bias: Option<WeightId>, out: BufId },
    /// In-place rotary embedding of every head of x: [n_tokens, n_heads * head_dim], token t at
    /// position `pos0 + t`.
    Rope { x: BufId, params: RopeParams },
    /// Writes k, v: [n_tokens, n_head_kv * head_dim] into the KV cache of `layer`: each
    /// sequence's tokens at its positions pos0.., through its block table. `k_offset`
    /// ([n_head_kv * head_dim] f32), when given, may be subtracted from every key before a lossy
    /// (quantized) store: it shifts all the scores of a query by the same q·k_offset, which the
    /// softmax ignores, so attention is unchanged in exact arithmetic while the stored values
    /// shrink (Qwen2's keys carry a large constant from their bias). `v_offset` (same shape) may
    /// likewise be subtracted from every value; attention adds it back (its weights sum to 1),
    /// so it must be the layer's [`AttentionParams::v_offset`]. Exact types (f32, f16) store k
    /// and v as they are and ignore both.
    /// `v` is None where the pool's values are the start of its key rows
    /// ([`ValueRows::KeyPrefix`]): storing k stores them.
    StoreKv { layer: usize, k: BufId, v: Option<BufId>, k_offset: Option<WeightId>, v_offset: Option<WeightId> },
    /// Causal attention of q: [n_tokens, n_head * head_dim] over the cache of `params.layer`:
    /// a token at position p of a sequence sees that sequence's positions 0..=p (limited by the
    /// window). out: [n_tokens, n_head * v_dim].
    Attention { q: BufId, params: AttentionParams, out: BufId },
    /// out = a + b, all [rows, cols]; `out` may be `a` (the residual stream is updated in place).
    Add { a: BufId, b: BufId, out: BufId },
    /// x *= factor, in place.
    Scale { x: BufId, factor: f32 },
    /// out = act(gate) * up as `activation` says; `out` may be `gate`. All [rows, cols].
    Glu { activation: GluActivation, gate: BufId, up: BufId, out: BufId },
    /// out: [n_seqs, cols], row s = x's row of the last token of sequence s — only those go
    /// through the output head.
    LastRows { x: BufId, out: BufId },
    /// A mixture-of-experts router: from logits [n_tokens, n_expert] (f32), each token's
    /// `routing.n_used` experts, most probable first, in ids [n_tokens, n_used] (u32), and their
    /// weights [n_tokens, n_used] (f32), as [`ExpertRouting`] says. With `tally`, the backend
    /// counts every pick as router `tally`'s (the model's layer) in its
    /// [`crate::backend::Backend::expert_tallies`]; a router whose picks are no load (a shared
    /// expert's gate) has none.
    RouteExperts { logits: BufId, routing: ExpertRouting, ids: BufId, weights: BufId, tally: Option<usize> },
    /// Each token's mat-mul with its chosen experts: out[t, s] = x[t, s] · W[ids[t, s]]ᵀ for the
    /// expert weight W: [n_expert][n, k] (GGML dims [k, n, n_expert]). ids: [n_tokens, n_used] (u32); x: [n_tokens, k] (every slot reads the
    /// token's row) or [n_tokens, n_used * k] (slot s reads its own k values); out:
    /// [n_tokens, n_used * n], slot after slot. `bias` ([n_expert][n] f32), when given, adds each
    /// slot's expert's row to its output.
    MatMulExperts { w: WeightId, x: BufId, ids: BufId, bias: Option<WeightId>, out: BufId },
    /// Each head's own mat-mul: out[t, h] = x[t, h] · W[h]ᵀ for W: [n_head][n, k] (GGML dims
    /// [k, n, n_head]), x: [n_tokens, n_head * k], out: [n_tokens, n_head * n] (MLA's per-head
    /// projections into and out of the latent space).
    MatMulHeads { w: WeightId, x: BufId, out: BufId },
    /// Per token, `groups` pairs of slices side by side: out[t] = [a_0, b_0, a_1, b_1, ...] where
    /// a_g is the g-th of a[t]'s `groups` equal slices, b_g b[t]'s. a: [n_tokens, groups * ca],
    /// b: [n_tokens, groups * cb], out: [n_tokens, groups * (ca + cb)].
    Concat { a: BufId, b: BufId, groups: usize, out: BufId },
    /// out[t] = Σ_s weights[t, s] · x[t, s], summed slot after slot: the experts' outputs
    /// x: [n_tokens, n_used * cols] combined by their router weights [n_tokens, n_used] into
    /// out: [n_tokens, cols].
    CombineExperts { x: BufId, weights: BufId, out: BufId },
}

impl Op {
    /// Short name for errors, logs and per-op timings.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Embed { .. } => "embed",
            Op::RmsNorm { .. } => "rms_norm",
            Op::MatMul { .. } => "mat_mul",
            Op::Rope { .. } => "rope",
            Op::StoreKv { .. } => "store_kv",
            Op::Attention { .. } => "attention",
            Op::Add { .. } => "add",
            Op::Scale { .. } => "scale",
            Op::Glu { activation, .. } => activation.name(),
            Op::LastRows { .. } => "last_rows",
            Op::RouteExperts { .. } => "route_experts",
            Op::MatMulExperts { .. } => "mat_mul_experts",
            Op::CombineExperts { .. } => "combine_experts",
            Op::MatMulHeads { .. } => "mat_mul_heads",
            Op::Concat { .. } => "concat",
        }
    }

    /// The activation buffers the op reads (an in-place op's buffer is also its output).
    pub fn inputs(&self) -> Vec<BufId> {
        match self {
            Op::Embed { .. } => Vec::new(),
            Op::RmsNorm { x, .. }
            | Op::MatMul { x, .. }
            | Op::Rope { x, .. }
            | Op::Scale { x, .. }
            | Op::LastRows { x, .. }
            | Op::MatMulHeads { x, .. } => vec![*x],
            Op::Concat { a, b, .. } => vec![*a, *b],
            Op::StoreKv { k, v, .. } => std::iter::once(*k).chain(*v).collect(),
            Op::Attention { q, .. } => vec![*q],
            Op::Add { a, b, .. } => vec![*a, *b],
            Op::Glu { gate, up, .. } => vec![*gate, *up],
            Op::RouteExperts { logits, .. } => vec![*logits],
            Op::MatMulExperts { x, ids, .. } => vec![*x, *ids],
            Op::CombineExperts { x, weights, .. } => vec![*x, *weights],
        }
    }

    /// The activation buffers the op writes: none for an op that writes only the KV cache, two
    /// for a router (ids and weights).
    pub fn outputs(&self) -> Vec<BufId> {
        match self {
            Op::Embed { out, .. }
            | Op::RmsNorm { out, .. }
            | Op::MatMul { out, .. }
            | Op::Attention { out, .. }
            | Op::Add { out, .. }
            | Op::Glu { out, .. }
            | Op::LastRows { out, .. }
            | Op::MatMulExperts { out, .. }
            | Op::CombineExperts { out, .. }
            | Op::MatMulHeads { out, .. }
            | Op::Concat { out, .. } => vec![*out],
            Op::Rope { x, .. } | Op::Scale { x, .. } => vec![*x],
            Op::StoreKv { .. } => Vec::new(),
            Op::RouteExperts { ids, weights, .. } => vec![*ids, *weights],
        }
    }

    /// Whether the op writes `buf`.
    pub fn writes(&self, buf: BufId) -> bool {
        self.outputs().contains(&buf)
    }

    /// Calls `buf` on every buffer id and `weight` on every weight id the op holds, each able to
    /// change it: to list them, or to renumber the op into another graph and another backend's
    /// weights (a step split across backends).
    pub fn visit_ids(&mut self, buf: &mut impl FnMut(&mut BufId), weight: &mut impl FnMut(&mut WeightId)) {
        match self {
            Op::Embed { table, out } => {
                weight(table);
                buf(out);
            }
            Op::RmsNorm { x, weight: w, out, .. } => {
                buf(x);
                w.iter_mut().for_each(&mut *weight);
                buf(out);
            }
            Op::MatMul { w, x, bias, out } => {
                weight(w);
                buf(x);
                bias.iter_mut().for_each(&mut *weight);
                buf(out);
            }
            Op::MatMulExperts { w, x, ids, bias, out } => {
                weight(w);
                buf(x);
                buf(ids);
                bias.iter_mut().for_each(&mut *weight);
                buf(out);
            }
            Op::Rope { x, params } => {
                buf(x);
                params.freq_factors.iter_mut().for_each(&mut *weight);
            }
            Op::StoreKv { k, v, k_offset, v_offset, .. } => {
                buf(k);
                v.iter_mut().for_each(&mut *buf);
                k_offset.iter_mut().chain(v_offset.iter_mut()).for_each(&mut *weight);
            }
            Op::Attention { q, params, out } => {
                buf(q);
                params.sinks.iter_mut().chain(params.v_offset.iter_mut()).for_each(&mut *weight);
                buf(out);
            }
            Op::Add { a, b, out } | Op::Concat { a, b, out, .. } => {
                buf(a);
                buf(b);
                buf(out);
            }
            Op::Scale { x, .. } => buf(x),
            Op::Glu { gate, up, out, .. } => {
                buf(gate);
                buf(up);
                buf(out);
            }
            Op::LastRows { x, out } => {
                buf(x);
                buf(out);
            }
            Op::RouteExperts { logits, routing, ids, weights, .. } => {
                buf(logits);
                routing.selection_bias.iter_mut().for_each(&mut *weight);
                buf(ids);
                buf(weights);
            }
            Op::MatMulHeads { w, x, out } => {
                weight(w);
                buf(x);
                buf(out);
            }
            Op::CombineExperts { x, weights, out } => {
                buf(x);
                buf(weights);
                buf(out);
            }
        }
    }

    /// The weights the op reads.
    pub fn weights(&self) -> Vec<WeightId> {
        let mut found = Vec::new();
        self.clone().visit_ids(&mut |_| {}, &mut |w| found.push(*w));
        found
    }
}

/// What a graph returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LogitsMode {
    /// Logits for the last token of each sequence only (generation).
    Last,
    /// Logits for every token (perplexity, teacher forcing, speculative verification).
    All,
}

#[derive(Clone, Debug)]
pub struct Graph {
    /// Tokens per step, over all sequences.
    pub n_tokens: usize,
    /// Sequences per step (a batch of decodes, or chunks of several prompts).
    pub n_seqs: usize,
    pub bufs: Vec<BufDesc>,
    pub ops: Vec<Op>,
    /// [n_out, n_vocab] where n_out is n_seqs (Last) or n_tokens (All).
    pub logits: BufId,
    /// Buffers read after a step besides the logits ([`crate::backend::Backend::read_output`]):
    /// a part of a step split across backends hands them to the next part. A backend writes them
    /// whole, as it does the logits, instead of folding them into the ops that read them.
    pub outputs: Vec<BufId>,
}

impl Graph {
    pub fn new(n_tokens: usize, n_seqs: usize) -> Self {
        Graph { n_tokens, n_seqs, bufs: Vec::new(), ops: Vec::new(), logits: BufId(u32::MAX), outputs: Vec::new() }
    }

    /// Whether `buf` is read after the step: the logits or one of [`Graph::outputs`].
    pub fn is_output(&self, buf: BufId) -> bool {
        buf == self.logits || self.outputs.contains(&buf)
    }

    /// A new f32 buffer `[rows, cols]`.
    pub fn buf(&mut self, name: impl Into<String>, rows: usize, cols: usize) -> BufId {
        self.typed_buf(name, BufType::F32, rows, cols)
    }

    /// A new buffer `[rows, cols]` of `dtype` elements.
    pub fn typed_buf(&mut self, name: impl Into<String>, dtype: BufType, rows: usize, cols: usize) -> BufId {
        self.bufs.push(BufDesc { name: name.into(), dtype, rows, cols });
        BufId(self.bufs.len() as u32 - 1)
    }

    pub fn desc(&self, b: BufId) -> &BufDesc {
        &self.bufs[b.0 as usize]
    }

    pub fn push(&mut self, op: Op) {
        self.ops.push(op);
    }
}

/// One sequence's part of a step: its tokens are the next `n_tokens` of [`StepInput::tokens`].
#[derive(Clone, Copy, Debug)]
pub struct SeqStep<'a> {
    pub n_tokens: usize,
    /// Position of the sequence's first token in this step.
    pub pos0: usize,
    /// Per KV block group: the block holding positions `i * block_size..` at index i; covers at
    /// least `pos0 + n_tokens` positions. `NO_BLOCK` for blocks a sliding window released.
    pub block_tables: &'a [Vec<u32>],
}

/// Per-step inputs: the only things that differ between replays of a graph.
#[derive(Clone, Copy, Debug)]
pub struct StepInput<'a> {
    /// [n_tokens] token ids, sequence after sequence.
    pub tokens: &'a [u32],
    pub seqs: &'a [SeqStep<'a>],
}

impl<'a> StepInput<'a> {
    /// Checks the input against a graph and the KV layout, so backends can index without panics:
    /// token and sequence counts, and every block a step reads or writes exists.
    pub fn validate(&self, graph: &Graph, layout: &KvLayout, n_vocab: usize) -> std::result::Result<(), String> {
        if self.tokens.len() != graph.n_tokens {
            return Err(format!("the graph takes {} tokens, the step has {}", graph.n_tokens, self.tokens.len()));
        }
        if self.seqs.len() != graph.n_seqs {
            return Err(format!("the graph takes {} sequences, the step has {}", graph.n_seqs, self.seqs.len()));
        }
        if self.seqs.iter().map(|s| s.n_tokens).sum::<usize>() != self.tokens.len()
            || self.seqs.iter().any(|s| s.n_tokens == 0)
        {
            return Err("every sequence needs at least one token, and their counts must add up to the step's".into());
        }
        if let Some(bad) = self.tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(format!("token id {bad} is outside the vocabulary of {n_vocab}"));
        }
        let bs = layout.block_size;
        for (i, s) in self.seqs.iter().enumerate() {
            if s.block_tables.len() != layout.groups.len() {
                return Err(format!(
                    "sequence {i} has {} block tables for {} KV groups",
                    s.block_tables.len(),
                    layout.groups.len()
                ));
            }
            let end = s.pos0 + s.n_tokens;
            for (g, (table, group)) in s.block_tables.iter().zip(&layout.groups).enumerate() {
                if table.len() * bs < end {
                    return Err(format!(
                        "sequence {i}: the block table of group {g} covers {} positions, the step needs {end}",
                        table.len() * bs
                    ));
                }
                // Blocks read: from the first position any query of the step sees.
                let lo = group.window.map_or(0, |w| (s.pos0 + 1).saturating_sub(w)) / bs;
                if let Some(b) = table[lo..end.div_ceil(bs)].iter().find(|&&b| b as usize >= group.n_blocks) {
                    return Err(format!(
                        "sequence {i}: block {b} of group {g} is not in the pool of {}",
                        group.n_blocks
                    ));
                }
            }
        }
        Ok(())
    }

    /// (sequence index, position) of every token, in order.
    pub fn token_positions(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.seqs.iter().enumerate().flat_map(|(i, s)| (0..s.n_tokens).map(move |t| (i, s.pos0 + t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expert_weight_is_a_stack_of_matrices_one_after_another() {
        // GGML [k = 64, n = 3, 5 experts] of Q8_0: 2 blocks of 34 bytes a row.
        let w = WeightDesc { name: "blk.0.ffn_up_exps.weight".into(), ty: GgmlType::Q8_0, dims: vec![64, 3, 5] };
        assert_eq!((w.row_len(), w.n_rows(), w.n_experts()), (64, 3, 5));
        assert_eq!((w.row_bytes().expect("row"), w.expert_bytes().expect("expert")), (68, 204));
        assert_eq!(w.n_bytes().expect("whole"), 1020);
        assert_eq!(w.expert_range(2).expect("expert 2"), 408..612);
        assert!(w.expert_range(5).is_err());
        let e = w.expert(4);
        assert_eq!(
            (e.name.as_str(), e.dims.as_slice(), e.n_experts()),
            ("blk.0.ffn_up_exps.weight[4]", &[64, 3][..], 1)
        );

        let dense = WeightDesc { name: "m".into(), ty: GgmlType::F32, dims: vec![8, 6] };
        assert_eq!((dense.n_rows(), dense.n_experts(), dense.n_bytes().expect("bytes")), (6, 1, 192));
        assert_eq!(dense.expert_range(0).expect("the one expert"), 0..192);
        let vector = WeightDesc { name: "v".into(), ty: GgmlType::F32, dims: vec![8] };
        assert_eq!((vector.row_len(), vector.n_rows(), vector.n_experts()), (8, 1, 1));
        // Several outer dims stack as many matrices as their product.
        let grid = WeightDesc { name: "g".into(), ty: GgmlType::F32, dims: vec![4, 2, 3, 2] };
        assert_eq!(grid.n_experts(), 6);
    }

    #[test]
    fn buffers_are_f32_unless_typed() {
        let mut g = Graph::new(2, 1);
        let x = g.buf("x", 2, 3);
        let ids = g.typed_buf("ids", BufType::U32, 2, 4);
        assert_eq!((g.desc(x).dtype, g.desc(ids).dtype), (BufType::F32, BufType::U32));
        assert_eq!((g.desc(x).bytes(), g.desc(ids).bytes()), (24, 32));
    }
}
