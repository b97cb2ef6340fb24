//! Quant formats against the `gguf` PyPI package (fixtures from tests/fixtures/quant/make_fixtures.py).

use hearth_core::quant::{dequantize_row, quantize_row, vec_dot, GgmlType};
use hearth_core::CoreError;
use std::collections::BTreeSet;
use std::path::PathBuf;

struct Case {
    name: String,
    kind: String,
    ty: GgmlType,
    n: usize,
    rows: usize,
    quantized: Vec<u8>,
    floats: Vec<f32>,
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quant")
}

fn ty_from_name(name: &str) -> GgmlType {
    GgmlType::ALL.into_iter().find(|t| t.name() == name).unwrap_or_else(|| panic!("unknown type {name}"))
}

fn load_cases() -> Vec<Case> {
    let dir = fixture_dir();
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).expect("manifest")).expect("json");
    manifest
        .as_array()
        .expect("array")
        .iter()
        .map(|e| {
            let name = e["name"].as_str().expect("name").to_string();
            let floats = std::fs::read(dir.join(format!("{name}.f32")))
                .expect("f32 file")
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            Case {
                quantized: std::fs::read(dir.join(format!("{name}.bin"))).expect("bin file"),
                kind: e["kind"].as_str().expect("kind").to_string(),
                ty: ty_from_name(e["type"].as_str().expect("type")),
                n: e["n"].as_u64().expect("n") as usize,
                rows: e["rows"].as_u64().expect("rows") as usize,
                floats,
                name,
            }
        })
        .collect()
}

/// Distance in units in the last place (0 for bit-identical, incl. equal infinities).
fn ulps(a: f32, b: f32) -> u32 {
    if a == b {
        return 0;
    }
    let key = |x: f32| {
        let bits = x.to_bits() as i32;
        if bits < 0 {
            i32::MIN.wrapping_sub(bits)
        } else {
            bits
        }
    };
    (key(a) as i64 - key(b) as i64).unsigned_abs().min(u32::MAX as u64) as u32
}

#[test]
fn dequantize_matches_gguf_python_for_every_type() {
    let mut covered = BTreeSet::new();
    for case in load_cases().iter().filter(|c| c.kind == "dequant") {
        let row_bytes = case.ty.row_bytes(case.n).expect("row bytes");
        assert_eq!(case.quantized.len(), row_bytes * case.rows, "{}", case.name);
        let mut worst = 0;
        for r in 0..case.rows {
            let mut out = vec![0f32; case.n];
            dequantize_row(case.ty, &case.quantized[r * row_bytes..(r + 1) * row_bytes], &mut out).expect("dequantize");
            for (i, (&got, &want)) in out.iter().zip(&case.floats[r * case.n..(r + 1) * case.n]).enumerate() {
                let d = ulps(got, want);
                assert!(d == 0, "{} row {r} elem {i}: got {got:e}, python {want:e}", case.name);
                worst = worst.max(d);
            }
        }
        eprintln!("{}: worst {} ulp", case.name, worst);
        covered.insert(case.ty.name());
    }
    for ty in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "MXFP4"]
    {
        assert!(covered.contains(ty), "no dequant fixture for {ty}");
    }
}

#[test]
fn run_time_quantizers_match_python_bit_for_bit() {
    let mut covered = BTreeSet::new();
    for case in load_cases().iter().filter(|c| c.kind == "quantize") {
        let mut out = vec![0u8; case.quantized.len()];
        let row_bytes = case.ty.row_bytes(case.n).expect("row bytes");
        for (r, (src, dst)) in case.floats.chunks(case.n).zip(out.chunks_mut(row_bytes)).enumerate() {
            quantize_row(case.ty, src, dst).expect("quantize");
            assert_eq!(dst, &case.quantized[r * row_bytes..(r + 1) * row_bytes], "{} row {r}", case.name);
        }
        covered.insert(case.ty.name());
    }
    assert_eq!(covered, BTreeSet::from(["Q4_0", "Q8_0", "Q8_1", "Q8_K"]));
}

