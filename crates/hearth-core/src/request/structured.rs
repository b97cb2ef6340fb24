//! Structured output in a request: the grammar its answer must match, from whichever dialect the
//! client speaks. OpenAI's `response_format` (`json_object`, `json_schema`; with WebLLM's and
//! llama-server's `schema` beside `json_object` and WebLLM's `{type: "grammar"}`), vLLM's
//! `structured_outputs` (`json`, `json_object`, `regex`, `choice`, `grammar`) and
//! llama-server's `json_schema` and `grammar`. A request sends at most one of them.

use super::{bad, Request};
use crate::constraint::{gbnf_to_lark, Activation, Grammar, GrammarRequest};
use crate::error::CoreError;
use serde_json::Value;

impl Request {
    /// The grammar the request constrains its answer to, if any.
    pub(super) fn grammar(&self) -> Result<Option<GrammarRequest>, CoreError> {
        let given = |v: &Option<Value>| v.as_ref().filter(|v| !v.is_null()).cloned();
        let mut sources = Vec::new();
        if let Some(format) = given(&self.response_format) {
            if let Some(grammar) = response_format(&format)? {
                sources.push(GrammarRequest { grammar, param: "response_format", activation: Activation::Always });
            }
        }
        if let Some(outputs) = given(&self.structured_outputs) {
            sources.push(GrammarRequest {
                grammar: structured_outputs(&outputs)?,
                param: "structured_outputs",
                activation: Activation::Always,
            });
        }
        if let Some(schema) = given(&self.json_schema) {
            sources.push(GrammarRequest {
                grammar: json_schema(&schema, true, "json_schema")?,
                param: "json_schema",
                activation: Activation::Always,
            });
        }
        if let Some(text) = given(&self.grammar) {
            let Value::String(text) = text else {
                return Err(bad("grammar", "grammar must be a string (GBNF or Lark)."));
            };
            sources.push(GrammarRequest {
                grammar: grammar_text(&text, "grammar")?,
                param: "grammar",
                activation: Activation::Always,
            });
        }
        match sources.len() {
            0 | 1 => Ok(sources.pop()),
            _ => {
                let names: Vec<&str> = sources.iter().map(|s| s.param).collect();
                Err(bad(
                    sources[1].param,
                    format!("A request constrains its answer one way; this one sends {}.", names.join(" and ")),
                ))
            }
        }
    }
}

/// OpenAI's `response_format` (`None` for plain text).
fn response_format(format: &Value) -> Result<Option<Grammar>, CoreError> {
    const PARAM: &str = "response_format";
    let object = format.as_object().ok_or_else(|| bad(PARAM, "response_format must be an object with a 'type'."))?;
    let kind = object.get("type").and_then(Value::as_str).unwrap_or_default();
    let allowed: &[&str] = match kind {
        "text" => &["type"],
        "json_object" => &["type", "schema"],
        "json_schema" => &["type", "json_schema", "schema"],
        "grammar" => &["type", "grammar"],
        _ => {
            return Err(bad(
                PARAM,
                format!(
                    "response_format.type must be 'text', 'json_object', 'json_schema' or 'grammar', got {}.",
                    object.get("type").unwrap_or(&Value::Null)
                ),
            ))
        }
    };
    if let Some(key) = object.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(bad(PARAM, format!("response_format of type '{kind}' takes no '{key}'.")));
    }
    Ok(match kind {
        "text" => None,
        // JSON mode: any object; WebLLM and llama-server send a schema with it, as an object
        // or as JSON text.
        "json_object" => Some(match object.get("schema").filter(|s| !s.is_null()) {
            Some(schema) => json_schema(schema, true, "response_format.schema")?,
            None => Grammar::JsonSchema { schema: serde_json::json!({"type": "object"}), strict: true },
        }),
        "json_schema" => {
            // OpenAI: {json_schema: {name, schema, strict, description}}; llama-server also
            // takes {schema} beside the type.
            match (object.get("json_schema"), object.get("schema")) {
                (Some(Value::Object(spec)), None) => {
                    if let Some(key) =
                        spec.keys().find(|k| !["name", "schema", "strict", "description"].contains(&k.as_str()))
                    {
                        return Err(bad(
                            PARAM,
                            format!(
                                "response_format.json_schema takes name, schema, strict and description; got '{key}'."
                            ),
                        ));
                    }
                    let strict = match spec.get("strict") {
                        None | Some(Value::Null) => true,
                        Some(Value::Bool(strict)) => *strict,
                        Some(other) => {
                            return Err(bad(
                                PARAM,
                                format!("response_format.json_schema.strict must be a boolean, got {other}."),
                            ))
                        }
                    };
                    let schema = spec.get("schema").cloned().unwrap_or_else(|| serde_json::json!({}));
                    Some(json_schema(&schema, strict, "response_format.json_schema.schema")?)
                }
                (None, Some(schema)) => Some(json_schema(schema, true, "response_format.schema")?),
                _ => {
                    return Err(bad(
                        PARAM,
                        "response_format of type 'json_schema' sends json_schema: {name, schema, strict}.",
                    ))
                }
            }
        }
        _ => match object.get("grammar") {
            Some(Value::String(text)) => Some(grammar_text(text, "response_format.grammar")?),
            _ => return Err(bad(PARAM, "response_format of type 'grammar' sends grammar: a GBNF or Lark grammar.")),
        },
    })
}

