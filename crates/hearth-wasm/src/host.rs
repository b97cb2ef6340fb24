//! The platform-independent half of the bindings: bytes → GGUF → Engine on a backend, and one
//! generation request → a [`Report`]. Plain Rust, so it is tested natively; `bindings.rs` only
//! converts JS values.

use crate::error::{Result, WasmError};
use crate::request::{LoadOptions, PromptInput, RequestOptions};
use hearth_core::backend::Backend;
use hearth_core::engine::{Engine, FinishReason, Generation};
use hearth_core::gguf::{ByteSource, GgufFile};
use hearth_core::tokenizer::Tokenizer;
use serde::Serialize;
use std::sync::Arc;

/// Model bytes owned by wasm memory. `MemorySource` wants an `Arc<[u8]>`, and turning a `Vec` into
/// one copies it: for a model of hundreds of MB that doubles the (never shrinking) wasm heap.
pub struct OwnedBytes(pub Vec<u8>);

impl ByteSource for OwnedBytes {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn slice(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        self.0.get(start..start.checked_add(len)?)
    }
}

/// One finished request: what JS turns into OpenAI `usage` and `finish_reason`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens actually evaluated (the others were reused from the KV cache).
    pub prompt_evaluated: usize,
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub finish_reason: FinishReason,
    pub text: String,
    pub prompt_token_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub seed: u64,
}

impl Report {
    fn new(generation: Generation, seed: u64) -> Self {
        let t = &generation.timings;
        Report {
            prompt_tokens: generation.prompt_tokens.len(),
            completion_tokens: generation.tokens.len(),
            prompt_evaluated: t.prompt_evaluated,
            ttft_ms: t.ttft_ms,
            prefill_tok_s: t.prefill_tok_s,
            decode_tok_s: t.decode_tok_s,
            finish_reason: generation.finish_reason,
            text: generation.text,
            prompt_token_ids: generation.prompt_tokens,
            token_ids: generation.tokens,
            seed,
        }
    }
}

/// Facts about the loaded model for `runtime_stats`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    pub architecture: String,
    pub n_ctx: usize,
    pub n_ctx_train: usize,
    pub n_vocab: usize,
    pub n_layer: usize,
    pub has_chat_template: bool,
    pub file_bytes: u64,
}

pub struct EngineHost {
    engine: Engine,
    info: ModelInfo,
}

impl EngineHost {
    /// Parses `bytes` as GGUF and loads it onto `backend`. `on_progress(done, total)` reports
    /// weight upload in bytes.
    pub fn load(
        bytes: Vec<u8>,
        options: &LoadOptions,
        backend: Box<dyn Backend>,
        on_progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        Self::load_source(Arc::new(OwnedBytes(bytes)), options, backend, on_progress)
    }

    /// [`EngineHost::load`] from any byte source (in the browser on WebGPU: the JS-held file,
    /// read tensor by tensor, never copied whole into wasm memory). The source is dropped when
    /// this returns unless the backend keeps weight views into it (the CPU backend does).
    pub fn load_source(
        source: Arc<dyn ByteSource>,
        options: &LoadOptions,
        backend: Box<dyn Backend>,
        on_progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let engine_options = options.engine_options()?;
        let file_bytes = source.len();
        let file = GgufFile::read(source)?;
        let architecture = file.architecture()?.to_string();
        let engine = Engine::load(&file, backend, &engine_options, on_progress)?;
        let config = engine.session().config();
        let info = ModelInfo {
            architecture,
            n_ctx: engine.session().n_ctx(),
            n_ctx_train: config.n_ctx_train,
            n_vocab: config.n_vocab,
            n_layer: config.n_layer,
            has_chat_template: engine.chat_template().is_some(),
            file_bytes,
        };
        Ok(EngineHost { engine, info })
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn backend_memory_bytes(&self) -> u64 {
        self.engine.session().backend().memory_bytes()
    }

    /// Token ids → text, special tokens included (tests, debugging).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.engine.tokenizer().decode(ids, false).unwrap_or_default()
    }

    /// Prompt text → token ids. Chat prompts are tokenized with special tokens parsed and without
    /// a second BOS when the template already wrote one (as `hearth run --chat` does).
    pub fn tokenize(&self, input: &PromptInput, now_unix: Option<i64>) -> Result<Vec<u32>> {
        let tokenizer = self.engine.tokenizer();
        let ids = match input {
            PromptInput::Text(text) => tokenizer.encode(text, tokenizer.add_bos_default(), true)?,
            PromptInput::Messages(messages) => {
                let template = self.engine.chat_template().ok_or_else(|| {
                    WasmError::bad_request("messages", "this model has no chat template; use a text prompt (completions)")
                })?;
                let template = match now_unix {
                    Some(now) => template.clone().with_now(now),
                    None => template.clone(),
                };
                let text = template.render_json(messages, true, None)?;
                tokenizer.encode(&text, add_bos_for_templated(tokenizer, &text), true)?
            }
        };
        if ids.is_empty() {
            return Err(WasmError::bad_request("prompt", "the prompt is empty"));
        }
        Ok(ids)
    }

    /// Runs one request; `on_text(delta)` streams text, returning false interrupts (the report
    /// then says `cancelled`). Synchronous: [`EngineHost::generate_async`] polled once.
    pub fn generate(
        &mut self,
        input: &PromptInput,
        options: &RequestOptions,
        default_seed: u64,
        now_unix: Option<i64>,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Report> {
        // The inner result is the request's; the outer one fails only if the backend was async.
        hearth_core::block_on::block_on(async { Ok(self.generate_async(input, options, default_seed, now_unix, on_text).await) })?
    }

    /// [`EngineHost::generate`] for backends whose logits arrive later (WebGPU in a browser).
    pub async fn generate_async(
        &mut self,
        input: &PromptInput,
        options: &RequestOptions,
        default_seed: u64,
        now_unix: Option<i64>,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Report> {
        let prompt = self.tokenize(input, now_unix)?;
        let n_ctx = self.engine.session().n_ctx();
        if prompt.len() >= n_ctx {
            return Err(hearth_core::CoreError::ContextOverflow { needed: prompt.len() + 1, capacity: n_ctx }.into());
        }
        let generate_options = options.generate_options(n_ctx - prompt.len(), default_seed)?;
        let seed = generate_options.sampling.seed;
        let generation = self.engine.generate_async(&prompt, &generate_options, on_text).await?;
        Ok(Report::new(generation, seed))
    }
}

/// A template that writes the BOS text itself must not get a second BOS token.
fn add_bos_for_templated(tokenizer: &Tokenizer, text: &str) -> bool {
    if let Some(bos) = tokenizer.bos() {
        let bos_text = String::from_utf8_lossy(&tokenizer.token_bytes(bos)).into_owned();
        if !bos_text.is_empty() && text.starts_with(&bos_text) {
            return false;
        }
    }
    tokenizer.add_bos_default()
}
