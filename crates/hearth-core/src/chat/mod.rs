//! Chat templates: the GGUF `tokenizer.chat_template` (a Jinja template written for HF
//! transformers) rendered with `minijinja`, configured to behave like transformers'
//! `apply_chat_template`: `trim_blocks` + `lstrip_blocks`, loop controls, Python string/dict
//! methods (`minijinja-contrib` pycompat), `raise_exception`, `strftime_now`, and Python's
//! `json.dumps` flavour of `tojson`.

mod pyjson;
mod strftime;
mod tool_calls;

pub use pyjson::python_float_repr;
pub use strftime::strftime_utc;
pub use tool_calls::{template_messages, ToolCall, ToolCallDelta, ToolCallFormat, ToolCallParser, TOOL_CALL_MARKERS};

use crate::error::{CoreError, Result};
use crate::gguf::Metadata;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};

/// The template's name inside its minijinja environment (shows up in error messages).
const TEMPLATE_NAME: &str = "chat_template";

/// One turn of a conversation with plain-text content. For OpenAI-shaped messages with
/// `tool_calls`, content parts, `name`, ... use [`ChatTemplate::render_json`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

/// A compiled chat template plus the special-token strings it may reference.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    environment: Environment<'static>,
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` become the template variables of the same name
    /// (undefined when `None`, as when a HF tokenizer has no such token).
    pub fn new(source: impl Into<String>, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let source = source.into();
        let mut environment = Environment::new();
        environment.set_trim_blocks(true);
        environment.set_lstrip_blocks(true);
        environment.set_auto_escape_callback(|_| AutoEscape::None);
        environment.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        environment.add_function("raise_exception", raise_exception);
        environment.add_filter("tojson", pyjson::tojson_filter);
        set_clock(&mut environment, None);
        environment
            .add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| CoreError::ChatTemplate(describe(&e)))?;
        Ok(ChatTemplate { source, bos_token, eos_token, environment })
    }

    /// The model's own template; `Ok(None)` when the GGUF has no `tokenizer.chat_template`.
    pub fn from_gguf(meta: &Metadata) -> Result<Option<Self>> {
        match meta.opt_str("tokenizer.chat_template")? {
            None => Ok(None),
            Some(source) => Self::from_gguf_with_source(meta, source).map(Some),
        }
    }

    /// `source` (a user-supplied or fallback template) with the special tokens of the GGUF.
    pub fn from_gguf_with_source(meta: &Metadata, source: &str) -> Result<Self> {
        let bos_token = token_text(meta, "tokenizer.ggml.bos_token_id")?;
        let eos_token = token_text(meta, "tokenizer.ggml.eos_token_id")?;
        Self::new(source, bos_token, eos_token)
    }

    /// Fixes the time `strftime_now` formats (UTC). Without it the system clock is used
    /// natively; on wasm (no clock in `std`) `strftime_now` then fails with a template error.
    pub fn with_now(mut self, unix_seconds: i64) -> Self {
        set_clock(&mut self.environment, Some(unix_seconds));
        self
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Renders a plain-text conversation. `add_generation_prompt` appends the assistant header.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, add_generation_prompt, None)
    }

    /// As [`render`](Self::render), with `tools`: a JSON array of OpenAI-style tool schemas.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        self.render_values(Value::from_serialize(messages), add_generation_prompt, tools)
    }

    /// Renders OpenAI-shaped messages given as JSON (an array of objects with `role`, `content`
    /// as a string or a list of parts, `tool_calls`, ...), passed to the template unchanged.
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        if !messages.is_array() {
            return Err(CoreError::ChatTemplate("messages must be a JSON array".into()));
        }
        self.render_values(Value::from_serialize(messages), add_generation_prompt, tools)
    }

    fn render_values(
        &self,
        messages: Value,
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        let template =
            self.environment.get_template(TEMPLATE_NAME).map_err(|e| CoreError::ChatTemplate(describe(&e)))?;
        // Like transformers: `tools` is None (not undefined) when absent; bos/eos undefined when the model has none.
        let tools = tools.map(Value::from_serialize).unwrap_or(Value::from(()));
        let context = minijinja::context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone(),
            eos_token => self.eos_token.clone(),
        };
        template.render(context).map_err(|e| CoreError::ChatTemplate(describe(&e)))
    }
}

/// The text of the special token whose id is stored under `id_key`, looked up in `tokenizer.ggml.tokens`.
fn token_text(meta: &Metadata, id_key: &str) -> Result<Option<String>> {
    let Some(id) = meta.opt_usize(id_key)? else { return Ok(None) };
    let Some(tokens) = meta.opt_array("tokenizer.ggml.tokens")? else { return Ok(None) };
    let token = tokens.get(id).ok_or_else(|| {
        CoreError::Tokenizer(format!("{id_key} = {id} is out of range for a vocabulary of {} tokens", tokens.len()))
    })?;
    let text = token.as_str().ok_or_else(|| CoreError::WrongType {
        key: "tokenizer.ggml.tokens".into(),
        expected: "an array of strings",
        found: token.type_name(),
    })?;
    Ok(Some(text.to_string()))
}

/// `raise_exception(message)`: how HF templates reject a conversation they cannot format.
fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

fn set_clock(environment: &mut Environment<'static>, fixed_now: Option<i64>) {
    environment.add_function("strftime_now", move |format: String| -> std::result::Result<Value, Error> {
        let now = match fixed_now {
            Some(now) => now,
            None => system_now()?,
        };
        Ok(Value::from(strftime_utc(&format, now)))
    });
}

#[cfg(not(target_arch = "wasm32"))]
fn system_now() -> std::result::Result<i64, Error> {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("strftime_now: system clock: {e}")))?;
    Ok(since_epoch.as_secs() as i64)
}

#[cfg(target_arch = "wasm32")]
fn system_now() -> std::result::Result<i64, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, "strftime_now: no clock on wasm; call ChatTemplate::with_now"))
}

/// The error with its cause chain and template location, on one line each.
fn describe(error: &Error) -> String {
    let mut message = error.to_string();
    if let Some(detail) = error.detail() {
        if !message.contains(detail) {
            message.push_str(": ");
            message.push_str(detail);
        }
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str("; caused by: ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
