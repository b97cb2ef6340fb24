//! Adapter and device setup. Opening is async (a browser resolves `requestAdapter` /
//! `requestDevice` on its event loop); natively `open` blocks on it with pollster.

use crate::WgpuError;
use std::sync::{Arc, Mutex};

/// How to open the GPU. `from_env` reads `HEARTH_WGPU_NO_F16=1`, `HEARTH_WGPU_NO_SUBGROUPS=1`,
/// `HEARTH_WGPU_NO_DOT4=1`, `HEARTH_WGPU_PROFILE=1` and `HEARTH_WGPU_SHAPES=gpu|cpu|auto`.
#[derive(Clone, Debug, Default)]
pub struct WgpuOptions {
    /// Do not request `shader-f16` even when the adapter has it: the kernels then read f16
    /// values with `unpack2x16float` (the `f32` / `subgroups` variants; same results).
    pub no_f16: bool,
    /// Do not request subgroup operations even when the adapter has them: reductions then go
    /// through shared-memory trees.
    pub no_subgroups: bool,
    /// Do not use WGSL's `dot4I8Packed` even where the implementation offers it: the 8-bit
    /// mat-mul then unpacks bytes with shifts (same integer sums).
    pub no_packed_dot: bool,
    /// Time every dispatch with GPU timestamps (`Backend::kernel_profile`), where the adapter has
    /// timestamps inside compute passes (natively; not in browsers). Costs a wait per step.
    pub profile: bool,
    /// Caps the bytes bound per weight buffer below the device limit, so tests can exercise the
    /// row-range split of large tensors with small ones.
    pub max_binding_bytes: Option<u64>,
    /// The kind of adapter the kernels are shaped for.
    pub kernel_shapes: KernelShapes,
}

/// What the kernels are shaped for. On a GPU, dispatches and memory latency cost the most: sibling
/// mat-muls (q/k/v, gate/up; same input, one weight type) run in one dispatch (matmul_q8.wgsl
/// SEGMENTS), and attention cuts shorter splits and issues its loads several at a time
/// (attention.wgsl GPU_SHAPES). On a CPU adapter (lavapipe, SwiftShader) every instruction and
/// register costs while dispatches and latency barely do: siblings one dispatch each (the fused
/// kernel measured about 10% slower there), attention's loads one at a time (the batched ones
/// measured 1.8x slower). Results are the same bits either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelShapes {
    /// By the adapter's device type.
    #[default]
    Auto,
    Gpu,
    Cpu,
}

impl WgpuOptions {
    #[cfg(not(target_arch = "wasm32"))]
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The options the variables `var` finds say (see [`WgpuOptions::from_env`]).
    #[cfg(not(target_arch = "wasm32"))]
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let on = |name: &str| var(name).is_some_and(|v| v == "1");
        WgpuOptions {
            no_f16: on("HEARTH_WGPU_NO_F16"),
            no_subgroups: on("HEARTH_WGPU_NO_SUBGROUPS"),
            no_packed_dot: on("HEARTH_WGPU_NO_DOT4"),
            profile: on("HEARTH_WGPU_PROFILE"),
            max_binding_bytes: None,
            kernel_shapes: match var("HEARTH_WGPU_SHAPES").as_deref() {
                Some("gpu") => KernelShapes::Gpu,
                Some("cpu") => KernelShapes::Cpu,
                Some("auto") | None => KernelShapes::Auto,
                Some(other) => {
                    eprintln!("HEARTH_WGPU_SHAPES={other} is not one of gpu, cpu, auto: using auto");
                    KernelShapes::Auto
                }
            },
        }
    }
}

/// What was opened and which optional features are in use.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub adapter_name: String,
    pub backend: String,
    pub device_type: String,
    pub shader_f16: bool,
    pub subgroups: bool,
    /// WGSL's `packed_4x8_integer_dot_product` language feature (`dot4I8Packed`) is in use:
    /// natively always (Naga emits the device's integer dot product, or its own expansion), in a
    /// browser where `navigator.gpu.wgslLanguageFeatures` lists it.
    pub packed_dot: bool,
    /// Dispatches are timed (`WgpuOptions::profile` on an adapter that can).
    pub timestamps: bool,
    /// The kernels are shaped for a GPU (`WgpuOptions::kernel_shapes` resolved; `KernelShapes`).
    pub gpu_shapes: bool,
    pub max_storage_binding: u64,
    pub max_buffer_size: u64,
}

