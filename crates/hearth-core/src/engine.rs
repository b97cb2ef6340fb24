//! The generation loop: prompt → prefill (in chunks) → sample → decode, with the KV cache kept
//! between calls so a chat turn only evaluates what is new.

use crate::backend::{Backend, GraphId};
use crate::chat::ChatTemplate;
use crate::error::{CoreError, Result};
use crate::gguf::GgufFile;
use crate::graph::{LogitsMode, StepInput};
use crate::kv_cache::KvCache;
use crate::model::{Model, ModelConfig};
use crate::sampling::{Sampler, SamplingParams, StopStrings};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::collections::HashMap;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Context size in tokens; 0 = min(training context, 4096).
    pub n_ctx: usize,
    /// Prompt tokens evaluated per forward pass.
    pub prefill_chunk: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions { n_ctx: 0, prefill_chunk: 256 }
    }
}

#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Stop at the model's end-of-generation tokens (true for normal use).
    pub ignore_eos: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The caller's callback asked to stop.
    Cancelled,
    /// The context is full.
    ContextFull,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Timings {
    /// Prompt tokens actually evaluated (the rest came from the KV cache).
    pub prompt_evaluated: usize,
    pub prompt_ms: f64,
    pub ttft_ms: f64,
    pub decode_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    /// Inter-token latencies in ms (decode steps).
    pub itl_ms: Vec<f64>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Generation {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub timings: Timings,
}

/// A model loaded on a backend with its KV cache: evaluates tokens, keeps them in context, rolls
/// back. No tokenizer: speculative decoding and perplexity drive this directly.
pub struct Session {
    backend: Box<dyn Backend>,
    model: Model,
    kv: KvCache,
    /// Tokens whose K/V are in the cache, in order.
    history: Vec<u32>,
    graphs: HashMap<(usize, LogitsMode), GraphId>,
    logits: Vec<f32>,
    prefill_chunk: usize,
}

impl Session {
    /// Loads the weights of `file` onto `backend`. `on_progress(done_bytes, total_bytes)`.
    pub fn load(
        file: &GgufFile,
        mut backend: Box<dyn Backend>,
        options: &EngineOptions,
        on_progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let model = Model::load(file, backend.as_mut(), on_progress)?;
        let n_ctx = match options.n_ctx {
            0 => model.config.n_ctx_train.min(4096),
            n => n,
        };
        let kv = KvCache::new(backend.as_mut(), model.kv_layout(n_ctx))?;
        Ok(Session {
            backend,
            model,
            kv,
            history: Vec::new(),
            graphs: HashMap::new(),
            logits: Vec::new(),
            prefill_chunk: options.prefill_chunk.max(1),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    pub fn n_ctx(&self) -> usize {
        self.kv.capacity()
    }

    /// Positions still free in the context.
    pub fn remaining(&self) -> usize {
        self.kv.remaining()
    }

    /// Tokens currently held in the KV cache.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Bytes of KV memory per token of context.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.kv.bytes_per_token(4)
    }

    /// Forgets everything after the first `len` tokens (rollback for speculative decoding,
    /// regenerate, editing a chat).
    pub fn rollback(&mut self, len: usize) -> Result<()> {
        self.kv.truncate(len)?;
        self.history.truncate(len);
        Ok(())
    }

    pub fn reset(&mut self) {
        self.kv.clear();
        self.history.clear();
    }

    fn graph(&mut self, n_tokens: usize, mode: LogitsMode) -> Result<GraphId> {
        if let Some(&id) = self.graphs.get(&(n_tokens, mode)) {
            return Ok(id);
        }
        let graph = self.model.build_graph(n_tokens, mode);
        let id = self.backend.compile(&graph)?;
        self.graphs.insert((n_tokens, mode), id);
        Ok(id)
    }

    /// Appends `tokens` to the context and returns logits: `[n_vocab]` for the last token
    /// (`LogitsMode::Last`) or `[tokens.len(), n_vocab]` (`LogitsMode::All`).
    pub fn eval(&mut self, tokens: &[u32], mode: LogitsMode) -> Result<&[f32]> {
        if tokens.is_empty() {
            return Err(CoreError::InvalidArgument("eval needs at least one token".into()));
        }
        let n_vocab = self.model.config.n_vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(CoreError::InvalidArgument(format!("token id {bad} is outside the vocabulary of {n_vocab}")));
        }
        self.kv.reserve(tokens.len())?;
        let mut all = Vec::new();
        let mut step_logits = std::mem::take(&mut self.logits);
        for chunk in tokens.chunks(self.prefill_chunk) {
            let graph = self.graph(chunk.len(), mode)?;
            let pos0 = self.kv.len();
            self.backend.execute(graph, self.kv.id(), StepInput { tokens: chunk, pos0 }, &mut step_logits)?;
            self.kv.advance(chunk.len())?;
            self.history.extend_from_slice(chunk);
            if mode == LogitsMode::All {
                all.extend_from_slice(&step_logits);
            }
        }
        self.logits = if mode == LogitsMode::All { all } else { step_logits };
        Ok(&self.logits)
    }
}

/// A [`Session`] plus the tokenizer and chat template: text in, text out.
pub struct Engine {
    session: Session,
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
}

impl Engine {
    /// Loads a model onto `backend`. `on_progress(done_bytes, total_bytes)` reports weight upload.
    pub fn load(
        file: &GgufFile,
        backend: Box<dyn Backend>,
        options: &EngineOptions,
        on_progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let tokenizer = Tokenizer::from_gguf(&file.metadata)?;
        let chat_template = ChatTemplate::from_gguf(&file.metadata)?;
        let session = Session::load(file, backend, options, on_progress)?;
        Ok(Engine { session, tokenizer, chat_template })
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Generates a continuation of `prompt`. Tokens already in the KV cache as a prefix of the
    /// prompt are reused. `on_text(delta)` receives streamed text; returning false cancels.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation> {
        if prompt.is_empty() {
            return Err(CoreError::InvalidArgument("the prompt is empty".into()));
        }
        if prompt.len() >= self.session.n_ctx() {
            return Err(CoreError::ContextOverflow { needed: prompt.len() + 1, capacity: self.session.n_ctx() });
        }
        let start = Instant::now();
        // Keep the longest cached prefix, but always evaluate at least one token to get logits.
        let common = self.session.history.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
        self.session.rollback(common)?;
        let mut logits = self.session.eval(&prompt[common..], LogitsMode::Last)?.to_vec();
        let prompt_ms = ms(start);

        let mut sampler = Sampler::new(options.sampling.clone());
        let mut stops = StopStrings::new(options.stop.clone());
        let mut decoder = StreamDecoder::default();
        let mut tokens = Vec::new();
        let mut text = String::new();
        let mut itl_ms = Vec::new();
        let mut ttft_ms = 0.0;
        let mut last = Instant::now();
        let mut stop_string_hit = false;
        let decode_start = Instant::now();
        let finish = loop {
            if tokens.len() >= options.max_tokens {
                break FinishReason::Length;
            }
            let token = sampler.sample(&mut logits, &self.session.history);
            if tokens.is_empty() {
                ttft_ms = ms(start);
            } else {
                itl_ms.push(ms(last));
            }
            last = Instant::now();
            if !options.ignore_eos && self.tokenizer.is_end_of_generation(token) {
                break FinishReason::Stop;
            }
            tokens.push(token);
            let piece = decoder.push(&self.tokenizer, token);
            let outcome = stops.push(&piece);
            text.push_str(&outcome.emit);
            if !outcome.emit.is_empty() && !on_text(&outcome.emit) {
                break FinishReason::Cancelled;
            }
            if outcome.stopped {
                stop_string_hit = true;
                break FinishReason::Stop;
            }
            if tokens.len() >= options.max_tokens {
                break FinishReason::Length;
            }
            if self.session.remaining() == 0 {
                break FinishReason::ContextFull;
            }
            logits = self.session.eval(&[token], LogitsMode::Last)?.to_vec();
        };
        // Text held back (a partial UTF-8 character, a possible stop-string prefix) is released
        // unless a stop string matched, in which case it belongs to the stop string.
        if !stop_string_hit {
            let rest = stops.push(&decoder.flush());
            let tail = rest.emit + &stops.finish();
            if !tail.is_empty() {
                text.push_str(&tail);
                on_text(&tail);
            }
        }
        let decode_ms = ms(decode_start);
        let n_eval = prompt.len() - common;
        let n_decoded = itl_ms.len();
        Ok(Generation {
            prompt_tokens: prompt.to_vec(),
            tokens,
            text,
            finish_reason: finish,
            timings: Timings {
                prompt_evaluated: n_eval,
                prompt_ms,
                ttft_ms,
                decode_ms,
                prefill_tok_s: per_second(n_eval, prompt_ms),
                decode_tok_s: per_second(n_decoded, itl_ms.iter().sum()),
                itl_ms,
            },
        })
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn per_second(n: usize, ms: f64) -> f64 {
    if ms <= 0.0 {
        0.0
    } else {
        n as f64 / (ms / 1e3)
    }
}
