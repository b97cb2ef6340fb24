//! Tool calls in a model's own format, recognised from its chat template: the grammar that
//! constrains them and the parser that turns an answer (whole or streamed) into OpenAI's
//! `tool_calls`.
//!
//! - Hermes / Qwen2.5 / Qwen3 (the template writes `<tool_call>`): each call is
//!   `<tool_call>\n{"name": "...", "arguments": {...}}\n</tool_call>`, one per line. Under
//!   `auto`, an answer that is calls fenced as a JSON code block (```` ```json\n{"name": ...``,
//!   one per line; how Qwen2.5-Coder often answers) is read as calls too, as llama.cpp does.
//! - Llama 3.1-3.3 (the template has an `ipython` role for tool results): the whole answer is one
//!   call, `{"name": "...", "parameters": {...}}`.

use super::ChatTemplate;
use crate::constraint::{Activation, Grammar, GrammarRequest, PrefixMatch, PrefixPattern, Trigger, PREFIX_WINDOW};
use crate::engine::GenerateOptions;
use crate::error::CoreError;
use crate::request::{ToolChoice, ToolRequest};
use crate::tokenizer::Tokenizer;
use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
/// What a Llama 3.x template writes for tool results (llama.cpp recognises the format by it).
const LLAMA3_TOOL_ROLE: &str = "<|start_header_id|>ipython<|end_header_id|>";
/// The beginning of an answer that is calls fenced as a JSON code block: the fence, then a call's
/// `{"name":`.
const FENCED_CALL_START: &str = r#"[ \t\r\n]*```(?:json)?[ \t]*\n[ \t\r\n]*\{[ \t\r\n]*"name"[ \t\r\n]*:"#;
/// The fence that closes them.
const FENCE_CLOSE: &str = "\n```";
/// The beginning of a Llama 3 call.
const LLAMA3_CALL_START: &str = r"[ \t\r\n]*\{";

/// Tokens that mark tool calls in the formats hearth knows. Where the vocabulary has them as
/// tokens, they are structure: a grammar places them (`<tool_call>` in Lark is the token), and
/// no text inside a call (a JSON string) can use them.
pub const TOOL_CALL_MARKERS: &[&str] = &[OPEN, CLOSE];

/// How a model writes tool calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// `<tool_call>\n{"name", "arguments"}\n</tool_call>`, several in one answer.
    #[default]
    Hermes,
    /// The whole answer is one `{"name", "parameters"}` object.
    Llama3,
}

impl ToolCallFormat {
    /// The format the template's tool section writes, if hearth knows it.
    pub fn of_template(template: &ChatTemplate) -> Option<Self> {
        let source = template.source();
        if source.contains(OPEN) {
            Some(ToolCallFormat::Hermes)
        } else if source.contains(LLAMA3_TOOL_ROLE) {
            Some(ToolCallFormat::Llama3)
        } else {
            None
        }
    }

