//! JS values at the edge, through serde and no JSON text: a request object and the load options go
//! straight into the core's serde types, reports and stats come back as plain JS objects.
//!
//! A JS value is read as `JSON.stringify` would see it (an object by its own enumerable properties,
//! an `undefined` property as an absent one), except for what JSON cannot carry:
//! - a number field of the schema (`temperature`, `top_p`, a `logit_bias` value...) takes NaN and
//!   ±Infinity as given, so the core's validation refuses them by name ("temperature must be
//!   between 0 and 2, got NaN."), where JSON would have sent null, "not given";
//! - a free-form value (`messages`, `prediction`, `logprobs`...: serde_json's `Value`, which has
//!   no NaN) refuses a non-finite number here, naming the field, instead of reading it as null;
//! - a `BigInt` is an integer (`seed`).
//!
//! serde-wasm-bindgen's own deserializer reads a struct by the fields it knows, which would let an
//! unknown field ("temprature") through unreported, and reports a string where an array belongs
//! as a `TypeError` from its iterator probe; objects and arrays are therefore walked here, and
//! serde-wasm-bindgen reads the scalars.

use crate::error::{Result, WasmError};
use crate::request::{endpoint, split_request, LoadOptions, RequestOptions};
use hearth_core::request::{Prompt, Request};
use hearth_core::CoreError;
use js_sys::{Array, Number, Object};
use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Unexpected, Visitor};
use serde::Serialize;
use std::fmt;
use wasm_bindgen::{JsCast, JsValue};

/// A request of `kind` ("chat" | "text"): a JS object in the core's request schema, checked by its
/// validation (see [`split_request`]). A field of the wrong type is a `BadRequest` naming it, as
/// `hearth serve` names it ("temperature: invalid type: string \"hot\", expected f32").
pub fn request(kind: &str, value: JsValue) -> Result<(Prompt, RequestOptions)> {
    let endpoint = endpoint(kind)?;
    let request: Request = decode(value).map_err(|e| {
        let path = e.path().to_string();
        let param = path.split(['.', '[']).next().filter(|p| !p.is_empty()).map(str::to_string);
        let message = match &param {
            Some(_) => format!("{path}: {}", e.inner()),
            None => format!("The request must be an object: {}", e.inner()),
        };
        WasmError::Core(CoreError::BadRequest { param, message })
    })?;
    split_request(endpoint, request)
}

/// The load options (`{ n_ctx, max_batch, ... }`); `undefined` or `null` for the defaults.
pub fn load_options(value: JsValue) -> Result<LoadOptions> {
    if value.is_undefined() || value.is_null() {
        return Ok(LoadOptions::default());
    }
    decode(value).map_err(|e| WasmError::bad_request("load options", e.to_string()))
}

/// `value` as a plain JS object: maps as objects, `u64` as numbers, `None` as null, as `JSON.parse`
/// of its JSON would make it. Failing is a bug (`internal`).
pub fn to_js<T: Serialize + ?Sized>(value: &T) -> std::result::Result<JsValue, JsValue> {
    value
        .serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .map_err(|e| crate::bindings::coded_error("internal", &format!("returning a result to JS: {}", message_of(e))))
}

fn decode<T: DeserializeOwned>(value: JsValue) -> std::result::Result<T, serde_path_to_error::Error<DecodeError>> {
    serde_path_to_error::deserialize(JsDeserializer(value))
}

/// The message of a serde-wasm-bindgen error, which carries it in a JS `Error` (its `Display` is
/// `String(error)`, "Error: ...").
fn message_of(error: serde_wasm_bindgen::Error) -> String {
    let value = JsValue::from(error);
    match value.dyn_ref::<js_sys::Error>() {
        Some(error) => String::from(error.message()),
        None => format!("{value:?}"),
    }
}

/// Why a JS value does not fit the type it is decoded into.
#[derive(Debug)]
pub struct DecodeError(String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

impl de::Error for DecodeError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        DecodeError(message.to_string())
    }
}

impl From<serde_wasm_bindgen::Error> for DecodeError {
    fn from(error: serde_wasm_bindgen::Error) -> Self {
        DecodeError(message_of(error))
    }
}

/// Decodes one JS value (see the module comment).
struct JsDeserializer(JsValue);

impl JsDeserializer {
    fn scalar(self) -> serde_wasm_bindgen::Deserializer {
        serde_wasm_bindgen::Deserializer::from(self.0)
    }

    fn is_nullish(&self) -> bool {
        self.0.is_undefined() || self.0.is_null()
    }

