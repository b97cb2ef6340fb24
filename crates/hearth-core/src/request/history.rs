//! The token ids of recent prompts and answers, so that a conversation sent back as text
//! continues from the tokens the model read and wrote.
//!
//! A chat client sends each round's whole conversation as text, the model's last answer
//! included. Tokenizing that text again gives the canonical tokenization, which is not always
//! the one the model sampled (a BPE model may write "Hello" as "Hel" + "lo"): the ids then
//! differ from the answer's, and the prefix cache, which matches ids, recomputes everything from
//! the first differing block. The history remembers each prompt's rendered text with its ids and
//! each finished answer's token bytes with its ids; a new prompt that starts with a remembered
//! text reuses that text's ids and tokenizes only the rest.
//!
//! The cut is made only where the rest starts with a special token (a chat template's
//! end-of-turn, `<|im_end|>`, `<end_of_turn>`, ...). Tokenizing from a special token gives the
//! same ids as tokenizing the whole text and keeping its tail, so every id after the cut is the
//! canonical one, and the ids before it spell the text's bytes exactly.

use crate::error::CoreError;
use crate::tokenizer::Tokenizer;
use std::collections::VecDeque;
use std::sync::Mutex;

/// Remembered sequences, most recent last.
pub const HISTORY_CAPACITY: usize = 32;

/// Recent prompts and answers with their token ids. Shared by reference (the server tokenizes on
/// its HTTP threads and learns answers on its engine thread).
#[derive(Default)]
pub struct TokenHistory {
    sequences: Mutex<VecDeque<Sequence>>,
}

/// A text with the ids that spell it, and the places where the ids may be cut.
#[derive(Clone, Debug)]
struct Sequence {
    /// Whether `ids` start with a BOS that `text` does not show.
    bos_added: bool,
    text: Vec<u8>,
    ids: Vec<u32>,
    /// `(text bytes, ids)` at each cut: the end of the prompt, then after each answer token.
    cuts: Vec<(usize, usize)>,
}

impl Sequence {
    /// The longest cut after which `text` goes on with a special token (or ends), if any.
    fn reusable_prefix(&self, tokenizer: &Tokenizer, text: &str, bos_added: bool) -> Option<(usize, usize)> {
        if self.bos_added != bos_added {
            return None;
        }
        let common = self.text.iter().zip(text.as_bytes()).take_while(|(a, b)| a == b).count();
        self.cuts.iter().rev().copied().find(|&(bytes, _)| {
            bytes <= common
                && text.is_char_boundary(bytes)
                && (bytes == text.len() || tokenizer.begins_with_special_token(&text[bytes..]))
        })
    }
}

impl TokenHistory {
    pub fn new() -> Self {
        TokenHistory::default()
    }

    /// The ids of `text` (with BOS in front when `add_bos`): a remembered sequence's ids for the
    /// longest prefix it shares, cut where `text` goes on with a special token, then the rest
    /// tokenized; else the whole text tokenized. The prompt is remembered.
    pub fn encode(&self, tokenizer: &Tokenizer, text: &str, add_bos: bool) -> Result<Vec<u32>, CoreError> {
        let reused = {
            let sequences = self.lock();
            sequences
                .iter()
                .rev()
                .filter_map(|s| s.reusable_prefix(tokenizer, text, add_bos).map(|(bytes, ids)| (bytes, s, ids)))
                .max_by_key(|&(bytes, _, _)| bytes)
                .map(|(bytes, s, ids)| (bytes, s.ids[..ids].to_vec()))
        };
        let ids = match reused {
            Some((bytes, mut ids)) => {
                ids.extend(tokenizer.encode(&text[bytes..], false, true)?);
                ids
            }
            None => tokenizer.encode(text, add_bos, true)?,
        };
        let prompt = Sequence {
            bos_added: add_bos,
            text: text.as_bytes().to_vec(),
            cuts: vec![(text.len(), ids.len())],
            ids: ids.clone(),
        };
        self.remember(prompt, None);
        Ok(ids)
    }

    /// A sequence finished: `answer` (the generated ids, without the end-of-generation token)
    /// followed `prompt`. Remembered when the prompt was tokenized here; it replaces the prompt
    /// alone, which it extends.
    pub fn learn_answer(&self, tokenizer: &Tokenizer, prompt: &[u32], answer: &[u32]) {
        let found = self.lock().iter().rev().find_map(|s| {
            let &(bytes, _) = s.cuts.iter().find(|&&(_, ids)| ids == prompt.len())?;
            (s.ids.get(..prompt.len()) == Some(prompt)).then(|| (s.bos_added, s.text[..bytes].to_vec()))
        });
        let Some((bos_added, mut text)) = found else { return };
        let mut cuts = vec![(text.len(), prompt.len())];
        for (i, &id) in answer.iter().enumerate() {
            text.extend(tokenizer.token_bytes(id));
            cuts.push((text.len(), prompt.len() + i + 1));
        }
        let ids = [prompt, answer].concat();
        self.remember(Sequence { bos_added, text, ids, cuts }, Some(prompt));
    }

    /// Adds `sequence` as the most recent, in place of the prompt-only sequence of `replacing`'s
    /// ids (or of an identical one), dropping the oldest beyond [`HISTORY_CAPACITY`].
    fn remember(&self, sequence: Sequence, replacing: Option<&[u32]>) {
        let mut sequences = self.lock();
        let replaced = replacing.unwrap_or(&sequence.ids);
        sequences.retain(|s| !(s.cuts.len() == 1 && s.ids == replaced) && s.ids != sequence.ids);
        sequences.push_back(sequence);
        while sequences.len() > HISTORY_CAPACITY {
            sequences.pop_front();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Sequence>> {
        // (A panic elsewhere while the lock was held leaves whole sequences: still usable.)
        self.sequences.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
