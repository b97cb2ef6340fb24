//! Model graphs. One decoder, written once against [`Graph`], covers llama (and Mixtral), qwen2,
//! qwen3, gemma3, qwen3moe, qwen2moe, olmoe, granite (dense and MoE), gpt-oss and deepseek2; the
//! architectures differ only in the switches of [`ModelConfig`] (biases, q/k norms, post-norms,
//! attention sinks, latent attention, activation, RoPE flavour, per-layer sliding windows, scale
//! factors, a mixture of experts in place of the dense FFN after some dense layers, its biases, a
//! shared expert). Backends never see the architecture, only the ops.

pub mod config;
pub mod weights;

pub use config::{Arch, LayerAttention, MlaConfig, ModelConfig, MoeConfig, QkNorm, SharedExpert, SharedExpertGate};
pub use weights::{
    AttentionWeights, DenseFfn, ExpertBiases, FfnWeights, HeadWeights, LatentWeights, LayerWeights, ModelWeights,
    SharedFfn,
};

use crate::backend::{Backend, KvLayout};
use crate::error::Result;
use crate::gguf::GgufFile;
pub use crate::graph::GluActivation;
use crate::graph::{
    AttentionParams, BufId, BufType, ExpertGating, ExpertRouting, Graph, LogitsMode, Op, RopeParams, WeightId,
};
use crate::kv::{KvGroup, KvType, ValueRows};

pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    pub parameters: ParameterCount,
}

/// A model's weights counted in values: all the file holds, and those one token's forward pass
/// reads (a mixture of experts reads `n_used` of its `n_expert` experts per layer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParameterCount {
    pub total: u64,
    pub active: u64,
}

impl ParameterCount {
    /// Counted from `file`'s tensors; expert stacks (`[k, n, n_expert]`) and their biases count
    /// `n_used` experts as active.
    pub fn of(file: &GgufFile, config: &ModelConfig) -> Self {
        let mut count = ParameterCount::default();
        for t in &file.tensors {
            let values = t.n_elements();
            count.total += values;
            count.active += match &config.moe {
                // Expert stacks and their biases (`[n, n_expert]`), by llama.cpp's "_exps" names.
                Some(moe) if t.name.contains("_exps.") && t.dims.last() == Some(&(moe.n_expert as u64)) => {
                    values / moe.n_expert as u64 * moe.routing.n_used as u64
                }
                _ => values,
            };
        }
        count
    }
}

impl std::fmt::Display for ParameterCount {
    /// "494M parameters", or "30.5B parameters, 3.3B active" for a mixture of experts.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let human = |n: u64| match n {
            n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
            n if n >= 1_000_000 => format!("{:.0}M", n as f64 / 1e6),
            n => format!("{:.0}K", n as f64 / 1e3),
        };
        write!(f, "{} parameters", human(self.total))?;
        if self.active != self.total {
            write!(f, ", {} active", human(self.active))?;
        }
        Ok(())
    }
}

impl Model {
    /// Reads the hyper-parameters and uploads the weights to `backend`; `logits_vocab` limits
    /// the output head to the first token ids (see [`ModelConfig::limit_logits`]).
    pub fn load(
        file: &GgufFile,
        backend: &mut dyn Backend,
        logits_vocab: Option<usize>,
        on_progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let mut config = ModelConfig::from_metadata(&file.metadata)?;
        config.limit_logits(logits_vocab)?;
        let weights = ModelWeights::upload(&config, file, backend, on_progress)?;
        let parameters = ParameterCount::of(file, &config);
        Ok(Model { config, weights, parameters })
    }

    /// Layers grouped by attention span: global layers in one KV block group, and the layers of
    /// each sliding-window size in another (their old blocks can be released). Block counts are
    /// left at 0 for the engine to size.
    pub fn kv_groups(&self) -> Vec<KvGroup> {
        let mut groups: Vec<KvGroup> = Vec::new();
        for (layer, la) in self.config.layers.iter().enumerate() {
            match groups.iter_mut().find(|g| g.window == la.window) {
                Some(g) => g.layers.push(layer),
                None => groups.push(KvGroup { layers: vec![layer], window: la.window, n_blocks: 0 }),
            }
        }
        groups
    }

