//! The wasm simd128 kernels (the browser's CPU engine) against the scalar reference of
//! `hearth_core::quant`: every dot product bit for bit on random rows of odd block counts, the
//! multi-row and tile paths equal to the one-row kernel bit for bit, the activation quantizers
//! equal to their reference rules, and the f16 scale conversion for every f16 value.
//!
//! wasm32 only; run in node by wasm-bindgen-test-runner (from wasm-bindgen-cli):
//!   CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
//!     cargo test --release --target wasm32-unknown-unknown -p hearth-cpu --test wasm_kernels
#![cfg(all(target_arch = "wasm32", target_feature = "simd128"))]

use half::f16;
use hearth_core::quant::{self, GgmlType};
use hearth_cpu::kernels::{
    detected_isa, has_simd_vec_dot, quantize_activation, vec_dot_rows_with, vec_dot_tile_with, vec_dot_with, Isa,
};
use wasm_bindgen_test::wasm_bindgen_test;

mod common;
use common::Rng;

const SIMD_TYPES: [GgmlType; 4] = [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q6_K];

/// Row lengths: one block, odd block counts (the legacy kernels step 4 blocks at a time, so
/// 1-3 leftover blocks), and the real models' widths.
fn row_lengths(ty: GgmlType) -> Vec<usize> {
    let blocks: &[usize] = if ty.block_len() == 32 { &[1, 3, 5, 7, 20, 28, 61] } else { &[1, 3, 5, 8] };
    blocks.iter().map(|b| b * ty.block_len()).collect()
}

/// Byte offsets of the f16 scale fields in one block.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// Random bytes with random finite f16 scales (some tiny, some subnormal).
fn random_weights(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut row: Vec<u8> = (0..ty.row_bytes(n).expect("whole blocks")).map(|_| rng.next_u32() as u8).collect();
    for block in row.chunks_exact_mut(ty.block_bytes()) {
        for &off in f16_fields(ty) {
            let magnitude = if rng.next_u32().is_multiple_of(8) { 1e-6 } else { 0.05 };
            block[off..off + 2].copy_from_slice(&f16::from_f32(rng.unit() * magnitude).to_le_bytes());
        }
    }
    row
}

/// Random activations with occasional large values (outliers set the block scales).
fn random_activation(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n).map(|i| rng.unit() * if i % 61 == 7 { 30.0 } else { 2.0 }).collect()
}

fn quantized_rows(ty: GgmlType, n: usize, rows: usize, rng: &mut Rng) -> Vec<u8> {
    let act_ty = ty.vec_dot_type();
    let act_row = act_ty.row_bytes(n).expect("act bytes");
    let mut acts = vec![0u8; act_row * rows];
    for a in acts.chunks_exact_mut(act_row) {
        quantize_activation(act_ty, &random_activation(n, rng), a);
    }
    acts
}

#[wasm_bindgen_test]
fn the_wasm_build_dispatches_simd128_for_the_models_weight_types() {
    assert_eq!(detected_isa(), Isa::Simd128);
    for ty in SIMD_TYPES {
        assert!(has_simd_vec_dot(Isa::Simd128, ty), "{ty}");
    }
}

#[wasm_bindgen_test]
fn simd128_dots_equal_the_scalar_reference_bit_for_bit() {
    let mut rng = Rng(42);
    for ty in SIMD_TYPES {
        for n in row_lengths(ty) {
            for _ in 0..4 {
                let w = random_weights(ty, n, &mut rng);
                let a = quantized_rows(ty, n, 1, &mut rng);
                let reference = quant::vec_dot(ty, n, &w, &a).expect("reference");
                let simd = vec_dot_with(Isa::Simd128, ty, n, &w, &a);
                assert_eq!(simd.to_bits(), reference.to_bits(), "{ty} n={n}: {simd} vs {reference}");
                assert_eq!(
                    vec_dot_with(Isa::Scalar, ty, n, &w, &a).to_bits(),
                    reference.to_bits(),
                    "{ty} n={n} scalar"
                );
            }
        }
    }
}

