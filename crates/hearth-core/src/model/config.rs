//! Hyper-parameters of the supported architectures, read from GGUF metadata.

use crate::error::{CoreError, Result};
use crate::gguf::{Metadata, Value};
use crate::graph::{ExpertGating, ExpertGroups, ExpertRouting, GluActivation, RopeMode, RopeYarn, YarnLogMultiplier};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM, Mistral: normal RoPE, SwiGLU; Mixtral: the same with a mixture of
    /// experts (`llama.expert_count` > 0; softmax router, top-k weights renormalised).
    Llama,
    /// Qwen 2/2.5: q/k/v biases, NeoX RoPE.
    Qwen2,
    /// Qwen 3: per-head q/k RMSNorm, NeoX RoPE, no biases.
    Qwen3,
    /// Gemma 3: q/k norm, embedding scale, GELU, post-norms, interleaved sliding-window layers.
    Gemma3,
    /// Qwen 3 MoE: Qwen 3's attention, a mixture-of-experts FFN in every layer (softmax router,
    /// top-k weights renormalised).
    Qwen3Moe,
    /// OLMoE: q/k RMSNorm over the whole projection (before the heads are split), NeoX RoPE,
    /// experts weighted by their softmax probabilities as they are (not renormalised).
    Olmoe,
    /// Granite 3 (dense): llama with four multipliers: the embeddings', the attention scale,
    /// each block's output before it joins the residual stream, and the logits' divisor.
    Granite,
    /// Granite 3 MoE: Granite with a mixture of experts (softmax router, top-k renormalised) and
    /// optionally an ungated shared expert run for every token.
    GraniteMoe,
    /// Qwen 1.5/2 MoE: Qwen 2's attention (q/k/v biases, NeoX RoPE), experts weighted by their
    /// softmax probabilities as they are, and a shared expert behind a per-token sigmoid gate.
    Qwen2Moe,
    /// gpt-oss: attention sinks, a sliding window on every other layer, YaRN, q/k/v and output
    /// biases; experts with biases and a clamped SwiGLU, chosen by their router logits (which
    /// have a bias too) and weighed by a softmax over the chosen ones.
    GptOss,
    /// DeepSeek-V2 (and its Lite form): multi-head latent attention (MLA), leading dense layers,
    /// then a mixture of experts with an ungated shared expert.
    Deepseek2,
}

impl Arch {
    pub fn from_name(name: &str) -> Result<Arch> {
        Ok(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma3" => Arch::Gemma3,
            "qwen3moe" => Arch::Qwen3Moe,
            "olmoe" => Arch::Olmoe,
            "granite" => Arch::Granite,
            "granitemoe" => Arch::GraniteMoe,
            "qwen2moe" => Arch::Qwen2Moe,
            "gpt-oss" => Arch::GptOss,
            "deepseek2" => Arch::Deepseek2,
            other => return Err(CoreError::UnknownArchitecture(other.to_string())),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Olmoe => "olmoe",
            Arch::Granite => "granite",
            Arch::GraniteMoe => "granitemoe",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::GptOss => "gpt-oss",
            Arch::Deepseek2 => "deepseek2",
        }
    }
}

/// A mixture-of-experts FFN: `n_expert` SwiGLU experts of `n_ff_expert` hidden values each,
/// `routing.n_used` of them per token.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub n_ff_expert: usize,
    pub routing: ExpertRouting,
    /// A SwiGLU expert every token runs beside its routed ones; `None` when the model has none.
    pub shared: Option<SharedExpert>,
    /// The router and every expert matrix have a bias (gpt-oss).
    pub biases: bool,
}

/// A mixture of experts' shared expert: `n_ff` hidden values, its output added to the routed
/// experts' sum as `gate` says.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedExpert {
    pub n_ff: usize,
    pub gate: SharedExpertGate,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedExpertGate {
    /// Added as it is (granitemoe).
    None,
    /// Multiplied by σ(h · g) per token, g a learned [n_embd] vector (qwen2moe's
    /// `ffn_gate_inp_shexp`).
    Sigmoid,
}

