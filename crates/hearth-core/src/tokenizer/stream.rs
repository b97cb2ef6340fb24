//! Incremental detokenization that never emits half a UTF-8 character.

use super::Tokenizer;

/// Turns a stream of token ids into text, never splitting a UTF-8 character: bytes of an incomplete
/// multi-byte sequence (e.g. an emoji spread over byte tokens) are held back until the rest arrives.
/// Control tokens are skipped unless built with [`StreamDecoder::with_special`] (llama.cpp's default
/// streaming also renders them as nothing).
#[derive(Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    show_special: bool,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// `show_special`: also emit the text of control tokens such as `<|im_end|>`.
    pub fn with_special(show_special: bool) -> Self {
        StreamDecoder { pending: Vec::new(), show_special }
    }

    /// Appends a token and returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        let skip = !self.show_special && tok.token_type(id).is_some_and(|t| t.is_special());
        if !skip {
            self.pending.extend(tok.token_bytes(id));
        }
        self.take_complete()
    }

    /// Returns whatever is still held back (an incomplete sequence becomes U+FFFD).
    pub fn flush(&mut self) -> String {
        String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned()
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(valid) => {
                    out.push_str(valid);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid_end = start + e.valid_up_to();
                    // Safe: `valid_up_to` bytes were just checked to be UTF-8.
                    out.push_str(std::str::from_utf8(&self.pending[start..valid_end]).unwrap_or_default());
                    match e.error_len() {
                        // Bytes that can never become valid: replace and keep going.
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            start = valid_end + bad;
                        }
                        // An incomplete sequence at the end: wait for more bytes.
                        None => {
                            start = valid_end;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_incomplete_sequences_and_replaces_invalid_bytes() {
        let mut d = StreamDecoder::default();
        d.pending.extend_from_slice(&[b'a', 0xF0, 0x9F]);
        assert_eq!(d.take_complete(), "a");
        d.pending.extend_from_slice(&[0x91, 0x8B, 0xFF, b'b']);
        assert_eq!(d.take_complete(), "👋\u{FFFD}b");
        d.pending.push(0xE4);
        assert_eq!(d.take_complete(), "");
        assert_eq!(d.flush(), "\u{FFFD}");
    }
}
