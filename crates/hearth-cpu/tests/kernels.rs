//! SIMD kernels against the scalar reference of `hearth_core::quant` (itself checked against the
//! `gguf` Python package in hearth-core's tests), on random rows of several lengths.

use half::f16;
use hearth_core::quant::{self, GgmlType};
use hearth_cpu::kernels::{
    detected_isa, has_simd_vec_dot, q4k_x16, q4k_x16_available, quantize_activation, vec_dot, vec_dot_q4k_x16,
    vec_dot_rows_with, vec_dot_tile_with, vec_dot_with, Isa, MULTI_ROWS, TILE_WEIGHT_ROWS,
};

mod common;
use common::Rng;

/// Byte offsets of the f16 scale fields in one block of each weight type.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// A random weight row: random bytes with finite random f16 scales (MXFP4: small powers of two;
/// floats for F32/F16/BF16).
fn random_weights(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| rng.unit().to_le_bytes()).collect(),
        GgmlType::F16 => (0..n).flat_map(|_| f16::from_f32(rng.unit() * 4.0).to_le_bytes()).collect(),
        GgmlType::BF16 => (0..n).flat_map(|_| half::bf16::from_f32(rng.unit() * 4.0).to_le_bytes()).collect(),
        _ => {
            let bytes = ty.row_bytes(n).expect("whole blocks");
            let mut row: Vec<u8> = (0..bytes).map(|_| rng.next_u32() as u8).collect();
            for block in row.chunks_exact_mut(ty.block_bytes()) {
                for &off in f16_fields(ty) {
                    block[off..off + 2].copy_from_slice(&f16::from_f32(rng.unit() * 0.05).to_le_bytes());
                }
                if ty == GgmlType::MXFP4 {
                    // An E8M0 scale of 2^-12..2^-5.
                    block[0] = 116 + (rng.next_u32() % 8) as u8;
                }
            }
            row
        }
    }
}

fn random_activation(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n).map(|i| rng.unit() * if i % 61 == 7 { 30.0 } else { 2.0 }).collect()
}

/// Σ|w_i a_i| over the dequantized rows: the scale that rounding errors are measured against.
fn magnitude(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f64 {
    let (mut wf, mut af) = (vec![0f32; n], vec![0f32; n]);
    quant::dequantize_row(ty, w, &mut wf).expect("dequantize weights");
    quant::dequantize_row(ty.vec_dot_type(), a, &mut af).expect("dequantize activation");
    wf.iter().zip(&af).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum()
}

const WEIGHT_TYPES: [GgmlType; GgmlType::WEIGHT_TYPES.len()] = GgmlType::WEIGHT_TYPES;

fn row_lengths(ty: GgmlType) -> Vec<usize> {
    if ty.block_len() == 256 {
        vec![256, 768, 2048, 4864]
    } else {
        vec![32, 96, 256, 896, 4864, 37 * 32 + if ty.block_len() == 1 { 5 } else { 0 }]
    }
}

#[test]
fn simd_vec_dot_matches_reference() {
    let isa = detected_isa();
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
        assert!(matches!(isa, Isa::Avx2 | Isa::Avx512Vnni), "{isa:?}");
    }
    let mut rng = Rng(42);
    let mut simd_types = 0;
    for ty in WEIGHT_TYPES {
        simd_types += has_simd_vec_dot(isa, ty) as usize;
        for n in row_lengths(ty) {
            for trial in 0..4 {
                let w = random_weights(ty, n, &mut rng);
                let act_ty = ty.vec_dot_type();
                let mut a = vec![0u8; act_ty.row_bytes(n).expect("act bytes")];
                quantize_activation(act_ty, &random_activation(n, &mut rng), &mut a);
                let reference = quant::vec_dot(ty, n, &w, &a).expect("reference");
                let fast = vec_dot(ty, n, &w, &a);
                let scale = magnitude(ty, n, &w, &a);
                let err = (fast as f64 - reference as f64).abs();
                assert!(
                    err <= 2e-5 * scale + 1e-30,
                    "{ty} n={n} trial {trial}: simd {fast:e} vs reference {reference:e} (magnitude {scale:e})"
                );
            }
        }
    }
    if isa != Isa::Scalar {
        assert!(simd_types >= 10, "expected AVX2 kernels for most weight types");
    }
}

