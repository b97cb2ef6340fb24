//! Bounded GGUF reader (versions 2 and 3).
//!
//! Spec: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>. Every length read from the file
//! is checked against a cap and against the file size before anything is allocated, so a crafted or
//! truncated file gives a [`CoreError`] naming the problem, never a panic or a huge allocation.
//! Only the header is read here; tensor data stays in the [`ByteSource`] until a backend uploads it.

mod source;
mod value;

#[cfg(not(target_arch = "wasm32"))]
pub use source::MmapSource;
pub use source::{ByteSource, MemorySource};
pub use value::{Metadata, Value};

use crate::error::{CoreError, Result};
use crate::quant::GgmlType;
use std::collections::HashMap;
use std::sync::Arc;

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Caps on what a header may declare. They are far above any real model (Gemma's 262,144-token
/// vocabulary is the largest array we know of) and far below what would exhaust memory.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_string_len: u64,
    pub max_array_len: u64,
    pub max_array_depth: u32,
    pub max_kv_count: u64,
    pub max_tensor_count: u64,
    pub max_dims: u32,
    pub max_header_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_string_len: 1 << 24,
            max_array_len: 1 << 24,
            max_array_depth: 4,
            max_kv_count: 1 << 16,
            max_tensor_count: 1 << 20,
            max_dims: 4,
            max_header_bytes: 1 << 30,
        }
    }
}

#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// GGML order: `dims[0]` is the contiguous (row) dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute offset of the data in the source.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// (row length, number of rows) viewing the tensor as a 2-D matrix.
    pub fn as_matrix(&self) -> (usize, usize) {
        let cols = self.dims.first().copied().unwrap_or(1) as usize;
        let rows = self.dims.iter().skip(1).product::<u64>() as usize;
        (cols, rows)
    }
}

/// A parsed GGUF header plus the source its tensor data lives in.
pub struct GgufFile {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
    source: Arc<dyn ByteSource>,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("kv_count", &self.metadata.len())
            .field("tensor_count", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: &std::path::Path) -> Result<Self> {
        Self::read(Arc::new(MmapSource::open(path)?))
    }

    pub fn read(source: Arc<dyn ByteSource>) -> Result<Self> {
        Self::read_with_limits(source, &Limits::default())
    }

    pub fn read_with_limits(source: Arc<dyn ByteSource>, limits: &Limits) -> Result<Self> {
        let data_end = source.len();
        Self::parse(source, limits, data_end)
    }

    /// The header alone: metadata and tensor table, the tensor data not required to be in
    /// `source` (a skeleton, the first `data_offset` bytes of a model, which `hearth models
    /// synth` fills with random weights). Reading a tensor's bytes then fails.
    pub fn read_header(source: Arc<dyn ByteSource>) -> Result<Self> {
        Self::parse(source, &Limits::default(), u64::MAX)
    }