/// DeepSeek's multi-head latent attention, in llama.cpp's absorbed form: per token one latent
/// vector of `kv_lora` values (normalised) and one rotated key of `qk_rope` shared by all heads;
/// each head's query is `qk_nope` values taken into the latent space by that head's `k_b`
/// matrix, then its `qk_rope` rotated values. Attention is multi-query over keys [latent,
/// rotated key] (`kv_lora + qk_rope` values, the model's `head_dim`) and values the latent; each
/// head's output leaves the latent space through its `v_b` matrix (`v_head` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaConfig {
    pub kv_lora: usize,
    pub qk_nope: usize,
    pub qk_rope: usize,
    pub v_head: usize,
    /// The query's low-rank compression (`q_lora_rank`, DeepSeek-V2/V3); 0: none (the Lite form).
    pub q_lora: usize,
}

/// RMSNorm of the queries and keys before RoPE, with learned weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Each head's values on their own (weights of `head_dim`): qwen3, gemma3.
    PerHead,
    /// The whole projection of a token (weights of `n_head * head_dim`, and of
    /// `n_head_kv * head_dim` for keys): olmoe.
    WholeRow,
}

/// Per-layer attention kind: global layers see the whole context, local ones a sliding window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerAttention {
    pub window: Option<usize>,
    pub rope_base: f32,
    pub rope_scale: f32,
    pub rope_yarn: Option<RopeYarn>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    /// Rows of the output head the graph computes: logits for token ids `0..n_logits`. The whole
    /// vocabulary, or a shortlist of its first ids (see [`EngineOptions::logits_vocab`]).
    ///
    /// [`EngineOptions::logits_vocab`]: crate::engine::EngineOptions::logits_vocab
    pub n_logits: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_mode: RopeMode,
    pub n_rot: usize,
    pub attn_scale: f32,
    /// The attention scale multiplies the queries (after RoPE) instead of the scores (gemma, as
    /// llama.cpp's graph and the reference implementation do; the same in real arithmetic, and
    /// where the scale is a power of two, as for Gemma 3's head sizes, in f32 too).
    pub scale_queries: bool,
    /// Multiplies the token embeddings (gemma: sqrt(n_embd); granite: `embedding_scale`).
    pub embd_scale: Option<f32>,
    /// Multiplies each attention and FFN block's output before it joins the residual stream
    /// (granite: `residual_scale`).
    pub residual_scale: Option<f32>,
    /// Multiplies the logits (granite: 1 / `logit_scale`).
    pub logits_factor: Option<f32>,
    pub ffn_activation: GluActivation,
    pub qkv_bias: bool,
    pub qk_norm: QkNorm,
    /// Gemma's extra norms after attention and after the FFN.
    pub post_norms: bool,
    /// Every layer has attention sinks (`attn_sinks.weight`, one logit per query head: gpt-oss).
    pub attn_sinks: bool,
    /// Every layer's FFN from `n_dense_lead` on is a mixture of experts (`None`: dense, `n_ff`
    /// wide); the layers before it are dense.
    pub moe: Option<MoeConfig>,
    pub n_dense_lead: usize,
    /// Multi-head latent attention in place of the Q/K/V projections (deepseek2).
    pub mla: Option<MlaConfig>,
    pub layers: Vec<LayerAttention>,
}

impl ModelConfig {
    /// Computes logits for the first `limit` token ids only (`None`: all of them).
    pub fn limit_logits(&mut self, limit: Option<usize>) -> Result<()> {
        match limit {
            None => self.n_logits = self.n_vocab,
            Some(0) => {
                return Err(CoreError::InvalidArgument("the logits vocabulary must hold at least one token".into()))
            }
            Some(n) => self.n_logits = n.min(self.n_vocab),
        }
        Ok(())
    }

