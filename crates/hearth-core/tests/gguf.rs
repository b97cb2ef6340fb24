//! GGUF reader: round trips through an independent test writer, every corrupt-file case we know of
//! (each must be the specific `CoreError`, never a panic), and a seeded mutation smoke test.

#[path = "gguf/model.rs"]
mod model;
#[path = "gguf/mutation.rs"]
mod mutation;
#[path = "gguf/writer.rs"]
mod writer;

use hearth_core::gguf::{GgufFile, Limits, MemorySource, Value};
use hearth_core::quant::GgmlType;
use hearth_core::{CoreError, Result};
use std::sync::Arc;
use writer::{put_str, put_u32, put_u64, GgufWriter, TensorSpec};

pub fn parse(bytes: &[u8]) -> Result<GgufFile> {
    GgufFile::read(Arc::new(MemorySource::new(bytes.to_vec())))
}

/// One value of every type, including nested arrays and edge values.
fn all_values() -> Vec<(&'static str, Value)> {
    vec![
        ("t.u8", Value::U8(255)),
        ("t.i8", Value::I8(-128)),
        ("t.u16", Value::U16(65535)),
        ("t.i16", Value::I16(-32768)),
        ("t.u32", Value::U32(u32::MAX)),
        ("t.i32", Value::I32(i32::MIN)),
        ("t.f32", Value::F32(-1.5e-7)),
        ("t.bool_true", Value::Bool(true)),
        ("t.bool_false", Value::Bool(false)),
        ("t.string", Value::String("héllo ▁wörld \u{1F600}".into())),
        ("t.empty_string", Value::String(String::new())),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("t.arr_i32", Value::Array(vec![Value::I32(1), Value::I32(-2), Value::I32(3)])),
        (
            "t.arr_str",
            Value::Array(vec![Value::String("a".into()), Value::String(String::new()), Value::String("<s>".into())]),
        ),
        ("t.arr_bool", Value::Array(vec![Value::Bool(true), Value::Bool(false)])),
        ("t.arr_f64", Value::Array(vec![Value::F64(0.25), Value::F64(-0.0)])),
        ("t.arr_empty", Value::Array(vec![])),
        (
            "t.arr_nested",
            Value::Array(vec![Value::Array(vec![Value::U16(1), Value::U16(2)]), Value::Array(vec![Value::U16(3)])]),
        ),
        ("t.arr_depth3", Value::Array(vec![Value::Array(vec![Value::Array(vec![Value::String("deep".into())])])])),
    ]
}

fn writer_with_all_values(version: u32) -> GgufWriter {
    all_values().into_iter().fold(GgufWriter::new(version), |w, (k, v)| w.kv(k, v))
}

/// A valid file with tensors of several types, the last one ending exactly at the end of the file.
fn model_like(version: u32) -> GgufWriter {
    writer_with_all_values(version)
        .kv("general.alignment", Value::U32(64))
        .tensor("a.f32", GgmlType::F32, &[3, 2])
        .tensor("b.f16", GgmlType::F16, &[5])
        .tensor("c.q8_0", GgmlType::Q8_0, &[64, 2])
        .tensor("d.q4_k", GgmlType::Q4_K, &[256, 1, 1, 2])
        .tensor("e.bf16", GgmlType::BF16, &[7, 3, 2])
        .tensor("f.q6_k", GgmlType::Q6_K, &[512])
        .with_alignment(64)
}

trait WithAlignment {
    fn with_alignment(self, a: u64) -> Self;
}
impl WithAlignment for GgufWriter {
    fn with_alignment(mut self, a: u64) -> Self {
        self.alignment = a;
        self
    }
}

#[test]
fn round_trips_every_value_type_v2_and_v3() {
    for version in [2, 3] {
        let file = parse(&writer_with_all_values(version).write().bytes).unwrap();
        assert_eq!(file.version, version);
        assert_eq!(file.alignment, 32);
        assert!(file.tensors.is_empty());
        let expected = all_values();
        assert_eq!(file.metadata.len(), expected.len());
        for ((k, v), (gk, gv)) in expected.iter().zip(file.metadata.iter()) {
            assert_eq!(*k, gk, "keys keep file order");
            match (v, gv) {
                // -0.0 == 0.0 and NaN != NaN: compare floats bitwise.
                (Value::Array(a), Value::Array(b)) if matches!(a.first(), Some(Value::F64(_))) => {
                    let bits = |x: &[Value]| x.iter().map(|v| v.as_f64().unwrap().to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(a), bits(b));
                }
                _ => assert_eq!(v, gv, "{k}"),
            }
        }
        assert_eq!(file.metadata.str("t.string").unwrap(), "héllo ▁wörld \u{1F600}");
        assert_eq!(file.metadata.u64("t.u8").unwrap(), 255);
        assert_eq!(file.metadata.str_array("t.arr_str").unwrap(), vec!["a", "", "<s>"]);
    }
}

