//! Shared by the wgpu tests: opening the backend (never skipping silently) and a tiny RNG.
#![allow(dead_code)]

use hearth_wgpu::{WgpuBackend, WgpuOptions};

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
/// given, then with `shader-f16` and/or subgroups forced off; the env switches
/// `HEARTH_WGPU_NO_F16=1` / `HEARTH_WGPU_NO_SUBGROUPS=1` force them off in all. Each opened
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
            ..options.clone()
        };
        let Some(backend) = open(asked.clone()) else { return backends };
        let info = backend.info();
        assert!(!(asked.no_f16 && info.shader_f16), "shader-f16 in use although switched off");
        assert!(!(asked.no_subgroups && info.subgroups), "subgroups in use although switched off");
        if !seen.contains(&info.variant()) {
            seen.push(info.variant());
            backends.push(backend);
        }
    }
    backends
}

/// xorshift64*: reproducible test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn below(&mut self, n: u32) -> u32 {
        (self.next_u64() % n as u64) as u32
    }
}

/// Normalised mean squared error of `got` against `want`.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let err: f64 = got.iter().zip(want).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let norm: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    err / norm.max(1e-30)
}

pub mod case;
