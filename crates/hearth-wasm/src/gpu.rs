//! WebGPU glue of the bindings: the model as a JS-held byte source, and device faults as error
//! codes.

use crate::error::WasmError;
use hearth_core::gguf::ByteSource;
use hearth_core::CoreError;
use hearth_wgpu::{GpuWatch, WgpuError};

/// The model file as a JS `Uint8Array` (outside wasm memory). `read_at` copies one range (a
/// header window, one tensor) into wasm memory, so loading onto WebGPU never holds the whole
/// model in the wasm heap.
pub struct JsBytes {
    bytes: js_sys::Uint8Array,
    len: u64,
}

impl JsBytes {
    pub fn new(bytes: js_sys::Uint8Array) -> Self {
        let len = bytes.length() as u64;
        JsBytes { bytes, len }
    }
}

// SAFETY: `ByteSource` is Send + Sync for native multithreading. This build is wasm32 without
// atomics: one thread, so the JS handle is never touched from another one.
unsafe impl Send for JsBytes {}
unsafe impl Sync for JsBytes {}

impl ByteSource for JsBytes {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> hearth_core::Result<()> {
        let end = offset.checked_add(buf.len() as u64).filter(|&end| end <= self.len);
        let Some(end) = end else {
            return Err(CoreError::Truncated { what: "read".into(), offset, needed: buf.len() as u64, file_len: self.len });
        };
        self.bytes.subarray(offset as u32, end as u32).copy_to(buf);
        Ok(())
    }
}

/// `error` of a WebGPU engine, re-coded when the device recorded why: lost → `device-lost`,
/// failed allocation → `out-of-memory`.
pub fn classify(watch: &GpuWatch, error: WasmError) -> WasmError {
    match watch.check() {
        Err(WgpuError::DeviceLost(m)) => WasmError::DeviceLost(m),
        Err(WgpuError::OutOfMemory(m)) => WasmError::OutOfMemory(m),
        _ => error,
    }
}
