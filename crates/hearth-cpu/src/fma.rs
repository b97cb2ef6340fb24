//! Runtime FMA dispatch for scalar code. The crate is built for the baseline x86_64 target, where
//! `f32::mul_add` is a call into libm's `fmaf` (correctly rounded, but a call per multiply-add).
//! Functions that need ggml's fused multiply-adds in hot loops (attention, RoPE, SwiGLU) run their
//! bodies through [`with_fma!`], which compiles a second copy with the `fma` and `avx2` target features (so loops also vectorise) and
//! picks it when the CPU has FMA. Both copies compute the same correctly rounded results.

/// Whether this CPU has FMA and AVX2 (always false off x86_64, where the portable copy runs).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline]
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static FMA: OnceLock<bool> = OnceLock::new();
        *FMA.get_or_init(|| is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `with_fma!(body(args...))` calls the `#[inline(always)]` function `body` through a copy compiled
/// with FMA when the CPU has it, otherwise directly.
macro_rules! with_fma {
    ($body:ident($($arg:expr),* $(,)?)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if $crate::fma::available() {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn fused<F: FnOnce() -> R, R>(f: F) -> R {
                    f()
                }
                // SAFETY: FMA is present (checked above).
                unsafe { fused(|| $body($($arg),*)) }
            } else {
                $body($($arg),*)
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            $body($($arg),*)
        }
    }};
}

pub(crate) use with_fma;