#[test]
fn scalar_fallback_is_the_reference() {
    let mut rng = Rng(7);
    for ty in WEIGHT_TYPES {
        for n in row_lengths(ty) {
            let w = random_weights(ty, n, &mut rng);
            let act_ty = ty.vec_dot_type();
            let mut a = vec![0u8; act_ty.row_bytes(n).expect("act bytes")];
            quantize_activation(act_ty, &random_activation(n, &mut rng), &mut a);
            let reference = quant::vec_dot(ty, n, &w, &a).expect("reference");
            assert_eq!(vec_dot_with(Isa::Scalar, ty, n, &w, &a).to_bits(), reference.to_bits(), "{ty} n={n}");
        }
    }
}

#[test]
fn zero_rows_give_zero() {
    for ty in WEIGHT_TYPES {
        let n = 512;
        let w = vec![0u8; ty.row_bytes(n).expect("bytes")];
        let act_ty = ty.vec_dot_type();
        let mut a = vec![0u8; act_ty.row_bytes(n).expect("bytes")];
        quantize_activation(act_ty, &vec![1.5; n], &mut a);
        assert_eq!(vec_dot(ty, n, &w, &a), 0.0, "{ty}");
    }
}

#[test]
fn quantize_activation_is_bit_identical_to_reference() {
    let mut rng = Rng(99);
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::F16, GgmlType::BF16, GgmlType::F32] {
        for n in [256, 768, 4864] {
            let mut src = random_activation(n, &mut rng);
            src[3] = 0.0;
            src[100..132].fill(0.0); // an all-zero Q8_0 block
            let bytes = ty.row_bytes(n).expect("bytes");
            let (mut fast, mut reference) = (vec![0u8; bytes], vec![0u8; bytes]);
            quantize_activation(ty, &src, &mut fast);
            quant::quantize_row(ty, &src, &mut reference).expect("reference");
            if matches!(ty, GgmlType::Q8_0 | GgmlType::Q8_1) {
                // llama.cpp's SIMD rounding (×127/amax, ties to even) vs ggml's scalar reference:
                // same scales, codes at most one step apart (only on rounding ties).
                let block = ty.block_bytes();
                let header = block - 32;
                let mut differing = 0;
                for (f, r) in fast.chunks_exact(block).zip(reference.chunks_exact(block)) {
                    assert_eq!(f[..2], r[..2], "{ty} n={n}: scale differs");
                    for (a, b) in f[header..].iter().zip(&r[header..]) {
                        let step = (*a as i8 as i32 - *b as i8 as i32).abs();
                        assert!(step <= 1, "{ty} n={n}: codes {a} vs {b}");
                        differing += step;
                    }
                }
                assert!(differing * 100 < n as i32, "{ty} n={n}: {differing} codes differ, more than ties explain");
            } else {
                assert_eq!(fast, reference, "{ty} n={n}");
            }
        }
    }
}

#[test]
fn wrong_sizes_give_nan_in_release_not_ub() {
    // In debug builds a size mismatch is a caller bug and trips a debug_assert instead.
    if cfg!(debug_assertions) {
        return;
    }
    let w = vec![0u8; GgmlType::Q4_K.row_bytes(256).expect("bytes")];
    let a = vec![0u8; 10];
    assert!(vec_dot(GgmlType::Q4_K, 256, &w, &a).is_nan());
}

/// The ISAs this CPU runs, best last.
fn available_isas() -> Vec<Isa> {
    match detected_isa() {
        Isa::Scalar => vec![Isa::Scalar],
        Isa::Avx2 => vec![Isa::Scalar, Isa::Avx2],
        Isa::Avx512Vnni => vec![Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni],
    }
}