    /// Parses the header; every tensor must end within `data_end`.
    fn parse(source: Arc<dyn ByteSource>, limits: &Limits, data_end: u64) -> Result<Self> {
        let mut r = Cursor::new(source.as_ref(), limits);
        let magic: [u8; 4] = r.array("magic")?;
        if magic != GGUF_MAGIC {
            return Err(CoreError::BadMagic { found: magic });
        }
        let version = r.u32("version")?;
        if version != 2 && version != 3 {
            return Err(CoreError::UnsupportedVersion(version));
        }
        let tensor_count = r.u64("tensor count")?;
        let kv_count = r.u64("metadata count")?;
        check_limit("tensor count", tensor_count, limits.max_tensor_count)?;
        check_limit("metadata count", kv_count, limits.max_kv_count)?;

        let mut metadata = Metadata::default();
        // A set, not `metadata.get`: a linear scan per key is quadratic in a 65,536-key header.
        let mut seen_keys = std::collections::HashSet::new();
        for _ in 0..kv_count {
            let key = r.string("metadata key")?;
            let type_id = r.u32("metadata value type")?;
            let value = r.value(&key, type_id, 0)?;
            if !seen_keys.insert(key.clone()) {
                return Err(CoreError::Duplicate { what: "metadata key", name: key });
            }
            metadata.entries.push((key, value));
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => {
                let a = v.as_u64().unwrap_or(0);
                if a == 0 || !a.is_power_of_two() || a > 1 << 20 {
                    return Err(CoreError::BadHyperParameter(format!(
                        "general.alignment must be a power of two up to 1 MiB, got {v:?}"
                    )));
                }
                a
            }
        };

        let mut raw = Vec::with_capacity(tensor_count.min(4096) as usize);
        for _ in 0..tensor_count {
            let name = r.string("tensor name")?;
            let n_dims = r.u32("tensor dimension count")?;
            if n_dims == 0 || n_dims > limits.max_dims {
                return Err(CoreError::BadTensor {
                    tensor: name,
                    reason: format!("has {n_dims} dimensions (allowed 1..={})", limits.max_dims),
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64("tensor dimension")?);
            }
            let type_id = r.u32("tensor type")?;
            let rel_offset = r.u64("tensor offset")?;
            raw.push((name, dims, type_id, rel_offset));
        }

        let data_offset = align_up(r.pos, alignment)
            .ok_or_else(|| CoreError::BadHyperParameter("tensor data offset overflows".into()))?;
        let file_len = data_end;
        let mut tensors = Vec::with_capacity(raw.len());
        let mut by_name = HashMap::with_capacity(raw.len());
        for (name, dims, type_id, rel_offset) in raw {
            let info = tensor_info(name, dims, type_id, rel_offset, alignment, data_offset, file_len)?;
            if by_name.insert(info.name.clone(), tensors.len()).is_some() {
                return Err(CoreError::Duplicate { what: "tensor", name: info.name });
            }
            tensors.push(info);
        }

        Ok(GgufFile { version, metadata, tensors, alignment, data_offset, source, by_name })
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name).ok_or_else(|| CoreError::MissingTensor(name.to_string()))
    }

    pub fn source(&self) -> &Arc<dyn ByteSource> {
        &self.source
    }

    /// Reads a tensor's bytes (copying unless the source can lend them).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> Result<std::borrow::Cow<'_, [u8]>> {
        let len = info.n_bytes as usize;
        if let Some(s) = self.source.slice(info.offset, len) {
            return Ok(std::borrow::Cow::Borrowed(s));
        }
        let mut buf = vec![0u8; len];
        self.source.read_at(info.offset, &mut buf)?;
        Ok(std::borrow::Cow::Owned(buf))
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.metadata.str("general.architecture")
    }
}

fn check_limit(what: &str, value: u64, max: u64) -> Result<()> {
    if value > max {
        return Err(CoreError::LimitExceeded { what: what.to_string(), value, max });
    }
    Ok(())
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    Some(x.checked_add(a - 1)? / a * a)
}

fn tensor_info(
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    rel_offset: u64,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<TensorInfo> {
    let bad = |reason: String| CoreError::BadTensor { tensor: name.clone(), reason };
    let ty =
        GgmlType::from_id(type_id).ok_or_else(|| CoreError::UnknownTensorType { tensor: name.clone(), type_id })?;
    if !ty.is_weight_type() {
        return Err(bad(format!("type {ty} is an activation-only format")));
    }
    if dims.contains(&0) {
        return Err(bad(format!("has a zero dimension {dims:?}")));
    }
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n < (1 << 40))
        .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
    if !dims[0].is_multiple_of(ty.block_len() as u64) {
        return Err(bad(format!("row length {} is not a multiple of the {ty} block size {}", dims[0], ty.block_len())));
    }
    let n_bytes = n_elements / ty.block_len() as u64 * ty.block_bytes() as u64;
    if !rel_offset.is_multiple_of(alignment) {
        return Err(bad(format!("data offset {rel_offset} is not aligned to {alignment}")));
    }
    let offset = data_offset.checked_add(rel_offset).ok_or_else(|| bad("data offset overflows".into()))?;
    let end = offset.checked_add(n_bytes).ok_or_else(|| bad("data end overflows".into()))?;
    if end > file_len {
        return Err(CoreError::Truncated { what: format!("tensor '{name}'"), offset, needed: n_bytes, file_len });
    }
    Ok(TensorInfo { name, dims, ty, offset, n_bytes })
}