#[test]
fn round_trips_tensor_infos_and_data_with_custom_alignment() {
    for version in [2, 3] {
        let w = model_like(version);
        let written = w.write();
        let file = parse(&written.bytes).unwrap();
        assert_eq!(file.alignment, 64);
        assert_eq!(file.data_offset as usize, written.data_offset);
        assert_eq!(file.data_offset % 64, 0);
        assert_eq!(file.tensors.len(), w.tensors.len());
        for (spec, info) in w.tensors.iter().zip(&file.tensors) {
            assert_eq!(info.name.as_bytes(), spec.name);
            assert_eq!(info.dims, spec.dims);
            assert_eq!(info.ty.id(), spec.type_id);
            assert_eq!((info.offset - file.data_offset) % 64, 0);
            assert_eq!(info.n_bytes as usize, spec.data.len());
            assert_eq!(&*file.tensor_bytes(info).unwrap(), &spec.data[..], "{}", info.name);
        }
        let q4k = file.require_tensor("d.q4_k").unwrap();
        assert_eq!(q4k.n_bytes, 2 * 144);
        assert_eq!(q4k.as_matrix(), (256, 2));
        assert!(matches!(file.require_tensor("nope"), Err(CoreError::MissingTensor(n)) if n == "nope"));
    }
}

#[test]
fn empty_and_bad_magic_and_versions() {
    assert!(matches!(parse(&[]), Err(CoreError::Truncated { offset: 0, .. })));
    assert!(matches!(parse(b"GG"), Err(CoreError::Truncated { offset: 0, needed: 4, file_len: 2, .. })));
    let mut bytes = GgufWriter::new(3).write().bytes;
    bytes[0] = b'g';
    assert!(matches!(parse(&bytes), Err(CoreError::BadMagic { found }) if &found == b"gGUF"));
    for version in [0, 1, 4, u32::MAX] {
        let bytes = GgufWriter::new(version).write().bytes;
        assert!(matches!(parse(&bytes), Err(CoreError::UnsupportedVersion(v)) if v == version), "{version}");
    }
}

#[test]
fn truncation_at_every_byte_is_a_truncated_error() {
    for version in [2, 3] {
        let written = model_like(version).write();
        assert!(parse(&written.bytes).is_ok());
        for cut in 0..written.bytes.len() {
            let r = parse(&written.bytes[..cut]);
            assert!(matches!(r, Err(CoreError::Truncated { .. })), "cut at {cut}: {r:?}");
        }
    }
}

fn first_err(w: GgufWriter) -> CoreError {
    parse(&w.write().bytes).expect_err("corrupt file parsed")
}

