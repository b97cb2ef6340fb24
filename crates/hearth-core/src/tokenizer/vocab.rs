//! Token table shared by every tokenizer kind: piece text, token type, the special-token partition
//! and the end-of-generation set, following llama.cpp's `llama_vocab` rules.

use std::collections::{HashMap, HashSet};

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    pub fn from_gguf(value: u64) -> Self {
        match value {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    /// Tokens llama.cpp cuts out of the text before running the model (`cache_special_tokens`).
    fn is_partitioned(self) -> bool {
        matches!(self, TokenType::Control | TokenType::UserDefined | TokenType::Unknown)
    }

    /// Tokens that only match as whole tokens when special-token parsing is on, and that are
    /// dropped by `decode(.., skip_special = true)`.
    pub fn is_special(self) -> bool {
        matches!(self, TokenType::Control | TokenType::Unknown)
    }
}

/// A piece of input after special-token partitioning.
#[derive(Debug, PartialEq, Eq)]
pub enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// Token texts llama.cpp marks as end-of-generation (`special_eog_ids`), whatever the model says.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// FIM tokens llama.cpp also stops on (pad, repo, file separator), found by text when the metadata
/// does not name them.
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

#[derive(Clone)]
pub struct Vocab {
    pieces: Vec<String>,
    types: Vec<TokenType>,
    piece_to_id: HashMap<String, u32>,
    /// Control, user-defined and unknown tokens, longest text first (llama.cpp's partition order).
    partitioned: Vec<u32>,
    eog: HashSet<u32>,
}

impl Vocab {
    /// `explicit_eog` are ids the metadata names as eos/eot/eom/fim (added to the text-based set).
    pub fn new(pieces: Vec<String>, mut types: Vec<TokenType>, explicit_eog: &[Option<u32>]) -> Self {
        let piece_to_id: HashMap<String, u32> =
            pieces.iter().enumerate().map(|(id, p)| (p.clone(), id as u32)).collect();
        let find_first = |texts: &[&str]| texts.iter().find_map(|t| piece_to_id.get(*t).copied());

        let mut eog: HashSet<u32> = HashSet::new();
        for texts in [FIM_PAD_TEXTS, FIM_REP_TEXTS, FIM_SEP_TEXTS] {
            eog.extend(find_first(texts));
        }
        for text in EOG_TEXTS {
            if let Some(&id) = piece_to_id.get(*text) {
                eog.insert(id);
                // llama.cpp promotes EOG-looking tokens to control type.
                if let Some(t) = types.get_mut(id as usize) {
                    if !t.is_special() {
                        *t = TokenType::Control;
                    }
                }
            }
        }
        eog.extend(explicit_eog.iter().flatten().filter(|&&id| (id as usize) < pieces.len()));
        // gpt-oss / solar-open: "<|end|>" ends a message, not the generation.
        let has = |eog: &HashSet<u32>, text: &str| piece_to_id.get(text).is_some_and(|id| eog.contains(id));
        if let Some(&end) = piece_to_id.get("<|end|>") {
            let call = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
            let (ret, flush) = (has(&eog, "<|return|>"), has(&eog, "<|flush|>"));
            if eog.contains(&end) && call && (ret || flush) {
                eog.remove(&end);
                types[end as usize] = TokenType::UserDefined;
            }
        }
        // gemma4 / plamo: "</s>" is an ordinary token there.
        if let Some(&s) = piece_to_id.get("</s>") {
            if eog.contains(&s) && (has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>")) {
                eog.remove(&s);
                types[s as usize] = TokenType::Normal;
            }
        }
        let mut partitioned: Vec<u32> =
            (0..pieces.len() as u32).filter(|&id| types[id as usize].is_partitioned()).collect();
        partitioned.sort_by_key(|&id| std::cmp::Reverse(pieces[id as usize].len()));

        Vocab { pieces, types, piece_to_id, partitioned, eog }
    }

    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    pub fn piece(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(String::as_str)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    pub fn id_of(&self, piece: &str) -> Option<u32> {
        self.piece_to_id.get(piece).copied()
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Whether `text` starts with a token [`Vocab::partition`] matches (control tokens only when
    /// `parse_special`).
    pub fn starts_with_partitioned(&self, text: &str, parse_special: bool) -> bool {
        self.partitioned.iter().any(|&id| {
            let piece = self.pieces[id as usize].as_str();
            (parse_special || !self.types[id as usize].is_special()) && !piece.is_empty() && text.starts_with(piece)
        })
    }

    /// Splits `text` around special tokens exactly like llama.cpp's `tokenizer_st_partition`: for each
    /// special token, longest first, every occurrence in every remaining text fragment becomes a token.
    /// Control and unknown tokens are only matched when `parse_special`; user-defined ones always.
    pub fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut fragments = Vec::new();
        if text.is_empty() {
            return fragments;
        }
        fragments.push(Fragment::Text(text));
        // Byte bigrams present in the text: a cheap filter that skips most of Gemma's 6k specials.
        let mut bigrams = vec![false; 1 << 16];
        for pair in text.as_bytes().windows(2) {
            bigrams[(pair[0] as usize) << 8 | pair[1] as usize] = true;
        }
        for &id in &self.partitioned {
            if !parse_special && self.types[id as usize].is_special() {
                continue;
            }
            let special = self.pieces[id as usize].as_str();
            let sb = special.as_bytes();
            if sb.is_empty() || sb.len() > text.len() {
                continue;
            }
            if sb.len() >= 2 && !bigrams[(sb[0] as usize) << 8 | sb[1] as usize] {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                match fragment {
                    Fragment::Text(mut rest) => {
                        while let Some(at) = rest.find(special) {
                            if at > 0 {
                                next.push(Fragment::Text(&rest[..at]));
                            }
                            next.push(Fragment::Token(id));
                            rest = &rest[at + special.len()..];
                        }
                        if !rest.is_empty() {
                            next.push(Fragment::Text(rest));
                        }
                    }
                    token => next.push(token),
                }
            }
            fragments = next;
        }
        fragments
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> Vocab {
        let pieces: Vec<String> = ["a", "<s>", "<|im_end|>", "  ", "   "].iter().map(|s| s.to_string()).collect();
        let types = vec![
            TokenType::Normal,
            TokenType::Control,
            TokenType::Normal,
            TokenType::UserDefined,
            TokenType::UserDefined,
        ];
        Vocab::new(pieces, types, &[Some(1)])
    }

    #[test]
    fn partition_prefers_longest_special_and_respects_parse_special() {
        let v = vocab();
        assert_eq!(
            v.partition("x     y<s>", true),
            vec![Fragment::Text("x"), Fragment::Token(4), Fragment::Token(3), Fragment::Text("y"), Fragment::Token(1)]
        );
        // Control tokens are plain text without parse_special; user-defined ones still match.
        assert_eq!(v.partition("<s>  ", false), vec![Fragment::Text("<s>"), Fragment::Token(3)]);
    }

    #[test]
    fn eog_includes_text_rules_and_explicit_ids() {
        let v = vocab();
        assert!(v.is_eog(2), "<|im_end|> is end-of-generation by text");
        assert_eq!(v.token_type(2), Some(TokenType::Control), "promoted to control like llama.cpp");
        assert!(v.is_eog(1), "explicit eos id");
        assert!(!v.is_eog(0));
    }
}
