//! Hearth in the browser. `WasmEngine` (wasm32 only, in `bindings`) is a thin JS shell over
//! [`host::EngineHost`], which is plain Rust and tested natively:
//!
//! ```text
//! WebGPU: Uint8Array (JS memory) or a JS range reader (Blob / OPFS file / HTTP ranges)
//!         ──JsModel::source, range by range──> GgufFile ──> Engine on WgpuBackend
//! CPU:    the same ──copy──> OwnedBytes ──> GgufFile ──> Engine on CpuBackend
//! generate(kind, request object, on_chunk) ──await──> text deltas ──> report object (usage, ids)
//! ```
//!
//! Requests, load options, reports and stats cross as JS objects, through serde (`js.rs`).

pub mod error;
pub mod host;
pub mod request;

#[cfg(target_arch = "wasm32")]
mod bindings;
#[cfg(target_arch = "wasm32")]
mod driver;
#[cfg(target_arch = "wasm32")]
mod gpu;
#[cfg(target_arch = "wasm32")]
mod js;
#[cfg(target_arch = "wasm32")]
mod source;

pub use error::{Result, WasmError};
