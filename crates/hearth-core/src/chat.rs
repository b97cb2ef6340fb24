//! Chat templates (GGUF `tokenizer.chat_template`) rendered with minijinja. Being written: see the chat task.

use crate::error::{CoreError, Result};
use crate::gguf::Metadata;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

pub struct ChatTemplate {
    source: String,
}

impl ChatTemplate {
    pub fn from_gguf(meta: &Metadata) -> Result<Option<Self>> {
        Ok(meta.opt_str("tokenizer.chat_template")?.map(|s| ChatTemplate { source: s.to_string() }))
    }
    pub fn render(&self, _messages: &[ChatMessage], _add_generation_prompt: bool) -> Result<String> {
        let _ = &self.source;
        Err(CoreError::ChatTemplate("not built yet".into()))
    }
}
