//! The task that runs the browser engine's batch. Concurrent `generate` calls each queue their
//! request; one driver task (`drive`) steps the scheduler until every request has ended, yielding
//! to the event loop between steps so that new requests and cancellations (`cancel(key)`) get in.
//! Cancels and new requests are applied between steps, never during one (a step's future is never
//! dropped half-way).

use crate::bindings::{coded_error, js_error};
use crate::error::WasmError;
use crate::gpu::classify;
use crate::host::{BatchStats, EngineHost, HostEvent, Report};
use crate::request::RequestOptions;
use hearth_core::chat::ToolCallDelta;
use hearth_core::request::Prompt;
use hearth_core::scheduler::RequestId;
use hearth_wgpu::{DeviceInfo, GpuWatch};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

/// A loaded model and what runs it.
pub(crate) struct Loaded {
    /// Borrowed mutably only by the driver (across its awaits) and by load/unload when idle.
    pub host: RefCell<EngineHost>,
    /// WebGPU: the device's fault watch and what was opened.
    pub gpu: Option<(GpuWatch, DeviceInfo)>,
    /// backend 'auto' that fell back to the CPU: why.
    pub fallback_reason: Option<String>,
    /// Where the draft model (held by `host`) runs, once one is loaded.
    pub draft: RefCell<Option<DraftRuntime>>,
}

/// What runs the draft model.
pub(crate) struct DraftRuntime {
    /// WebGPU: its own device's fault watch and what was opened.
    pub gpu: Option<(GpuWatch, DeviceInfo)>,
    /// backend 'auto' that fell back to the CPU: why.
    pub fallback_reason: Option<String>,
}

impl Loaded {
    /// A failure of a WebGPU step reported with the device's own reason when one has it (the
    /// target's device, then the draft's).
    pub fn classify(&self, error: WasmError) -> WasmError {
        let error = match &self.gpu {
            Some((watch, _)) => classify(watch, error),
            None => error,
        };
        if matches!(error, WasmError::DeviceLost(_) | WasmError::OutOfMemory(_)) {
            return error;
        }
        match self.draft.borrow().as_ref().and_then(|d| d.gpu.as_ref()) {
            Some((watch, _)) => classify(watch, error),
            None => error,
        }
    }

    /// Whether a device (the target's or the draft's) has recorded a fault.
    fn device_fault(&self) -> bool {
        let draft = self.draft.borrow();
        let draft_watch = draft.as_ref().and_then(|d| d.gpu.as_ref()).map(|(w, _)| w);
        self.gpu.as_ref().map(|(w, _)| w).into_iter().chain(draft_watch).any(|w| w.check().is_err())
    }

    /// Pokes every device so that a pending loss notification is delivered.
    fn probe_devices(&self) {
        let draft = self.draft.borrow();
        let draft_watch = draft.as_ref().and_then(|d| d.gpu.as_ref()).map(|(w, _)| w);
        for watch in self.gpu.as_ref().map(|(w, _)| w).into_iter().chain(draft_watch) {
            watch.probe();
        }
    }
}

/// A `generate` call waiting to be submitted.
pub(crate) struct Pending {
    pub key: u32,
    pub input: Prompt,
    pub options: RequestOptions,
    pub seed: u64,
    pub now_unix: i64,
}

/// A `generate` call in flight: how to stream to it and settle its Promise.
pub(crate) struct JsRequest {
    /// `on_chunk(text, choice)`.
    pub on_chunk: js_sys::Function,
    pub resolve: js_sys::Function,
    pub reject: js_sys::Function,
    /// What `on_chunk` threw (the request is cancelled and its Promise rejected).
    pub callback_error: Option<JsValue>,
    /// Each choice's report once it has ended; the Promise resolves to them all, in choice order.
    pub reports: Vec<Option<Report>>,
}

#[derive(Default)]
pub(crate) struct State {
    pub loaded: RefCell<Option<Rc<Loaded>>>,
    /// Calls not yet submitted.
    pub inbox: RefCell<VecDeque<Pending>>,
    pub requests: RefCell<HashMap<u32, JsRequest>>,
    /// Scheduler request id → the caller's key and the choice it generates.
    pub keys: RefCell<HashMap<RequestId, (u32, usize)>>,
    pub cancels: RefCell<Vec<u32>>,
    /// The driver task is running.
    pub driving: Cell<bool>,
    /// (backend memory, batch stats) after the last step, for `runtime_stats` during a step.
    pub last_stats: Cell<(u64, BatchStats)>,
}

impl State {
    /// Records that `choice` of `key` ended with `report`; once every choice has, resolves the
    /// Promise to their reports.
    fn finish(&self, key: u32, choice: usize, report: Report) {
        let complete = {
            let mut requests = self.requests.borrow_mut();
            let Some(request) = requests.get_mut(&key) else { return };
            if let Some(slot) = request.reports.get_mut(choice) {
                *slot = Some(report);
            }
            request.reports.iter().all(Option::is_some)
        };
        if complete {
            self.settle(key, Ok(()));
        }
    }