    pub fn from_metadata(meta: &Metadata) -> Result<Self> {
        let arch_name = meta.str("general.architecture")?;
        let arch = Arch::from_name(arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");

        let n_layer = meta.usize(&key("block_count"))?;
        let n_embd = meta.usize(&key("embedding_length"))?;
        let n_head = meta.usize(&key("attention.head_count"))?;
        let n_head_kv = meta.opt_usize(&key("attention.head_count_kv"))?.unwrap_or(n_head);
        let n_ff = meta.usize(&key("feed_forward_length"))?;
        let n_ctx_train = meta.usize(&key("context_length"))?;
        let rms_eps = meta.f32(&key("attention.layer_norm_rms_epsilon"))?;
        if n_layer == 0 || n_embd == 0 || n_head == 0 || n_head_kv == 0 || n_ff == 0 {
            return Err(CoreError::BadHyperParameter(format!(
                "zero size: block_count={n_layer} embedding_length={n_embd} head_count={n_head} head_count_kv={n_head_kv} feed_forward_length={n_ff}"
            )));
        }
        if n_head % n_head_kv != 0 {
            return Err(CoreError::BadHyperParameter(format!(
                "head_count {n_head} is not a multiple of head_count_kv {n_head_kv}"
            )));
        }
        let head_dim = match meta.opt_usize(&key("attention.key_length"))? {
            Some(d) => d,
            None => {
                if n_embd % n_head != 0 {
                    return Err(CoreError::BadHyperParameter(format!(
                        "embedding_length {n_embd} is not a multiple of head_count {n_head}"
                    )));
                }
                n_embd / n_head
            }
        };
        let v_dim = meta.opt_usize(&key("attention.value_length"))?.unwrap_or(head_dim);
        // MLA's cache rows: keys of the latent and the rotated key, values of the latent alone.
        if v_dim != head_dim && arch != Arch::Deepseek2 {
            return Err(CoreError::BadHyperParameter(format!(
                "value_length {v_dim} differs from key_length {head_dim}, which no supported architecture does"
            )));
        }
        let n_rot = meta.opt_usize(&key("rope.dimension_count"))?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(CoreError::BadHyperParameter(format!(
                "rope.dimension_count {n_rot} invalid for head size {head_dim}"
            )));
        }
        let rope_base = meta.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        let scaling_factor = meta.opt_f32(&key("rope.scaling.factor"))?.filter(|f| *f > 0.0);
        let (rope_scale, rope_yarn) = match meta.opt_str(&key("rope.scaling.type"))? {
            Some("linear") | None => (scaling_factor.map_or(1.0, |f| 1.0 / f), None),
            Some("none") => (1.0, None),
            Some("yarn") => {
                let factor = scaling_factor.unwrap_or(1.0);
                // As llama.cpp reads them for these architectures: the original context (else the
                // training context) and the attention factor; its default correction range.
                let n_ctx_orig = meta.opt_usize(&key("rope.scaling.original_context_length"))?.unwrap_or(n_ctx_train);
                let attn_factor = meta.opt_f32(&key("rope.scaling.attn_factor"))?.unwrap_or(1.0);
                // deepseek2 reads the log multiplier (a tenth of mscale_all_dim) and divides it into
                // itself: its RoPE is not scaled (llama-context.cpp).
                let log_multiplier = match arch {
                    Arch::Deepseek2 => yarn_mscale_all_dims(meta, arch_name)?
                        .map(|all_dims| YarnLogMultiplier { mscale: all_dims, mscale_all_dims: all_dims }),
                    _ => None,
                };
                let yarn =
                    RopeYarn::new(n_rot, n_ctx_orig, rope_base, factor, [32.0, 1.0], attn_factor, log_multiplier);
                (1.0 / factor, Some(yarn))
            }
            Some(other) => {
                return Err(CoreError::BadHyperParameter(format!("rope scaling type '{other}' is not supported yet")))
            }
        };
        let n_vocab = meta.array("tokenizer.ggml.tokens")?.len();
        check_sizes(n_layer, n_embd, n_head, head_dim, n_ff)?;

        let global = LayerAttention { window: None, rope_base, rope_scale, rope_yarn };
        let mut cfg = ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_vocab,
            n_logits: n_vocab,
            n_ctx_train,
            rms_eps,
            rope_mode: RopeMode::Neox,
            n_rot,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            scale_queries: false,
            embd_scale: None,
            residual_scale: None,
            logits_factor: None,
            ffn_activation: GluActivation::Silu,
            qkv_bias: false,
            qk_norm: QkNorm::None,
            post_norms: false,
            attn_sinks: false,
            moe: None,
            n_dense_lead: 0,
            mla: None,
            layers: vec![global; n_layer],
        };
        match arch {
            Arch::Llama => {
                cfg.rope_mode = RopeMode::Normal;
                if meta.opt_usize(&key("expert_count"))?.unwrap_or(0) > 0 {
                    cfg.moe = Some(moe_config(meta, arch_name, n_embd, n_ff, true)?);
                }
            }
            Arch::Qwen2 => cfg.qkv_bias = true,
            Arch::Qwen3 => cfg.qk_norm = QkNorm::PerHead,
            Arch::Qwen3Moe => {
                cfg.qk_norm = QkNorm::PerHead;
                // Experts n_ff / n_used wide unless the file says, as llama.cpp reads them.
                let n_used = meta.usize(&key("expert_used_count"))?.max(1);
                cfg.moe = Some(moe_config(meta, arch_name, n_embd, n_ff / n_used, true)?);
            }
            Arch::Qwen2Moe => {
                cfg.qkv_bias = true;
                // As llama.cpp reads them: the experts n_ff / n_used wide and the shared expert
                // n_ff wide unless the file says.
                let n_used = meta.usize(&key("expert_used_count"))?.max(1);
                let mut moe = moe_config(meta, arch_name, n_embd, n_ff / n_used, false)?;
                let n_ff_shared = meta.opt_usize(&key("expert_shared_feed_forward_length"))?.filter(|&f| f > 0);
                moe.shared = Some(SharedExpert { n_ff: n_ff_shared.unwrap_or(n_ff), gate: SharedExpertGate::Sigmoid });
                cfg.moe = Some(moe);
            }
            Arch::Olmoe => {
                cfg.qk_norm = QkNorm::WholeRow;
                cfg.moe = Some(moe_config(meta, arch_name, n_embd, n_ff, false)?);
            }
            Arch::Granite | Arch::GraniteMoe => {
                cfg.rope_mode = RopeMode::Normal;
                // llama.cpp reads the three optional multipliers as 0 when absent, and 0 as "none".
                let multiplier = |k: &str| -> Result<Option<f32>> { Ok(meta.opt_f32(&key(k))?.filter(|f| *f != 0.0)) };
                cfg.embd_scale = multiplier("embedding_scale")?;
                cfg.residual_scale = multiplier("residual_scale")?;
                if let Some(scale) = multiplier("attention.scale")? {
                    cfg.attn_scale = scale;
                }
                let logit_scale = meta.f32(&key("logit_scale"))?;
                if !logit_scale.is_finite() || logit_scale == 0.0 {
                    return Err(CoreError::BadHyperParameter(format!("logit_scale {logit_scale}")));
                }
                cfg.logits_factor = Some(1.0 / logit_scale);
                if meta.opt_usize(&key("expert_count"))?.unwrap_or(0) > 0 {
                    let mut moe = moe_config(meta, arch_name, n_embd, n_ff, true)?;
                    let n_ff_shared = meta.opt_usize(&key("expert_shared_feed_forward_length"))?.filter(|&f| f > 0);
                    moe.shared = n_ff_shared.map(|n_ff| SharedExpert { n_ff, gate: SharedExpertGate::None });
                    cfg.moe = Some(moe);
                }
            }
            Arch::GptOss => {
                // As llama.cpp's openai-moe.cpp: scores scaled by 1/sqrt(n_rot); a sliding window
                // on even layers (swa pattern 2), which keep the global layers' RoPE (YaRN
                // included) unless the file gives them a base of their own.
                cfg.attn_scale = 1.0 / (n_rot as f32).sqrt();
                cfg.attn_sinks = true;
                cfg.ffn_activation = GluActivation::GPT_OSS;
                let window = meta.usize(&key("attention.sliding_window"))?;
                let is_local = sliding_window_layers(meta, &key("attention.sliding_window_pattern"), n_layer, 2)?;
                let local_base = meta.opt_f32(&key("rope.freq_base_swa"))?.unwrap_or(rope_base);
                for (layer, local) in cfg.layers.iter_mut().zip(is_local) {
                    if local {
                        layer.window = Some(window);
                        layer.rope_base = local_base;
                    }
                }
                let n_ff_expert = meta.usize(&key("expert_feed_forward_length"))?;
                let mut moe = moe_config(meta, arch_name, n_embd, n_ff_expert, false)?;
                moe.routing.gating = ExpertGating::SoftmaxOfChosen;
                moe.biases = true;
                cfg.moe = Some(moe);
            }
            Arch::Deepseek2 => deepseek2(&mut cfg, meta, arch_name, v_dim)?,
            Arch::Gemma3 => {
                cfg.qk_norm = QkNorm::PerHead;
                cfg.post_norms = true;
                cfg.scale_queries = true;
                cfg.ffn_activation = GluActivation::GeluTanh;
                cfg.embd_scale = Some((n_embd as f32).sqrt());
                let window = meta.usize(&key("attention.sliding_window"))?;
                // Gemma 3: five local layers, then one global (llama.cpp's swa pattern 6), local
                // layers with their own RoPE base (10k) and no position scaling.
                let is_local = sliding_window_layers(meta, &key("attention.sliding_window_pattern"), n_layer, 6)?;
                let local_base = meta.opt_f32(&key("rope.freq_base_swa"))?.unwrap_or(10_000.0);
                for (layer, local) in cfg.layers.iter_mut().zip(is_local) {
                    if local {
                        *layer = LayerAttention {
                            window: Some(window),
                            rope_base: local_base,
                            rope_scale: 1.0,
                            rope_yarn: None,
                        };
                    }
                }
            }
        }
        if let Some(shared) = cfg.moe.as_ref().and_then(|m| m.shared.as_ref()).filter(|s| s.n_ff > MAX_DIM) {
            return Err(CoreError::BadHyperParameter(format!(
                "expert_shared_feed_forward_length {} exceeds {MAX_DIM}",
                shared.n_ff
            )));
        }
        Ok(cfg)
    }
}

