//! The JS-facing class. `load` and `generate` return Promises (a WebGPU step completes on the JS
//! event loop); every failure reaches JS as an `Error` with hearth's message and a stable `code`
//! property (`WasmError::code`), never a trap.
//! Concurrent `generate` calls run as one continuous batch (see `driver.rs`).

use crate::driver::{drive, DraftRuntime, JsRequest, Loaded, Pending, State};
use crate::error::WasmError;
use crate::gpu::classify;
use crate::host::{BatchStats, EngineHost, ModelInfo, OwnedBytes};
use crate::js;
use crate::source::JsModel;
use hearth_core::backend::{Backend, BackendKind};
use hearth_core::CoreError;
use hearth_wgpu::{DeviceInfo, WgpuBackend, WgpuOptions};
use serde::Serialize;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{future_to_promise, spawn_local};

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
pub(crate) fn js_error(error: WasmError) -> JsValue {
    let value = coded_error(error.code(), &error.to_string());
    // A refused request parameter is named (HearthError.param).
    if let WasmError::Core(hearth_core::CoreError::BadRequest { param: Some(param), .. }) = &error {
        let _ = js_sys::Reflect::set(&value, &JsValue::from_str("param"), &JsValue::from_str(param));
    }
    value
}

pub(crate) fn coded_error(code: &str, message: &str) -> JsValue {
    let error = js_sys::Error::new(message);
    // Setting a property on a fresh Error object cannot fail.
    let _ = js_sys::Reflect::set(&error, &JsValue::from_str("code"), &JsValue::from_str(code));
    error.into()
}

fn busy() -> JsValue {
    coded_error("busy", "the engine is busy generating (cancel or await its requests first)")
}