#[test]
fn multi_row_dots_equal_single_row_dots_bit_for_bit() {
    let mut rng = Rng(1234);
    for ty in WEIGHT_TYPES {
        for n in row_lengths(ty) {
            let w = random_weights(ty, n, &mut rng);
            let act_ty = ty.vec_dot_type();
            let act_row = act_ty.row_bytes(n).expect("act bytes");
            // 2 tiles of MULTI_ROWS plus a remainder, so both the tiled and the per-row path run.
            let rows = 2 * MULTI_ROWS + 3;
            let mut acts = vec![0u8; act_row * rows];
            for a in acts.chunks_exact_mut(act_row) {
                quantize_activation(act_ty, &random_activation(n, &mut rng), a);
            }
            for isa in available_isas() {
                let mut out = vec![0f32; rows];
                vec_dot_rows_with(isa, ty, n, &w, &acts, &mut out);
                for (r, a) in acts.chunks_exact(act_row).enumerate() {
                    let single = vec_dot_with(isa, ty, n, &w, a);
                    assert_eq!(
                        out[r].to_bits(),
                        single.to_bits(),
                        "{ty} n={n} {isa:?} row {r}: {} vs {single}",
                        out[r]
                    );
                }
            }
        }
    }
}

/// The VNNI flavour only swaps instructions that produce the same i32 lanes, so it must agree with
/// the AVX2 kernels exactly (the tolerance test above covers AVX2 against the scalar reference).
#[test]
fn vnni_kernels_equal_avx2_kernels_bit_for_bit() {
    if detected_isa() != Isa::Avx512Vnni {
        return;
    }
    let mut rng = Rng(77);
    for ty in WEIGHT_TYPES {
        for n in row_lengths(ty) {
            for _ in 0..4 {
                let w = random_weights(ty, n, &mut rng);
                let act_ty = ty.vec_dot_type();
                let mut a = vec![0u8; act_ty.row_bytes(n).expect("act bytes")];
                quantize_activation(act_ty, &random_activation(n, &mut rng), &mut a);
                let avx2 = vec_dot_with(Isa::Avx2, ty, n, &w, &a);
                let vnni = vec_dot_with(Isa::Avx512Vnni, ty, n, &w, &a);
                assert_eq!(avx2.to_bits(), vnni.to_bits(), "{ty} n={n}: {avx2} vs {vnni}");
            }
        }
    }
}