/// vLLM's `structured_outputs`: exactly one of `json`, `json_object`, `regex`, `choice`, `grammar`.
fn structured_outputs(outputs: &Value) -> Result<Grammar, CoreError> {
    const PARAM: &str = "structured_outputs";
    let object = outputs.as_object().ok_or_else(|| bad(PARAM, "structured_outputs must be an object."))?;
    let mut grammars = Vec::new();
    for (key, value) in object {
        if value.is_null() || *value == Value::Bool(false) {
            continue;
        }
        let grammar = match key.as_str() {
            "json" => json_schema(value, true, "structured_outputs.json")?,
            "json_object" => Grammar::JsonSchema { schema: serde_json::json!({"type": "object"}), strict: true },
            "regex" => match value {
                Value::String(regex) => Grammar::Regex(regex.clone()),
                _ => return Err(bad(PARAM, "structured_outputs.regex must be a string.")),
            },
            "choice" => match value.as_array().map(|c| c.iter().map(|s| s.as_str().map(str::to_string)).collect::<Option<Vec<_>>>()) {
                Some(Some(choices)) if !choices.is_empty() => Grammar::Choice(choices),
                _ => return Err(bad(PARAM, "structured_outputs.choice must be a non-empty list of strings.")),
            },
            "grammar" => match value {
                Value::String(text) => grammar_text(text, "structured_outputs.grammar")?,
                _ => return Err(bad(PARAM, "structured_outputs.grammar must be a string (GBNF or Lark).")),
            },
            other => {
                return Err(bad(
                    PARAM,
                    format!("structured_outputs.{other} is not supported: send one of json, json_object, regex, choice or grammar."),
                ))
            }
        };
        grammars.push(grammar);
    }
    match grammars.len() {
        1 => Ok(grammars.remove(0)),
        0 => Err(bad(PARAM, "structured_outputs sends one of json, json_object, regex, choice or grammar.")),
        _ => {
            Err(bad(PARAM, "structured_outputs sends one of json, json_object, regex, choice or grammar, not several."))
        }
    }
}

/// A JSON Schema given as an object (or a boolean) or as JSON text.
fn json_schema(schema: &Value, strict: bool, param: &str) -> Result<Grammar, CoreError> {
    let top = param.split('.').next().unwrap_or(param);
    let schema = match schema {
        Value::String(text) => {
            serde_json::from_str(text).map_err(|e| bad(top, format!("{param} is a string that is not JSON: {e}.")))?
        }
        Value::Object(_) | Value::Bool(_) => schema.clone(),
        other => return Err(bad(top, format!("{param} must be a JSON Schema (an object), got {other}."))),
    };
    Ok(Grammar::JsonSchema { schema, strict })
}

/// A grammar as text: Lark (llguidance's dialect; llama.cpp marks it with a `%llguidance`
/// first line), or llama.cpp's GBNF (rules written `name ::= ...`), rewritten as Lark.
fn grammar_text(text: &str, param: &str) -> Result<Grammar, CoreError> {
    let top = param.split('.').next().unwrap_or(param);
    if text.trim().is_empty() {
        return Err(bad(top, format!("{param} is empty.")));
    }
    if !text.trim_start().starts_with("%llguidance") && text.contains("::=") {
        return Ok(Grammar::Lark(gbnf_to_lark(text, top)?));
    }
    Ok(Grammar::Lark(text.to_string()))
}