    /// The KV layout with `groups` (sized by the engine), stored as `kv_type` in blocks of
    /// `block_size` positions.
    pub fn kv_layout(&self, kv_type: KvType, block_size: usize, groups: Vec<KvGroup>) -> KvLayout {
        let c = &self.config;
        let k_width = c.n_head_kv * c.head_dim;
        let v_width = c.mla.map_or(k_width, |mla| mla.kv_lora);
        KvLayout { n_layers: c.n_layer, k_width, v_width, values: self.value_rows(), kv_type, block_size, groups }
    }

    /// MLA's values are its latent, which starts its key rows (the latent, then the rotated
    /// key): the pool stores the key rows only, where the latent is whole 32-value blocks (as
    /// in every DeepSeek model; [`ValueRows::KeyPrefix`]).
    fn value_rows(&self) -> ValueRows {
        match self.config.mla {
            Some(mla) if ValueRows::key_prefix_fits(mla.kv_lora, self.config.head_dim) => ValueRows::KeyPrefix,
            _ => ValueRows::Stored,
        }
    }

    /// The forward pass for `n_tokens` tokens of `n_seqs` sequences (each sequence's tokens
    /// consecutive): per layer an attention block and an FFN block around the residual stream.
    /// Activation buffers are shared by all layers (the residual stream is updated in place), so
    /// memory does not grow with depth.
    pub fn build_graph(&self, n_tokens: usize, n_seqs: usize, logits: LogitsMode) -> Graph {
        let c = &self.config;
        let w = &self.weights;
        let n = n_tokens;
        let mut g = Graph::new(n, n_seqs);
        let b = Activations::new(&mut g, c, n);

        g.push(Op::Embed { table: w.token_embd, out: b.residual });
        if let Some(s) = c.embd_scale {
            g.push(Op::Scale { x: b.residual, factor: s });
        }
        for il in 0..w.layers.len() {
            self.attention_block(&mut g, &b, il);
            self.ffn_block(&mut g, &b, il);
        }

        let x = b.residual;
        let n_out = match logits {
            LogitsMode::Last => n_seqs,
            LogitsMode::All => n,
        };
        let last = if logits == LogitsMode::All || n_seqs == n {
            x
        } else {
            let last = g.buf("last_residual", n_seqs, c.n_embd); // [n_seqs, n_embd]
            g.push(Op::LastRows { x, out: last });
            last
        };
        let out_norm = g.buf("output_norm", n_out, c.n_embd); // [n_out, n_embd]
        g.push(Op::RmsNorm { x: last, weight: Some(w.output_norm), eps: c.rms_eps, group: c.n_embd, out: out_norm });
        let logits_buf = g.buf("logits", n_out, c.n_logits); // [n_out, n_logits]
        g.push(Op::MatMul { w: w.output, x: out_norm, bias: None, out: logits_buf });
        if let Some(factor) = c.logits_factor {
            g.push(Op::Scale { x: logits_buf, factor });
        }
        g.logits = logits_buf;
        g
    }

    /// Layer `il`'s self-attention, added to the residual stream: norm, Q/K/V projections (with
    /// biases and q/k norms where the architecture has them), RoPE, the KV store, paged attention
    /// over the sequence's cache, the output projection and its post-norm.
    fn attention_block(&self, g: &mut Graph, b: &Activations, il: usize) {
        let c = &self.config;
        let lw = &self.weights.layers[il];
        let (x, h) = (b.residual, b.normed);
        g.push(Op::RmsNorm { x, weight: Some(lw.attn_norm), eps: c.rms_eps, group: c.n_embd, out: h });
        match (&lw.attn, &b.latent) {
            (AttentionWeights::Heads(heads), _) => self.head_attention(g, b, il, heads),
            (AttentionWeights::Latent(latent), Some(lb)) => self.latent_attention(g, b, lb, il, latent),
            // Weights are uploaded as the config says: latent ones exactly when it has MLA.
            (AttentionWeights::Latent(_), None) => unreachable!("latent weights without an MLA config"),
        }
        g.push(Op::MatMul { w: lw.wo, x: b.attn, bias: lw.bo, out: b.proj });
        if let Some(pn) = lw.attn_post_norm {
            g.push(Op::RmsNorm { x: b.proj, weight: Some(pn), eps: c.rms_eps, group: c.n_embd, out: b.proj });
        }
        if let Some(factor) = c.residual_scale {
            g.push(Op::Scale { x: b.proj, factor });
        }
        g.push(Op::Add { a: x, b: b.proj, out: x });
    }