#[wasm_bindgen_test]
fn extreme_codes_equal_the_scalar_reference() {
    // All-ones weight bytes give the largest codes (and Q6_K scales of -1); activations of ±amax
    // give ±127: the i16 products and i32 sums must not overflow.
    let mut rng = Rng(5);
    for ty in SIMD_TYPES {
        let n = 4 * ty.block_len().max(64);
        let mut w = vec![0xffu8; ty.row_bytes(n).expect("bytes")];
        for block in w.chunks_exact_mut(ty.block_bytes()) {
            for &off in f16_fields(ty) {
                block[off..off + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
            }
        }
        for sign in [1.0f32, -1.0] {
            let x: Vec<f32> = (0..n).map(|i| if i % 3 == 0 { sign } else { -sign * rng.unit().abs() }).collect();
            let act_ty = ty.vec_dot_type();
            let mut a = vec![0u8; act_ty.row_bytes(n).expect("act bytes")];
            quantize_activation(act_ty, &x, &mut a);
            let reference = quant::vec_dot(ty, n, &w, &a).expect("reference");
            let simd = vec_dot_with(Isa::Simd128, ty, n, &w, &a);
            assert_eq!(simd.to_bits(), reference.to_bits(), "{ty} sign {sign}: {simd} vs {reference}");
        }
    }
}

#[wasm_bindgen_test]
fn multi_row_and_tile_dots_equal_one_row_dots_bit_for_bit() {
    let mut rng = Rng(1234);
    for ty in SIMD_TYPES {
        for n in row_lengths(ty).into_iter().take(3) {
            let act_row = ty.vec_dot_type().row_bytes(n).expect("act bytes");
            let w_row = ty.row_bytes(n).expect("w bytes");
            // 3 weight rows × 11 activation rows: two passes of 4 rows and one of 3.
            let (n_w, rows) = (3, 11);
            let weights: Vec<u8> = (0..n_w).flat_map(|_| random_weights(ty, n, &mut rng)).collect();
            let acts = quantized_rows(ty, n, rows, &mut rng);
            let mut tile = vec![0f32; n_w * rows];
            vec_dot_tile_with(Isa::Simd128, ty, n, &weights, &acts, &mut tile);
            for (wi, w) in weights.chunks_exact(w_row).enumerate() {
                for count in [rows, 4, 3, 2, 1] {
                    let mut multi = vec![0f32; count];
                    vec_dot_rows_with(Isa::Simd128, ty, n, w, &acts[..count * act_row], &mut multi);
                    for (r, m) in multi.iter().enumerate() {
                        let single = vec_dot_with(Isa::Simd128, ty, n, w, &acts[r * act_row..(r + 1) * act_row]);
                        assert_eq!(m.to_bits(), single.to_bits(), "{ty} n={n} rows={count} row {r}");
                    }
                }
                for r in 0..rows {
                    let single = vec_dot_with(Isa::Simd128, ty, n, w, &acts[r * act_row..(r + 1) * act_row]);
                    assert_eq!(tile[wi * rows + r].to_bits(), single.to_bits(), "{ty} n={n} tile w{wi} r{r}");
                }
            }
        }
    }
}

#[wasm_bindgen_test]
fn f16_scales_convert_as_half_does_for_every_value() {
    // One Q8_0 block per f16 value as its scale, codes all 1, against an activation of scale 1 and
    // codes all 1: the dot is 32 * scale; four values per row (one simd128 step).
    let n = 4 * 32;
    let act: Vec<u8> = (0..4).flat_map(|_| [f16::ONE.to_le_bytes().as_slice(), &[1u8; 32]].concat()).collect();
    for first in (0..=u16::MAX as u32).step_by(4) {
        let w: Vec<u8> =
            (first..first + 4).flat_map(|bits| [(bits as u16).to_le_bytes().as_slice(), &[1u8; 32]].concat()).collect();
        let reference = quant::vec_dot(GgmlType::Q8_0, n, &w, &act).expect("reference");
        let simd = vec_dot_with(Isa::Simd128, GgmlType::Q8_0, n, &w, &act);
        if reference.is_nan() {
            // A NaN's payload is not deterministic in wasm arithmetic; only NaN-ness is.
            assert!(simd.is_nan(), "f16 bits {first:#06x}..: {simd}");
        } else {
            assert_eq!(simd.to_bits(), reference.to_bits(), "f16 bits {first:#06x}..: {simd} vs {reference}");
        }
    }
}

/// The Q8_0 rule of the SIMD quantizers (llama.cpp's, see `kernels::quantize_activation`):
/// `d = amax/127`, `q = round_half_even(x * 127/amax)`.
fn q8_0_expected(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in x.chunks_exact(32) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(amax / 127.0).to_le_bytes());
        out.extend(block.iter().map(|&v| (v * id).round_ties_even() as i8 as u8));
    }
    out
}

