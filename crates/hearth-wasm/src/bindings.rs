//! The JS-facing class. `load` and `generate` return Promises (a WebGPU step completes on the JS
//! event loop); every failure reaches JS as an `Error` with hearth's message and a stable `code`
//! property (`WasmError::code`), never a trap.

use crate::error::WasmError;
use crate::gpu::classify;
use crate::source::JsModel;
use crate::host::EngineHost;
use crate::request::{LoadOptions, PromptInput, RequestOptions};
use hearth_core::backend::Backend;
use hearth_wgpu::{DeviceInfo, GpuWatch, WgpuBackend, WgpuOptions};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

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

/// A loaded model and what runs it.
struct Loaded {
    host: EngineHost,
    /// WebGPU: the device's fault watch and what was opened.
    gpu: Option<(GpuWatch, DeviceInfo)>,
    /// backend 'auto' that fell back to the CPU: why.
    fallback_reason: Option<String>,
}

impl Loaded {
    /// A failure of a WebGPU step reported with the device's own reason when it has one.
    fn classify(&self, error: WasmError) -> WasmError {
        match &self.gpu {
            Some((watch, _)) => classify(watch, error),
            None => error,
        }
    }
}

#[derive(Default)]
struct State {
    loaded: RefCell<Option<Loaded>>,
    interrupted: Cell<bool>,
}

/// A model on WebGPU or the CPU fallback. State is shared with the Promises `load`/`generate`
/// return, so `interrupt()` may be called from inside an `on_chunk` callback while one runs.
#[wasm_bindgen]
#[derive(Default)]
pub struct WasmEngine {
    state: Rc<State>,
}

#[wasm_bindgen]
impl WasmEngine {
    #[wasm_bindgen(constructor)]
    pub fn new() -> WasmEngine {
        WasmEngine::default()
    }