#[test]
fn extreme_codes_do_not_saturate() {
    // All-ones weight bytes give the largest codes; activations of ±amax give ±127. The i16 pair
    // sums of maddubs must stay in range, so SIMD equals the reference up to float rounding.
    for ty in [GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let n = 512;
        let mut w = vec![0xffu8; ty.row_bytes(n).expect("bytes")];
        for block in w.chunks_exact_mut(ty.block_bytes()) {
            for &off in f16_fields(ty) {
                block[off..off + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
            }
        }
        let act_ty = ty.vec_dot_type();
        let mut a = vec![0u8; act_ty.row_bytes(n).expect("bytes")];
        let x: Vec<f32> = (0..n).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
        quantize_activation(act_ty, &x, &mut a);
        let reference = quant::vec_dot(ty, n, &w, &a).expect("reference");
        for isa in available_isas() {
            let got = vec_dot_with(isa, ty, n, &w, &a);
            let scale = magnitude(ty, n, &w, &a);
            assert!((got as f64 - reference as f64).abs() <= 2e-5 * scale, "{ty} {isa:?}: {got} vs {reference}");
        }
    }
}

#[test]
fn tiled_dots_equal_single_row_dots_bit_for_bit() {
    let mut rng = Rng(4321);
    for ty in WEIGHT_TYPES {
        for n in row_lengths(ty).into_iter().take(3) {
            let w_row = ty.row_bytes(n).expect("row bytes");
            // Odd counts on both sides: full tiles plus remainders (16 + 9 weight rows: Q5_0/Q8_0
            // prefill with VNNI unpacks tiles of 16 rows, then the packed tiles take the rest).
            let n_w = 16 + 4 * TILE_WEIGHT_ROWS + 1;
            let rows = MULTI_ROWS + 3;
            let weights: Vec<u8> = (0..n_w).flat_map(|_| random_weights(ty, n, &mut rng)).collect();
            let act_ty = ty.vec_dot_type();
            let act_row = act_ty.row_bytes(n).expect("act bytes");
            let mut acts = vec![0u8; act_row * rows];
            for a in acts.chunks_exact_mut(act_row) {
                quantize_activation(act_ty, &random_activation(n, &mut rng), a);
            }
            // All rows (token tiles, with remainders of 3, 2 and 1 rows), and a single row
            // (decode, wider weight tiles).
            for (isa, rows) in
                available_isas().into_iter().flat_map(|isa| [(isa, rows), (isa, rows - 1), (isa, rows - 2), (isa, 1)])
            {
                let acts = &acts[..rows * act_row];
                let mut out = vec![0f32; n_w * rows];
                vec_dot_tile_with(isa, ty, n, &weights, acts, &mut out);
                for (wi, wr) in weights.chunks_exact(w_row).enumerate() {
                    for (r, a) in acts.chunks_exact(act_row).enumerate() {
                        let single = vec_dot_with(isa, ty, n, wr, a);
                        let got = out[wi * rows + r];
                        assert_eq!(
                            got.to_bits(),
                            single.to_bits(),
                            "{ty} n={n} {isa:?} w {wi} r {r}: {got} vs {single}"
                        );
                    }
                }
            }
        }
    }
}

/// The verification-sized Q4_K/Q6_K tiles (W weight rows × R activation rows, R up to 8, row
/// counts split into near-equal groups): every row count 1..=19 (odd counts, remainders, groups
/// straddling the 8-row limit; from 16 rows Q4_K's interleaved prefill kernel with its 1-3 row
/// remainders) and 64 (a prefill tile), weight counts that leave remainders of every tile width,
/// short and long rows, under both SIMD flavours; each output against the single-row dot product.
#[test]
fn verification_tiles_equal_single_row_dots_bit_for_bit() {
    let mut rng = Rng(2718);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        for n in [256, 1536, 2304] {
            let w_row = ty.row_bytes(n).expect("row bytes");
            // 16 weight rows (a mat-mul task) plus 3: remainders after tiles of 4, 2 and 1.
            let n_w = 19;
            let weights: Vec<u8> = (0..n_w).flat_map(|_| random_weights(ty, n, &mut rng)).collect();
            let act_ty = ty.vec_dot_type();
            let act_row = act_ty.row_bytes(n).expect("act bytes");
            // 1..=19 rows, and prefill's tile of 64 (8 groups of 8).
            let row_counts = (1..=19).chain([64]);
            let max_rows = 64;
            let mut acts = vec![0u8; act_row * max_rows];
            for a in acts.chunks_exact_mut(act_row) {
                quantize_activation(act_ty, &random_activation(n, &mut rng), a);
            }
            for isa in available_isas() {
                for rows in row_counts.clone() {
                    let acts = &acts[..rows * act_row];
                    for n_w in [n_w, 16, 3, 1] {
                        let weights = &weights[..n_w * w_row];
                        let mut out = vec![f32::NAN; n_w * rows];
                        vec_dot_tile_with(isa, ty, n, weights, acts, &mut out);
                        for (wi, wr) in weights.chunks_exact(w_row).enumerate() {
                            for (r, a) in acts.chunks_exact(act_row).enumerate() {
                                let single = vec_dot_with(isa, ty, n, wr, a);
                                let got = out[wi * rows + r];
                                assert_eq!(
                                    got.to_bits(),
                                    single.to_bits(),
                                    "{ty} n={n} {isa:?} {n_w}x{rows}: w {wi} r {r}: {got} vs {single}"
                                );
                            }
                        }
                    }
                    // And the one-weight-row path (vec_dot_rows), remainders of 1-3 rows included.
                    let mut out = vec![f32::NAN; rows];
                    vec_dot_rows_with(isa, ty, n, &weights[..w_row], acts, &mut out);
                    for (r, a) in acts.chunks_exact(act_row).enumerate() {
                        let single = vec_dot_with(isa, ty, n, &weights[..w_row], a);
                        assert_eq!(out[r].to_bits(), single.to_bits(), "{ty} n={n} {isa:?} rows {rows}: r {r}");
                    }
                }
            }
        }
    }
}

