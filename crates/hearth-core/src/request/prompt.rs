//! A request's prompt, and the one rule that turns it into token ids.

use super::{bad, TokenHistory, ToolRequest};
use crate::chat::ChatTemplate;
use crate::error::CoreError;
use crate::tokenizer::Tokenizer;
use serde_json::Value;

/// What the model reads: chat messages (rendered with the model's chat template) or raw text.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// OpenAI-shaped messages, each with a string `role` and its `content` as one string (text
    /// parts joined); other fields (`name`, `tool_calls`, ...) go to the template as sent.
    Chat(Vec<Value>),
    Text(String),
}

impl Prompt {
    /// Messages with string content, or content as a list of `{"type": "text", "text": ...}`
    /// parts (joined); a missing or null content is empty.
    pub fn from_messages(messages: Option<&[Value]>) -> Result<Prompt, CoreError> {
        let messages = match messages {
            None => return Err(bad("messages", "'messages' is a required property.")),
            Some([]) => return Err(bad("messages", "'messages' must contain at least one message.")),
            Some(m) => m,
        };
        messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let invalid = |what: &str| bad("messages", format!("messages[{i}]: {what}"));
                let Value::Object(fields) = m else {
                    return Err(invalid("a message must be an object like {\"role\": \"user\", \"content\": \"...\"}"));
                };
                if !fields.get("role").is_some_and(Value::is_string) {
                    return Err(invalid("'role' must be a string"));
                }
                let content = match fields.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                            (Some("text"), Some(text)) => Ok(text),
                            _ => Err(invalid(
                                "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported",
                            )),
                        })
                        .collect::<Result<Vec<_>, _>>()?
                        .concat(),
                    Some(_) => return Err(invalid("'content' must be a string or a list of text parts")),
                };
                let mut message = fields.clone();
                message.insert("content".into(), Value::String(content));
                Ok(Value::Object(message))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Prompt::Chat)
    }

    /// A non-empty string, or a list holding one.
    pub fn from_completion(prompt: Option<&Value>) -> Result<Prompt, CoreError> {
        let invalid = |m: &str| bad("prompt", m);
        match prompt {
            None => Err(invalid("'prompt' is a required property.")),
            Some(Value::String(s)) if s.is_empty() => Err(invalid("'prompt' must not be empty.")),
            Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
            Some(Value::Array(items)) => match items.as_slice() {
                [Value::String(s)] if !s.is_empty() => Ok(Prompt::Text(s.clone())),
                _ => Err(invalid(
                    "'prompt' must be a non-empty string or a list of one string (batches are not supported).",
                )),
            },
            Some(_) => Err(invalid("'prompt' must be a string.")),
        }
    }

    /// The prompt's token ids. Text is tokenized with the model's BOS default; chat messages are
    /// rendered with `template` (at `now_unix`, for templates that print the date), then
    /// tokenized with special tokens parsed and no second BOS where the template wrote one.
    pub fn tokenize(
        &self,
        tokenizer: &Tokenizer,
        template: Option<&ChatTemplate>,
        now_unix: Option<i64>,
    ) -> Result<Vec<u32>, CoreError> {
        self.tokenize_with_tools(tokenizer, template, now_unix, None, None)
    }

    /// [`Prompt::tokenize`] with the request's tools in the template's `tools` variable.
    /// Assistant messages' tool-call arguments sent as JSON text (OpenAI's shape) reach the
    /// template as objects ([`crate::chat::template_messages`]). With a `history`, a prompt that
    /// goes on from a remembered prompt and answer keeps their ids ([`TokenHistory`]).
    pub fn tokenize_with_tools(
        &self,
        tokenizer: &Tokenizer,
        template: Option<&ChatTemplate>,
        now_unix: Option<i64>,
        tools: Option<&ToolRequest>,
        history: Option<&TokenHistory>,
    ) -> Result<Vec<u32>, CoreError> {
        let (text, add_bos) = self.render(tokenizer, template, now_unix, tools)?;
        let ids = match history {
            Some(history) => history.encode(tokenizer, &text, add_bos)?,
            None => tokenizer.encode(&text, add_bos, true)?,
        };
        if ids.is_empty() {
            return Err(bad("prompt", "The prompt is empty."));
        }
        Ok(ids)
    }

    /// The text the model reads, and whether BOS goes in front of it.
    fn render(
        &self,
        tokenizer: &Tokenizer,
        template: Option<&ChatTemplate>,
        now_unix: Option<i64>,
        tools: Option<&ToolRequest>,
    ) -> Result<(String, bool), CoreError> {
        match self {
            Prompt::Text(text) => Ok((text.clone(), tokenizer.add_bos_default())),
            Prompt::Chat(messages) => {
                let template = template.ok_or_else(|| {
                    bad("messages", "This model has no chat template; send a text prompt to completions instead.")
                })?;
                let messages = Value::from(crate::chat::template_messages(messages));
                let tools = tools.map(|t| Value::from(t.tools.clone()));
                let text = match now_unix {
                    Some(now) => template.clone().with_now(now).render_json(&messages, true, tools.as_ref()),
                    None => template.render_json(&messages, true, tools.as_ref()),
                }
                .map_err(|e| bad("messages", format!("The chat template rejected the messages: {e}")))?;
                let add_bos = templated_add_bos(tokenizer, &text);
                Ok((text, add_bos))
            }
        }
    }
}

/// Whether text a chat template produced still needs the model's BOS: not when the template wrote
/// it already (a second BOS changes what the model sees).
pub fn templated_add_bos(tokenizer: &Tokenizer, text: &str) -> bool {
    if let Some(bos) = tokenizer.bos() {
        let bos_text = String::from_utf8_lossy(&tokenizer.token_bytes(bos)).into_owned();
        if !bos_text.is_empty() && text.starts_with(&bos_text) {
            return false;
        }
    }
    tokenizer.add_bos_default()
}
