//! The model file as JS holds it: bytes in JS memory (a `Uint8Array`), or a synchronous range
//! reader `{ byteLength, readAt(offset, length) → Uint8Array }` that the worker builds over a
//! `Blob` (a `File`, or the OPFS-cached copy of a URL) or over HTTP range requests
//! (web/hearth-llm/src/range-reader.js). WebGPU loading reads it range by range — a header
//! window, then each tensor in pieces — so a streamed model is never whole in any memory; the
//! CPU engine copies it into wasm memory once.

use crate::error::WasmError;
use hearth_core::gguf::ByteSource;
use hearth_core::CoreError;
use std::cell::RefCell;
use std::sync::Arc;
use wasm_bindgen::{JsCast, JsValue};

/// Bytes per `readAt` call when the CPU engine copies a streamed model into wasm memory.
const COPY_PIECE_BYTES: u64 = 16 << 20;

pub enum JsModel {
    Bytes(js_sys::Uint8Array),
    Reader(Arc<JsReader>),
}

impl JsModel {
    /// A `Uint8Array`, or an object with a numeric `byteLength` and a `readAt` function.
    pub fn from_js(value: &JsValue) -> Result<Self, WasmError> {
        if let Some(bytes) = value.dyn_ref::<js_sys::Uint8Array>() {
            return Ok(JsModel::Bytes(bytes.clone()));
        }
        let field = |name: &str| js_sys::Reflect::get(value, &JsValue::from_str(name)).unwrap_or(JsValue::UNDEFINED);
        let read_at = field("readAt").dyn_into::<js_sys::Function>().ok();
        let len = field("byteLength").as_f64().filter(|n| n.is_finite() && *n >= 0.0 && n.fract() == 0.0);
        match (read_at, len) {
            (Some(read_at), Some(len)) => Ok(JsModel::Reader(Arc::new(JsReader {
                this: value.clone(),
                read_at,
                len: len as u64,
                failure: RefCell::new(None),
            }))),
            _ => Err(WasmError::bad_request(
                "model",
                "expected a Uint8Array or a reader { byteLength, readAt(offset, length) }",
            )),
        }
    }

    pub fn len(&self) -> u64 {
        match self {
            JsModel::Bytes(bytes) => bytes.length() as u64,
            JsModel::Reader(reader) => reader.len,
        }
    }

    /// The model as a byte source the loader reads range by range (nothing is copied here).
    pub fn source(&self) -> Arc<dyn ByteSource> {
        match self {
            JsModel::Bytes(bytes) => Arc::new(JsBytes { bytes: bytes.clone(), len: bytes.length() as u64 }),
            JsModel::Reader(reader) => reader.clone(),
        }
    }

    /// What a failed read threw, to rethrow as is (see [`JsReader`]).
    pub fn take_failure(&self) -> Option<JsValue> {
        match self {
            JsModel::Bytes(_) => None,
            JsModel::Reader(reader) => reader.failure.borrow_mut().take(),
        }
    }

    /// The whole model in wasm memory (the CPU engine reads weights in place). try_reserve: a
    /// model larger than the wasm heap can grow to is an `out-of-memory` error, not an allocation
    /// abort (which would trap and poison the module).
    pub fn copy_into_wasm(&self, mut on_progress: impl FnMut(u64, u64)) -> Result<Vec<u8>, WasmError> {
        let len = self.len();
        let mut model = Vec::new();
        usize::try_from(len)
            .ok()
            .and_then(|n| model.try_reserve_exact(n).ok())
            .ok_or_else(|| WasmError::OutOfMemory(format!("cannot allocate {} MiB of WebAssembly memory for the model (the wasm32 engine addresses at most 4 GiB in all)", len >> 20)))?;
        model.resize(len as usize, 0);
        match self {
            JsModel::Bytes(bytes) => bytes.copy_to(&mut model),
            JsModel::Reader(reader) => {
                for (index, piece) in model.chunks_mut(COPY_PIECE_BYTES as usize).enumerate() {
                    let offset = index as u64 * COPY_PIECE_BYTES;
                    reader.read_at(offset, piece)?;
                    on_progress(offset + piece.len() as u64, len);
                }
            }
        }
        Ok(model)
    }
}

/// A `Uint8Array` in JS memory: `read_at` copies one range into wasm memory.
struct JsBytes {
    bytes: js_sys::Uint8Array,
    len: u64,
}

impl ByteSource for JsBytes {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> hearth_core::Result<()> {
        let end = offset.checked_add(buf.len() as u64).filter(|&end| end <= self.len);
        let Some(end) = end else {
            return Err(CoreError::Truncated {
                what: "read".into(),
                offset,
                needed: buf.len() as u64,
                file_len: self.len,
            });
        };
        self.bytes.subarray(offset as u32, end as u32).copy_to(buf);
        Ok(())
    }
}

/// A JS range reader. A read that throws keeps the thrown value, so the load can rethrow the
/// reader's own error (e.g. a `network` HearthError) instead of a generic I/O error.
pub struct JsReader {
    this: JsValue,
    read_at: js_sys::Function,
    len: u64,
    failure: RefCell<Option<JsValue>>,
}

// SAFETY: `ByteSource` is Send + Sync for native multithreading. This build is wasm32 without
// atomics: one thread, so the JS handles and the RefCell are never touched from another one.
unsafe impl Send for JsReader {}
unsafe impl Sync for JsReader {}
unsafe impl Send for JsBytes {}
unsafe impl Sync for JsBytes {}

impl ByteSource for JsReader {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> hearth_core::Result<()> {
        if offset.checked_add(buf.len() as u64).is_none_or(|end| end > self.len) {
            return Err(CoreError::Truncated {
                what: "read".into(),
                offset,
                needed: buf.len() as u64,
                file_len: self.len,
            });
        }
        let failed = |message: String| CoreError::io("reading the model", std::io::Error::other(message));
        let result =
            self.read_at.call2(&self.this, &JsValue::from_f64(offset as f64), &JsValue::from_f64(buf.len() as f64));
        let bytes = match result {
            Ok(value) => value
                .dyn_into::<js_sys::Uint8Array>()
                .map_err(|_| failed("readAt did not return a Uint8Array".into()))?,
            Err(thrown) => {
                let message = thrown
                    .dyn_ref::<js_sys::Error>()
                    .map_or_else(|| format!("{thrown:?}"), |e| String::from(e.message()));
                *self.failure.borrow_mut() = Some(thrown);
                return Err(failed(message));
            }
        };
        if bytes.length() as usize != buf.len() {
            return Err(failed(format!("readAt({offset}, {}) returned {} bytes", buf.len(), bytes.length())));
        }
        bytes.copy_to(buf);
        Ok(())
    }
}