    /// An object that is read by its properties (not an array, not null).
    fn is_record(&self) -> bool {
        self.0.is_object() && !Array::is_array(&self.0)
    }

    fn invalid_type<T>(&self, expected: &dyn de::Expected) -> std::result::Result<T, DecodeError> {
        let text;
        let unexpected = if self.is_nullish() {
            Unexpected::Unit
        } else if let Some(b) = self.0.as_bool() {
            Unexpected::Bool(b)
        } else if let Some(v) = self.0.as_f64() {
            if Number::is_safe_integer(&self.0) {
                Unexpected::Signed(v as i64)
            } else {
                Unexpected::Float(v)
            }
        } else if let Some(s) = self.0.as_string() {
            text = s;
            Unexpected::Str(&text)
        } else if Array::is_array(&self.0) {
            Unexpected::Seq
        } else if self.0.is_object() {
            Unexpected::Map
        } else {
            text = format!("{:?}", self.0);
            Unexpected::Other(&text)
        };
        Err(de::Error::invalid_type(unexpected, expected))
    }
}

/// Methods whose value is a scalar (or, for an enum, a variant name): serde-wasm-bindgen's.
macro_rules! scalar {
    ($($method:ident),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> std::result::Result<V::Value, DecodeError> {
            Ok(self.scalar().$method(visitor)?)
        }
    )*};
}

impl<'de> de::Deserializer<'de> for JsDeserializer {
    type Error = DecodeError;

    scalar!(
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_unit,
        deserialize_identifier,
        deserialize_ignored_any
    );

    // A typed number takes NaN and ±Infinity as given: the core's validation names them.
    scalar!(deserialize_f32, deserialize_f64);

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> std::result::Result<V::Value, DecodeError> {
        match self.0.as_f64() {
            Some(v) if !v.is_finite() => Err(de::Error::invalid_value(Unexpected::Float(v), &"a finite number")),
            _ if Array::is_array(&self.0) => self.deserialize_seq(visitor),
            _ if self.is_record() => self.deserialize_map(visitor),
            _ => Ok(self.scalar().deserialize_any(visitor)?),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> std::result::Result<V::Value, DecodeError> {
        if self.is_nullish() {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> std::result::Result<V::Value, DecodeError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> std::result::Result<V::Value, DecodeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> std::result::Result<V::Value, DecodeError> {
        match self.0.dyn_ref::<Array>() {
            Some(array) => visitor.visit_seq(Elements { array: array.clone(), next: 0 }),
            None => self.invalid_type(&visitor),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> std::result::Result<V::Value, DecodeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> std::result::Result<V::Value, DecodeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> std::result::Result<V::Value, DecodeError> {
        if !self.is_record() {
            return self.invalid_type(&visitor);
        }
        let entries = Object::entries(self.0.unchecked_ref());
        visitor.visit_map(Properties { entries, next: 0, value: None })
    }

    // Every property is offered, so `deny_unknown_fields` sees the ones the struct does not know.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> std::result::Result<V::Value, DecodeError> {
        self.deserialize_map(visitor)
    }

    // The request schema's enums are unit variants named by strings (`mode: 'lookup'`), which
    // serde-wasm-bindgen reads.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> std::result::Result<V::Value, DecodeError> {
        Ok(self.scalar().deserialize_enum(name, variants, visitor)?)
    }
}

/// The elements of a JS array.
struct Elements {
    array: Array,
    next: u32,
}

impl<'de> SeqAccess<'de> for Elements {
    type Error = DecodeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> std::result::Result<Option<T::Value>, DecodeError> {
        if self.next >= self.array.length() {
            return Ok(None);
        }
        let value = self.array.get(self.next);
        self.next += 1;
        seed.deserialize(JsDeserializer(value)).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.array.length().saturating_sub(self.next) as usize)
    }
}

/// The own enumerable properties of a JS object (`Object.entries`), less those that are `undefined`.
struct Properties {
    entries: Array,
    next: u32,
    value: Option<JsValue>,
}

impl<'de> MapAccess<'de> for Properties {
    type Error = DecodeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> std::result::Result<Option<K::Value>, DecodeError> {
        while self.next < self.entries.length() {
            let entry: Array = self.entries.get(self.next).unchecked_into();
            self.next += 1;
            let value = entry.get(1);
            if value.is_undefined() {
                continue;
            }
            self.value = Some(value);
            return seed.deserialize(JsDeserializer(entry.get(0))).map(Some);
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> std::result::Result<V::Value, DecodeError> {
        match self.value.take() {
            Some(value) => seed.deserialize(JsDeserializer(value)),
            None => Err(de::Error::custom("a property's value was asked for before its name")),
        }
    }
}
