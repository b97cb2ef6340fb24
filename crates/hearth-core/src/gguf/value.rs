//! GGUF metadata values (all 13 value types of the spec).

use crate::error::{CoreError, Result};

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// Any integer type that fits in a u64 (metadata writers disagree on u32 vs i32 vs u64).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Typed accessors over the key/value section, with errors that name the key.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    pub(crate) entries: Vec<(String, Value)>,
}

impl Metadata {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| CoreError::MissingKey(key.to_string()))
    }

    fn wrong(key: &str, expected: &'static str, v: &Value) -> CoreError {
        CoreError::WrongType { key: key.to_string(), expected, found: v.type_name() }
    }

    pub fn u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64().ok_or_else(|| Self::wrong(key, "an unsigned integer", v))
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        let v = self.u64(key)?;
        usize::try_from(v).map_err(|_| CoreError::BadHyperParameter(format!("{key} = {v} does not fit in usize")))
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        self.usize(key).map(Some)
    }

    pub fn f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_f64().map(|x| x as f32).ok_or_else(|| Self::wrong(key, "a number", v))
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        self.f32(key).map(Some)
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| Self::wrong(key, "a bool", v)),
        }
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong(key, "a string", v))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| Self::wrong(key, "a string", v)),
        }
    }

    pub fn array(&self, key: &str) -> Result<&[Value]> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| Self::wrong(key, "an array", v))
    }

    pub fn opt_array(&self, key: &str) -> Result<Option<&[Value]>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_array().map(Some).ok_or_else(|| Self::wrong(key, "an array", v)),
        }
    }

    /// An array of strings (token lists, merges).
    pub fn str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.array(key)?.iter().map(|v| v.as_str().ok_or_else(|| Self::wrong(key, "an array of strings", v))).collect()
    }
}
