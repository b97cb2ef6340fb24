//! Tool calling in a request: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`, checked
//! once for every surface.

use super::{bad, Request};
use crate::error::CoreError;
use serde_json::Value;

/// The tools a request offers the model and how it may call them.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    /// The tools as the chat template reads them (OpenAI's `{"type": "function", "function":
    /// {name, description, parameters}}`, parameters defaulted).
    pub tools: Vec<Value>,
    pub functions: Vec<Function>,
    pub choice: ToolChoice,
    /// Several calls in one answer (OpenAI's default).
    pub parallel: bool,
}

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    /// A JSON Schema of its arguments object.
    pub parameters: Value,
    /// OpenAI's `strict`: a schema keyword the engine cannot enforce refuses the request
    /// (otherwise such keywords are ignored and the rest enforced).
    pub strict: bool,
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The tools are in the prompt, but the answer is text.
    None,
    /// Text or calls, as the model decides (the default).
    Auto,
    /// One or more calls, nothing else.
    Required,
    /// A call of this function, nothing else.
    Function(String),
}

impl ToolRequest {
    /// The functions the answer may call under its choice.
    pub fn callable(&self) -> impl Iterator<Item = &Function> {
        self.functions.iter().filter(|f| match &self.choice {
            ToolChoice::Function(name) => f.name == *name,
            ToolChoice::None => false,
            ToolChoice::Auto | ToolChoice::Required => true,
        })
    }
}

impl Request {
    /// The request's tools, checked (`None`: it offers none).
    pub(super) fn tool_request(&self) -> Result<Option<ToolRequest>, CoreError> {
        let given = |v: &Option<Value>| v.as_ref().filter(|v| !v.is_null()).cloned();
        let tools = match given(&self.tools) {
            None => Vec::new(),
            Some(Value::Array(tools)) => tools,
            Some(_) => {
                return Err(bad("tools", "tools must be a list of {\"type\": \"function\", \"function\": {...}}."))
            }
        };
        let choice = given(&self.tool_choice);
        let parallel = match given(&self.parallel_tool_calls) {
            None => true,
            Some(Value::Bool(parallel)) => parallel,
            Some(other) => {
                return Err(bad("parallel_tool_calls", format!("parallel_tool_calls must be a boolean, got {other}.")))
            }
        };
        if tools.is_empty() {
            return match choice.as_ref().and_then(Value::as_str) {
                None | Some("none") | Some("auto") if choice.as_ref().is_none_or(Value::is_string) => Ok(None),
                _ => Err(bad("tool_choice", "tool_choice names a way to call tools, but the request sends no tools.")),
            };
        }
        let mut functions: Vec<Function> = Vec::with_capacity(tools.len());
        let mut normalized = Vec::with_capacity(tools.len());
        for (i, tool) in tools.iter().enumerate() {
            let invalid = |what: &str| bad("tools", format!("tools[{i}]: {what}"));
            if tool.get("type").and_then(Value::as_str) != Some("function") {
                return Err(invalid("only {\"type\": \"function\"} tools are supported"));
            }
            let Some(function) = tool.get("function").and_then(Value::as_object) else {
                return Err(invalid("'function' must be an object with a 'name'"));
            };
            if let Some(key) =
                function.keys().find(|k| !["name", "description", "parameters", "strict"].contains(&k.as_str()))
            {
                return Err(invalid(&format!("function takes name, description, parameters and strict; got '{key}'")));
            }
            let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
            let name_ok = (1..=64).contains(&name.len())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !name_ok {
                return Err(invalid(&format!(
                    "function.name must be 1 to 64 letters, digits, '_' or '-', got {name:?}"
                )));
            }
            if functions.iter().any(|f| f.name == name) {
                return Err(invalid(&format!("two tools are named '{name}'")));
            }
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => return Err(invalid("function.parameters must be a JSON Schema object")),
            };
            let strict = match function.get("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(strict)) => *strict,
                Some(_) => return Err(invalid("function.strict must be a boolean")),
            };
            let mut tool = tool.clone();
            tool["function"]["parameters"] = parameters.clone();
            normalized.push(tool);
            functions.push(Function { name: name.to_string(), parameters, strict });
        }
        let choice = match choice {
            None => ToolChoice::Auto,
            Some(Value::String(choice)) => match choice.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => return Err(bad("tool_choice", format!("tool_choice must be 'none', 'auto', 'required' or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got '{other}'."))),
            },
            Some(named) => {
                let name = named.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
                match (named.get("type").and_then(Value::as_str), name) {
                    (Some("function"), Some(name)) if functions.iter().any(|f| f.name == name) => ToolChoice::Function(name.to_string()),
                    (Some("function"), Some(name)) => return Err(bad("tool_choice", format!("tool_choice names '{name}', which is not among the tools."))),
                    _ => return Err(bad("tool_choice", "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}.")),
                }
            }
        };
        Ok(Some(ToolRequest { tools: normalized, functions, choice, parallel }))
    }
}
