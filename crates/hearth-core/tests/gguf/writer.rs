//! A small GGUF writer for tests, written from the spec
//! (<https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>) independently of the reader, with
//! escape hatches (raw key bytes, raw value bytes, forced counts and offsets) to build corrupt files.

#![allow(dead_code)]

use hearth_core::gguf::Value;
use hearth_core::quant::GgmlType;

/// GGUF value type id of a [`Value`] (spec: `gguf_metadata_value_type`).
pub fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s);
}

/// The payload of a value, without its type id. An array's element type is its first element's
/// (u8 for an empty array); all elements must share it.
pub fn put_payload(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s.as_bytes()),
        Value::Array(items) => {
            let elem = items.first().map_or(0, type_id);
            assert!(items.iter().all(|i| type_id(i) == elem), "mixed array in test writer");
            put_u32(out, elem);
            put_u64(out, items.len() as u64);
            for item in items {
                put_payload(out, item);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// Bytes of a tensor's data: `n_elements / block_len * block_bytes`.
pub fn tensor_size(ty: GgmlType, dims: &[u64]) -> usize {
    let n: u64 = dims.iter().product();
    n as usize / ty.block_len() * ty.block_bytes()
}

#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: Vec<u8>,
    pub dims: Vec<u64>,
    pub type_id: u32,
    /// Offset relative to the data section; `None` = next aligned position.
    pub offset: Option<u64>,
    pub data: Vec<u8>,
}

#[derive(Clone, Debug)]
pub struct GgufWriter {
    pub version: u32,
    /// Encoded `key, type, payload` records.
    pub kvs: Vec<Vec<u8>>,
    pub tensors: Vec<TensorSpec>,
    /// Alignment used to lay out tensor data (set `general.alignment` yourself to change the reader's).
    pub alignment: u64,
    pub tensor_count: Option<u64>,
    pub kv_count: Option<u64>,
}

/// A written file and where its sections start.
pub struct Written {
    pub bytes: Vec<u8>,
    /// End of the tensor infos (= start of the alignment padding).
    pub header_end: usize,
    pub data_offset: usize,
}

impl GgufWriter {
    pub fn new(version: u32) -> Self {
        GgufWriter { version, kvs: Vec::new(), tensors: Vec::new(), alignment: 32, tensor_count: None, kv_count: None }
    }

    pub fn kv(mut self, key: &str, v: Value) -> Self {
        let mut rec = Vec::new();
        put_str(&mut rec, key.as_bytes());
        put_u32(&mut rec, type_id(&v));
        put_payload(&mut rec, &v);
        self.kvs.push(rec);
        self
    }

    /// A record from raw parts: key bytes, type id and payload bytes, unchecked.
    pub fn raw_kv(mut self, key: &[u8], type_id: u32, payload: &[u8]) -> Self {
        let mut rec = Vec::new();
        put_str(&mut rec, key);
        put_u32(&mut rec, type_id);
        rec.extend_from_slice(payload);
        self.kvs.push(rec);
        self
    }

    /// A tensor with deterministic data of the right size for `ty` and `dims`.
    pub fn tensor(self, name: &str, ty: GgmlType, dims: &[u64]) -> Self {
        let size = tensor_size(ty, dims);
        let data = (0..size).map(|i| (i * 31 + name.len()) as u8).collect();
        self.raw_tensor(TensorSpec {
            name: name.as_bytes().to_vec(),
            dims: dims.to_vec(),
            type_id: ty.id(),
            offset: None,
            data,
        })
    }

    pub fn raw_tensor(mut self, spec: TensorSpec) -> Self {
        self.tensors.push(spec);
        self
    }

    pub fn write(&self) -> Written {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        put_u32(&mut out, self.version);
        put_u64(&mut out, self.tensor_count.unwrap_or(self.tensors.len() as u64));
        put_u64(&mut out, self.kv_count.unwrap_or(self.kvs.len() as u64));
        for rec in &self.kvs {
            out.extend_from_slice(rec);
        }
        let align = |x: u64| x.div_ceil(self.alignment) * self.alignment;
        let mut next = 0u64;
        let mut placed = Vec::new();
        for t in &self.tensors {
            let offset = t.offset.unwrap_or_else(|| align(next));
            next = offset + t.data.len() as u64;
            placed.push(offset);
            put_str(&mut out, &t.name);
            put_u32(&mut out, t.dims.len() as u32);
            for &d in &t.dims {
                put_u64(&mut out, d);
            }
            put_u32(&mut out, t.type_id);
            put_u64(&mut out, offset);
        }
        let header_end = out.len();
        let data_offset = align(header_end as u64) as usize;
        for (t, &offset) in self.tensors.iter().zip(&placed) {
            // Offsets far beyond any test file are corrupt on purpose: write the info, not the data.
            if offset > 1 << 24 {
                continue;
            }
            let start = data_offset + offset as usize;
            if out.len() < start {
                out.resize(start, 0);
            }
            let end = start + t.data.len();
            if out.len() < end {
                out.resize(end, 0);
            }
            out[start..end].copy_from_slice(&t.data);
        }
        Written { bytes: out, header_end, data_offset }
    }
}
