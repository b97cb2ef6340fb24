//! Finds, checks and uploads the tensors of a model. Shapes are validated here, once, so backends
//! can trust every row length they are given.

use super::config::{Arch, MlaConfig, ModelConfig, QkNorm, SharedExpertGate};
use crate::backend::{Backend, WeightData};
use crate::error::{CoreError, Result};
use crate::gguf::MemorySource;
use crate::gguf::{GgufFile, TensorInfo};
use crate::graph::{WeightDesc, WeightId};
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: WeightId,
    pub attn: AttentionWeights,
    pub wo: WeightId,
    /// The output projection's bias, where the file has one (llama.cpp reads it for llama and
    /// granite).
    pub bo: Option<WeightId>,
    pub attn_post_norm: Option<WeightId>,
    /// [n_head] attention sink logits (gpt-oss).
    pub attn_sinks: Option<WeightId>,
    pub ffn_norm: WeightId,
    pub ffn: FfnWeights,
    pub ffn_post_norm: Option<WeightId>,
}

/// How a layer makes its queries, keys and values.
#[derive(Clone, Debug)]
pub enum AttentionWeights {
    /// Q, K and V projections, with biases and q/k norms where the model has them.
    Heads(HeadWeights),
    /// DeepSeek's multi-head latent attention.
    Latent(LatentWeights),
}

#[derive(Clone, Copy, Debug)]
pub struct HeadWeights {
    pub wq: WeightId,
    pub wk: WeightId,
    pub wv: WeightId,
    pub bq: Option<WeightId>,
    pub bk: Option<WeightId>,
    pub bv: Option<WeightId>,
    pub q_norm: Option<WeightId>,
    pub k_norm: Option<WeightId>,
}

/// MLA's matrices (shapes in [`super::MlaConfig`]'s names), each as the file's rows that the graph
/// uses on their own: the query's `qk_nope` and `qk_rope` rows of every head (of `attn_q`, or of
/// `attn_q_b` after the compression `q_a` and its norm), and the latent's and the rotated key's
/// rows of `attn_kv_a_mqa`.
#[derive(Clone, Copy, Debug)]
pub struct LatentWeights {
    /// attn_q_a: [q_lora, n_embd] and its norm [q_lora], where the model compresses its queries.
    pub q_a: Option<(WeightId, WeightId)>,
    /// [n_head * qk_nope, q_in] and [n_head * qk_rope, q_in] (q_in: q_lora or n_embd).
    pub q_nope: WeightId,
    pub q_rope: WeightId,
    /// [kv_lora, n_embd] and [qk_rope, n_embd].
    pub latent: WeightId,
    pub k_rope: WeightId,
    /// [kv_lora]
    pub latent_norm: WeightId,
    /// attn_k_b: [n_head][kv_lora, qk_nope]; attn_v_b: [n_head][v_head, kv_lora].
    pub k_b: WeightId,
    pub v_b: WeightId,
}

/// A SwiGLU FFN's matrices: gate, up: [n_ff, n_embd]; down: [n_embd, n_ff].
#[derive(Clone, Copy, Debug)]
pub struct DenseFfn {
    pub gate: WeightId,
    pub up: WeightId,
    pub down: WeightId,
}

/// A mixture of experts' shared expert: its FFN and, when gated, its gate vector g:
/// [n_embd] (the expert's output is scaled by σ(h · g) per token).
#[derive(Clone, Copy, Debug)]
pub struct SharedFfn {
    pub ffn: DenseFfn,
    pub gate: Option<WeightId>,
}

/// A layer's feed-forward matrices.
#[derive(Clone, Debug)]
pub enum FfnWeights {
    Dense(DenseFfn),
    /// router: [n_expert, n_embd] (F32 in llama.cpp's files); gate, up: [n_expert][n_ff_expert,
    /// n_embd]; down: [n_expert][n_embd, n_ff_expert]; `biases`: theirs, where the model has
    /// them; `shared`: the shared expert, where the model has one.
    Experts {
        router: WeightId,
        gate: WeightId,
        up: WeightId,
        down: WeightId,
        biases: Option<ExpertBiases>,
        /// [n_expert] added to the router's probabilities to choose experts (DeepSeek-V3).
        selection_bias: Option<WeightId>,
        shared: Option<SharedFfn>,
    },
}

/// The biases of a mixture of experts (gpt-oss): router: [n_expert]; gate, up:
/// [n_expert][n_ff_expert]; down: [n_expert][n_embd].
#[derive(Clone, Copy, Debug)]
pub struct ExpertBiases {
    pub router: WeightId,
    pub gate: WeightId,
    pub up: WeightId,
    pub down: WeightId,
}