    /// The key of a call's arguments object.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "arguments",
            ToolCallFormat::Llama3 => "parameters",
        }
    }

    /// The grammar of the answer under `tools`' choice: every call's arguments valid under its
    /// function's schema; for `required` and a named function the whole answer is calls, for
    /// `auto` the grammar starts once the model opens a call (text before it is free). `None`
    /// for `tool_choice: "none"`.
    pub fn grammar(self, tools: &ToolRequest, tokenizer: &Tokenizer) -> Option<GrammarRequest> {
        let key = self.arguments_key();
        let bodies: Vec<Value> = tools
            .callable()
            .map(|f| {
                let mut arguments = f.parameters.clone();
                if let (Some(object), false) = (arguments.as_object_mut(), f.strict) {
                    // (Keywords the engine cannot enforce are ignored unless the tool is strict.)
                    let guidance = object.entry("x-guidance").or_insert_with(|| json!({}));
                    if let Some(guidance) = guidance.as_object_mut() {
                        guidance.entry("lenient").or_insert(json!(true));
                    }
                }
                json!({
                    "type": "object",
                    "properties": {"name": {"const": f.name}, key: arguments},
                    "required": ["name", key],
                    "additionalProperties": false,
                })
            })
            .collect();
        if bodies.is_empty() {
            return None;
        }
        let body = json!({"anyOf": bodies});
        let (start, activation) = match self {
            ToolCallFormat::Hermes => {
                // (The markers as tokens, `<tool_call>`, where the vocabulary has them; as text
                // otherwise.)
                let marker = |text: &str| {
                    if tokenizer.token_id(text).is_some() {
                        text.to_string()
                    } else {
                        format!("\"{text}\"")
                    }
                };
                let call = format!("{} \"\\n\" body \"\\n\" {}", marker(OPEN), marker(CLOSE));
                // (A named function is called once, as OpenAI's forced function call.)
                let once = !tools.parallel || matches!(tools.choice, ToolChoice::Function(_));
                let more = if once { "" } else { " (\"\\n\" call)*" };
                match tools.choice {
                    // From `<tool_call>` on, calls; or, from the answer's start, calls fenced as a
                    // JSON code block.
                    ToolChoice::Auto => {
                        let fenced_more = if once { "" } else { " (\"\\n\" body)*" };
                        let start = format!(
                            "start: call{more} | fenced\ncall: {call}\n\
                             fenced: FENCE_OPEN body{fenced_more} {FENCE_CLOSE:?}\n\
                             FENCE_OPEN: /[ \\t\\r\\n]*```(json)?[ \\t]*\\n[ \\t\\r\\n]*/"
                        );
                        let triggers =
                            vec![Trigger::Token(OPEN.to_string()), Trigger::Prefix(FENCED_CALL_START.into())];
                        (start, Activation::Lazy(triggers))
                    }
                    _ => (format!("start: call{more}\ncall: {call}"), Activation::Always),
                }
            }
            // (One call per answer: Llama 3's template renders one call per assistant turn.)
            ToolCallFormat::Llama3 => match tools.choice {
                ToolChoice::Auto => (
                    "start: body | LEADING_SPACE body\nLEADING_SPACE: /[ \\t\\r\\n]+/".to_string(),
                    Activation::Lazy(vec![Trigger::Prefix(LLAMA3_CALL_START.into())]),
                ),
                _ => ("start: body".to_string(), Activation::Always),
            },
        };
        let lark = format!("{start}\nbody: %json {body}");
        Some(GrammarRequest { grammar: Grammar::Lark(lark), param: "tools", activation })
    }

    /// A parser of this format's answers.
    pub fn parser(self) -> ToolCallParser {
        ToolCallParser { format: self, ..ToolCallParser::default() }
    }
}

/// One call, as OpenAI's `tool_calls[]` reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments object as JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// OpenAI's object, with the call's id.
    pub fn to_json(&self, id: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}})
    }
}

/// What a piece of streamed answer adds.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolCallDelta {
    /// Text outside calls.
    Content(String),
    /// Call `index` starts, calling `name` (its arguments follow).
    Call { index: usize, name: String },
    /// More of call `index`'s arguments text.
    Arguments { index: usize, text: String },
}

/// Splits an answer into text and calls as it streams: text before a call is content; each
/// `<tool_call>...</tool_call>` (Llama 3: an answer that begins with `{`) becomes a call whose
/// name is sent once known and whose arguments stream as they come. A call that never closes
/// (the answer was cut) or does not parse stays text.
#[derive(Debug, Default)]
pub struct ToolCallParser {
    format: ToolCallFormat,
    /// Llama 3: the answer's first character has come (a call is the whole answer or none).
    decided: bool,
    /// Hermes: whether the answer is calls fenced as a JSON code block (`None`: undecided, its
    /// beginning held back), with the fence's line.
    fenced: Option<Option<String>>,
    /// Text received and not yet emitted.
    pending: String,
    /// Inside a call: its text after `<tool_call>`, and what of it went out.
    call: Option<OpenCall>,
    calls: Vec<ToolCall>,
    content: String,
    /// A call just closed: whitespace before the next one is not content.
    after_call: bool,
}

#[derive(Debug, Default)]
struct OpenCall {
    text: String,
    /// Where the arguments start in `text`, once the name is known.
    arguments_at: Option<usize>,
    /// Bytes of the arguments already sent.
    sent: usize,
}

