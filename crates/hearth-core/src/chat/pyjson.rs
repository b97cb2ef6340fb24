//! `tojson` exactly as HF transformers defines it for chat templates:
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
//! minijinja's built-in `tojson` differs (compact separators, HTML escaping), which changes the
//! prompt a tool-calling model sees, so we re-implement Python's output byte for byte.

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};
use serde_json::Value as Json;

/// Formatting options of Python's `json.dumps` that templates use.
struct DumpOptions {
    ensure_ascii: bool,
    /// `None`: single line. `Some(n)`: newline + n spaces per nesting level.
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

/// The `tojson` filter: `value | tojson(ensure_ascii=false, indent=none, separators=none, sort_keys=false)`.
pub fn tojson_filter(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(if let Some(s) = v.as_str() {
            s.to_string()
        } else {
            let n = i64::try_from(v.clone()).map_err(|_| {
                Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an integer or a string")
            })?;
            " ".repeat(n.max(0) as usize)
        }),
    };
    // Python: separators default to (', ', ': '), or (',', ': ') when indenting.
    let (item_separator, key_separator) = match separators {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.as_str().unwrap_or_default().to_string(), b.as_str().unwrap_or_default().to_string())
                }
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")),
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let options = DumpOptions {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let json = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: value is not serializable: {e}")))?;
    let mut out = String::new();
    dump(&json, &options, 0, &mut out);
    Ok(Value::from(out))
}

fn newline_indent(options: &DumpOptions, level: usize, out: &mut String) {
    if let Some(indent) = &options.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn dump(json: &Json, options: &DumpOptions, level: usize, out: &mut String) {
    match json {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (_, Some(u), _) => out.push_str(&u.to_string()),
            (_, _, Some(f)) => out.push_str(&python_float_repr(f)),
            _ => out.push_str(&n.to_string()),
        },
        Json::String(s) => dump_string(s, options.ensure_ascii, out),
        Json::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item_separator);
                }
                newline_indent(options, level + 1, out);
                dump(item, options, level + 1, out);
            }
            newline_indent(options, level, out);
            out.push(']');
        }
        Json::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<(&String, &Json)> = map.iter().collect();
            if options.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item_separator);
                }
                newline_indent(options, level + 1, out);
                dump_string(key, options.ensure_ascii, out);
                out.push_str(&options.key_separator);
                dump(item, options, level + 1, out);
            }
            newline_indent(options, level, out);
            out.push('}');
        }
    }
}

/// Python's `json.encoder` string escaping (lower-case `\u00xx` for other control characters).
fn dump_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round-trip digits, scientific notation when the decimal
/// exponent is < -4 or >= 16, exponent written with a sign and at least two digits (`1e-07`).
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.5e-7", "1e20", "0e0".
    let sci = format!("{f:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    if (-4..16).contains(&exponent) {
        // Positional notation, always with a fractional part ("1.0", "0.001", "123.5").
        let point = exponent + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if (point as usize) >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{body}")
    } else {
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exponent.abs())
    }
}