impl DeviceInfo {
    /// The kernel variant in use: "f16+subgroups", "f16", "subgroups" or "f32".
    pub fn variant(&self) -> &'static str {
        match (self.shader_f16, self.subgroups) {
            (true, true) => "f16+subgroups",
            (true, false) => "f16",
            (false, true) => "subgroups",
            (false, false) => "f32",
        }
    }

    /// The shader defines of the variant (see `shaders/`): `SHADER_F16`, `SUBGROUPS` (and in a
    /// browser `SUBGROUPS_DIRECTIVE`), `DOT4`, `GPU_SHAPES`.
    pub fn defines(&self) -> Vec<&'static str> {
        let mut defines = Vec::new();
        if self.shader_f16 {
            defines.push("SHADER_F16");
        }
        if self.subgroups {
            defines.push("SUBGROUPS");
            // WGSL goes to the browser's compiler as written there; natively Naga takes it.
            if cfg!(target_arch = "wasm32") {
                defines.push("SUBGROUPS_DIRECTIVE");
            }
        }
        if self.packed_dot {
            defines.push("DOT4");
        }
        if self.gpu_shapes {
            defines.push("GPU_SHAPES");
        }
        defines
    }
}

pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: DeviceInfo,
    /// Largest weight chunk bound at once (bytes, multiple of 4).
    pub max_binding: u64,
    /// The first error the device reported outside an error scope, or its loss.
    pub faults: FaultWatch,
}

/// The first device loss or uncaptured error (in a browser, where error scopes cannot be popped
/// synchronously, allocation and validation errors arrive here). Shared with the device's
/// callbacks; cloned to callers who want to check after an async wait.
#[derive(Clone, Default)]
pub struct FaultWatch(Arc<Mutex<Option<WgpuError>>>);

impl FaultWatch {
    fn record(&self, error: WgpuError) {
        if let Ok(mut slot) = self.0.lock() {
            slot.get_or_insert(error);
        }
    }

    /// The recorded fault, if any. A lost device stays lost: it is reported again on every call.
    pub fn check(&self) -> Result<(), WgpuError> {
        let slot = self.0.lock().map_err(|_| WgpuError::Execution("fault watch poisoned".into()))?;
        match &*slot {
            None => Ok(()),
            Some(WgpuError::DeviceLost(m)) => Err(WgpuError::DeviceLost(m.clone())),
            Some(WgpuError::OutOfMemory(m)) => Err(WgpuError::OutOfMemory(m.clone())),
            Some(other) => Err(WgpuError::Execution(other.to_string())),
        }
    }
}

/// Where a browser's uncaptured errors and device loss go.
fn watch(device: &wgpu::Device) -> FaultWatch {
    let faults = FaultWatch::default();
    let sink = faults.clone();
    device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
        sink.record(match error {
            wgpu::Error::OutOfMemory { .. } => WgpuError::OutOfMemory(error.to_string()),
            other => WgpuError::Execution(other.to_string()),
        })
    }));
    let sink = faults.clone();
    device.set_device_lost_callback(move |reason, message| {
        sink.record(WgpuError::DeviceLost(format!("{reason:?}: {message}")))
    });
    faults
}

/// The adapter, with whether its WGSL implementation has `dot4I8Packed`.
pub(crate) async fn request_adapter_async() -> Result<(wgpu::Adapter, bool), WgpuError> {
    #[cfg(not(target_arch = "wasm32"))]
    let descriptor = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    // In the browser: navigator.gpu only (no WebGL fallback: our kernels need compute).
    #[cfg(target_arch = "wasm32")]
    let descriptor = wgpu::InstanceDescriptor {
        backends: wgpu::Backends::BROWSER_WEBGPU,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    };
    let instance = wgpu::Instance::new(descriptor);
    let packed_dot = instance.wgsl_language_features().contains(wgpu::WgslLanguageFeatures::Packed4x8IntegerDotProduct);
    let adapter = instance
        .request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            ..Default::default()
        })
        .await
        .map_err(|e| WgpuError::NoAdapter(e.to_string()))?;
    Ok((adapter, packed_dot))
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn request_adapter() -> Result<(wgpu::Adapter, bool), WgpuError> {
    pollster::block_on(request_adapter_async())
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn open(options: &WgpuOptions) -> Result<Gpu, WgpuError> {
    pollster::block_on(open_async(options))
}

/// The adapter for a unit test that needs a device: without one the test fails unless
/// `HEARTH_ALLOW_NO_GPU=1` (then `None`, after a loud message); `HEARTH_REQUIRE_GPU=1` makes it fail
/// regardless. The integration tests' `common::open` applies the same rule to a whole backend.
#[cfg(all(test, not(target_arch = "wasm32")))]
pub(crate) fn open_for_test() -> Option<Gpu> {
    match open(&WgpuOptions::default()) {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            let require = std::env::var("HEARTH_REQUIRE_GPU").is_ok_and(|v| v == "1");
            let allow = std::env::var("HEARTH_ALLOW_NO_GPU").is_ok_and(|v| v == "1");
            eprintln!("\n!!!!!!!! NO WEBGPU ADAPTER: {e}\n");
            assert!(!require && allow, "no WebGPU adapter: {e}");
            None
        }
    }
}

