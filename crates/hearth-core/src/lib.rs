//! Hearth core: everything that is the same on every backend and every platform.
//!
//! - [`gguf`]: bounded GGUF reader over a [`gguf::ByteSource`] (mmap natively, bytes in wasm).
//! - [`quant`]: GGML block formats, reference dequantization and quantized dot products.
//! - [`tokenizer`]: GGUF-described tokenizers on top of HF `tokenizers`, streaming detokenizer.
//! - [`chat`]: chat templates rendered with `minijinja`.
//! - [`model`]: architectures (llama, qwen2, qwen3, gemma3) written once as a [`graph::Graph`].
//! - [`backend`]: the coarse seam every backend implements (upload weights, compile a graph, run a step).
//! - [`kv`]: paged KV cache owned outside the model: block pools, prefix cache, rollback.
//! - [`runner`]: a model + backend + KV pool running steps over batches of sequences.
//! - [`sampling`]: logits processors and samplers.
//! - [`constraint`]: structured output (JSON Schema, regex, Lark) as token masks.
//! - [`scheduler`]: continuous batching of many requests over one runner (the server).
//! - [`engine`]: prompt → tokens loop tying the above together.
//! - [`speculative`]: speculative decoding (draft model or prompt lookup) over any backend.

pub mod backend;
pub mod block_on;
pub mod chat;
pub mod constraint;
pub mod engine;
pub mod error;
pub mod gguf;
pub mod graph;
pub mod kv;
pub mod model;
pub mod offload;
pub mod quant;
pub mod request;
pub mod runner;
pub mod sampling;
pub mod scheduler;
pub mod speculative;
pub mod tokenizer;

pub use error::{CoreError, DeviceFault, Result};