/// DeepSeek-V2's switches, as llama.cpp's deepseek2.cpp reads them: MLA from the latent rank and
/// the logical head sizes (`key_length_mla`, `value_length_mla`), scores scaled by one over the
/// square root of the logical key size, normal RoPE on the rotated part; the first
/// `leading_dense_block_count` layers dense, then experts routed by a softmax (V2), their weights
/// renormalised when `expert_weights_norm` and scaled by `expert_weights_scale`, beside an ungated
/// shared expert `expert_shared_count` experts wide; with YaRN, the scores scaled by its mscale².
/// V3's routing: a sigmoid (`expert_gating_func` 2), the layer's `exp_probs_b` added to choose
/// experts, `expert_group_count` groups of which `expert_group_used_count` are chosen from.
fn deepseek2(cfg: &mut ModelConfig, meta: &Metadata, arch_name: &str, v_dim: usize) -> Result<()> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let bad = |what: String| Err(CoreError::BadHyperParameter(what));
    let kv_lora = meta.usize(&key("attention.kv_lora_rank"))?;
    let q_lora = meta.opt_usize(&key("attention.q_lora_rank"))?.unwrap_or(0);
    let (k_mla, v_head) =
        (meta.usize(&key("attention.key_length_mla"))?, meta.usize(&key("attention.value_length_mla"))?);
    let qk_rope = cfg.n_rot;
    let too_wide = [kv_lora, q_lora, k_mla, v_head].iter().any(|&d| d > MAX_DIM);
    if too_wide
        || cfg.n_head_kv != 1
        || cfg.head_dim != kv_lora + qk_rope
        || v_dim != kv_lora
        || k_mla <= qk_rope
        || v_head == 0
    {
        return bad(format!(
            "MLA needs one KV head of key_length = kv_lora_rank + rope.dimension_count and value_length = \
             kv_lora_rank, key_length_mla above the rotated size, every size at most {MAX_DIM}: head_count_kv {}, \
             key_length {}, value_length {v_dim}, kv_lora_rank {kv_lora}, q_lora_rank {q_lora}, \
             rope.dimension_count {qk_rope}, key_length_mla {k_mla}, value_length_mla {v_head}",
            cfg.n_head_kv, cfg.head_dim
        ));
    }

    // llama.cpp's expert_gating_func: absent or 1 the softmax of V2, 2 V3's sigmoid.
    let gating = match meta.opt_usize(&key("expert_gating_func"))?.unwrap_or(1) {
        0 | 1 => ExpertGating::Softmax,
        2 => ExpertGating::Sigmoid,
        other => return bad(format!("expert_gating_func {other} (softmax 1 and sigmoid 2 are supported)")),
    };
    let n_group = meta.opt_usize(&key("expert_group_count"))?.unwrap_or(0);
    let groups = (n_group > 1)
        .then(|| -> Result<ExpertGroups> {
            Ok(ExpertGroups { n_group, n_used: meta.usize(&key("expert_group_used_count"))? })
        })
        .transpose()?;
    cfg.mla = Some(MlaConfig { kv_lora, qk_nope: k_mla - qk_rope, qk_rope, v_head, q_lora });
    cfg.rope_mode = RopeMode::Normal;
    // With YaRN llama.cpp scales the scores by mscale² (deepseek2.cpp): RoPE's magnitude scale
    // times 1 + 0.1 · mscale_all_dim · ln(factor).
    let kq_mscale = match cfg.layers[0].rope_yarn {
        Some(yarn) => {
            let factor = 1.0 / cfg.layers[0].rope_scale;
            yarn.mscale * (1.0 + 0.1 * yarn_mscale_all_dims(meta, arch_name)?.unwrap_or(0.0) * factor.ln())
        }
        None => 1.0,
    };
    cfg.attn_scale = kq_mscale * kq_mscale / (k_mla as f32).sqrt();
    cfg.n_dense_lead = meta.opt_usize(&key("leading_dense_block_count"))?.unwrap_or(0).min(cfg.n_layer);
    let n_ff_expert = meta.usize(&key("expert_feed_forward_length"))?;
    let normalize = meta.opt_bool(&key("expert_weights_norm"))?.unwrap_or(false);
    let mut moe = moe_config(meta, arch_name, cfg.n_embd, n_ff_expert, normalize)?;
    moe.routing.scale = meta.opt_f32(&key("expert_weights_scale"))?.filter(|s| *s != 0.0).unwrap_or(1.0);
    moe.routing.gating = gating;
    if let Some(g) = groups {
        let per_group = moe.n_expert / g.n_group;
        if moe.n_expert % g.n_group != 0
            || per_group < 2
            || g.n_used == 0
            || g.n_used > g.n_group
            || moe.routing.n_used > g.n_used * per_group
        {
            return bad(format!(
                "expert_group_count {} with expert_group_used_count {} for {} experts, {} used",
                g.n_group, g.n_used, moe.n_expert, moe.routing.n_used
            ));
        }
    }
    moe.routing.groups = groups;
    let n_shared = meta.opt_usize(&key("expert_shared_count"))?.unwrap_or(0);
    if n_shared > 0 {
        // Checked against MAX_DIM with the other shared experts' widths.
        let n_ff = n_ff_expert.saturating_mul(n_shared);
        moe.shared = Some(SharedExpert { n_ff, gate: SharedExpertGate::None });
    }
    cfg.moe = Some(moe);
    Ok(())
}