impl OpenCall {
    /// Deltas for the call's text so far: its name once written, then its arguments but the
    /// tail that may be the call's closing `}`, whitespace and the start of `</tool_call>`.
    fn stream(&mut self, index: usize, key: &str, deltas: &mut Vec<ToolCallDelta>) {
        if self.arguments_at.is_none() {
            if let Some((name, at)) = name_and_arguments(&self.text, key) {
                self.arguments_at = Some(at);
                deltas.push(ToolCallDelta::Call { index, name });
            }
        }
        if let Some(at) = self.arguments_at {
            let arguments = &self.text[at..];
            let safe = arguments.rfind('}').unwrap_or(arguments.len());
            // (Whitespace before the call's closing brace is not the arguments'.)
            let safe = arguments[..safe].trim_end().len();
            if safe > self.sent && arguments.is_char_boundary(safe) {
                deltas.push(ToolCallDelta::Arguments { index, text: arguments[self.sent..safe].to_string() });
                self.sent = safe;
            }
        }
    }
}

impl ToolCallParser {
    /// What `text` (the next piece of the answer) adds.
    pub fn push(&mut self, text: &str) -> Vec<ToolCallDelta> {
        self.pending.push_str(text);
        let mut deltas = Vec::new();
        if self.format == ToolCallFormat::Llama3 {
            self.push_whole_answer_call(&mut deltas);
            return deltas;
        }
        if self.fenced.is_none() && !self.decide_fence() {
            return deltas;
        }
        if let Some(Some(_)) = self.fenced {
            self.push_fenced_calls(&mut deltas);
            return deltas;
        }
        loop {
            match self.call.as_mut() {
                None => {
                    if self.after_call {
                        let rest = self.pending.trim_start();
                        if rest.is_empty() || OPEN.starts_with(rest) {
                            return deltas; // (whitespace, or the start of another call: wait)
                        }
                        if rest.starts_with(OPEN) {
                            self.pending = rest.to_string();
                        }
                        self.after_call = false;
                    }
                    let Some(at) = self.pending.find(OPEN) else {
                        // Hold back what may be the start of `<tool_call>`.
                        let keep = partial_suffix(&self.pending, OPEN);
                        let ready: String = self.pending.drain(..self.pending.len() - keep).collect();
                        self.emit_content(ready, &mut deltas);
                        return deltas;
                    };
                    let before: String = self.pending.drain(..at).collect();
                    self.emit_content(before, &mut deltas);
                    self.pending.drain(..OPEN.len());
                    self.call = Some(OpenCall::default());
                }
                Some(call) => {
                    call.text.push_str(&std::mem::take(&mut self.pending));
                    let index = self.calls.len();
                    if let Some(end) = call.text.find(CLOSE) {
                        self.pending = call.text[end + CLOSE.len()..].to_string();
                        call.text.truncate(end);
                        self.close_call(&mut deltas);
                        self.after_call = true;
                        continue;
                    }
                    call.stream(index, self.format.arguments_key(), &mut deltas);
                    return deltas;
                }
            }
        }
    }

    /// Hermes: whether the answer begins as calls fenced as a JSON code block (then its fence's
    /// line is taken from the text held back); false while its beginning is undecided.
    fn decide_fence(&mut self) -> bool {
        let fenced = match fenced_call_start().check(self.pending.as_bytes()) {
            PrefixMatch::Undecided if self.pending.len() <= PREFIX_WINDOW => return false,
            PrefixMatch::Matched => {
                let open = self.pending.find("```").map_or(0, |at| at + 3);
                let line_end = self.pending[open..].find('\n').map_or(self.pending.len(), |at| open + at + 1);
                self.call = Some(OpenCall::default());
                Some(self.pending.drain(..line_end).collect())
            }
            _ => None,
        };
        self.fenced = Some(fenced);
        true
    }

