//! Tokenizers described by GGUF metadata, built on HF `tokenizers`. Being written: see the tokenizer task.

use crate::error::{CoreError, Result};
use crate::gguf::Metadata;

pub struct Tokenizer {
    _private: (),
}

impl Tokenizer {
    pub fn from_gguf(_meta: &Metadata) -> Result<Self> {
        Err(CoreError::Tokenizer("not built yet".into()))
    }
    pub fn vocab_size(&self) -> usize {
        0
    }
    pub fn encode(&self, _text: &str, _add_bos: bool, _parse_special: bool) -> Result<Vec<u32>> {
        Err(CoreError::Tokenizer("not built yet".into()))
    }
    pub fn add_bos_default(&self) -> bool {
        false
    }
    pub fn bos(&self) -> Option<u32> {
        None
    }
    pub fn eos(&self) -> Option<u32> {
        None
    }
    pub fn is_end_of_generation(&self, _id: u32) -> bool {
        false
    }
    pub fn token_bytes(&self, _id: u32) -> Vec<u8> {
        Vec::new()
    }
    pub fn decode(&self, _ids: &[u32], _skip_special: bool) -> Result<String> {
        Ok(String::new())
    }
}

/// Turns a stream of token ids into text, never splitting a UTF-8 character.
#[derive(Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend(tok.token_bytes(id));
        String::new()
    }
    pub fn flush(&mut self) -> String {
        String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned()
    }
}