/// A YaRN file's mscale_all_dim: `rope.scaling.yarn_log_multiplier` holds a tenth of it.
fn yarn_mscale_all_dims(meta: &Metadata, arch_name: &str) -> Result<Option<f32>> {
    Ok(meta.opt_f32(&format!("{arch_name}.rope.scaling.yarn_log_multiplier"))?.map(|m| m / 0.1))
}

/// Most experts accepted (real models: up to 384).
const MAX_EXPERTS: usize = 1 << 12;

/// The experts of a mixture-of-experts FFN from `{arch}.expert_count`, `expert_used_count` and
/// `expert_feed_forward_length` (absent: `default_n_ff`, per architecture as llama.cpp reads it),
/// routed by a softmax over all experts, the chosen weights divided by their sum when `normalize`
/// (fixed per architecture in llama.cpp, which reads no key for it on these).
fn moe_config(
    meta: &Metadata,
    arch_name: &str,
    n_embd: usize,
    default_n_ff: usize,
    normalize: bool,
) -> Result<MoeConfig> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let n_expert = meta.usize(&key("expert_count"))?;
    let n_used = meta.usize(&key("expert_used_count"))?;
    if n_expert == 0 || n_expert > MAX_EXPERTS || n_used == 0 || n_used > n_expert {
        return Err(CoreError::BadHyperParameter(format!(
            "expert_used_count {n_used} of expert_count {n_expert} (at most {MAX_EXPERTS} experts)"
        )));
    }
    let n_ff_expert = meta.opt_usize(&key("expert_feed_forward_length"))?.filter(|&f| f > 0).unwrap_or(default_n_ff);
    // The chosen experts' hidden values, and their outputs, lie side by side in one activation row.
    if n_ff_expert == 0 || n_ff_expert.max(n_embd).saturating_mul(n_used) > MAX_DIM {
        return Err(CoreError::BadHyperParameter(format!(
            "{n_used} experts used of feed-forward length {n_ff_expert} (embedding {n_embd}) exceed rows of {MAX_DIM}"
        )));
    }
    let routing = ExpertRouting {
        n_used,
        gating: ExpertGating::Softmax,
        normalize,
        scale: 1.0,
        selection_bias: None,
        groups: None,
    };
    Ok(MoeConfig { n_expert, n_ff_expert, routing, shared: None, biases: false })
}