    /// Fails the whole request of `key`: its other choices are cancelled.
    fn fail(&self, host: &mut EngineHost, key: u32, error: JsValue) {
        for id in self.take_ids(key) {
            host.cancel(id);
        }
        self.settle(key, Err(error));
    }

    /// The scheduler requests (choices) of `key`, forgotten here.
    fn take_ids(&self, key: u32) -> Vec<RequestId> {
        let mut keys = self.keys.borrow_mut();
        let ids: Vec<RequestId> = keys.iter().filter(|(_, &(k, _))| k == key).map(|(&id, _)| id).collect();
        for id in &ids {
            keys.remove(id);
        }
        ids
    }

    /// Resolves (the choices' reports, as an array of objects) or rejects the Promise of `key`.
    fn settle(&self, key: u32, result: Result<(), JsValue>) {
        let Some(request) = self.requests.borrow_mut().remove(&key) else { return };
        let reports: Vec<Report> = request.reports.into_iter().flatten().collect();
        let outcome = match (request.callback_error, result) {
            (Some(e), _) => {
                let message =
                    e.as_string().or_else(|| js_sys::Error::from(e).message().as_string()).unwrap_or_default();
                Err(coded_error("internal", &format!("on_chunk threw: {message}")))
            }
            (None, Ok(())) => crate::js::to_js(&reports),
            (None, Err(e)) => Err(e),
        };
        // A throwing then-handler is the caller's; nothing to do here.
        let _ = match outcome {
            Ok(value) => request.resolve.call1(&JsValue::NULL, &value),
            Err(error) => request.reject.call1(&JsValue::NULL, &error),
        };
    }

    /// Streams a delta of `choice` to `key`: text, or a piece of a tool call (`on_chunk("", choice,
    /// {index, name} | {index, arguments})`); a `false` return or a throw cancels the request.
    fn stream(&self, key: u32, choice: usize, delta: &str, tool_call: Option<&ToolCallDelta>) {
        let on_chunk = match self.requests.borrow().get(&key) {
            Some(r) => r.on_chunk.clone(),
            None => return,
        };
        let tool_call = match tool_call {
            Some(ToolCallDelta::Call { index, name }) => {
                crate::js::to_js(&serde_json::json!({"index": index, "name": name})).unwrap_or(JsValue::UNDEFINED)
            }
            Some(ToolCallDelta::Arguments { index, text }) => {
                crate::js::to_js(&serde_json::json!({"index": index, "arguments": text})).unwrap_or(JsValue::UNDEFINED)
            }
            Some(ToolCallDelta::Content(_)) | None => JsValue::UNDEFINED,
        };
        let chunk =
            on_chunk.call3(&JsValue::NULL, &JsValue::from_str(delta), &JsValue::from_f64(choice as f64), &tool_call);
        match chunk {
            Ok(result) if result == JsValue::FALSE => self.cancels.borrow_mut().push(key),
            Ok(_) => {}
            Err(e) => {
                if let Some(r) = self.requests.borrow_mut().get_mut(&key) {
                    r.callback_error = Some(e);
                }
                self.cancels.borrow_mut().push(key);
            }
        }
    }

    fn reject_all_queued(&self, error: impl Fn() -> JsValue) {
        let queued: Vec<u32> = self.inbox.borrow_mut().drain(..).map(|p| p.key).collect();
        for key in queued {
            self.settle(key, Err(error()));
        }
    }
}