    /// The RoPE of layer `il` over heads of `head_dim` values.
    fn rope(&self, il: usize, head_dim: usize) -> RopeParams {
        let (c, la) = (&self.config, &self.config.layers[il]);
        RopeParams {
            mode: c.rope_mode,
            head_dim,
            n_rot: c.n_rot,
            freq_base: la.rope_base,
            freq_scale: la.rope_scale,
            freq_factors: self.weights.rope_freqs,
            yarn: la.rope_yarn,
        }
    }

    /// Attention through Q/K/V projections (normed h into b.attn): biases and q/k norms where the
    /// architecture has them, RoPE, the KV store and paged attention over the sequence's cache.
    fn head_attention(&self, g: &mut Graph, b: &Activations, il: usize, lw: &HeadWeights) {
        let c = &self.config;
        let la = c.layers[il];
        let (h, q, k, v) = (b.normed, b.q, b.k, b.v);
        g.push(Op::MatMul { w: lw.wq, x: h, bias: lw.bq, out: q });
        g.push(Op::MatMul { w: lw.wk, x: h, bias: lw.bk, out: k });
        g.push(Op::MatMul { w: lw.wv, x: h, bias: lw.bv, out: v });
        if let (Some(qn), Some(kn)) = (lw.q_norm, lw.k_norm) {
            let (q_group, k_group) = match c.qk_norm {
                QkNorm::WholeRow => (c.n_head * c.head_dim, c.n_head_kv * c.head_dim),
                QkNorm::PerHead | QkNorm::None => (c.head_dim, c.head_dim),
            };
            g.push(Op::RmsNorm { x: q, weight: Some(qn), eps: c.rms_eps, group: q_group, out: q });
            g.push(Op::RmsNorm { x: k, weight: Some(kn), eps: c.rms_eps, group: k_group, out: k });
        }
        let rope = self.rope(il, c.head_dim);
        g.push(Op::Rope { x: q, params: rope.clone() });
        g.push(Op::Rope { x: k, params: rope });
        if c.scale_queries {
            g.push(Op::Scale { x: q, factor: c.attn_scale });
        }
        // Quantized caches store keys and values minus the K and V biases (Qwen2's K bias
        // reaches ~150 where the rest of a key is ~1): exact, as the softmax ignores a shift
        // shared by all of a query's scores and its weights sum to 1 (softcap is None below).
        // After RoPE a key holds R_p·b_k rather than b_k, yet b_k everywhere measured closer
        // to the f32 cache than b_k on the slowly rotating pairs only (docs/BENCHMARKS.md).
        let (k_offset, v_offset) = (lw.bk, lw.bv);
        g.push(Op::StoreKv { layer: il, k, v: Some(v), k_offset, v_offset });
        let params = AttentionParams {
            layer: il,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            v_head_dim: None,
            values: ValueRows::Stored,
            scale: if c.scale_queries { 1.0 } else { c.attn_scale },
            window: la.window,
            softcap: None,
            v_offset,
            sinks: self.weights.layers[il].attn_sinks,
        };
        g.push(Op::Attention { q, params, out: b.attn });
    }