/// Q4_K rows repacked into x16 tiles (the layout of AVX-512 VNNI machines) come back byte for
/// byte, whatever their scale bytes hold; the SIMD repack writes the reference's bytes.
#[test]
fn q4k_x16_tiles_give_back_every_row_byte_for_byte() {
    let mut rng = Rng(1618);
    for n in [256, 1536, 8960] {
        let w_row = GgmlType::Q4_K.row_bytes(n).expect("row bytes");
        let rows: Vec<u8> = (0..q4k_x16::TILE_ROWS).flat_map(|_| random_weights(GgmlType::Q4_K, n, &mut rng)).collect();
        let mut tile = vec![0u8; q4k_x16::tile_bytes(n)];
        q4k_x16::repack_tile(n, &rows, &mut tile);
        let mut reference = vec![0u8; q4k_x16::tile_bytes(n)];
        q4k_x16::repack_tile_reference(n, &rows, &mut reference);
        assert!(tile == reference, "n={n}: the SIMD repack differs from the reference");
        let mut back = vec![0u8; w_row];
        for (l, original) in rows.chunks_exact(w_row).enumerate() {
            q4k_x16::unpack_row(n, &tile, l, &mut back);
            assert!(back == original, "n={n}: row {l} differs after repacking");
        }
    }
}

/// The x16 kernel (every row count a call gets: decode's 1, verification's 2-9, a prefill tile of
/// 64; 1 to 3 tiles) equals the one-row kernel on the rows before repacking, bit for bit. On a CPU
/// without AVX-512 VNNI it checks the fallback that rebuilds each row.
#[test]
fn q4k_x16_dots_equal_single_row_dots_bit_for_bit() {
    let mut rng = Rng(4242);
    eprintln!("q4k_x16 kernel available: {}", q4k_x16_available());
    for n in [256, 1536, 2304] {
        let w_row = GgmlType::Q4_K.row_bytes(n).expect("row bytes");
        let act_row = GgmlType::Q8_K.row_bytes(n).expect("act bytes");
        let n_tiles = 3;
        let rows: Vec<u8> =
            (0..n_tiles * q4k_x16::TILE_ROWS).flat_map(|_| random_weights(GgmlType::Q4_K, n, &mut rng)).collect();
        let tile_bytes = q4k_x16::tile_bytes(n);
        let mut tiles = vec![0u8; n_tiles * tile_bytes];
        for (dst, src) in tiles.chunks_exact_mut(tile_bytes).zip(rows.chunks_exact(q4k_x16::TILE_ROWS * w_row)) {
            q4k_x16::repack_tile(n, src, dst);
        }
        let mut acts = vec![0u8; act_row * 64];
        for a in acts.chunks_exact_mut(act_row) {
            quantize_activation(GgmlType::Q8_K, &random_activation(n, &mut rng), a);
        }
        for act_rows in (1..=9).chain([64]) {
            for used_tiles in [1, n_tiles] {
                let acts = &acts[..act_rows * act_row];
                let mut out = vec![f32::NAN; used_tiles * q4k_x16::TILE_ROWS * act_rows];
                vec_dot_q4k_x16(n, &tiles[..used_tiles * tile_bytes], acts, &mut out);
                for (w, wr) in rows.chunks_exact(w_row).take(used_tiles * q4k_x16::TILE_ROWS).enumerate() {
                    for (r, a) in acts.chunks_exact(act_row).enumerate() {
                        let single = vec_dot(GgmlType::Q4_K, n, wr, a);
                        let got = out[w * act_rows + r];
                        assert_eq!(
                            got.to_bits(),
                            single.to_bits(),
                            "n={n} {used_tiles} tiles x {act_rows} rows: w {w} r {r}: {got} vs {single}"
                        );
                    }
                }
            }
        }
    }
}