/// Deterministic pseudo-random activations in roughly [-2, 2] with a few large outliers.
fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0;
            if i % 97 == 13 {
                u * 25.0
            } else {
                u
            }
        })
        .collect()
}

#[test]
fn vec_dot_matches_dot_of_dequantized_rows() {
    let mut covered = BTreeSet::new();
    for (k, case) in load_cases().iter().filter(|c| c.kind == "dequant" && c.ty.is_weight_type()).enumerate() {
        let row_bytes = case.ty.row_bytes(case.n).expect("row bytes");
        let act_ty = case.ty.vec_dot_type();
        for r in 0..case.rows {
            let weights = &case.quantized[r * row_bytes..(r + 1) * row_bytes];
            let w = &case.floats[r * case.n..(r + 1) * case.n];
            if w.iter().any(|v| !v.is_finite()) {
                continue;
            }
            let mut act = vec![0u8; act_ty.row_bytes(case.n).expect("act bytes")];
            quantize_row(act_ty, &activations(case.n, (k * 10 + r) as u64), &mut act).expect("quantize act");
            let mut a = vec![0f32; case.n];
            dequantize_row(act_ty, &act, &mut a).expect("dequantize act");

            let exact: f64 = w.iter().zip(&a).map(|(&x, &y)| x as f64 * y as f64).sum();
            let magnitude: f64 = w.iter().zip(&a).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum();
            let got = vec_dot(case.ty, case.n, weights, &act).expect("vec_dot") as f64;
            // Q8_1 stores s = f16(d * Σq), so the `m * s` term of Q4_1/Q5_1 carries f16 rounding.
            let rel = if act_ty == GgmlType::Q8_1 { 2e-3 } else { 1e-5 };
            assert!(
                (got - exact).abs() <= rel * magnitude + 1e-30,
                "{} row {r}: vec_dot {got:e}, dequantized dot {exact:e} (magnitude {magnitude:e})",
                case.name
            );
        }
        covered.insert(case.ty.name());
    }
    assert_eq!(covered.len(), 11, "weight types covered: {covered:?}");
}

#[test]
fn bad_sizes_are_errors_not_panics() {
    for ty in GgmlType::ALL {
        let n = ty.block_len() * 2;
        let bytes = ty.row_bytes(n).expect("whole blocks");
        let mut out = vec![0f32; n];
        assert!(dequantize_row(ty, &vec![0u8; bytes + 1], &mut out).is_err(), "{ty} long src");
        assert!(dequantize_row(ty, &vec![0u8; bytes - 1], &mut out).is_err(), "{ty} short src");
        if ty.block_len() > 1 {
            let mut odd = vec![0f32; n - 1];
            assert!(matches!(dequantize_row(ty, &vec![0u8; bytes], &mut odd), Err(CoreError::InvalidArgument(_))));
            assert!(vec_dot(ty, n + 1, &vec![0u8; bytes], &vec![0u8; bytes]).is_err(), "{ty} partial block");
        }
        let act_bytes = ty.vec_dot_type().row_bytes(n).expect("act");
        if ty.is_weight_type() {
            assert!(vec_dot(ty, n, &vec![0u8; bytes], &vec![0u8; act_bytes + 2]).is_err(), "{ty} act size");
            assert!(vec_dot(ty, n, &vec![0u8; bytes - 1], &vec![0u8; act_bytes]).is_err(), "{ty} weight size");
            assert!(vec_dot(ty, n, &vec![0u8; bytes], &vec![0u8; act_bytes]).is_ok(), "{ty} good sizes");
        } else {
            assert!(matches!(
                vec_dot(ty, n, &vec![0u8; bytes], &vec![0u8; act_bytes]),
                Err(CoreError::UnsupportedTensorType { .. })
            ));
        }
    }
    let src = vec![0f32; 256];
    assert!(matches!(
        quantize_row(GgmlType::Q4_K, &src, &mut [0u8; 144]),
        Err(CoreError::UnsupportedTensorType { .. })
    ));
    assert!(quantize_row(GgmlType::Q8_K, &src, &mut [0u8; 291]).is_err());
    assert!(quantize_row(GgmlType::Q8_0, &src[..31], &mut [0u8; 34]).is_err());
}
