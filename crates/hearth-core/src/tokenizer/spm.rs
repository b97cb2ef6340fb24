//! SentencePiece-BPE as llama.cpp runs it (`llm_tokenizer_spm_session`): start from UTF-8
//! characters, repeatedly merge the adjacent pair whose concatenation is the highest-scoring token
//! (leftmost on ties), and emit characters that never formed a token as `<0xNN>` byte tokens.
//!
//! This is a small custom model rather than HF `BPE` with merges derived from the scores: that
//! derivation needs ~0.5M merges for Gemma's 262k vocabulary and took over a second to build, and HF
//! ranks cannot express llama.cpp's "equal score → leftmost" rule.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;
use crate::error::{CoreError, Result};

#[derive(Clone)]
pub struct SpmModel {
    scores: Vec<f32>,
    /// `<0xNN>` token of each byte (or the single-byte token), for characters outside the vocabulary.
    byte_tokens: [Option<u32>; 256],
    unk: Option<u32>,
}

struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

impl SpmModel {
    pub fn new(vocab: &Vocab, scores: Vec<f32>, unk: Option<u32>) -> Self {
        let mut byte_tokens = [None; 256];
        for (byte, slot) in byte_tokens.iter_mut().enumerate() {
            *slot = vocab.id_of(&format!("<0x{byte:02X}>")).or_else(|| {
                let single = [byte as u8];
                std::str::from_utf8(&single).ok().and_then(|s| vocab.id_of(s))
            });
        }
        SpmModel { scores, byte_tokens, unk }
    }

    /// Appends the tokens of `text` (spaces already replaced by `▁`) to `out`.
    pub fn tokenize(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            let end = start + c.len_utf8();
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: (end < text.len()).then_some(i + 1),
            });
        }
        let mut queue = BinaryHeap::new();
        let try_add =
            |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: Option<usize>, right: Option<usize>| {
                let (Some(left), Some(right)) = (left, right) else {
                    return;
                };
                let (l, r) = (&symbols[left], &symbols[right]);
                let merged = &text[l.start..r.start + r.len];
                if let Some(id) = vocab.id_of(merged) {
                    let score = self.scores.get(id as usize).copied().unwrap_or(0.0);
                    queue.push(Bigram { score, left, right, len: merged.len() });
                }
            };
        for i in 1..symbols.len() {
            try_add(&symbols, &mut queue, Some(i - 1), Some(i));
        }
        while let Some(bigram) = queue.pop() {
            let (left_len, right_len) = (symbols[bigram.left].len, symbols[bigram.right].len);
            // Stale: one side was merged into something else since this pair was queued.
            if left_len == 0 || right_len == 0 || left_len + right_len != bigram.len {
                continue;
            }
            let right_next = symbols[bigram.right].next;
            symbols[bigram.left].len += right_len;
            symbols[bigram.left].next = right_next;
            symbols[bigram.right].len = 0;
            if let Some(next) = right_next {
                symbols[next].prev = Some(bigram.left);
            }
            let left_prev = symbols[bigram.left].prev;
            try_add(&symbols, &mut queue, left_prev, Some(bigram.left));
            try_add(&symbols, &mut queue, Some(bigram.left), right_next);
        }

        let mut at = if symbols.is_empty() { None } else { Some(0) };
        while let Some(i) = at {
            let symbol = &symbols[i];
            let piece = &text[symbol.start..symbol.start + symbol.len];
            match vocab.id_of(piece) {
                Some(id) => out.push(id),
                None => {
                    for &byte in piece.as_bytes() {
                        let id = self.byte_tokens[byte as usize].or(self.unk).ok_or_else(|| {
                            CoreError::Tokenizer(format!("no byte token for 0x{byte:02X} and no unknown token"))
                        })?;
                        out.push(id);
                    }
                }
            }
            at = symbol.next;
        }
        Ok(())
    }
}