    /// Calls fenced as a JSON code block: the first one's name and arguments stream as they come;
    /// at the closing fence every call is read (text after it is content).
    fn push_fenced_calls(&mut self, deltas: &mut Vec<ToolCallDelta>) {
        let pending = std::mem::take(&mut self.pending);
        let Some(call) = self.call.as_mut() else {
            // (After the closing fence.)
            self.emit_content(pending, deltas);
            return;
        };
        call.text.push_str(&pending);
        let Some(end) = call.text.find(FENCE_CLOSE) else {
            // (Once the first call is whole, the rest waits for the fence: the first call's
            // stream must not run into the next one.)
            let mut values = serde_json::Deserializer::from_str(&call.text).into_iter::<serde::de::IgnoredAny>();
            if !matches!(values.next(), Some(Ok(_))) {
                call.stream(self.calls.len(), self.format.arguments_key(), deltas);
            }
            return;
        };
        let after = call.text[end + FENCE_CLOSE.len()..].to_string();
        call.text.truncate(end);
        let Some(call) = self.call.take() else { return };
        let key = self.format.arguments_key();
        let bodies = json_values(&call.text);
        let parsed: Option<Vec<ToolCall>> = bodies.iter().map(|body| parse_call(body, key)).collect();
        match parsed.filter(|calls| !calls.is_empty()) {
            Some(calls) => {
                for (k, parsed) in calls.into_iter().enumerate() {
                    let index = self.calls.len();
                    let streamed = if k == 0 { call.arguments_at.map(|_| call.sent) } else { None };
                    if streamed.is_none() {
                        deltas.push(ToolCallDelta::Call { index, name: parsed.name.clone() });
                    }
                    let rest = parsed.arguments.get(streamed.unwrap_or(0)..).unwrap_or_default();
                    if !rest.is_empty() {
                        deltas.push(ToolCallDelta::Arguments { index, text: rest.to_string() });
                    }
                    self.calls.push(parsed);
                }
                self.after_call = true;
            }
            None => {
                let fence = self.fenced.clone().flatten().unwrap_or_default();
                self.emit_content(format!("{fence}{}{FENCE_CLOSE}", call.text), deltas);
            }
        }
        // (Whitespace after the closing fence is not content.)
        let after = after.trim_start().to_string();
        self.emit_content(after, deltas);
    }

    /// Llama 3's calls: an answer that begins with `{` is a call to its end; any other is text.
    fn push_whole_answer_call(&mut self, deltas: &mut Vec<ToolCallDelta>) {
        if !self.decided {
            let begun = self.pending.trim_start();
            if begun.is_empty() {
                return; // (leading whitespace: wait)
            }
            self.decided = true;
            if begun.starts_with('{') {
                self.call = Some(OpenCall::default());
            }
        }
        let pending = std::mem::take(&mut self.pending);
        match self.call.as_mut() {
            Some(call) => {
                call.text.push_str(&pending);
                call.stream(0, self.format.arguments_key(), deltas);
            }
            None => self.emit_content(pending, deltas),
        }
    }

    /// The call being read is complete (its text is the call's body): a call when it parses,
    /// text otherwise.
    fn close_call(&mut self, deltas: &mut Vec<ToolCallDelta>) {
        let Some(call) = self.call.take() else { return };
        let index = self.calls.len();
        match parse_call(&call.text, self.format.arguments_key()) {
            Some(parsed) => {
                if call.arguments_at.is_none() {
                    deltas.push(ToolCallDelta::Call { index, name: parsed.name.clone() });
                }
                let rest = parsed.arguments.get(call.sent..).unwrap_or_default();
                if !rest.is_empty() {
                    deltas.push(ToolCallDelta::Arguments { index, text: rest.to_string() });
                }
                self.calls.push(parsed);
            }
            None => {
                let text = match self.format {
                    ToolCallFormat::Hermes => format!("{OPEN}{}{CLOSE}", call.text),
                    ToolCallFormat::Llama3 => call.text,
                };
                self.emit_content(text, deltas);
            }
        }
    }

    fn emit_content(&mut self, text: String, deltas: &mut Vec<ToolCallDelta>) {
        if text.is_empty() {
            return;
        }
        self.content.push_str(&text);
        match deltas.last_mut() {
            Some(ToolCallDelta::Content(last)) => last.push_str(&text),
            _ => deltas.push(ToolCallDelta::Content(text)),
        }
    }