    /// Loads a GGUF model. `model`: a `Uint8Array`, or a range reader
    /// `{ byteLength, readAt(offset, length) → Uint8Array }` (see source.rs). `backend`: "webgpu"
    /// (fails with code `no-webgpu` without an adapter), "cpu", or "auto" (WebGPU when a device
    /// opens, else CPU). On WebGPU the weights are read tensor by tensor from `model` into GPU
    /// buffers and the model is never copied into wasm memory; the CPU engine copies it once.
    /// `options_json`: `{"n_ctx": 2048}` or "". `on_progress(done_bytes, total_bytes)`. Resolves
    /// to undefined; a reader's own exception is rethrown as is.
    pub fn load(&self, model: &JsValue, options_json: &str, backend: &str, on_progress: Option<js_sys::Function>) -> js_sys::Promise {
        let state = self.state.clone();
        let model = model.clone();
        let options_json = options_json.to_string();
        let backend = backend.to_string();
        future_to_promise(async move {
            let options = LoadOptions::parse(&options_json).map_err(js_error)?;
            let model = JsModel::from_js(&model).map_err(js_error)?;
            // A failed read: rethrow what the reader threw (a `network` error...), else `error`.
            let failed = |error: JsValue| model.take_failure().unwrap_or(error);
            let mut slot = state.loaded.try_borrow_mut().map_err(|_| busy())?;
            *slot = None; // free the previous model (and its device) first
            let mut report = |done: u64, total: u64| {
                if let Some(f) = &on_progress {
                    // A throwing progress callback must not abort the load.
                    let _ = f.call2(&JsValue::NULL, &JsValue::from_f64(done as f64), &JsValue::from_f64(total as f64));
                }
            };
            let (gpu, fallback_reason) = match backend.as_str() {
                "cpu" => (None, None),
                "auto" if !has_navigator_gpu() => (None, Some("navigator.gpu is missing".to_string())),
                "webgpu" if !has_navigator_gpu() => return Err(js_error(WasmError::NoWebGpu("navigator.gpu is missing".into()))),
                "webgpu" | "auto" => match WgpuBackend::new_async(WgpuOptions::default()).await {
                    // A software adapter (SwiftShader: Vulkan on the CPU) runs our kernels far
                    // slower than the wasm CPU engine (docs/BENCHMARKS.md): 'auto' skips it.
                    Ok(gpu) if backend == "auto" && gpu.info().device_type == "Cpu" => {
                        (None, Some(format!("the WebGPU adapter is a software renderer ({}); the WebAssembly CPU engine is faster", gpu.info().backend)))
                    }
                    Ok(gpu) => (Some(gpu), None),
                    Err(e) if backend == "auto" => (None, Some(e.to_string())),
                    Err(e) => return Err(js_error(WasmError::NoWebGpu(e.to_string()))),
                },
                other => return Err(js_error(WasmError::bad_request("backend", format!("expected 'webgpu', 'cpu' or 'auto', got '{other}'")))),
            };
            let loaded = match gpu {
                Some(gpu) => {
                    let watch = gpu.watch();
                    let info = gpu.info().clone();
                    let host = EngineHost::load_source(model.source(), &options, Box::new(gpu), &mut report).map_err(|e| failed(js_error(classify(&watch, e))))?;
                    // Allocation failures of the upload are reported asynchronously.
                    watch.settle().await.map_err(|e| js_error(classify(&watch, WasmError::Core(e.into()))))?;
                    Loaded { host, gpu: Some((watch, info)), fallback_reason }
                }
                None => {
                    let model = model.copy_into_wasm(&mut report).map_err(|e| failed(js_error(e)))?;
                    let cpu: Box<dyn Backend> = Box::new(hearth_cpu::CpuBackend::new(None).map_err(|e| js_error(e.into()))?);
                    Loaded { host: EngineHost::load(model, &options, cpu, &mut report).map_err(js_error)?, gpu: None, fallback_reason }
                }
            };
            *slot = Some(loaded);
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Generates for `prompt_json` (a JSON string = raw completion, or a JSON array of chat
    /// messages) with `options_json` (OpenAI-named sampling options). `on_chunk(text)` receives
    /// each text delta; returning `false` interrupts. Resolves to the report as a JSON string.
    pub fn generate(&self, prompt_json: &str, options_json: &str, on_chunk: js_sys::Function) -> js_sys::Promise {
        let state = self.state.clone();
        let prompt_json = prompt_json.to_string();
        let options_json = options_json.to_string();
        future_to_promise(async move {
            let input = PromptInput::parse(&prompt_json).map_err(js_error)?;
            let options = RequestOptions::parse(&options_json).map_err(js_error)?;
            let mut slot = state.loaded.try_borrow_mut().map_err(|_| busy())?;
            let loaded = slot.as_mut().ok_or_else(|| js_error(WasmError::NotLoaded))?;
            state.interrupted.set(false);
            let default_seed = (js_sys::Math::random() * 9_007_199_254_740_992.0) as u64;
            let now_unix = (js_sys::Date::now() / 1000.0) as i64;
            let mut callback_error = None;
            let mut on_text = |delta: &str| {
                if state.interrupted.get() {
                    return false;
                }
                match on_chunk.call1(&JsValue::NULL, &JsValue::from_str(delta)) {
                    Ok(result) => result != JsValue::FALSE && !state.interrupted.get(),
                    Err(e) => {
                        callback_error = Some(e);
                        false
                    }
                }
            };
            let result = loaded.host.generate_async(&input, &options, default_seed, Some(now_unix), &mut on_text).await;
            let report = result.map_err(|e| js_error(loaded.classify(e)))?;
            if let Some(e) = callback_error {
                let message = e.as_string().or_else(|| js_sys::Error::from(e).message().as_string()).unwrap_or_default();
                return Err(coded_error("internal", &format!("on_chunk threw: {message}")));
            }
            let json = serde_json::to_string(&report).map_err(|e| coded_error("internal", &format!("serializing the report: {e}")))?;
            Ok(JsValue::from_str(&json))
        })
    }

    /// Asks a running `generate` to stop after the current token (call it from `on_chunk`).
    pub fn interrupt(&self) {
        self.state.interrupted.set(true);
    }

    /// Frees the model (its wasm memory is kept by the module for reuse; GPU buffers are freed).
    pub fn unload(&self) -> Result<(), JsValue> {
        let mut slot = self.state.loaded.try_borrow_mut().map_err(|_| busy())?;
        *slot = None;
        Ok(())
    }

    pub fn is_loaded(&self) -> bool {
        self.state.loaded.try_borrow().map(|h| h.is_some()).unwrap_or(true)
    }

    /// `{"backend": "webgpu" | "cpu-wasm", "adapter": {...} | null, "fallback_reason": string |
    /// null, "simd128": bool, "threads": 1, "wasm_memory_bytes": n, "backend_memory_bytes": n,
    /// "model": {...}}`.
    pub fn runtime_stats(&self) -> Result<String, JsValue> {
        let slot = self.state.loaded.try_borrow().map_err(|_| busy())?;
        let memory = wasm_bindgen::memory().unchecked_into::<js_sys::WebAssembly::Memory>();
        let wasm_memory_bytes = memory.buffer().unchecked_into::<js_sys::ArrayBuffer>().byte_length();
        let gpu = slot.as_ref().and_then(|l| l.gpu.as_ref());
        let adapter = gpu.map(|(_, i)| {
            serde_json::json!({
                "name": i.adapter_name,
                "backend": i.backend,
                "device_type": i.device_type,
                "shader_f16": i.shader_f16,
                "subgroups": i.subgroups,
                "variant": i.variant(),
                "max_storage_buffer_binding_size": i.max_storage_binding,
                "max_buffer_size": i.max_buffer_size,
            })
        });
        let stats = serde_json::json!({
            "backend": if gpu.is_some() { "webgpu" } else { "cpu-wasm" },
            "adapter": adapter,
            "fallback_reason": slot.as_ref().and_then(|l| l.fallback_reason.clone()),
            "simd128": cfg!(target_feature = "simd128"),
            "threads": 1,
            "wasm_memory_bytes": wasm_memory_bytes,
            "backend_memory_bytes": slot.as_ref().map(|l| l.host.backend_memory_bytes()),
            "model": slot.as_ref().map(|l| l.host.info()),
        });
        Ok(stats.to_string())
    }
}

/// Whether this global scope (page or worker) has `navigator.gpu` (checked before wgpu touches it).
fn has_navigator_gpu() -> bool {
    let navigator = js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("navigator")).unwrap_or(JsValue::UNDEFINED);
    !navigator.is_undefined() && js_sys::Reflect::get(&navigator, &JsValue::from_str("gpu")).is_ok_and(|gpu| !gpu.is_undefined() && !gpu.is_null())
}