/// A model on WebGPU or the CPU fallback. State is shared with the Promises `load`/`generate`
/// return, so `cancel()` may be called from inside an `on_chunk` callback while one runs.
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
    /// `options`: `{ n_ctx: 2048, max_batch: 4 }` (the fields of `request::LoadOptions`), or
    /// undefined. `on_progress(done_bytes, total_bytes)`. Resolves to undefined; a reader's own
    /// exception is rethrown as is.
    pub fn load(
        &self,
        model: &JsValue,
        options: JsValue,
        backend: &str,
        on_progress: Option<js_sys::Function>,
    ) -> js_sys::Promise {
        let state = self.state.clone();
        let model = model.clone();
        let options = js::load_options(options);
        let backend = backend.to_string();
        future_to_promise(async move {
            let options = options.map_err(js_error)?;
            let model = JsModel::from_js(&model).map_err(js_error)?;
            // A failed read: rethrow what the reader threw (a `network` error...), else `error`.
            let failed = |error: JsValue| model.take_failure().unwrap_or(error);
            if state.driving.get() {
                return Err(busy());
            }
            *state.loaded.borrow_mut() = None; // free the previous model (and its device) first
            let mut report = |done: u64, total: u64| {
                if let Some(f) = &on_progress {
                    // A throwing progress callback must not abort the load.
                    let _ = f.call2(&JsValue::NULL, &JsValue::from_f64(done as f64), &JsValue::from_f64(total as f64));
                }
            };
            let kind = backend_kind(&backend)?;
            let (gpu, mut fallback_reason) = open_backend(kind).await?;
            let mut on_gpu = None;
            if let Some(gpu) = gpu {
                let watch = gpu.watch();
                let info = gpu.info().clone();
                match EngineHost::load_source(model.source(), &options, Box::new(gpu), &mut report) {
                    Ok(host) => {
                        // Allocation failures of the upload are reported asynchronously.
                        watch.settle().await.map_err(|e| js_error(classify(&watch, WasmError::Core(e.into()))))?;
                        on_gpu = Some(Loaded {
                            host: RefCell::new(host),
                            gpu: Some((watch, info)),
                            fallback_reason: None,
                            draft: RefCell::new(None),
                        });
                    }
                    // 'auto' runs a model the WebGPU kernels cannot (a weight type without a
                    // kernel) on the CPU engine, and says why.
                    Err(WasmError::Core(CoreError::Unsupported { what, .. })) if kind == BackendKind::Auto => {
                        fallback_reason = Some(format!("the WebGPU backend does not support {what}"));
                    }
                    Err(e) => return Err(failed(js_error(classify(&watch, e)))),
                }
            }
            let loaded = match on_gpu {
                Some(loaded) => loaded,
                None => {
                    let model = model.copy_into_wasm(&mut report).map_err(|e| failed(js_error(e)))?;
                    let cpu: Box<dyn Backend> =
                        Box::new(hearth_cpu::CpuBackend::new(None).map_err(|e| js_error(e.into()))?);
                    let host = EngineHost::load(model, &options, cpu, &mut report).map_err(js_error)?;
                    Loaded { host: RefCell::new(host), gpu: None, fallback_reason, draft: RefCell::new(None) }
                }
            };
            {
                let host = loaded.host.borrow();
                state.last_stats.set((host.backend_memory_bytes(), host.batch_stats()));
            }
            *state.loaded.borrow_mut() = Some(Rc::new(loaded));
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Loads a draft model for speculative requests with mode 'draft-model'. It must share the
    /// loaded model's vocabulary (checked before its weights load: code `bad-argument` otherwise).
    /// `model`: as in [`WasmEngine::load`]. `backend`: "webgpu" | "cpu" | "auto", the rules of
    /// `load` (the package passes the target's backend option unless told otherwise). On WebGPU
    /// the draft gets a device of its own, reads its weights range by range like the target, and
    /// its passes are awaited; on the CPU it is copied into wasm memory. Resolves to undefined.
    pub fn load_draft(&self, model: &JsValue, backend: &str, on_progress: Option<js_sys::Function>) -> js_sys::Promise {
        let state = self.state.clone();
        let model = model.clone();
        let backend = backend.to_string();
        future_to_promise(async move {
            let model = JsModel::from_js(&model).map_err(js_error)?;
            let failed = |error: JsValue| model.take_failure().unwrap_or(error);
            if state.driving.get() {
                return Err(busy());
            }
            let loaded = state.loaded.borrow().clone().ok_or_else(|| js_error(WasmError::NotLoaded))?;
            // A draft of another vocabulary is refused from its header, before its weights load.
            let header = hearth_core::gguf::GgufFile::read(model.source()).map_err(|e| failed(js_error(e.into())))?;
            loaded.host.try_borrow().map_err(|_| busy())?.check_draft_vocabulary(&header).map_err(js_error)?;
            drop(header);
            // The host is never borrowed across an await: a `generate` call meanwhile starts the
            // driver, which borrows it.
            let kind = backend_kind(&backend)?;
            let (gpu, mut fallback_reason) = open_backend(kind).await?;
            if state.driving.get() {
                return Err(busy());
            }
            let mut report = |done: u64, total: u64| {
                if let Some(f) = &on_progress {
                    let _ = f.call2(&JsValue::NULL, &JsValue::from_f64(done as f64), &JsValue::from_f64(total as f64));
                }
            };
            let draft = {
                let mut host = loaded.host.try_borrow_mut().map_err(|_| busy())?;
                // The previous draft (and its device) goes first.
                host.unload_draft();
                *loaded.draft.borrow_mut() = None;
                let mut on_gpu = None;
                if let Some(gpu) = gpu {
                    let (watch, info) = (gpu.watch(), gpu.info().clone());
                    match host.load_draft(model.source(), Box::new(gpu), &mut report) {
                        Ok(()) => on_gpu = Some(DraftRuntime { gpu: Some((watch, info)), fallback_reason: None }),
                        // 'auto' runs a draft the WebGPU kernels cannot on the CPU engine, as
                        // for the target model.
                        Err(WasmError::Core(CoreError::Unsupported { what, .. })) if kind == BackendKind::Auto => {
                            fallback_reason = Some(format!("the WebGPU backend does not support {what}"));
                        }
                        Err(e) => return Err(failed(js_error(classify(&watch, e)))),
                    }
                }
                match on_gpu {
                    Some(runtime) => runtime,
                    None => {
                        let bytes = model.copy_into_wasm(&mut report).map_err(|e| failed(js_error(e)))?;
                        let cpu: Box<dyn Backend> =
                            Box::new(hearth_cpu::CpuBackend::new(None).map_err(|e| js_error(e.into()))?);
                        host.load_draft(Arc::new(OwnedBytes(bytes)), cpu, &mut report).map_err(js_error)?;
                        DraftRuntime { gpu: None, fallback_reason }
                    }
                }
            };
            // Allocation failures of a WebGPU upload are reported asynchronously.
            if let Some((watch, _)) = &draft.gpu {
                if let Err(e) = watch.settle().await {
                    if let Ok(mut host) = loaded.host.try_borrow_mut() {
                        host.unload_draft();
                    }
                    return Err(js_error(classify(watch, WasmError::Core(e.into()))));
                }
            }
            *loaded.draft.borrow_mut() = Some(draft);
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Generates for `request`, an OpenAI request object of `kind` "chat" (with `messages`) or
    /// "text" (with `prompt`), plus hearth's `speculative`: decoded into the core's request
    /// schema and checked by its validation, so a refused field rejects with code `bad-argument`
    /// and `param` naming it. `on_chunk(text, choice)` receives each text delta of each choice
    /// (`n` of them, sharing the prompt's KV blocks; choice `i` seeded with the seed + `i`);
    /// returning `false` cancels them all. `key` names the request for [`WasmEngine::cancel`].
    /// Resolves to the choices' reports, an array of objects (`host::Report`) in choice order.
    /// Concurrent calls are batched.
    pub fn generate(&self, kind: &str, request: JsValue, on_chunk: js_sys::Function, key: u32) -> js_sys::Promise {
        let state = self.state.clone();
        let parsed = js::request(kind, request);
        let mut handlers = None;
        let promise = js_sys::Promise::new(&mut |resolve, reject| handlers = Some((resolve, reject)));
        let Some((resolve, reject)) = handlers else { return promise };
        let (input, options) = match parsed {
            Ok(p) => p,
            Err(e) => {
                let _ = reject.call1(&JsValue::NULL, &js_error(e));
                return promise;
            }
        };
        if state.loaded.borrow().is_none() {
            let _ = reject.call1(&JsValue::NULL, &js_error(WasmError::NotLoaded));
            return promise;
        }
        let pending = Pending {
            key,
            seed: (js_sys::Math::random() * 9_007_199_254_740_992.0) as u64,
            now_unix: (js_sys::Date::now() / 1000.0) as i64,
            input,
            options,
        };
        state
            .requests
            .borrow_mut()
            .insert(key, JsRequest { on_chunk, resolve, reject, callback_error: None, reports: Vec::new() });
        state.inbox.borrow_mut().push_back(pending);
        if !state.driving.get() {
            state.driving.set(true);
            spawn_local(drive(state));
        }
        promise
    }

    /// Ends request `key` at the next step boundary, freeing its KV blocks; its Promise resolves
    /// with finish reason `cancelled`.
    pub fn cancel(&self, key: u32) {
        self.state.cancels.borrow_mut().push(key);
    }

    /// Cancels every request.
    pub fn interrupt(&self) {
        let keys: Vec<u32> = self.state.requests.borrow().keys().copied().collect();
        self.state.cancels.borrow_mut().extend(keys);
    }

    /// Frees the model (its wasm memory is kept by the module for reuse; GPU buffers are freed).
    /// `busy` while requests run: cancel and await them first.
    pub fn unload(&self) -> Result<(), JsValue> {
        if self.state.driving.get() {
            return Err(busy());
        }
        *self.state.loaded.borrow_mut() = None;
        Ok(())
    }

    pub fn is_loaded(&self) -> bool {
        self.state.loaded.borrow().is_some()
    }

    /// Test hook: destroys the WebGPU device as a driver reset would (the engine then reports
    /// `device-lost` and must be loaded again). Returns whether there was a device.
    pub fn lose_device_for_test(&self) -> bool {
        match self.state.loaded.borrow().as_ref().and_then(|l| l.gpu.as_ref()) {
            Some((watch, _)) => {
                watch.destroy_device();
                true
            }
            None => false,
        }
    }

    /// The runtime as a [`RuntimeStats`] object.
    pub fn runtime_stats(&self) -> Result<JsValue, JsValue> {
        let loaded = self.state.loaded.borrow().clone();
        let memory = wasm_bindgen::memory().unchecked_into::<js_sys::WebAssembly::Memory>();
        let wasm_memory_bytes = memory.buffer().unchecked_into::<js_sys::ArrayBuffer>().byte_length();
        let gpu = loaded.as_ref().and_then(|l| l.gpu.as_ref());
        // During a step the driver holds the host: report the figures of the last step.
        let host = loaded.as_ref().and_then(|l| l.host.try_borrow().ok());
        let (backend_memory_bytes, batch) = match &host {
            Some(h) => (h.backend_memory_bytes(), h.batch_stats()),
            None => self.state.last_stats.get(),
        };
        // The draft's memory is read while the host is free (the driver holds it during a step).
        let draft_memory = host.as_ref().and_then(|h| h.draft_backend()).map(|(_, bytes)| bytes);
        let draft = loaded.as_ref().and_then(|l| {
            l.draft.borrow().as_ref().map(|d| DraftStats {
                backend: backend_name(d.gpu.is_some()),
                adapter: d.gpu.as_ref().map(|(_, i)| AdapterStats::new(i)),
                fallback_reason: d.fallback_reason.clone(),
                backend_memory_bytes: draft_memory,
            })
        });
        js::to_js(&RuntimeStats {
            backend: backend_name(gpu.is_some()),
            adapter: gpu.map(|(_, i)| AdapterStats::new(i)),
            fallback_reason: loaded.as_ref().and_then(|l| l.fallback_reason.clone()),
            simd128: cfg!(target_feature = "simd128"),
            threads: 1,
            wasm_memory_bytes,
            backend_memory_bytes: loaded.as_ref().map(|_| backend_memory_bytes),
            model: host.as_ref().map(|h| h.info().clone()),
            batch: loaded.as_ref().map(|_| batch),
            draft_model: host.as_ref().is_some_and(|h| h.has_draft()),
            draft,
        })
    }
}

/// What `runtime_stats` reports; a field that does not apply (no model loaded, no adapter) is
/// null.
#[derive(Serialize)]
struct RuntimeStats {
    /// "webgpu" or "cpu-wasm".
    backend: &'static str,
    adapter: Option<AdapterStats>,
    /// backend 'auto' that fell back to the CPU: why.
    fallback_reason: Option<String>,
    simd128: bool,
    threads: u32,
    wasm_memory_bytes: u32,
    backend_memory_bytes: Option<u64>,
    model: Option<ModelInfo>,
    batch: Option<BatchStats>,
    /// Whether a draft model is loaded.
    draft_model: bool,
    draft: Option<DraftStats>,
}

/// Where the draft model runs.
#[derive(Serialize)]
struct DraftStats {
    backend: &'static str,
    adapter: Option<AdapterStats>,
    fallback_reason: Option<String>,
    /// Null while a step holds the engine.
    backend_memory_bytes: Option<u64>,
}

/// The WebGPU adapter as `runtime_stats` reports it.
#[derive(Serialize)]
struct AdapterStats {
    name: String,
    backend: String,
    device_type: String,
    shader_f16: bool,
    subgroups: bool,
    packed_dot: bool,
    gpu_shapes: bool,
    variant: &'static str,
    max_storage_buffer_binding_size: u64,
    max_buffer_size: u64,
}

impl AdapterStats {
    fn new(i: &DeviceInfo) -> Self {
        AdapterStats {
            name: i.adapter_name.clone(),
            backend: i.backend.clone(),
            device_type: i.device_type.clone(),
            shader_f16: i.shader_f16,
            subgroups: i.subgroups,
            packed_dot: i.packed_dot,
            gpu_shapes: i.gpu_shapes,
            variant: i.variant(),
            max_storage_buffer_binding_size: i.max_storage_binding,
            max_buffer_size: i.max_buffer_size,
        }
    }
}

fn backend_name(on_gpu: bool) -> &'static str {
    if on_gpu {
        "webgpu"
    } else {
        "cpu-wasm"
    }
}

/// The backend a JS caller named: "webgpu" (or "wgpu"), "cpu" or "auto".
fn backend_kind(backend: &str) -> Result<BackendKind, JsValue> {
    match BackendKind::parse(backend) {
        Ok(BackendKind::Cuda) | Err(_) => Err(js_error(WasmError::bad_request(
            "backend",
            format!("expected 'webgpu', 'cpu' or 'auto', got '{backend}'"),
        ))),
        Ok(kind) => Ok(kind),
    }
}

/// The WebGPU device for `kind`, or `None` for the CPU engine with why 'auto' fell back. 'webgpu'
/// without a device is `no-webgpu`.
async fn open_backend(kind: BackendKind) -> Result<(Option<WgpuBackend>, Option<String>), JsValue> {
    let auto = kind == BackendKind::Auto;
    Ok(match kind {
        BackendKind::Cpu | BackendKind::Cuda => (None, None),
        _ if !has_navigator_gpu() && auto => (None, Some("navigator.gpu is missing".to_string())),
        _ if !has_navigator_gpu() => return Err(js_error(WasmError::NoWebGpu("navigator.gpu is missing".into()))),
        BackendKind::Wgpu | BackendKind::Auto => match WgpuBackend::new_async(WgpuOptions::default()).await {
            // A software adapter (SwiftShader: Vulkan on the CPU) runs our kernels far
            // slower than the wasm CPU engine (docs/BENCHMARKS.md): 'auto' skips it.
            Ok(gpu) if auto && gpu.info().device_type == "Cpu" => (
                None,
                Some(format!(
                    "the WebGPU adapter is a software renderer ({}); the WebAssembly CPU engine is faster",
                    gpu.info().backend
                )),
            ),
            Ok(gpu) => (Some(gpu), None),
            Err(e) if auto => (None, Some(e.to_string())),
            Err(e) => return Err(js_error(WasmError::NoWebGpu(e.to_string()))),
        },
    })
}

/// Whether this global scope (page or worker) has `navigator.gpu` (checked before wgpu touches it).
fn has_navigator_gpu() -> bool {
    let navigator =
        js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("navigator")).unwrap_or(JsValue::UNDEFINED);
    !navigator.is_undefined()
        && js_sys::Reflect::get(&navigator, &JsValue::from_str("gpu"))
            .is_ok_and(|gpu| !gpu.is_undefined() && !gpu.is_null())
}
