//! What a request asks its answer to match, before it is compiled for a model.

use crate::error::CoreError;
use llguidance::api::TopLevelGrammar;
use llguidance::JsonCompileOptions;
use serde_json::Value;

/// The language an answer must belong to.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// A JSON value valid under `schema` (JSON Schema draft 2020-12). `strict`: a keyword the
    /// engine cannot enforce refuses the schema (OpenAI's `strict: true`); otherwise such
    /// keywords are ignored and the rest is enforced.
    JsonSchema { schema: Value, strict: bool },
    /// Text the regular expression matches whole.
    Regex(String),
    /// Text of a Lark grammar (llguidance's dialect: `start` rule, `%json` embeds, special tokens
    /// as `<|name|>`).
    Lark(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}

/// A grammar and the request parameter it came from (errors name it).
#[derive(Clone, Debug, PartialEq)]
pub struct GrammarRequest {
    pub grammar: Grammar,
    pub param: &'static str,
    /// When the grammar starts constraining the answer.
    pub activation: Activation,
}

/// When a grammar constrains an answer: from its first token, or lazily (tool calls the model may
/// or may not make).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// The whole answer follows the grammar.
    Always,
    /// The answer is free text until one of these triggers; from the trigger on it follows the
    /// grammar, which reads the trigger's tokens first. Where the grammar does not accept them,
    /// the answer stays free.
    Lazy(Vec<Trigger>),
}

/// What starts a lazy grammar.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// The model samples this token (one token of the vocabulary, e.g. `<tool_call>`) anywhere in
    /// the answer: the grammar starts with it.
    Token(String),
    /// The answer begins with a match of this regular expression (within its first
    /// [`PREFIX_WINDOW`] bytes, e.g. a Llama 3 call's `{`): the grammar starts with the answer.
    Prefix(String),
}

/// How far into an answer a [`Trigger::Prefix`] is looked for.
pub const PREFIX_WINDOW: usize = 96;

/// Whitespace a JSON answer may hold between tokens: bounded, so a model cannot fill its whole
/// budget with newlines (an unbounded run is a known failure of small models under JSON masks).
const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{0,16}";

impl GrammarRequest {
    /// A client error about this grammar.
    pub(super) fn error(&self, message: impl std::fmt::Display) -> CoreError {
        CoreError::BadRequest { param: Some(self.param.to_string()), message: format!("{}: {message}", self.param) }
    }

    /// A key identifying the grammar for the compile cache.
    pub(super) fn cache_key(&self) -> String {
        let grammar = match &self.grammar {
            Grammar::JsonSchema { schema, strict } => format!("json {strict} {schema}"),
            Grammar::Regex(regex) => format!("regex {regex}"),
            Grammar::Lark(lark) => format!("lark {lark}"),
            Grammar::Choice(choices) => format!("choice {}", Value::from(choices.clone())),
        };
        format!("{:?} {grammar}", self.activation)
    }

    /// llguidance's form of the grammar.
    pub(super) fn top_level(&self) -> Result<TopLevelGrammar, CoreError> {
        Ok(match &self.grammar {
            Grammar::JsonSchema { schema, strict } => {
                TopLevelGrammar::from_json_schema(self.json_schema(schema, *strict)?)
            }
            Grammar::Regex(regex) => TopLevelGrammar::from_regex(regex),
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
            Grammar::Choice(choices) => {
                if choices.is_empty() {
                    return Err(self.error("the list of choices is empty"));
                }
                let alternatives: Vec<String> = choices.iter().map(|c| Value::from(c.as_str()).to_string()).collect();
                TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
            }
        })
    }

    /// The schema with hearth's compile options (bounded whitespace; `lenient` unless strict)
    /// under llguidance's `x-guidance` key, the schema's own `x-guidance` options winning.
    fn json_schema(&self, schema: &Value, strict: bool) -> Result<Value, CoreError> {
        let mut schema = match schema {
            Value::Object(_) => schema.clone(),
            Value::Bool(true) => Value::Object(Default::default()),
            Value::Bool(false) => return Err(self.error("the schema `false` accepts no value")),
            other => return Err(self.error(format!("a JSON Schema is an object or a boolean, got {other}"))),
        };
        let options = JsonCompileOptions {
            whitespace_pattern: Some(JSON_WHITESPACE.to_string()),
            lenient: !strict,
            ..JsonCompileOptions::default()
        };
        let mut guidance = serde_json::to_value(&options).map_err(|e| self.error(e))?;
        if let (Some(defaults), Some(Value::Object(own))) = (guidance.as_object_mut(), schema.get("x-guidance")) {
            for (key, value) in own {
                defaults.insert(key.clone(), value.clone());
            }
        }
        if let Some(object) = schema.as_object_mut() {
            object.insert("x-guidance".to_string(), guidance);
        }
        Ok(schema)
    }
}