/// Largest layer count and tensor dimension accepted (real models: ~128 layers, dimensions below 2^17).
/// The cap keeps `vec![_; n_layer]` and the width products below from exhausting memory or
/// overflowing on a crafted header.
const MAX_LAYERS: usize = 1 << 16;
const MAX_DIM: usize = 1 << 24;

fn check_sizes(n_layer: usize, n_embd: usize, n_head: usize, head_dim: usize, n_ff: usize) -> Result<()> {
    if n_layer > MAX_LAYERS {
        return Err(CoreError::BadHyperParameter(format!("block_count {n_layer} exceeds {MAX_LAYERS}")));
    }
    for (name, v) in
        [("embedding_length", n_embd), ("head_count", n_head), ("key_length", head_dim), ("feed_forward_length", n_ff)]
    {
        if v > MAX_DIM {
            return Err(CoreError::BadHyperParameter(format!("{name} {v} exceeds {MAX_DIM}")));
        }
    }
    // n_head_kv <= n_head (it divides it), so only the query width can overflow.
    if n_head.checked_mul(head_dim).is_none_or(|w| w > MAX_DIM) {
        return Err(CoreError::BadHyperParameter(format!(
            "head_count {n_head} x key_length {head_dim} exceeds {MAX_DIM}"
        )));
    }
    if head_dim == 0 {
        return Err(CoreError::BadHyperParameter("key_length is 0".into()));
    }
    Ok(())
}

/// Which layers use the sliding window: the metadata holds either a per-layer bool array or a
/// period `n` (layers `il % n < n - 1` are local, every n-th is global).
fn sliding_window_layers(meta: &Metadata, key: &str, n_layer: usize, default_period: usize) -> Result<Vec<bool>> {
    if let Some(Value::Array(items)) = meta.get(key) {
        if items.len() != n_layer {
            return Err(CoreError::BadHyperParameter(format!(
                "{key} has {} entries for {n_layer} layers",
                items.len()
            )));
        }
        return items
            .iter()
            .map(|v| v.as_bool().ok_or_else(|| CoreError::BadHyperParameter(format!("{key} must hold bools"))))
            .collect();
    }
    let period = meta.opt_usize(key)?.unwrap_or(default_period);
    Ok((0..n_layer).map(|il| period == 0 || il % period < period - 1).collect())
}