pub(crate) async fn open_async(options: &WgpuOptions) -> Result<Gpu, WgpuError> {
    let (adapter, packed_dot) = request_adapter_async().await?;
    let packed_dot = packed_dot && !options.no_packed_dot;
    let features = adapter.features();
    let shader_f16 = !options.no_f16 && features.contains(wgpu::Features::SHADER_F16);
    let subgroups = !options.no_subgroups && features.contains(wgpu::Features::SUBGROUP);
    let mut required_features = wgpu::Features::empty();
    if shader_f16 {
        required_features |= wgpu::Features::SHADER_F16;
    }
    if subgroups {
        required_features |= wgpu::Features::SUBGROUP;
    }
    let timestamp_features = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
    let timestamps = options.profile && features.contains(timestamp_features) && cfg!(not(target_arch = "wasm32"));
    if timestamps {
        required_features |= timestamp_features;
    }
    // All the adapter offers: the defaults cap storage bindings at 128 MiB and buffers at 256 MiB.
    let limits = adapter.limits();
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("hearth"),
            required_features,
            required_limits: limits.clone(),
            ..Default::default()
        })
        .await
        .map_err(|e| WgpuError::Device(e.to_string()))?;
    let faults = watch(&device);
    let ai = adapter.get_info();
    let max_storage_binding = limits.max_storage_buffer_binding_size;
    let max_buffer_size = limits.max_buffer_size;
    let mut max_binding = max_storage_binding.min(max_buffer_size);
    if let Some(cap) = options.max_binding_bytes {
        max_binding = max_binding.min(cap);
    }
    let info = DeviceInfo {
        adapter_name: ai.name,
        backend: format!("{:?}", ai.backend),
        device_type: format!("{:?}", ai.device_type),
        shader_f16,
        subgroups,
        packed_dot,
        timestamps,
        gpu_shapes: match options.kernel_shapes {
            KernelShapes::Gpu => true,
            KernelShapes::Cpu => false,
            KernelShapes::Auto => ai.device_type != wgpu::DeviceType::Cpu,
        },
        max_storage_binding,
        max_buffer_size,
    };
    Ok(Gpu { device, queue, info, max_binding: max_binding / 4 * 4, faults })
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::{KernelShapes, WgpuOptions};

    /// Each switch turns on its own option and nothing else; the tests' devices honour the options
    /// (tests/common `open_variants`), so together a switch forces its fallback.
    #[test]
    fn each_environment_switch_sets_its_option() {
        let with = |pairs: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            WgpuOptions::from_vars(move |name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
        };
        let flags = |o: &WgpuOptions| (o.no_f16, o.no_subgroups, o.no_packed_dot, o.profile);
        assert_eq!(flags(&with(&[])), (false, false, false, false));
        assert_eq!(flags(&with(&[("HEARTH_WGPU_NO_F16", "1")])), (true, false, false, false));
        assert_eq!(flags(&with(&[("HEARTH_WGPU_NO_SUBGROUPS", "1")])), (false, true, false, false));
        assert_eq!(flags(&with(&[("HEARTH_WGPU_NO_DOT4", "1")])), (false, false, true, false));
        assert_eq!(flags(&with(&[("HEARTH_WGPU_PROFILE", "1")])), (false, false, false, true));
        assert_eq!(flags(&with(&[("HEARTH_WGPU_NO_F16", "0")])), (false, false, false, false), "only 1 switches on");
        assert_eq!(with(&[]).kernel_shapes, KernelShapes::Auto);
        assert_eq!(with(&[("HEARTH_WGPU_SHAPES", "gpu")]).kernel_shapes, KernelShapes::Gpu);
        assert_eq!(with(&[("HEARTH_WGPU_SHAPES", "cpu")]).kernel_shapes, KernelShapes::Cpu);
        assert_eq!(with(&[("HEARTH_WGPU_SHAPES", "tpu")]).kernel_shapes, KernelShapes::Auto);
    }
}
