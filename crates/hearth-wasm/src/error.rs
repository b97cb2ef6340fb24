//! The one error type of `hearth-wasm`; at the JS boundary every variant becomes a `JsError`
//! carrying its message (see `bindings.rs`).

use hearth_core::CoreError;
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
}

impl WasmError {
    pub fn bad_request(what: &'static str, message: impl Into<String>) -> Self {
        WasmError::BadRequest { what, message: message.into() }
    }
}

pub type Result<T, E = WasmError> = std::result::Result<T, E>;