#[test]
fn huge_lengths_are_limited_before_allocating() {
    let mut payload = Vec::new();
    put_u64(&mut payload, u64::MAX);
    let e = first_err(GgufWriter::new(3).raw_kv(b"k", 8, &payload));
    assert!(matches!(e, CoreError::LimitExceeded { value: u64::MAX, .. }), "{e:?}");
    // A huge key length.
    let mut bytes = GgufWriter::new(3).write().bytes;
    bytes[16..24].copy_from_slice(&1u64.to_le_bytes());
    put_u64(&mut bytes, 1 << 40);
    assert!(matches!(parse(&bytes), Err(CoreError::LimitExceeded { value, .. }) if value == 1 << 40));
    // A string length within the cap but beyond the file.
    let mut payload = Vec::new();
    put_u64(&mut payload, 1000);
    payload.extend_from_slice(b"short");
    assert!(matches!(
        first_err(GgufWriter::new(3).raw_kv(b"k", 8, &payload)),
        CoreError::Truncated { needed: 1000, .. }
    ));
    // Array lengths: above the cap, and within it but beyond the file.
    for (len, cap_hit) in [(u64::MAX, true), (1 << 30, true), (100, false)] {
        let mut payload = Vec::new();
        put_u32(&mut payload, 0);
        put_u64(&mut payload, len);
        payload.extend_from_slice(&[1, 2, 3]);
        let e = first_err(GgufWriter::new(3).raw_kv(b"arr", 9, &payload));
        match cap_hit {
            true => assert!(matches!(e, CoreError::LimitExceeded { value, .. } if value == len), "{e:?}"),
            false => assert!(matches!(e, CoreError::Truncated { .. }), "{e:?}"),
        }
    }
    // An array of u64 whose count fits in the remaining bytes but whose elements do not.
    let mut payload = Vec::new();
    put_u32(&mut payload, 10);
    put_u64(&mut payload, 64);
    payload.extend_from_slice(&[0u8; 64]);
    let e = first_err(GgufWriter::new(3).raw_kv(b"arr", 9, &payload));
    assert!(matches!(e, CoreError::Truncated { ref what, .. } if what.contains("array of 64 elements")), "{e:?}");
}

#[test]
fn many_keys_parse() {
    let n = Limits::default().max_kv_count as usize;
    let w = (0..n).fold(GgufWriter::new(3), |w, i| w.kv(&format!("k{i}"), Value::U32(i as u32)));
    let file = parse(&w.write().bytes).unwrap();
    assert_eq!(file.metadata.len(), n);
    assert_eq!(file.metadata.u64("k65535").unwrap(), 65535);
}

#[test]
fn nested_array_depth_bomb_is_limited() {
    let depth = 10_000;
    let mut payload = Vec::new();
    for _ in 0..depth {
        put_u32(&mut payload, 9);
        put_u64(&mut payload, 1);
    }
    put_u32(&mut payload, 0);
    put_u64(&mut payload, 0);
    let e = first_err(GgufWriter::new(3).raw_kv(b"bomb", 9, &payload));
    let max = Limits::default().max_array_depth as u64;
    assert!(matches!(e, CoreError::LimitExceeded { value, max: m, .. } if m == max && value == max + 1), "{e:?}");
}

#[test]
fn bad_value_types_bools_utf8_and_duplicates() {
    for bad in [13, 14, 255, u32::MAX] {
        let e = first_err(GgufWriter::new(3).raw_kv(b"k", bad, &[0; 8]));
        assert!(matches!(e, CoreError::BadValueType { ref key, type_id } if key == "k" && type_id == bad), "{e:?}");
    }
    // An array whose element type is unknown.
    let mut payload = Vec::new();
    put_u32(&mut payload, 99);
    put_u64(&mut payload, 1);
    payload.push(0);
    assert!(matches!(
        first_err(GgufWriter::new(3).raw_kv(b"k", 9, &payload)),
        CoreError::BadValueType { type_id: 99, .. }
    ));
    assert!(matches!(first_err(GgufWriter::new(3).raw_kv(b"k", 7, &[2])), CoreError::BadHyperParameter(_)));
    let e = first_err(GgufWriter::new(3).raw_kv(b"bad\xff\xfekey", 4, &[0; 4]));
    assert!(matches!(e, CoreError::BadUtf8 { ref what } if what == "metadata key"), "{e:?}");
    let mut payload = Vec::new();
    put_str(&mut payload, b"\xc3\x28");
    assert!(matches!(first_err(GgufWriter::new(3).raw_kv(b"k", 8, &payload)), CoreError::BadUtf8 { .. }));
    let e = first_err(GgufWriter::new(3).kv("dup", Value::U8(1)).kv("other", Value::U8(2)).kv("dup", Value::U32(3)));
    assert!(matches!(e, CoreError::Duplicate { what: "metadata key", ref name } if name == "dup"), "{e:?}");
    let e = first_err(GgufWriter::new(3).tensor("t", GgmlType::F32, &[4]).tensor("t", GgmlType::F32, &[4]));
    assert!(matches!(e, CoreError::Duplicate { what: "tensor", ref name } if name == "t"), "{e:?}");
    let spec = TensorSpec { name: b"\xff".to_vec(), dims: vec![1], type_id: 0, offset: None, data: vec![0; 4] };
    assert!(matches!(first_err(GgufWriter::new(3).raw_tensor(spec)), CoreError::BadUtf8 { .. }));
}