/// Fewest bytes one array element of value type `type_id` occupies in the file.
fn min_encoded_len(type_id: u32) -> u64 {
    match type_id {
        2 | 3 => 2,
        4..=6 => 4,
        // A string is at least its u64 length; u64, i64, f64.
        8 | 10..=12 => 8,
        // A nested array is at least its u32 element type and u64 length.
        9 => 12,
        // u8, i8, bool; unknown types fail on the first element.
        _ => 1,
    }
}

/// Sequential reader over a [`ByteSource`] with a small window, so the header is parsed without
/// holding the file in memory.
struct Cursor<'a> {
    source: &'a dyn ByteSource,
    limits: &'a Limits,
    pos: u64,
    window: Vec<u8>,
    window_start: u64,
}

const WINDOW: usize = 1 << 16;

impl<'a> Cursor<'a> {
    fn new(source: &'a dyn ByteSource, limits: &'a Limits) -> Self {
        Cursor { source, limits, pos: 0, window: Vec::new(), window_start: 0 }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        let file_len = self.source.len();
        let end = self.pos.checked_add(n as u64).filter(|&e| e <= file_len).ok_or_else(|| CoreError::Truncated {
            what: what.to_string(),
            offset: self.pos,
            needed: n as u64,
            file_len,
        })?;
        if end > self.limits.max_header_bytes {
            return Err(CoreError::LimitExceeded {
                what: "header size".into(),
                value: end,
                max: self.limits.max_header_bytes,
            });
        }
        let window_end = self.window_start + self.window.len() as u64;
        if self.pos < self.window_start || end > window_end {
            let len = (n.max(WINDOW) as u64).min(file_len - self.pos) as usize;
            self.window.resize(len, 0);
            self.source.read_at(self.pos, &mut self.window)?;
            self.window_start = self.pos;
        }
        let start = (self.pos - self.window_start) as usize;
        self.pos = end;
        Ok(&self.window[start..start + n])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        check_limit(&format!("{what} length"), len, self.limits.max_string_len)?;
        let bytes = self.take(len as usize, what)?.to_vec();
        String::from_utf8(bytes).map_err(|_| CoreError::BadUtf8 { what: what.to_string() })
    }

    fn value(&mut self, key: &str, type_id: u32, depth: u32) -> Result<Value> {
        Ok(match type_id {
            0 => Value::U8(self.array::<1>(key)?[0]),
            1 => Value::I8(self.array::<1>(key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            4 => Value::U32(u32::from_le_bytes(self.array(key)?)),
            5 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(CoreError::BadHyperParameter(format!(
                        "metadata '{key}': bool byte is {b}, expected 0 or 1"
                    )))
                }
            },
            8 => Value::String(self.string(&format!("metadata '{key}' string"))?),
            9 => {
                if depth >= self.limits.max_array_depth {
                    return Err(CoreError::LimitExceeded {
                        what: format!("metadata '{key}' array nesting"),
                        value: depth as u64 + 1,
                        max: self.limits.max_array_depth as u64,
                    });
                }
                let elem_type = self.u32(key)?;
                let len = self.u64(key)?;
                check_limit(&format!("metadata '{key}' array length"), len, self.limits.max_array_len)?;
                // Every element takes at least `min_encoded_len` bytes: a length whose elements cannot
                // fit in the rest of the file is a lie, caught before allocating for it.
                let remaining = self.source.len().saturating_sub(self.pos);
                if len.saturating_mul(min_encoded_len(elem_type)) > remaining {
                    return Err(CoreError::Truncated {
                        what: format!("metadata '{key}' array of {len} elements"),
                        offset: self.pos,
                        needed: len,
                        file_len: self.source.len(),
                    });
                }
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(key, elem_type, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(key)?)),
            11 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            _ => return Err(CoreError::BadValueType { key: key.to_string(), type_id }),
        })
    }
}