    /// DeepSeek's multi-head latent attention (normed h into b.attn), as llama.cpp's absorbed
    /// graph: each head's non-rotated query taken into the latent space (`k_b`) beside its
    /// rotated part; the token's normalised latent beside its rotated key as the one KV head's
    /// key, the latent alone (the start of that key, not stored again) as its value;
    /// multi-query attention in the latent space; each head's output out of it (`v_b`).
    fn latent_attention(&self, g: &mut Graph, b: &Activations, lb: &LatentActivations, il: usize, lw: &LatentWeights) {
        let c = &self.config;
        let eps = c.rms_eps;
        let h = match (lw.q_a, lb.q_compressed) {
            (Some((q_a, q_a_norm)), Some(q_in)) => {
                g.push(Op::MatMul { w: q_a, x: b.normed, bias: None, out: q_in });
                let group = g.desc(q_in).cols;
                g.push(Op::RmsNorm { x: q_in, weight: Some(q_a_norm), eps, group, out: q_in });
                q_in
            }
            _ => b.normed,
        };
        g.push(Op::MatMul { w: lw.q_nope, x: h, bias: None, out: lb.q_nope });
        g.push(Op::MatMul { w: lw.q_rope, x: h, bias: None, out: lb.q_rope });
        g.push(Op::MatMulHeads { w: lw.k_b, x: lb.q_nope, out: lb.q_latent });
        let rope = self.rope(il, c.n_rot);
        g.push(Op::Rope { x: lb.q_rope, params: rope.clone() });
        g.push(Op::Concat { a: lb.q_latent, b: lb.q_rope, groups: c.n_head, out: b.q });

        let latent = lb.latent;
        g.push(Op::MatMul { w: lw.latent, x: b.normed, bias: None, out: latent });
        let group = g.desc(latent).cols;
        g.push(Op::RmsNorm { x: latent, weight: Some(lw.latent_norm), eps, group, out: latent });
        g.push(Op::MatMul { w: lw.k_rope, x: b.normed, bias: None, out: lb.k_rope });
        g.push(Op::Rope { x: lb.k_rope, params: rope });
        g.push(Op::Concat { a: latent, b: lb.k_rope, groups: 1, out: b.k });
        let values = self.value_rows();
        let v = (values == ValueRows::Stored).then_some(latent);
        g.push(Op::StoreKv { layer: il, k: b.k, v, k_offset: None, v_offset: None });
        let params = AttentionParams {
            layer: il,
            n_head: c.n_head,
            n_head_kv: 1,
            head_dim: c.head_dim,
            v_head_dim: Some(group),
            values,
            scale: c.attn_scale,
            window: c.layers[il].window,
            softcap: None,
            v_offset: None,
            sinks: None,
        };
        g.push(Op::Attention { q: b.q, params, out: lb.out_latent });
        g.push(Op::MatMulHeads { w: lw.v_b, x: lb.out_latent, out: b.attn });
    }