fn tensor_err(dims: &[u64], type_id: u32, offset: Option<u64>, data_len: usize) -> CoreError {
    let spec = TensorSpec { name: b"w".to_vec(), dims: dims.to_vec(), type_id, offset, data: vec![0; data_len] };
    first_err(GgufWriter::new(3).raw_tensor(spec))
}

fn is_bad_tensor(e: &CoreError, needle: &str) -> bool {
    matches!(e, CoreError::BadTensor { tensor, reason } if tensor == "w" && reason.contains(needle))
}

#[test]
fn bad_tensor_infos() {
    let e = tensor_err(&[], 0, None, 0);
    assert!(is_bad_tensor(&e, "0 dimensions"), "{e:?}");
    let e = tensor_err(&[1, 1, 1, 1, 1], 0, None, 4);
    assert!(is_bad_tensor(&e, "5 dimensions"), "{e:?}");
    let e = tensor_err(&[4, 0], 0, None, 0);
    assert!(is_bad_tensor(&e, "zero dimension"), "{e:?}");
    let e = tensor_err(&[1 << 32, 1 << 32], 0, None, 0);
    assert!(is_bad_tensor(&e, "overflow"), "{e:?}");
    let e = tensor_err(&[u64::MAX, 2], 0, None, 0);
    assert!(is_bad_tensor(&e, "overflow"), "{e:?}");
    let e = tensor_err(&[33, 1], GgmlType::Q8_0.id(), None, 68);
    assert!(is_bad_tensor(&e, "not a multiple"), "{e:?}");
    let e = tensor_err(&[128], GgmlType::Q4_K.id(), None, 144);
    assert!(is_bad_tensor(&e, "not a multiple"), "{e:?}");
    for bad in [4, 5, 16, 29, 31, 1000, u32::MAX] {
        let e = tensor_err(&[32], bad, None, 64);
        assert!(
            matches!(e, CoreError::UnknownTensorType { ref tensor, type_id } if tensor == "w" && type_id == bad),
            "{e:?}"
        );
    }
    for act in [GgmlType::Q8_K, GgmlType::Q8_1] {
        let e = tensor_err(&[256], act.id(), None, 292);
        assert!(is_bad_tensor(&e, "activation-only"), "{act}: {e:?}");
    }
    let e = tensor_err(&[4], 0, Some(4), 16);
    assert!(is_bad_tensor(&e, "not aligned"), "{e:?}");
    let e = tensor_err(&[4], 0, Some(u64::MAX - 31), 16);
    assert!(is_bad_tensor(&e, "overflows"), "{e:?}");
    let e = tensor_err(&[4], 0, Some(64), 0);
    assert!(matches!(e, CoreError::Truncated { ref what, needed: 16, .. } if what.contains("'w'")), "{e:?}");
    let e = tensor_err(&[1 << 20], 0, None, 16);
    assert!(matches!(e, CoreError::Truncated { needed, .. } if needed == 4 << 20), "{e:?}");
}

#[test]
fn bad_alignment_values() {
    for v in
        [Value::U32(0), Value::U32(3), Value::U32(48), Value::U64(1 << 40), Value::I32(-32), Value::String("32".into())]
    {
        let e = first_err(GgufWriter::new(3).kv("general.alignment", v.clone()).tensor("t", GgmlType::F32, &[4]));
        assert!(matches!(e, CoreError::BadHyperParameter(ref m) if m.contains("general.alignment")), "{v:?}: {e:?}");
    }
    // Valid non-default alignments.
    for a in [1u32, 8, 256, 4096] {
        let w = GgufWriter::new(3)
            .kv("general.alignment", Value::U32(a))
            .tensor("t", GgmlType::F32, &[3])
            .tensor("u", GgmlType::F32, &[5])
            .with_alignment(a as u64);
        let file = parse(&w.write().bytes).unwrap();
        assert_eq!(file.alignment, a as u64);
        assert_eq!(file.tensors[1].offset % a as u64, 0);
    }
}

