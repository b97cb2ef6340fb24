//! WebGPU glue of the bindings: device faults as error codes.

use crate::error::WasmError;
use hearth_wgpu::{GpuWatch, WgpuError};

/// `error` of a WebGPU engine, re-coded when the device recorded why: lost → `device-lost`,
/// failed allocation → `out-of-memory`.
pub fn classify(watch: &GpuWatch, error: WasmError) -> WasmError {
    match watch.check() {
        Err(WgpuError::DeviceLost(m)) => WasmError::DeviceLost(m),
        Err(WgpuError::OutOfMemory(m)) => WasmError::OutOfMemory(m),
        _ => error,
    }
}