    /// Layer `il`'s feed-forward network, added to the residual stream: norm, gate and up
    /// projections, the gated activation, the down projection and its post-norm. In a mixture
    /// of experts the router picks each token's experts first, the projections are theirs, and
    /// their outputs are summed by the router's weights.
    fn ffn_block(&self, g: &mut Graph, b: &Activations, il: usize) {
        let c = &self.config;
        let lw = &self.weights.layers[il];
        let (x, h, proj) = (b.residual, b.normed, b.proj);
        g.push(Op::RmsNorm { x, weight: Some(lw.ffn_norm), eps: c.rms_eps, group: c.n_embd, out: h });
        match (&lw.ffn, &c.moe, &b.experts) {
            (FfnWeights::Dense(ffn), _, _) => {
                // Built with the buffers of dense layers wherever a layer is dense.
                let [gate, up] = b.dense.expect("dense FFN buffers");
                self.swiglu_ffn(g, ffn, h, [gate, up], proj)
            }
            (
                FfnWeights::Experts { router, gate: wg, up: wu, down: wd, biases, selection_bias, shared },
                Some(moe),
                Some(e),
            ) => {
                let [gate, up] = e.gate_up;
                let bias = |pick: fn(&ExpertBiases) -> WeightId| biases.as_ref().map(pick);
                g.push(Op::MatMul { w: *router, x: h, bias: bias(|b| b.router), out: e.router_logits });
                let routing = ExpertRouting { selection_bias: *selection_bias, ..moe.routing.clone() };
                let (logits, ids, weights) = (e.router_logits, e.ids, e.weights);
                g.push(Op::RouteExperts { logits, routing, ids, weights, tally: Some(il) });
                g.push(Op::MatMulExperts { w: *wg, x: h, ids: e.ids, bias: bias(|b| b.gate), out: gate });
                g.push(Op::MatMulExperts { w: *wu, x: h, ids: e.ids, bias: bias(|b| b.up), out: up });
                g.push(self.activation(gate, up));
                g.push(Op::MatMulExperts { w: *wd, x: gate, ids: e.ids, bias: bias(|b| b.down), out: e.outputs });
                g.push(Op::CombineExperts { x: e.outputs, weights: e.weights, out: proj });
                if let (Some(shared), Some(s)) = (shared, &e.shared) {
                    self.swiglu_ffn(g, &shared.ffn, h, [s.gate, s.up], s.out);
                    let out = match (shared.gate, &s.gated) {
                        // Gated: the expert behind a one-expert sigmoid router, its output
                        // "combined" with the weight σ(h · g), exactly the gate's product.
                        (Some(gate), Some(gated)) => {
                            g.push(Op::MatMul { w: gate, x: h, bias: None, out: gated.logit });
                            let routing = ExpertRouting::top(1, ExpertGating::Sigmoid);
                            let (ids, weights) = (gated.ids, gated.weight);
                            g.push(Op::RouteExperts { logits: gated.logit, routing, ids, weights, tally: None });
                            g.push(Op::CombineExperts { x: s.out, weights: gated.weight, out: gated.out });
                            gated.out
                        }
                        _ => s.out,
                    };
                    g.push(Op::Add { a: proj, b: out, out: proj });
                }
            }
            // Weights are uploaded as the config says: experts exactly when it has a MoE.
            (FfnWeights::Experts { .. }, _, _) => unreachable!("expert weights without a MoE config"),
        }
        if let Some(pn) = lw.ffn_post_norm {
            g.push(Op::RmsNorm { x: proj, weight: Some(pn), eps: c.rms_eps, group: c.n_embd, out: proj });
        }
        if let Some(factor) = c.residual_scale {
            g.push(Op::Scale { x: proj, factor });
        }
        g.push(Op::Add { a: x, b: proj, out: x });
    }

    /// A dense gated FFN of `h` into `out`: the gate and up projections into `[gate, up]`, the
    /// gated activation (into gate), and the down projection.
    fn swiglu_ffn(&self, g: &mut Graph, ffn: &DenseFfn, h: BufId, [gate, up]: [BufId; 2], out: BufId) {
        g.push(Op::MatMul { w: ffn.gate, x: h, bias: None, out: gate });
        g.push(Op::MatMul { w: ffn.up, x: h, bias: None, out: up });
        g.push(self.activation(gate, up));
        g.push(Op::MatMul { w: ffn.down, x: gate, bias: None, out });
    }

    /// The gated activation of the model's FFNs, written over `gate`.
    fn activation(&self, gate: BufId, up: BufId) -> Op {
        Op::Glu { activation: self.config.ffn_activation, gate, up, out: gate }
    }
}

/// The activation buffers every layer shares.
struct Activations {
    residual: BufId, // [n, n_embd]
    normed: BufId,   // [n, n_embd]
    q: BufId,        // [n, n_head * head_dim]
    k: BufId,        // [n, n_head_kv * head_dim]
    v: BufId,        // [n, n_head_kv * head_dim]
    attn: BufId,     // [n, n_head * head_dim] (MLA: [n, n_head * v_head])
    proj: BufId,     // [n, n_embd]: attention output / FFN output
    /// [n, n_ff] gate (then the activated product) and up, where some layer's FFN is dense.
    dense: Option<[BufId; 2]>,
    experts: Option<ExpertActivations>,
    latent: Option<LatentActivations>,
}

/// The buffers of multi-head latent attention.
struct LatentActivations {
    q_compressed: Option<BufId>, // [n, q_lora]
    q_nope: BufId,               // [n, n_head * qk_nope]
    q_rope: BufId,               // [n, n_head * qk_rope]
    q_latent: BufId,             // [n, n_head * kv_lora]
    latent: BufId,               // [n, kv_lora]: the values
    k_rope: BufId,               // [n, qk_rope]
    out_latent: BufId,           // [n, n_head * kv_lora]
}