    /// The end of the answer: what is still held back (an unclosed call is text).
    pub fn finish(&mut self) -> Vec<ToolCallDelta> {
        let mut deltas = Vec::new();
        if self.format == ToolCallFormat::Llama3 {
            // (The answer's end closes its call.)
            self.close_call(&mut deltas);
            let rest = std::mem::take(&mut self.pending);
            self.emit_content(rest, &mut deltas);
            return deltas;
        }
        let rest = match self.call.take() {
            // (A fenced call that never closed, or the fence's beginning.)
            Some(call) if self.fenced.as_ref().is_some_and(Option::is_some) => {
                format!("{}{}{}", self.fenced.clone().flatten().unwrap_or_default(), call.text, self.pending)
            }
            Some(call) => format!("{OPEN}{}{}", call.text, self.pending),
            // (Whitespace after the last call is not content.)
            None if self.after_call && self.pending.trim().is_empty() => String::new(),
            None => std::mem::take(&mut self.pending),
        };
        self.pending.clear();
        self.emit_content(rest, &mut deltas);
        deltas
    }

    /// Whether a call closed so far.
    pub fn has_calls(&self) -> bool {
        !self.calls.is_empty()
    }

    /// The whole answer's content (None when it is only calls and whitespace) and its calls.
    pub fn into_message(mut self) -> (Option<String>, Vec<ToolCall>) {
        self.finish();
        let content = if self.calls.is_empty() || !self.content.trim().is_empty() { Some(self.content) } else { None };
        (content, self.calls)
    }

    /// Parses a whole answer.
    pub fn parse(mut self, text: &str) -> (Option<String>, Vec<ToolCall>) {
        self.push(text);
        self.into_message()
    }
}

/// The beginning of an answer that is fenced calls ([`FENCED_CALL_START`]).
fn fenced_call_start() -> &'static PrefixPattern {
    static PATTERN: std::sync::OnceLock<PrefixPattern> = std::sync::OnceLock::new();
    PATTERN.get_or_init(|| PrefixPattern::new(FENCED_CALL_START).expect("the fenced-call pattern compiles"))
}

/// The JSON values `text` holds one after another, each as its text (empty when anything else is
/// in it).
fn json_values(text: &str) -> Vec<&str> {
    let mut values = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<serde::de::IgnoredAny>();
    let mut start = 0;
    while let Some(value) = stream.next() {
        if value.is_err() {
            return Vec::new();
        }
        let end = stream.byte_offset();
        values.push(text[start..end].trim());
        start = end;
    }
    if !text[start..].trim().is_empty() {
        return Vec::new();
    }
    values
}

/// The length of the longest suffix of `text` that begins `marker`.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// In a call's text so far: its function's name and where its arguments (under `key`) start,
/// once both are written (`{"name": "f", "arguments": ` — the grammar writes the name first).
fn name_and_arguments(text: &str, key: &str) -> Option<(String, usize)> {
    let rest = text.trim_start().strip_prefix('{')?.trim_start();
    let rest = rest.strip_prefix("\"name\"")?.trim_start().strip_prefix(':')?.trim_start();
    let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<String>();
    let name = stream.next()?.ok()?;
    let after_name = &rest[stream.byte_offset()..];
    let after = after_name.trim_start().strip_prefix(',')?.trim_start();
    let after = after.strip_prefix('"')?.strip_prefix(key)?.strip_prefix('"')?.trim_start().strip_prefix(':')?;
    let value = after.trim_start();
    if value.is_empty() {
        return None;
    }
    Some((name, text.len() - value.len()))
}

/// A closed call's `{"name", key}`: a JSON object whose arguments, as the model wrote them
/// (OpenAI's `arguments` is that text), come after its name.
fn parse_call(body: &str, key: &str) -> Option<ToolCall> {
    let value: Value = serde_json::from_str(body.trim()).ok()?;
    value.get(key)?.as_object()?;
    let (name, at) = name_and_arguments(body, key)?;
    let end = body.rfind('}')?;
    let arguments = body.get(at..end)?.trim_end().to_string();
    Some(ToolCall { name, arguments })
}

/// Messages as the template reads them: an assistant's `tool_calls[].function.arguments` sent as
/// JSON text (OpenAI's shape) become objects, as Hermes-style templates print them with `tojson`.
pub fn template_messages(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .map(|message| {
            let mut message = message.clone();
            if let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) {
                for call in calls {
                    let arguments = call.get_mut("function").and_then(|f| f.get_mut("arguments"));
                    if let Some(arguments) = arguments {
                        if let Some(parsed) = arguments.as_str().and_then(|t| serde_json::from_str::<Value>(t).ok()) {
                            *arguments = parsed;
                        }
                    }
                }
            }
            message
        })
        .collect()
}