/// Steps the batch until no request is left: submits new calls, applies cancels, runs one
/// batched forward pass, streams and settles, then yields to the event loop (on the CPU a step
/// never awaits; without the yield no message or timer could reach the engine).
#[expect(
    clippy::await_holding_refcell_ref,
    reason = "the driver owns the host across a step's awaits; every other user checks `driving` or takes it with try_borrow, and reports busy"
)]
pub(crate) async fn drive(state: Rc<State>) {
    loop {
        let loaded = state.loaded.borrow().clone();
        let Some(loaded) = loaded else {
            state.reject_all_queued(|| js_error(WasmError::NotLoaded));
            break;
        };
        let mut host = loaded.host.borrow_mut();
        submit_queued(&state, &loaded, &mut host);
        apply_cancels(&state, &mut host);
        if host.is_idle() {
            break;
        }
        // Failures are settled after the step, once the device had a chance to say why.
        let mut failed: Vec<(u32, WasmError)> = Vec::new();
        let stepped = host
            .step_async(&mut |event| match event {
                HostEvent::Text { id, delta } => {
                    let choice = state.keys.borrow().get(&id).copied();
                    if let Some((key, choice)) = choice {
                        state.stream(key, choice, &delta, None);
                    }
                }
                HostEvent::ToolCall { id, delta } => {
                    let choice = state.keys.borrow().get(&id).copied();
                    if let Some((key, choice)) = choice {
                        state.stream(key, choice, "", Some(&delta));
                    }
                }
                HostEvent::Finished { id, report } => {
                    let choice = state.keys.borrow_mut().remove(&id);
                    if let Some((key, choice)) = choice {
                        state.finish(key, choice, *report);
                    }
                }
                HostEvent::Failed { id, error } => {
                    let choice = state.keys.borrow_mut().remove(&id);
                    if let Some((key, _)) = choice {
                        failed.push((key, error));
                    }
                }
            })
            .await;
        if !failed.is_empty() || stepped.is_err() {
            wait_for_device_fault(&loaded).await;
        }
        for (key, error) in failed {
            state.fail(&mut host, key, js_error(loaded.classify(error)));
        }
        if let Err(error) = stepped {
            // The scheduler reports request failures as events; this is the backend itself.
            let message = loaded.classify(error);
            let (code, text) = (message.code(), message.to_string());
            let mut keys: Vec<u32> = state.keys.borrow().values().map(|&(key, _)| key).collect();
            keys.sort_unstable();
            keys.dedup();
            for key in keys {
                state.fail(&mut host, key, coded_error(code, &text));
            }
        }
        state.last_stats.set((host.backend_memory_bytes(), host.batch_stats()));
        let done = host.is_idle() && state.inbox.borrow().is_empty();
        drop(host);
        if done {
            // Stop before yielding: the callers of the requests just settled may unload or load
            // as soon as they run, and must not find the engine busy.
            break;
        }
        yield_to_event_loop().await;
    }
    state.driving.set(false);
}

fn submit_queued(state: &State, loaded: &Loaded, host: &mut EngineHost) {
    let queued: Vec<Pending> = state.inbox.borrow_mut().drain(..).collect();
    for p in queued {
        match host.submit(&p.input, &p.options, p.seed, Some(p.now_unix)) {
            Ok(ids) => {
                if let Some(request) = state.requests.borrow_mut().get_mut(&p.key) {
                    request.reports = ids.iter().map(|_| None).collect();
                }
                let mut keys = state.keys.borrow_mut();
                for (choice, id) in ids.into_iter().enumerate() {
                    keys.insert(id, (p.key, choice));
                }
            }
            Err(e) => state.settle(p.key, Err(js_error(loaded.classify(e)))),
        }
    }
}

fn apply_cancels(state: &State, host: &mut EngineHost) {
    let cancels: Vec<u32> = state.cancels.borrow_mut().drain(..).collect();
    for key in cancels {
        // Every choice still running ends now, with what it has (finish reason `cancelled`).
        let choices: Vec<(RequestId, usize)> =
            state.keys.borrow().iter().filter(|(_, &(k, _))| k == key).map(|(&id, &(_, c))| (id, c)).collect();
        for (id, choice) in choices {
            state.keys.borrow_mut().remove(&id);
            if let Some(report) = host.cancel(id) {
                state.finish(key, choice, report);
            }
        }
    }
}

/// How long a failed WebGPU step waits for the device's own reason: turns of this many ms.
const FAULT_WAIT_TURNS: usize = 100;
const FAULT_WAIT_MS: f64 = 50.0;

/// After a failed WebGPU step: the browser may reject the step's buffer mapping before it
/// delivers the device-lost notification (seen with `device.destroy()` between two short steps on
/// SwiftShader: the notification came 1.4 s later), so poke the devices (target and draft) and give
/// the callback up to five seconds to record the loss before the failure is classified.
async fn wait_for_device_fault(loaded: &Loaded) {
    let on_gpu = loaded.gpu.is_some() || loaded.draft.borrow().as_ref().is_some_and(|d| d.gpu.is_some());
    if !on_gpu {
        return;
    }
    for _ in 0..FAULT_WAIT_TURNS {
        if loaded.device_fault() {
            return;
        }
        loaded.probe_devices();
        sleep_ms(FAULT_WAIT_MS).await;
    }
}

/// Resolves on a later task of the event loop (`setTimeout(0)`), letting queued messages,
/// callbacks and timers run.
async fn yield_to_event_loop() {
    sleep_ms(0.0).await;
}

/// Resolves after `ms` milliseconds (`setTimeout`); at once where there is no `setTimeout`.
async fn sleep_ms(ms: f64) {
    let promise = js_sys::Promise::new(&mut |resolve, _reject| {
        let global = js_sys::global();
        let set_timeout = js_sys::Reflect::get(&global, &JsValue::from_str("setTimeout"))
            .ok()
            .and_then(|f| f.dyn_into::<js_sys::Function>().ok());
        let scheduled = set_timeout.is_some_and(|f| f.call2(&global, &resolve, &JsValue::from_f64(ms)).is_ok());
        if !scheduled {
            let _ = resolve.call0(&JsValue::NULL);
        }
    });
    let _ = JsFuture::from(promise).await;
}