/// The buffers of a mixture-of-experts FFN.
struct ExpertActivations {
    gate_up: [BufId; 2],  // [n, n_used * n_ff_expert] each; the gate then the activated product
    router_logits: BufId, // [n, n_expert]
    ids: BufId,           // [n, n_used] u32
    weights: BufId,       // [n, n_used]
    outputs: BufId,       // [n, n_used * n_embd]
    shared: Option<SharedExpertActivations>,
}

/// The buffers of a shared expert.
struct SharedExpertActivations {
    gate: BufId, // [n, n_ff_shared], then the activated product
    up: BufId,   // [n, n_ff_shared]
    out: BufId,  // [n, n_embd]
    gated: Option<GateActivations>,
}

/// The buffers of a shared expert's sigmoid gate.
struct GateActivations {
    logit: BufId,  // [n, 1]: h · g
    ids: BufId,    // [n, 1] u32: the one-expert router's choice (always 0)
    weight: BufId, // [n, 1]: σ(h · g)
    out: BufId,    // [n, n_embd]: the shared expert's output times its weight
}

impl Activations {
    fn new(g: &mut Graph, c: &ModelConfig, n: usize) -> Self {
        let q_width = c.n_head * c.head_dim;
        let kv_width = c.n_head_kv * c.head_dim;
        let any_dense = c.moe.is_none() || c.n_dense_lead > 0;
        let dense = any_dense.then(|| [g.buf("ffn_gate", n, c.n_ff), g.buf("ffn_up", n, c.n_ff)]);
        let latent = c.mla.map(|m| LatentActivations {
            q_compressed: (m.q_lora > 0).then(|| g.buf("q_a", n, m.q_lora)),
            q_nope: g.buf("q_nope", n, c.n_head * m.qk_nope),
            q_rope: g.buf("q_pe", n, c.n_head * m.qk_rope),
            q_latent: g.buf("q_nope_absorbed", n, c.n_head * m.kv_lora),
            latent: g.buf("kv_cmpr", n, m.kv_lora),
            k_rope: g.buf("k_pe", n, m.qk_rope),
            out_latent: g.buf("kqv_latent", n, c.n_head * m.kv_lora),
        });
        let attn_width = c.mla.map_or(q_width, |m| c.n_head * m.v_head);
        let experts = c.moe.as_ref().map(|m| ExpertActivations {
            gate_up: [
                g.buf("ffn_moe_gate", n, m.routing.n_used * m.n_ff_expert),
                g.buf("ffn_moe_up", n, m.routing.n_used * m.n_ff_expert),
            ],
            router_logits: g.buf("ffn_moe_logits", n, m.n_expert),
            ids: g.typed_buf("ffn_moe_topk", BufType::U32, n, m.routing.n_used),
            weights: g.buf("ffn_moe_weights", n, m.routing.n_used),
            outputs: g.buf("ffn_moe_down", n, m.routing.n_used * c.n_embd),
            shared: m.shared.as_ref().map(|shared| SharedExpertActivations {
                gate: g.buf("ffn_shexp_gate", n, shared.n_ff),
                up: g.buf("ffn_shexp_up", n, shared.n_ff),
                out: g.buf("ffn_shexp", n, c.n_embd),
                gated: (shared.gate == SharedExpertGate::Sigmoid).then(|| GateActivations {
                    logit: g.buf("ffn_shexp_gate_inp", n, 1),
                    ids: g.typed_buf("ffn_shexp_gate_id", BufType::U32, n, 1),
                    weight: g.buf("ffn_shexp_gate_weight", n, 1),
                    out: g.buf("ffn_shexp_out", n, c.n_embd),
                }),
            }),
        });
        Activations {
            residual: g.buf("residual", n, c.n_embd),
            normed: g.buf("normed", n, c.n_embd),
            q: g.buf("q", n, q_width),
            k: g.buf("k", n, kv_width),
            v: g.buf("v", n, kv_width),
            attn: g.buf("attn_out", n, attn_width),
            proj: g.buf("proj", n, c.n_embd),
            dense,
            experts,
            latent,
        }
    }
}