#[wasm_bindgen_test]
fn activation_quantizers_equal_their_reference_rules() {
    let mut rng = Rng(9);
    let n = 3 * 256;
    let mut inputs: Vec<Vec<f32>> = (0..6).map(|_| random_activation(n, &mut rng)).collect();
    // Zero blocks, a negative maximum tied in magnitude with a later positive one, exact halves
    // (x * 127/amax lands on .5 for these), and a NaN element.
    let mut special = vec![0f32; n];
    special[256 + 3] = -2.0;
    special[256 + 9] = 2.0;
    for (i, v) in special[512..].iter_mut().enumerate() {
        *v = (i % 9) as f32 * 0.5 - 2.0;
    }
    special[512] = 127.0;
    inputs.push(special.clone());
    special[700] = f32::NAN;
    inputs.push(special);
    for x in &inputs {
        let mut q8k = vec![0u8; GgmlType::Q8_K.row_bytes(n).expect("bytes")];
        let mut reference = q8k.clone();
        quantize_activation(GgmlType::Q8_K, x, &mut q8k);
        quant::quantize_row(GgmlType::Q8_K, x, &mut reference).expect("reference");
        assert_eq!(q8k, reference, "Q8_K");
        let mut q8_0 = vec![0u8; GgmlType::Q8_0.row_bytes(n).expect("bytes")];
        quantize_activation(GgmlType::Q8_0, x, &mut q8_0);
        assert_eq!(q8_0, q8_0_expected(x), "Q8_0");
    }
}

#[wasm_bindgen_test]
fn activations_changed_in_place_are_not_served_from_the_widened_copy() {
    // The kernels keep the last activation rows widened to i16 while later calls pass the same
    // bytes; a buffer rewritten in place (as the engine's activation buffer is) must be re-read.
    let mut rng = Rng(31);
    for ty in SIMD_TYPES {
        let n = 5 * ty.block_len();
        let w = random_weights(ty, n, &mut rng);
        let mut a = quantized_rows(ty, n, 1, &mut rng);
        let last = a.len() - 1;
        for at in [last, a.len() / 2, 3] {
            let before = vec_dot_with(Isa::Simd128, ty, n, &w, &a);
            assert_eq!(before.to_bits(), quant::vec_dot(ty, n, &w, &a).expect("reference").to_bits(), "{ty}");
            a[at] = a[at].wrapping_add(1);
            let after = vec_dot_with(Isa::Simd128, ty, n, &w, &a);
            assert_eq!(after.to_bits(), quant::vec_dot(ty, n, &w, &a).expect("reference").to_bits(), "{ty} byte {at}");
        }
    }
}

#[wasm_bindgen_test]
fn no_activation_rows_give_no_outputs_and_no_panic() {
    let mut rng = Rng(3);
    for ty in SIMD_TYPES {
        let n = ty.block_len();
        let w = random_weights(ty, n, &mut rng);
        let mut out: Vec<f32> = Vec::new();
        vec_dot_tile_with(Isa::Simd128, ty, n, &w, &[], &mut out);
        vec_dot_rows_with(Isa::Simd128, ty, n, &w, &[], &mut out);
        assert!(out.is_empty(), "{ty}");
    }
}
