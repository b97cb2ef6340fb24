//! The token environment llguidance's parsers work in, built from hearth's own tokenizer: every
//! id's bytes (one entry per logit, so a mask is exactly one row of logits wide) and an encoder
//! for the forced-token and token-healing paths.

use crate::chat::TOOL_CALL_MARKERS;
use crate::tokenizer::{TokenType, Tokenizer};
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// A model's tokens as llguidance sees them.
pub(super) struct TokenEnv {
    tokenizer: Tokenizer,
    trie: TokTrie,
    canonical: bool,
}

impl TokenEnv {
    /// The environment of `tokenizer` for logit rows `n_logits` wide. Control (and unknown)
    /// tokens carry llguidance's special-token marker, so grammar text never matches them but
    /// `<|im_end|>` written in a Lark grammar does; so do the tool-call markers
    /// ([`TOOL_CALL_MARKERS`]: a call's JSON cannot contain `<tool_call>` as a token). Other
    /// user-defined tokens are plain text (Gemma's `<table>` may appear in a JSON string).
    /// Ids past the vocabulary (padded output rows) have no bytes and are never allowed.
    pub fn new(tokenizer: &Tokenizer, n_logits: usize) -> Self {
        let words: Vec<Vec<u8>> = (0..n_logits as u32)
            .map(|id| match tokenizer.token_type(id) {
                Some(TokenType::Control | TokenType::Unknown) => special(tokenizer.piece(id)),
                Some(TokenType::UserDefined) if TOOL_CALL_MARKERS.contains(&tokenizer.piece(id)) => {
                    special(tokenizer.piece(id))
                }
                Some(_) => tokenizer.token_bytes(id),
                None => Vec::new(),
            })
            .collect();
        let end_of_generation: Vec<u32> =
            tokenizer.end_of_generation_ids().into_iter().filter(|&id| (id as usize) < n_logits).collect();
        let eos = tokenizer.eos().filter(|&id| (id as usize) < n_logits).or(end_of_generation.first().copied());
        let info = TokRxInfo {
            vocab_size: n_logits as u32,
            tok_eos: eos.unwrap_or(0),
            tok_bos: tokenizer.bos(),
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        let mut trie = TokTrie::from(&info, &words);
        if !end_of_generation.is_empty() {
            trie = trie.with_eos_tokens(&end_of_generation);
        }
        TokenEnv { tokenizer: tokenizer.clone(), trie, canonical: tokenizer.encodes_fragments_canonically() }
    }
}

/// A special token's word: llguidance's marker byte, then its text.
fn special(text: &str) -> Vec<u8> {
    let mut word = vec![TokTrie::SPECIAL_TOKEN_MARKER];
    word.extend_from_slice(text.as_bytes());
    word
}

impl TokenEnv {
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

impl TokenizerEnv for TokenEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The model's tokens of `bytes` as text inside an answer (no control tokens parsed); bytes
    /// that are not UTF-8 go byte by byte through the trie.
    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        let n_logits = self.trie.vocab_size() as u32;
        self.trie.tokenize_with_greedy_fallback(bytes, |text| {
            // (Plain text always encodes; a failure, or an id past the logits, falls back to
            // the trie's greedy tokenization, which is valid if not the model's own.)
            match self.tokenizer.encode(text, false, false) {
                Ok(ids) if ids.iter().all(|&id| id < n_logits) => ids,
                _ => self.trie.greedy_tokenize(text.as_bytes()),
            }
        })
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical
    }
}
