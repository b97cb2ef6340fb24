//! Model graphs. One decoder, written once against [`Graph`], covers llama, qwen2, qwen3 and
//! gemma3; the architectures differ only in the switches of [`ModelConfig`] (biases, q/k norms,
//! post-norms, activation, RoPE flavour, per-layer sliding windows). Backends never see the
//! architecture, only the ops.

pub mod config;
pub mod weights;

pub use config::{Arch, FfnActivation, LayerAttention, ModelConfig};
pub use weights::{LayerWeights, ModelWeights};

use crate::backend::{Backend, KvLayout};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::graph::{AttentionParams, Graph, LogitsMode, Op, RopeParams};

pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
}

impl Model {
    /// Reads the hyper-parameters and uploads the weights to `backend`.
    pub fn load(file: &GgufFile, backend: &mut dyn Backend, on_progress: &mut dyn FnMut(u64, u64)) -> Result<Self> {
        let config = ModelConfig::from_metadata(&file.metadata)?;
        let weights = ModelWeights::upload(&config, file, backend, on_progress)?;
        Ok(Model { config, weights })
    }

    pub fn kv_layout(&self, capacity: usize) -> KvLayout {
        let width = self.config.n_head_kv * self.config.head_dim;
        KvLayout { n_layers: self.config.n_layer, capacity, k_width: width, v_width: width }
    }

    /// The forward pass for `n_tokens` consecutive tokens. Activation buffers are shared by all
    /// layers (the residual stream is updated in place), so memory does not grow with depth.
    pub fn build_graph(&self, n_tokens: usize, logits: LogitsMode) -> Graph {
        let c = &self.config;
        let w = &self.weights;
        let n = n_tokens;
        let q_width = c.n_head * c.head_dim;
        let kv_width = c.n_head_kv * c.head_dim;
        let mut g = Graph::new(n);

        let x = g.buf("residual", n, c.n_embd); // [n, n_embd]
        let h = g.buf("normed", n, c.n_embd); // [n, n_embd]
        let q = g.buf("q", n, q_width); // [n, n_head * head_dim]
        let k = g.buf("k", n, kv_width); // [n, n_head_kv * head_dim]
        let v = g.buf("v", n, kv_width); // [n, n_head_kv * head_dim]
        let attn = g.buf("attn_out", n, q_width); // [n, n_head * head_dim]
        let proj = g.buf("proj", n, c.n_embd); // [n, n_embd]: attention output / FFN output
        let gate = g.buf("ffn_gate", n, c.n_ff); // [n, n_ff], then the activated product
        let up = g.buf("ffn_up", n, c.n_ff); // [n, n_ff]

        g.push(Op::Embed { table: w.token_embd, out: x });
        if let Some(s) = c.embd_scale {
            g.push(Op::Scale { x, factor: s });
        }

        for (il, lw) in w.layers.iter().enumerate() {
            let la = c.layers[il];
            g.push(Op::RmsNorm { x, weight: Some(lw.attn_norm), eps: c.rms_eps, group: c.n_embd, out: h });
            g.push(Op::MatMul { w: lw.wq, x: h, bias: lw.bq, out: q });
            g.push(Op::MatMul { w: lw.wk, x: h, bias: lw.bk, out: k });
            g.push(Op::MatMul { w: lw.wv, x: h, bias: lw.bv, out: v });
            if let (Some(qn), Some(kn)) = (lw.q_norm, lw.k_norm) {
                g.push(Op::RmsNorm { x: q, weight: Some(qn), eps: c.rms_eps, group: c.head_dim, out: q });
                g.push(Op::RmsNorm { x: k, weight: Some(kn), eps: c.rms_eps, group: c.head_dim, out: k });
            }
            let rope = RopeParams {
                mode: c.rope_mode,
                head_dim: c.head_dim,
                n_rot: c.n_rot,
                freq_base: la.rope_base,
                freq_scale: la.rope_scale,
                freq_factors: w.rope_freqs,
            };
            g.push(Op::Rope { x: q, params: rope.clone() });
            g.push(Op::Rope { x: k, params: rope });
            g.push(Op::StoreKv { layer: il, k, v });
            let params = AttentionParams {
                layer: il,
                n_head: c.n_head,
                n_head_kv: c.n_head_kv,
                head_dim: c.head_dim,
                scale: c.attn_scale,
                window: la.window,
                softcap: None,
            };
            g.push(Op::Attention { q, params, out: attn });
            g.push(Op::MatMul { w: lw.wo, x: attn, bias: None, out: proj });
            if let Some(pn) = lw.attn_post_norm {
                g.push(Op::RmsNorm { x: proj, weight: Some(pn), eps: c.rms_eps, group: c.n_embd, out: proj });
            }
            g.push(Op::Add { a: x, b: proj, out: x });

            g.push(Op::RmsNorm { x, weight: Some(lw.ffn_norm), eps: c.rms_eps, group: c.n_embd, out: h });
            g.push(Op::MatMul { w: lw.ffn_gate, x: h, bias: None, out: gate });
            g.push(Op::MatMul { w: lw.ffn_up, x: h, bias: None, out: up });
            g.push(match c.ffn_activation {
                FfnActivation::Silu => Op::SwiGlu { gate, up, out: gate },
                FfnActivation::GeluTanh => Op::GeGlu { gate, up, out: gate },
            });
            g.push(Op::MatMul { w: lw.ffn_down, x: gate, bias: None, out: proj });
            if let Some(pn) = lw.ffn_post_norm {
                g.push(Op::RmsNorm { x: proj, weight: Some(pn), eps: c.rms_eps, group: c.n_embd, out: proj });
            }
            g.push(Op::Add { a: x, b: proj, out: x });
        }

        let n_out = match logits {
            LogitsMode::Last => 1,
            LogitsMode::All => n,
        };
        let last = if n_out == n {
            x
        } else {
            let last = g.buf("last_residual", 1, c.n_embd);
            g.push(Op::LastRow { x, out: last });
            last
        };
        let out_norm = g.buf("output_norm", n_out, c.n_embd);
        g.push(Op::RmsNorm { x: last, weight: Some(w.output_norm), eps: c.rms_eps, group: c.n_embd, out: out_norm });
        let logits_buf = g.buf("logits", n_out, c.n_vocab);
        g.push(Op::MatMul { w: w.output, x: out_norm, bias: None, out: logits_buf });
        g.logits = logits_buf;
        g
    }
}
