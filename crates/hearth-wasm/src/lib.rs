//! Hearth in the browser. `WasmEngine` (wasm32 only, in `bindings`) is a thin JS shell over
//! [`host::EngineHost`], which is plain Rust and tested natively:
//!
//! ```text
//! Uint8Array ──copy──> OwnedBytes ──> GgufFile ──> Engine on Box<dyn Backend> (CpuBackend today;
//!                                                  the WebGPU backend plugs in at the same seam)
//! generate(prompt JSON, options JSON, on_chunk) ──> text deltas ──> report JSON (usage, ids)
//! ```

pub mod error;
pub mod host;
pub mod request;

#[cfg(target_arch = "wasm32")]
mod bindings;

pub use error::{Result, WasmError};
