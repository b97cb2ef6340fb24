//! Shared by the wgpu tests: opening the backend (never skipping silently), the conformance subject.
#![allow(dead_code)]

use hearth_wgpu::{KernelShapes, WgpuBackend, WgpuOptions};

/// Opens the wgpu backend. Without an adapter the test fails unless `HEARTH_ALLOW_NO_GPU=1`
/// (then it returns None after a loud message); `HEARTH_REQUIRE_GPU=1` makes it fail regardless.
pub fn open(options: WgpuOptions) -> Option<WgpuBackend> {
    match WgpuBackend::new(options) {
        Ok(b) => {
            eprintln!("wgpu adapter: {:?}", b.info());
            Some(b)
        }
        Err(e) => {
            let require = std::env::var("HEARTH_REQUIRE_GPU").is_ok_and(|v| v == "1");
            let allow = std::env::var("HEARTH_ALLOW_NO_GPU").is_ok_and(|v| v == "1");
            eprintln!("\n!!!!!!!! NO WEBGPU ADAPTER: {e}\n!!!!!!!! (install mesa-vulkan-drivers for lavapipe, or set HEARTH_ALLOW_NO_GPU=1 to skip)\n");
            assert!(!require && allow, "no WebGPU adapter: {e}");
            None
        }
    }
}

/// One backend per kernel variant the adapter supports (`DeviceInfo::variant`): `options` as
/// given, then with `shader-f16` and/or subgroups forced off (the last, `f32`, also without
/// `dot4I8Packed`: the plainest WGSL a browser may offer), the kernels shaped for a GPU in the
/// variants with subgroups and for a CPU adapter in the others (`KernelShapes`); the env switches
/// `HEARTH_WGPU_NO_F16=1` / `HEARTH_WGPU_NO_SUBGROUPS=1` / `HEARTH_WGPU_NO_DOT4=1` force them off
/// in all. Each opened
/// device must honour what was asked. Empty only when no adapter opens and that is allowed
/// (see `open`).
pub fn open_variants(options: WgpuOptions) -> Vec<WgpuBackend> {
    let env = WgpuOptions::from_env();
    let mut seen = Vec::new();
    let mut backends = Vec::new();
    for (no_f16, no_subgroups) in [(false, false), (true, false), (false, true), (true, true)] {
        let asked = WgpuOptions {
            no_f16: options.no_f16 || env.no_f16 || no_f16,
            no_subgroups: options.no_subgroups || env.no_subgroups || no_subgroups,
            no_packed_dot: options.no_packed_dot || env.no_packed_dot || (no_f16 && no_subgroups),
            // Both kernel shapes, whatever the adapter would choose.
            kernel_shapes: if no_subgroups { KernelShapes::Cpu } else { KernelShapes::Gpu },
            ..options.clone()
        };
        let Some(backend) = open(asked.clone()) else { return backends };
        let info = backend.info();
        assert!(!(asked.no_f16 && info.shader_f16), "shader-f16 in use although switched off");
        assert!(!(asked.no_subgroups && info.subgroups), "subgroups in use although switched off");
        assert!(!(asked.no_packed_dot && info.packed_dot), "dot4I8Packed in use although switched off");
        if !seen.contains(&info.variant()) {
            seen.push(info.variant());
            backends.push(backend);
        }
    }
    backends
}

#[allow(unused_imports)] // not every test binary uses both
pub use hearth_backend_tests::{case, Rng};

/// The wgpu backend as a conformance subject: one device per kernel variant the adapter offers.
pub struct WgpuSubject(pub WgpuOptions);

impl hearth_backend_tests::Subject for WgpuSubject {
    fn variants(&self) -> Vec<(String, Box<dyn hearth_core::backend::Backend>)> {
        open_variants(self.0.clone())
            .into_iter()
            .map(|b| (b.info().variant().to_string(), Box::new(b) as Box<dyn hearth_core::backend::Backend>))
            .collect()
    }

    /// The options as given with the environment's switches, one device, its kernels shaped for a
    /// GPU unless `HEARTH_WGPU_SHAPES` says otherwise: the whole models run as they run on the
    /// devices they are for, also on a CPU adapter (whose own shapes the browser tests run on
    /// SwiftShader, and the op checks on every variant).
    fn first_variant(&self) -> Option<(String, Box<dyn hearth_core::backend::Backend>)> {
        let env = WgpuOptions::from_env();
        let options = WgpuOptions {
            no_f16: self.0.no_f16 || env.no_f16,
            no_subgroups: self.0.no_subgroups || env.no_subgroups,
            no_packed_dot: self.0.no_packed_dot || env.no_packed_dot,
            profile: self.0.profile || env.profile,
            max_binding_bytes: self.0.max_binding_bytes,
            kernel_shapes: match env.kernel_shapes {
                KernelShapes::Auto => KernelShapes::Gpu,
                chosen => chosen,
            },
        };
        let backend = open(options)?;
        Some((backend.info().variant().to_string(), Box::new(backend)))
    }
}