#[test]
fn counts_beyond_caps_and_beyond_the_file() {
    let limits = Limits::default();
    let mut w = GgufWriter::new(3);
    w.tensor_count = Some(limits.max_tensor_count + 1);
    assert!(matches!(first_err(w), CoreError::LimitExceeded { ref what, .. } if what == "tensor count"));
    let mut w = GgufWriter::new(3);
    w.kv_count = Some(u64::MAX);
    assert!(matches!(first_err(w), CoreError::LimitExceeded { ref what, .. } if what == "metadata count"));
    // Within the caps but more records than the file holds.
    let mut w = GgufWriter::new(3).kv("a", Value::U8(1)).kv("b", Value::U8(2));
    w.kv_count = Some(1000);
    assert!(matches!(first_err(w), CoreError::Truncated { .. }));
    let mut w = GgufWriter::new(3).kv("a", Value::U8(1));
    w.tensor_count = Some(1 << 20);
    assert!(matches!(first_err(w), CoreError::Truncated { .. }));
    // Custom, tighter limits.
    let tight = Limits { max_string_len: 3, ..Limits::default() };
    let bytes = GgufWriter::new(3).kv("long", Value::U8(0)).write().bytes;
    let e = GgufFile::read_with_limits(Arc::new(MemorySource::new(bytes)), &tight).unwrap_err();
    assert!(matches!(e, CoreError::LimitExceeded { value: 4, max: 3, .. }), "{e:?}");
}

/// Files written by the reference writer (gguf-py, `tests/fixtures/gguf/make_fixtures.py`); the
/// absolute data offsets are what gguf-py's `GGUFReader` reports for them.
#[test]
fn parses_files_written_by_gguf_py() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf");
    for (name, alignment, offsets) in
        [("tiny_v3.gguf", 32, [640, 672, 704]), ("tiny_v3_align64.gguf", 64, [704, 768, 832])]
    {
        let file = GgufFile::open(&dir.join(name)).unwrap();
        let m = &file.metadata;
        assert_eq!((file.version, file.alignment), (3, alignment));
        assert_eq!(file.architecture().unwrap(), "llama");
        assert_eq!(m.get("t.u8"), Some(&Value::U8(200)));
        assert_eq!(m.get("t.i8"), Some(&Value::I8(-7)));
        assert_eq!(m.get("t.u16"), Some(&Value::U16(60000)));
        assert_eq!(m.get("t.i16"), Some(&Value::I16(-30000)));
        assert_eq!(m.get("t.u32"), Some(&Value::U32(4_000_000_000)));
        assert_eq!(m.get("t.i32"), Some(&Value::I32(-2_000_000_000)));
        assert_eq!(m.get("t.f32"), Some(&Value::F32(0.5)));
        assert_eq!(m.get("t.u64"), Some(&Value::U64((1 << 63) + 5)));
        assert_eq!(m.get("t.i64"), Some(&Value::I64(-(1 << 62))));
        assert_eq!(m.get("t.f64"), Some(&Value::F64(-2.25)));
        assert_eq!(m.get("t.bool"), Some(&Value::Bool(true)));
        assert_eq!(m.str("t.str").unwrap(), "gguf ▁ok");
        assert_eq!(m.get("t.arr_i32"), Some(&Value::Array(vec![Value::I32(1), Value::I32(-2), Value::I32(3)])));
        assert_eq!(m.str_array("t.arr_str").unwrap(), vec!["a", "bc"]);
        let nested =
            Value::Array(vec![Value::Array(vec![Value::I32(1), Value::I32(2)]), Value::Array(vec![Value::I32(3)])]);
        assert_eq!(m.get("t.arr_nested"), Some(&nested));
        let names: Vec<_> = file.tensors.iter().map(|t| (t.name.as_str(), t.dims.clone(), t.ty, t.offset)).collect();
        assert_eq!(
            names,
            vec![
                ("a.f32", vec![3, 2], GgmlType::F32, offsets[0]),
                ("b.f16", vec![5], GgmlType::F16, offsets[1]),
                ("c.f32", vec![32, 2], GgmlType::F32, offsets[2]),
            ]
        );
        let a = file.tensor_bytes(file.require_tensor("a.f32").unwrap()).unwrap();
        let floats: Vec<f32> = a.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(floats, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let b = file.tensor_bytes(file.require_tensor("b.f16").unwrap()).unwrap();
        let halves: Vec<f32> = b.chunks(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect();
        assert_eq!(halves, [0.0, 1.0, 2.0, 3.0, 4.0]);
    }
}