#[derive(Clone, Debug)]
pub struct ModelWeights {
    pub token_embd: WeightId,
    pub output_norm: WeightId,
    /// The output head; the token embedding when the model ties them.
    pub output: WeightId,
    pub rope_freqs: Option<WeightId>,
    pub layers: Vec<LayerWeights>,
}

struct Uploader<'a> {
    file: &'a GgufFile,
    backend: &'a mut dyn Backend,
    on_progress: &'a mut dyn FnMut(u64, u64),
    done_bytes: u64,
    total_bytes: u64,
}

/// The tensor `name` of `file`, checked to have the shape `expected`.
fn checked_tensor<'f>(file: &'f GgufFile, name: &str, expected: &[u64]) -> Result<&'f TensorInfo> {
    let info = file.require_tensor(name)?;
    if info.dims != expected {
        return Err(CoreError::ShapeMismatch {
            tensor: name.to_string(),
            expected: expected.to_vec(),
            found: info.dims.clone(),
        });
    }
    Ok(info)
}

impl Uploader<'_> {
    fn upload(&mut self, name: &str, expected: &[u64]) -> Result<WeightId> {
        let info = checked_tensor(self.file, name, expected)?;
        let desc = WeightDesc { name: name.to_string(), ty: info.ty, dims: info.dims.clone() };
        let data = WeightData { source: self.file.source().clone(), offset: info.offset, len: info.n_bytes as usize };
        let n_bytes = info.n_bytes;
        let id = self.backend.upload_weight(desc, data)?;
        self.progress(n_bytes);
        Ok(id)
    }

    /// The first `rows` rows of a 2-D tensor of shape `expected`, as a weight of its own. Its
    /// bytes join the progress total; a tensor uploaded only as this shortlist (`only_rows`: an
    /// untied output head) leaves it.
    fn upload_first_rows(&mut self, name: &str, expected: &[u64], rows: usize, only_rows: bool) -> Result<WeightId> {
        let info = checked_tensor(self.file, name, expected)?;
        let row_len = expected.first().copied().unwrap_or(0) as usize;
        let len = rows * info.ty.row_bytes(row_len)?;
        let desc =
            WeightDesc { name: format!("{name}[..{rows}]"), ty: info.ty, dims: vec![row_len as u64, rows as u64] };
        let data = WeightData { source: self.file.source().clone(), offset: info.offset, len };
        let whole = info.n_bytes;
        let id = self.backend.upload_weight(desc, data)?;
        self.total_bytes = self.total_bytes + len as u64 - if only_rows { whole } else { 0 };
        self.progress(len as u64);
        Ok(id)
    }

    /// The rows `rows` of a 2-D tensor of shape `expected`, in that order, as a weight of its own
    /// named `{name}[{part}]`: lent from the file where they are one run, else copied.
    fn upload_rows(
        &mut self,
        name: &str,
        expected: &[u64],
        part: &str,
        rows: &[std::ops::Range<usize>],
    ) -> Result<WeightId> {
        let info = checked_tensor(self.file, name, expected)?;
        let row_len = expected.first().copied().unwrap_or(0) as usize;
        let row_bytes = info.ty.row_bytes(row_len)?;
        let n_rows: usize = rows.iter().map(|r| r.len()).sum();
        let desc =
            WeightDesc { name: format!("{name}[{part}]"), ty: info.ty, dims: vec![row_len as u64, n_rows as u64] };
        let data = match rows {
            [run] => WeightData {
                source: self.file.source().clone(),
                offset: info.offset + (run.start * row_bytes) as u64,
                len: run.len() * row_bytes,
            },
            _ => {
                let mut bytes = vec![0u8; n_rows * row_bytes];
                let mut at = 0;
                for run in rows {
                    let len = run.len() * row_bytes;
                    self.file
                        .source()
                        .read_at(info.offset + (run.start * row_bytes) as u64, &mut bytes[at..at + len])?;
                    at += len;
                }
                WeightData { source: Arc::new(MemorySource::new(bytes)), offset: 0, len: n_rows * row_bytes }
            }
        };
        let id = self.backend.upload_weight(desc, data)?;
        self.progress((n_rows * row_bytes) as u64);
        Ok(id)
    }

    /// The rows of a query projection of `n_head` heads of `nope + rope` rows each, split into
    /// every head's first `nope` rows and every head's last `rope` rows.
    fn split_heads(&mut self, name: &str, q_in: u64, n_head: usize, [nope, rope]: [usize; 2]) -> Result<[WeightId; 2]> {
        let expected = [q_in, (n_head * (nope + rope)) as u64];
        let head = |h: usize| h * (nope + rope);
        let nope_rows: Vec<_> = (0..n_head).map(|h| head(h)..head(h) + nope).collect();
        let rope_rows: Vec<_> = (0..n_head).map(|h| head(h) + nope..head(h + 1)).collect();
        Ok([
            self.upload_rows(name, &expected, "nope", &nope_rows)?,
            self.upload_rows(name, &expected, "rope", &rope_rows)?,
        ])
    }

    /// A layer's MLA matrices (see [`LatentWeights`]).
    fn latent(&mut self, il: usize, cfg: &ModelConfig, mla: &MlaConfig) -> Result<LatentWeights> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let (e, h) = (cfg.n_embd as u64, cfg.n_head as u64);
        let (kv_lora, qk_rope) = (mla.kv_lora, mla.qk_rope);
        let parts = [mla.qk_nope, qk_rope];
        let (q_a, [q_nope, q_rope]) = if mla.q_lora > 0 {
            let q_lora = mla.q_lora as u64;
            let q_a = (
                self.upload(&n("attn_q_a.weight"), &[e, q_lora])?,
                self.upload(&n("attn_q_a_norm.weight"), &[q_lora])?,
            );
            (Some(q_a), self.split_heads(&n("attn_q_b.weight"), q_lora, cfg.n_head, parts)?)
        } else {
            (None, self.split_heads(&n("attn_q.weight"), e, cfg.n_head, parts)?)
        };
        let kv_a = n("attn_kv_a_mqa.weight");
        let kv_a_dims = [e, (kv_lora + qk_rope) as u64];
        Ok(LatentWeights {
            q_a,
            q_nope,
            q_rope,
            latent: self.upload_rows(&kv_a, &kv_a_dims, "latent", std::slice::from_ref(&(0..kv_lora)))?,
            k_rope: self.upload_rows(&kv_a, &kv_a_dims, "rope", std::slice::from_ref(&(kv_lora..kv_lora + qk_rope)))?,
            latent_norm: self.upload(&n("attn_kv_a_norm.weight"), &[kv_lora as u64])?,
            k_b: self.upload(&n("attn_k_b.weight"), &[mla.qk_nope as u64, kv_lora as u64, h])?,
            v_b: self.upload(&n("attn_v_b.weight"), &[kv_lora as u64, mla.v_head as u64, h])?,
        })
    }

    fn progress(&mut self, uploaded: u64) {
        self.done_bytes += uploaded;
        (self.on_progress)(self.done_bytes, self.total_bytes);
    }

    /// The SwiGLU matrices `{prefix}ffn_{gate,up,down}{suffix}.weight` of an FFN `n_ff` wide.
    fn dense_ffn(&mut self, prefix: &str, suffix: &str, n_embd: u64, n_ff: u64) -> Result<DenseFfn> {
        let name = |m: &str| format!("{prefix}ffn_{m}{suffix}.weight");
        Ok(DenseFfn {
            gate: self.upload(&name("gate"), &[n_embd, n_ff])?,
            up: self.upload(&name("up"), &[n_embd, n_ff])?,
            down: self.upload(&name("down"), &[n_ff, n_embd])?,
        })
    }

    fn optional(&mut self, name: &str, expected: &[u64]) -> Result<Option<WeightId>> {
        if self.file.tensor(name).is_none() {
            return Ok(None);
        }
        self.upload(name, expected).map(Some)
    }

    /// A projection's bias: required where the architecture always has one, otherwise used when
    /// the file holds it (as llama.cpp does for every architecture).
    fn bias(&mut self, required: bool, name: &str, expected: &[u64]) -> Result<Option<WeightId>> {
        if required {
            self.upload(name, expected).map(Some)
        } else {
            self.optional(name, expected)
        }
    }

    fn required_if(&mut self, present: bool, name: &str, expected: &[u64]) -> Result<Option<WeightId>> {
        if present {
            self.upload(name, expected).map(Some)
        } else {
            Ok(None)
        }
    }
}

