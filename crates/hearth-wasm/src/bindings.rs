//! The JS-facing class. Every method returns `Result<_, JsValue>`: bad bytes, bad JSON, unknown
//! architectures and context overflow reach JS as an `Error` with hearth's message and a stable
//! `code` property (`WasmError::code`), never a trap.

use crate::error::WasmError;
use crate::host::EngineHost;
use crate::request::{LoadOptions, PromptInput, RequestOptions};
use hearth_core::backend::Backend;
use std::cell::{Cell, RefCell};
use wasm_bindgen::prelude::*;

/// Runs once when the module is instantiated: panics (bugs, not input errors: those are
/// `JsError`s) are logged to the console with their message and location before the trap.
#[wasm_bindgen(start)]
pub fn on_start() {
    std::panic::set_hook(Box::new(|info| {
        web_sys::console::error_1(&JsValue::from_str(&format!("hearth-wasm panicked: {info}")));
    }));
}

/// A JS `Error` with hearth's message and a `code` property ([`WasmError::code`]), which the
/// package turns into a `HearthError`.
fn js_error(error: WasmError) -> JsValue {
    coded_error(error.code(), &error.to_string())
}

fn coded_error(code: &str, message: &str) -> JsValue {
    let error = js_sys::Error::new(message);
    // Setting a property on a fresh Error object cannot fail.
    let _ = js_sys::Reflect::set(&error, &JsValue::from_str("code"), &JsValue::from_str(code));
    error.into()
}

fn busy() -> JsValue {
    coded_error("busy", "the engine is busy generating")
}

/// A model on the CPU fallback backend. Methods take `&self` (state in cells) so that
/// `interrupt()` may be called from inside an `on_chunk` callback while `generate` runs.
#[wasm_bindgen]
pub struct WasmEngine {
    host: RefCell<Option<EngineHost>>,
    interrupted: Cell<bool>,
}

impl Default for WasmEngine {
    fn default() -> Self {
        Self::new()
    }
}

#[wasm_bindgen]
impl WasmEngine {
    #[wasm_bindgen(constructor)]
    pub fn new() -> WasmEngine {
        WasmEngine { host: RefCell::new(None), interrupted: Cell::new(false) }
    }

    /// Loads a GGUF model from its bytes (copied once into wasm memory). `options_json`: `{"n_ctx":
    /// 2048, "prefill_chunk": 256}` or "" for defaults. `on_progress(done_bytes, total_bytes)`.
    pub fn load(&self, bytes: &js_sys::Uint8Array, options_json: &str, on_progress: Option<js_sys::Function>) -> Result<(), JsValue> {
        let options = LoadOptions::parse(options_json).map_err(js_error)?;
        let mut slot = self.host.try_borrow_mut().map_err(|_| busy())?;
        *slot = None; // free the previous model before the new one is copied in
        // try_reserve: a model larger than the wasm heap can grow to is an `out-of-memory` error, not
        // an allocation abort (which would trap and poison the module).
        let length = bytes.length() as usize;
        let mut model = Vec::new();
        model.try_reserve_exact(length).map_err(|_| {
            coded_error(
                "out-of-memory",
                &format!("cannot allocate {} MiB of WebAssembly memory for the model (the wasm32 engine addresses at most 4 GiB in all)", length >> 20),
            )
        })?;
        model.resize(length, 0);
        bytes.copy_to(&mut model);
        let backend: Box<dyn Backend> = Box::new(hearth_cpu::CpuBackend::new(None).map_err(|e| js_error(e.into()))?);
        let mut report = |done: u64, total: u64| {
            if let Some(f) = &on_progress {
                // A throwing progress callback must not abort the load.
                let _ = f.call2(&JsValue::NULL, &JsValue::from_f64(done as f64), &JsValue::from_f64(total as f64));
            }
        };
        *slot = Some(EngineHost::load(model, &options, backend, &mut report).map_err(js_error)?);
        Ok(())
    }

    /// Generates for `prompt_json` (a JSON string = raw completion, or a JSON array of chat
    /// messages) with `options_json` (OpenAI-named sampling options). `on_chunk(text)` receives
    /// each text delta; returning `false` interrupts. Returns the report as a JSON string.
    pub fn generate(&self, prompt_json: &str, options_json: &str, on_chunk: &js_sys::Function) -> Result<String, JsValue> {
        let input = PromptInput::parse(prompt_json).map_err(js_error)?;
        let options = RequestOptions::parse(options_json).map_err(js_error)?;
        let mut slot = self.host.try_borrow_mut().map_err(|_| busy())?;
        let host = slot.as_mut().ok_or_else(|| js_error(WasmError::NotLoaded))?;
        self.interrupted.set(false);
        let default_seed = (js_sys::Math::random() * 9_007_199_254_740_992.0) as u64;
        let now_unix = (js_sys::Date::now() / 1000.0) as i64;
        let mut callback_error = None;
        let mut on_text = |delta: &str| {
            if self.interrupted.get() {
                return false;
            }
            match on_chunk.call1(&JsValue::NULL, &JsValue::from_str(delta)) {
                Ok(result) => result != JsValue::FALSE && !self.interrupted.get(),
                Err(e) => {
                    callback_error = Some(e);
                    false
                }
            }
        };
        let report = host.generate(&input, &options, default_seed, Some(now_unix), &mut on_text).map_err(js_error)?;
        if let Some(e) = callback_error {
            let message = e.as_string().or_else(|| js_sys::Error::from(e).message().as_string()).unwrap_or_default();
            return Err(coded_error("internal", &format!("on_chunk threw: {message}")));
        }
        serde_json::to_string(&report).map_err(|e| coded_error("internal", &format!("serializing the report: {e}")))
    }

    /// Asks a running `generate` to stop after the current token (call it from `on_chunk`).
    pub fn interrupt(&self) {
        self.interrupted.set(true);
    }

    /// Frees the model (its wasm memory is kept by the module for reuse).
    pub fn unload(&self) -> Result<(), JsValue> {
        let mut slot = self.host.try_borrow_mut().map_err(|_| busy())?;
        *slot = None;
        Ok(())
    }

    pub fn is_loaded(&self) -> bool {
        self.host.try_borrow().map(|h| h.is_some()).unwrap_or(true)
    }

    /// `{"backend": "cpu-wasm", "simd128": bool, "threads": 1, "wasm_memory_bytes": n, "model": {...}}`.
    pub fn runtime_stats(&self) -> Result<String, JsValue> {
        let slot = self.host.try_borrow().map_err(|_| busy())?;
        let memory = wasm_bindgen::memory().unchecked_into::<js_sys::WebAssembly::Memory>();
        let wasm_memory_bytes = memory.buffer().unchecked_into::<js_sys::ArrayBuffer>().byte_length();
        let stats = serde_json::json!({
            "backend": "cpu-wasm",
            "simd128": cfg!(target_feature = "simd128"),
            "threads": 1,
            "wasm_memory_bytes": wasm_memory_bytes,
            "backend_memory_bytes": slot.as_ref().map(|h| h.backend_memory_bytes()),
            "model": slot.as_ref().map(|h| h.info()),
        });
        Ok(stats.to_string())
    }
}
