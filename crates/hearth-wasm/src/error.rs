//! The one error type of `hearth-wasm`; at the JS boundary every variant becomes a `JsError`
//! carrying its message (see `bindings.rs`).

use hearth_core::{CoreError, DeviceFault};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum WasmError {
    /// Model loading, tokenizing, templating or generation failed inside hearth-core.
    #[error("{0}")]
    Core(#[from] CoreError),
    /// Options or messages that do not parse or make no sense.
    #[error("invalid {what}: {message}")]
    BadRequest { what: &'static str, message: String },
    /// `generate` or `runtime_stats` before `load` (or after `unload`).
    #[error("no model is loaded; call load() first")]
    NotLoaded,
    /// backend 'webgpu' was asked for, but no adapter or device could be opened.
    #[error("WebGPU is not available: {0}")]
    NoWebGpu(String),
    /// The GPU device was lost; the engine must be loaded again.
    #[error("the GPU device was lost ({0}); load the model again")]
    DeviceLost(String),
    /// A GPU (or wasm memory) allocation failed.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
}

impl WasmError {
    /// The stable machine-readable code JS sees as `HearthError.code` (see web/hearth-llm/src/errors.js):
    /// `invalid-model` (corrupt or truncated file), `unsupported-model` (a valid GGUF that hearth cannot
    /// run: architecture, tensor type, GGUF version, chat template, or a weight type the chosen
    /// backend has no kernel for), `context-overflow`, `bad-argument`, `not-loaded`, `no-webgpu`,
    /// `device-lost`, `out-of-memory`, `internal` (anything else: a bug or a backend failure).
    pub fn code(&self) -> &'static str {
        use CoreError as C;
        match self {
            WasmError::BadRequest { .. } => "bad-argument",
            WasmError::NotLoaded => "not-loaded",
            WasmError::NoWebGpu(_) => "no-webgpu",
            WasmError::DeviceLost(_) => "device-lost",
            WasmError::OutOfMemory(_) => "out-of-memory",
            WasmError::Core(core) => match core {
                C::BadMagic { .. }
                | C::Truncated { .. }
                | C::LimitExceeded { .. }
                | C::BadValueType { .. }
                | C::BadUtf8 { .. }
                | C::Duplicate { .. }
                | C::BadTensor { .. }
                | C::MissingKey(_)
                | C::WrongType { .. }
                | C::MissingTensor(_)
                | C::ShapeMismatch { .. }
                | C::BadHyperParameter(_)
                | C::Tokenizer(_) => "invalid-model",
                C::UnsupportedVersion(_)
                | C::UnknownTensorType { .. }
                | C::UnknownArchitecture(_)
                | C::UnsupportedTensorType { .. }
                | C::ChatTemplate(_) => "unsupported-model",
                C::Unsupported { .. } => "unsupported-model",
                C::Device { kind: DeviceFault::Lost, .. } => "device-lost",
                C::Device { kind: DeviceFault::OutOfMemory, .. } => "out-of-memory",
                C::ContextOverflow { .. } => "context-overflow",
                C::Constraint { .. } => "grammar-dead-end",
                C::InvalidArgument(_) | C::BadRequest { .. } => "bad-argument",
                _ => "internal",
            },
        }
    }

    pub fn bad_request(what: &'static str, message: impl Into<String>) -> Self {
        WasmError::BadRequest { what, message: message.into() }
    }
}

pub type Result<T, E = WasmError> = std::result::Result<T, E>;