impl ModelWeights {
    /// Uploads every tensor the architecture needs. `on_progress(done_bytes, total_bytes)`.
    pub fn upload(
        cfg: &ModelConfig,
        file: &GgufFile,
        backend: &mut dyn Backend,
        on_progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let total_bytes = file.tensors.iter().map(|t| t.n_bytes).sum();
        let mut up = Uploader { file, backend, on_progress, done_bytes: 0, total_bytes };
        let (e, v) = (cfg.n_embd as u64, cfg.n_vocab as u64);
        let q_width = (cfg.n_head * cfg.head_dim) as u64;
        let kv_width = (cfg.n_head_kv * cfg.head_dim) as u64;
        let (hd, ff) = (cfg.head_dim as u64, cfg.n_ff as u64);
        // A q/k norm's weights span a head, or the whole projection.
        let qk_norm_len = |width: u64| if cfg.qk_norm == QkNorm::WholeRow { width } else { hd };

        let token_embd = up.upload("token_embd.weight", &[e, v])?;
        let output_norm = up.upload("output_norm.weight", &[e])?;
        let output_name = if up.file.tensor("output.weight").is_some() { "output.weight" } else { "token_embd.weight" };
        let output = if cfg.n_logits < cfg.n_vocab {
            // A shortlist: its own tensor of the head's first rows (the embedding keeps them all).
            up.upload_first_rows(output_name, &[e, v], cfg.n_logits, output_name == "output.weight")?
        } else {
            up.optional("output.weight", &[e, v])?.unwrap_or(token_embd)
        };
        let rope_freqs = up.optional("rope_freqs.weight", &[(cfg.n_rot / 2) as u64])?;

        let mut layers = Vec::with_capacity(cfg.n_layer);
        for il in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            let attn_norm = up.upload(&n("attn_norm.weight"), &[e])?;
            let (attn, o_width) = match &cfg.mla {
                Some(mla) => (AttentionWeights::Latent(up.latent(il, cfg, mla)?), (cfg.n_head * mla.v_head) as u64),
                None => {
                    let heads = HeadWeights {
                        wq: up.upload(&n("attn_q.weight"), &[e, q_width])?,
                        wk: up.upload(&n("attn_k.weight"), &[e, kv_width])?,
                        wv: up.upload(&n("attn_v.weight"), &[e, kv_width])?,
                        bq: up.bias(cfg.qkv_bias, &n("attn_q.bias"), &[q_width])?,
                        bk: up.bias(cfg.qkv_bias, &n("attn_k.bias"), &[kv_width])?,
                        bv: up.bias(cfg.qkv_bias, &n("attn_v.bias"), &[kv_width])?,
                        q_norm: up.required_if(
                            cfg.qk_norm != QkNorm::None,
                            &n("attn_q_norm.weight"),
                            &[qk_norm_len(q_width)],
                        )?,
                        k_norm: up.required_if(
                            cfg.qk_norm != QkNorm::None,
                            &n("attn_k_norm.weight"),
                            &[qk_norm_len(kv_width)],
                        )?,
                    };
                    (AttentionWeights::Heads(heads), q_width)
                }
            };
            layers.push(LayerWeights {
                attn_norm,
                attn,
                wo: up.upload(&n("attn_output.weight"), &[o_width, e])?,
                bo: up.optional(&n("attn_output.bias"), &[e])?,
                attn_post_norm: up.required_if(cfg.post_norms, &n("post_attention_norm.weight"), &[e])?,
                attn_sinks: up.required_if(cfg.attn_sinks, &n("attn_sinks.weight"), &[cfg.n_head as u64])?,
                // gpt-oss names its pre-FFN norm as gemma names its post-attention norm.
                ffn_norm: up.upload(
                    &n(if cfg.arch == Arch::GptOss { "post_attention_norm.weight" } else { "ffn_norm.weight" }),
                    &[e],
                )?,
                ffn: match &cfg.moe {
                    Some(moe) if il >= cfg.n_dense_lead => {
                        let (x, fx) = (moe.n_expert as u64, moe.n_ff_expert as u64);
                        FfnWeights::Experts {
                            router: up.upload(&n("ffn_gate_inp.weight"), &[e, x])?,
                            gate: up.upload(&n("ffn_gate_exps.weight"), &[e, fx, x])?,
                            up: up.upload(&n("ffn_up_exps.weight"), &[e, fx, x])?,
                            down: up.upload(&n("ffn_down_exps.weight"), &[fx, e, x])?,
                            biases: match moe.biases {
                                true => Some(ExpertBiases {
                                    router: up.upload(&n("ffn_gate_inp.bias"), &[x])?,
                                    gate: up.upload(&n("ffn_gate_exps.bias"), &[fx, x])?,
                                    up: up.upload(&n("ffn_up_exps.bias"), &[fx, x])?,
                                    down: up.upload(&n("ffn_down_exps.bias"), &[e, x])?,
                                }),
                                false => None,
                            },
                            selection_bias: up.optional(&n("exp_probs_b.bias"), &[x])?,
                            shared: match &moe.shared {
                                Some(shared) => Some(SharedFfn {
                                    ffn: up.dense_ffn(&n(""), "_shexp", e, shared.n_ff as u64)?,
                                    gate: up.required_if(
                                        shared.gate == SharedExpertGate::Sigmoid,
                                        &n("ffn_gate_inp_shexp.weight"),
                                        &[e],
                                    )?,
                                }),
                                None => None,
                            },
                        }
                    }
                    _ => FfnWeights::Dense(up.dense_ffn(&n(""), "", e, ff)?),
                },
                ffn_post_norm: up.required_if(cfg.post_norms, &n("post_ffw_norm.weight"), &[e])?,
            });
        }
        Ok(ModelWeights { token_embd, output_norm, output, rope_freqs, layers })
    }
}