impl ToolRequest {
    /// The request's tools for this model: the answer's constraint set in `options` (the calls'
    /// grammar), and the format to read its calls in; `None` under `tool_choice: "none"`, where
    /// the answer is text (a Hermes call's opening token is banned). A template that writes no
    /// tool calls refuses tools.
    pub fn apply(
        &self,
        template: Option<&ChatTemplate>,
        tokenizer: &Tokenizer,
        options: &mut GenerateOptions,
    ) -> Result<Option<ToolCallFormat>, CoreError> {
        let format = template.and_then(ToolCallFormat::of_template).ok_or_else(|| CoreError::BadRequest {
            param: Some("tools".into()),
            message: "This model's chat template writes no tool calls hearth knows (Hermes / Qwen `<tool_call>`, Llama 3.x JSON); send the request without tools.".into(),
        })?;
        match format.grammar(self, tokenizer) {
            Some(grammar) => {
                options.grammar = Some(grammar);
                Ok(Some(format))
            }
            None => {
                if let (ToolCallFormat::Hermes, Some(opening)) = (format, tokenizer.token_id(OPEN)) {
                    options.sampling.logit_bias.insert(opening, f32::NEG_INFINITY);
                }
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": {\"n\": 2}}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

    #[test]
    fn a_whole_answer_is_content_and_calls() {
        let (content, calls) = ToolCallParser::default().parse(ANSWER);
        assert_eq!(content.as_deref(), Some("Let me check.\n"));
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0],
            ToolCall { name: "get_weather".into(), arguments: r#"{"city": "Paris", "days": {"n": 2}}"#.into() }
        );
        assert_eq!(calls[1], ToolCall { name: "get_time".into(), arguments: "{}".into() });
        let (content, calls) = ToolCallParser::default().parse("No tools needed.");
        assert_eq!((content.as_deref(), calls.len()), (Some("No tools needed."), 0));
    }

    #[test]
    fn streamed_in_any_pieces_the_deltas_add_up_to_the_whole() {
        for piece in [1, 2, 3, 5, 8, 1000] {
            let mut parser = ToolCallParser::default();
            let mut deltas = Vec::new();
            let chars: Vec<char> = ANSWER.chars().collect();
            for chunk in chars.chunks(piece) {
                deltas.extend(parser.push(&chunk.iter().collect::<String>()));
            }
            deltas.extend(parser.finish());
            let content: String = deltas
                .iter()
                .filter_map(|d| if let ToolCallDelta::Content(t) = d { Some(t.as_str()) } else { None })
                .collect();
            assert_eq!(content, "Let me check.\n", "pieces of {piece}");
            let names: Vec<&str> = deltas
                .iter()
                .filter_map(|d| if let ToolCallDelta::Call { name, .. } = d { Some(name.as_str()) } else { None })
                .collect();
            assert_eq!(names, ["get_weather", "get_time"], "pieces of {piece}");
            for (index, expected) in [r#"{"city": "Paris", "days": {"n": 2}}"#, "{}"].iter().enumerate() {
                let arguments: String = deltas
                    .iter()
                    .filter_map(|d| match d {
                        ToolCallDelta::Arguments { index: i, text } if *i == index => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                assert_eq!(arguments, *expected, "pieces of {piece}");
            }
        }
    }

    #[test]
    fn an_unclosed_call_stays_text() {
        let (content, calls) = ToolCallParser::default().parse("<tool_call>\n{\"name\": \"f\", \"argu");
        assert!(calls.is_empty());
        assert_eq!(content.as_deref(), Some("<tool_call>\n{\"name\": \"f\", \"argu"));
    }

    const LLAMA3_CALL: &str = r#"{"name": "get_weather", "parameters": {"city": "Paris", "days": {"n": 2}}}"#;

    /// Deltas of `answer` pushed in pieces of `piece` characters.
    fn streamed(format: ToolCallFormat, answer: &str, piece: usize) -> Vec<ToolCallDelta> {
        let mut parser = format.parser();
        let chars: Vec<char> = answer.chars().collect();
        let mut deltas: Vec<ToolCallDelta> =
            chars.chunks(piece).flat_map(|chunk| parser.push(&chunk.iter().collect::<String>())).collect();
        deltas.extend(parser.finish());
        deltas
    }

    #[test]
    fn a_llama3_answer_is_one_call_or_text() {
        let (content, calls) = ToolCallFormat::Llama3.parser().parse(&format!("\n {LLAMA3_CALL}"));
        assert_eq!(content, None);
        assert_eq!(
            calls,
            [ToolCall { name: "get_weather".into(), arguments: r#"{"city": "Paris", "days": {"n": 2}}"#.into() }]
        );
        // Text (even text that holds a call later) stays text, and so does JSON that is no call.
        for text in [format!("Sure: {LLAMA3_CALL}"), r#"{"name": "f"}"#.to_string(), "{\"name\": \"f\", \"para".into()]
        {
            let (content, calls) = ToolCallFormat::Llama3.parser().parse(&text);
            assert_eq!((content.as_deref(), calls.len()), (Some(text.as_str()), 0), "{text}");
        }
        for piece in [1, 3, 7, 1000] {
            let deltas = streamed(ToolCallFormat::Llama3, LLAMA3_CALL, piece);
            assert_eq!(deltas[0], ToolCallDelta::Call { index: 0, name: "get_weather".into() }, "pieces of {piece}");
            let arguments: String = deltas[1..]
                .iter()
                .map(|d| match d {
                    ToolCallDelta::Arguments { index: 0, text } => text.as_str(),
                    other => panic!("{other:?} in a call, pieces of {piece}"),
                })
                .collect();
            assert_eq!(arguments, r#"{"city": "Paris", "days": {"n": 2}}"#, "pieces of {piece}");
            let text = streamed(ToolCallFormat::Llama3, "It is sunny.", piece);
            assert!(text.iter().all(|d| matches!(d, ToolCallDelta::Content(_))), "pieces of {piece}");
        }
    }

    const FENCED: &str = "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": {\"n\": 2}}}\n{\"name\": \"get_time\", \"arguments\": {}}\n```";

    #[test]
    fn calls_fenced_as_a_json_code_block_are_calls() {
        for piece in [1, 2, 5, 1000] {
            let deltas = streamed(ToolCallFormat::Hermes, FENCED, piece);
            let names: Vec<&str> = deltas
                .iter()
                .filter_map(|d| if let ToolCallDelta::Call { name, .. } = d { Some(name.as_str()) } else { None })
                .collect();
            assert_eq!(names, ["get_weather", "get_time"], "pieces of {piece}");
            assert!(!deltas.iter().any(|d| matches!(d, ToolCallDelta::Content(_))), "pieces of {piece}: {deltas:?}");
            for (index, expected) in [r#"{"city": "Paris", "days": {"n": 2}}"#, "{}"].iter().enumerate() {
                let arguments: String = deltas
                    .iter()
                    .filter_map(|d| match d {
                        ToolCallDelta::Arguments { index: i, text } if *i == index => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                assert_eq!(arguments, *expected, "pieces of {piece}");
            }
        }
        // A code block of anything else, a fence left open, or JSON that is no call stay text.
        for text in [
            "```python\nprint(1)\n```".to_string(),
            "```json\n{\"a\": 1}\n```".to_string(),
            "```json\n{\"name\": \"f\", \"argu".to_string(),
            format!("Here: {FENCED}"),
        ] {
            let (content, calls) = ToolCallParser::default().parse(&text);
            assert_eq!((content.as_deref(), calls.len()), (Some(text.as_str()), 0), "{text}");
        }
    }

    #[test]
    fn the_format_is_read_from_the_template() {
        let template = |source: &str| ChatTemplate::new(source, None, None).expect("template");
        let hermes = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}<tool_call>{% endif %}";
        let llama3 = "{% for m in messages %}{% if m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{% endif %}{{ m.content }}{% endfor %}";
        assert_eq!(ToolCallFormat::of_template(&template(hermes)), Some(ToolCallFormat::Hermes));
        assert_eq!(ToolCallFormat::of_template(&template(llama3)), Some(ToolCallFormat::Llama3));
        assert_eq!(ToolCallFormat::of_template(&template("{{ messages[0].content }}")), None);
    }
}
