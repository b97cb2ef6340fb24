//! Tokenizers described by GGUF metadata (or a HF `tokenizer.json`), built on HF `tokenizers`, with
//! llama.cpp's semantics: special-token partitioning, BOS/EOS defaults, end-of-generation set and
//! piece decoding all follow `llama-vocab.cpp`.
//!
//! Encoding: the text is first cut around special tokens ([`vocab::Vocab::partition`]); each text
//! fragment then goes through a HF pipeline (byte-level BPE with llama.cpp's pre-tokenizer regexes
//! for `gpt2` models, the model's own pipeline for `tokenizer.json`), or for `llama` (SentencePiece)
//! GGUFs through [`spm::SpmModel`], llama.cpp's score-ordered merge loop.

mod build;
mod byte_level;
mod pre_tokenizer;
mod spm;
mod stream;
mod vocab;

pub use stream::StreamDecoder;
pub use vocab::TokenType;

use crate::error::{CoreError, Result};
use crate::gguf::Metadata;
use byte_level::{byte_level_piece_bytes, parse_byte_token, spm_piece_bytes};
use vocab::{Fragment, Vocab};

/// How text fragments reach the HF pipeline.
#[derive(Clone)]
enum TextPipeline {
    /// GGUF `gpt2`: the HF pipeline does the regex pre-tokenization and byte mapping.
    ByteLevel,
    /// GGUF `llama`: spaces become `▁` here; a space is prepended to fragments that start the input
    /// or follow a special token when `add_space_prefix`. Tokenized by [`spm::SpmModel`].
    SentencePiece { add_space_prefix: bool, model: Box<spm::SpmModel> },
    /// `tokenizer.json`: its own normalizer and pre-tokenizer do everything.
    HfNative,
}

/// How token pieces map back to bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PieceStyle {
    ByteLevel,
    SentencePiece,
}

#[derive(Clone)]
pub struct Tokenizer {
    vocab: Vocab,
    /// HF pipeline for byte-level BPE and tokenizer.json models; `None` for SentencePiece GGUFs.
    hf: Option<tokenizers::Tokenizer>,
    pipeline: TextPipeline,
    piece_style: PieceStyle,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
}

fn opt_id(meta: &Metadata, key: &str, n_tokens: usize) -> Result<Option<u32>> {
    Ok(meta.opt_usize(key)?.filter(|&id| id < n_tokens).map(|id| id as u32))
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata (models `gpt2` and `llama`).
    pub fn from_gguf(meta: &Metadata) -> Result<Self> {
        let model = meta.str("tokenizer.ggml.model")?;
        let pieces: Vec<String> = meta.str_array("tokenizer.ggml.tokens")?.into_iter().map(str::to_owned).collect();
        let n = pieces.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(CoreError::Tokenizer(format!("vocabulary has {n} tokens")));
        }
        let mut types = vec![TokenType::Normal; n];
        if let Some(raw) = meta.opt_array("tokenizer.ggml.token_type")? {
            if raw.len() < n {
                return Err(CoreError::Tokenizer(format!("token_type has {} entries for {n} tokens", raw.len())));
            }
            for (t, v) in types.iter_mut().zip(raw) {
                *t = TokenType::from_gguf(v.as_u64().unwrap_or(0));
            }
        }

        // llama.cpp's per-model defaults, overridden by metadata below.
        let (hf, scores, piece_style, default_bos, default_eos, default_add_bos) = match model {
            "gpt2" => {
                let pre = meta.opt_str("tokenizer.ggml.pre")?.unwrap_or("default");
                let spec = pre_tokenizer::spec_for(pre)?;
                let merges = meta.str_array("tokenizer.ggml.merges")?;
                let hf = build::byte_level_bpe(&pieces, &merges, &spec)?;
                (Some(hf), None, PieceStyle::ByteLevel, Some(11), Some(11), spec.add_bos_default)
            }
            "llama" => {
                let scores: Vec<f32> = match meta.opt_array("tokenizer.ggml.scores")? {
                    Some(raw) if raw.len() >= n => raw.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect(),
                    Some(raw) => {
                        return Err(CoreError::Tokenizer(format!("scores has {} entries for {n} tokens", raw.len())))
                    }
                    None => vec![0.0; n],
                };
                (None, Some(scores), PieceStyle::SentencePiece, Some(1), Some(2), true)
            }
            other => {
                return Err(CoreError::Tokenizer(format!(
                    "unsupported tokenizer model '{other}' (supported: gpt2, llama)"
                )))
            }
        };
        let in_range = |id: Option<u32>| id.filter(|&id| (id as usize) < n);
        let bos = opt_id(meta, "tokenizer.ggml.bos_token_id", n)?.or(in_range(default_bos));
        let eos = opt_id(meta, "tokenizer.ggml.eos_token_id", n)?.or(in_range(default_eos));
        let add_bos = meta.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(default_add_bos);
        let explicit_eog = [
            eos,
            opt_id(meta, "tokenizer.ggml.eot_token_id", n)?,
            opt_id(meta, "tokenizer.ggml.eom_token_id", n)?,
            opt_id(meta, "tokenizer.ggml.fim_pad_token_id", n)?,
            opt_id(meta, "tokenizer.ggml.fim_rep_token_id", n)?,
            opt_id(meta, "tokenizer.ggml.fim_sep_token_id", n)?,
        ];
        let vocab = Vocab::new(pieces, types, &explicit_eog);
        let pipeline = match scores {
            Some(scores) => {
                let unk = opt_id(meta, "tokenizer.ggml.unknown_token_id", n)?.or(Some(0));
                let add_space_prefix = meta.opt_bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
                TextPipeline::SentencePiece {
                    add_space_prefix,
                    model: Box::new(spm::SpmModel::new(&vocab, scores, unk)),
                }
            }
            None => TextPipeline::ByteLevel,
        };
        Ok(Tokenizer { vocab, hf, pipeline, piece_style, bos, eos, add_bos })
    }

    /// Builds the tokenizer from a HF `tokenizer.json`. Added tokens become control tokens
    /// (`special: true`) or user-defined ones; BOS is the special token the post-processor puts in
    /// front of a single sequence, if any; EOS is found by the usual names.
    pub fn from_tokenizer_json(bytes: &[u8]) -> Result<Self> {
        let mut hf = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| CoreError::Tokenizer(format!("parsing tokenizer.json: {e}")))?;
        let json: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| CoreError::Tokenizer(format!("parsing tokenizer.json: {e}")))?;
        let mentions_byte_level = |key: &str| json.get(key).is_some_and(|v| v.to_string().contains("\"ByteLevel\""));
        let piece_style = if mentions_byte_level("decoder") || mentions_byte_level("pre_tokenizer") {
            PieceStyle::ByteLevel
        } else {
            PieceStyle::SentencePiece
        };

        let by_piece = hf.get_vocab(true);
        let n = by_piece.values().map(|&id| id as usize + 1).max().unwrap_or(0);
        let mut pieces: Vec<String> = (0..n).map(|id| format!("[UNUSED_{id}]")).collect();
        let mut types = vec![TokenType::Unused; n];
        for (piece, id) in by_piece {
            let is_byte = piece_style == PieceStyle::SentencePiece && parse_byte_token(&piece).is_some();
            types[id as usize] = if is_byte { TokenType::Byte } else { TokenType::Normal };
            pieces[id as usize] = piece;
        }
        for (id, added) in hf.get_added_tokens_decoder() {
            if let Some(t) = types.get_mut(id as usize) {
                *t = if added.special { TokenType::Control } else { TokenType::UserDefined };
            }
        }
        // Find BOS before switching off special-token matching (the post-processor adds it).
        let probe = hf.encode("a", true).map_err(|e| CoreError::Tokenizer(format!("probing tokenizer.json: {e}")))?;
        let first = probe.get_ids().first().copied();
        let bos = first.filter(|&id| types.get(id as usize) == Some(&TokenType::Control));
        let add_bos = bos.is_some();
        let find =
            |names: &[&str]| names.iter().find_map(|name| pieces.iter().position(|p| p == name).map(|i| i as u32));
        let eos = find(&["<eos>", "</s>", "<|end_of_text|>", "<|endoftext|>"]);
        // Our partition finds special tokens; the HF pipeline must treat any left in the text as text.
        hf.set_encode_special_tokens(true);
        let vocab = Vocab::new(pieces, types, &[eos]);
        Ok(Tokenizer { vocab, hf: Some(hf), pipeline: TextPipeline::HfNative, piece_style, bos, eos, add_bos })
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// Token ids of `text`. `add_bos` prepends BOS (error if the model has none); `parse_special`
    /// lets control tokens written in the text (e.g. `<|im_start|>`) match as single tokens —
    /// without it they are tokenized as plain text. User-defined tokens always match (as in llama.cpp).
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if add_bos {
            ids.push(self.bos.ok_or_else(|| CoreError::Tokenizer("model has no BOS token".into()))?);
        }
        let mut after_special = true;
        for fragment in self.vocab.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    ids.push(id);
                    after_special = true;
                }
                Fragment::Text(text) => {
                    match (&self.pipeline, &self.hf) {
                        (TextPipeline::SentencePiece { add_space_prefix, model }, _) => {
                            let prefix = if *add_space_prefix && after_special { "\u{2581}" } else { "" };
                            let escaped = format!("{prefix}{}", text.replace(' ', "\u{2581}"));
                            model.tokenize(&self.vocab, &escaped, &mut ids)?;
                        }
                        (TextPipeline::ByteLevel | TextPipeline::HfNative, Some(hf)) => {
                            let encoding = hf
                                .encode(text, false)
                                .map_err(|e| CoreError::Tokenizer(format!("encoding text: {e}")))?;
                            ids.extend_from_slice(encoding.get_ids());
                        }
                        (_, None) => return Err(CoreError::Tokenizer("tokenizer has no text model".into())),
                    }
                    after_special = false;
                }
            }
        }
        Ok(ids)
    }

    /// Whether the model wants BOS in front of a prompt (`tokenizer.ggml.add_bos_token`, else
    /// llama.cpp's default for the tokenizer kind).
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// llama.cpp's end-of-generation set: EOS, EOT/EOM, the FIM pad/repo/file-separator tokens and
    /// tokens named like `<|im_end|>`, `<|endoftext|>`, `<end_of_turn>`, `<|eot_id|>`, ...
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.vocab.is_eog(id)
    }

    /// Every end-of-generation token id (see [`Tokenizer::is_end_of_generation`]), ascending.
    pub fn end_of_generation_ids(&self) -> Vec<u32> {
        (0..self.vocab.len() as u32).filter(|&id| self.vocab.is_eog(id)).collect()
    }

    /// Whether encoding a text fragment gives the tokens of its bytes alone: false for
    /// SentencePiece models that prefix a space to the input's first fragment, whose encoding
    /// of a continuation is not the continuation's tokens.
    pub fn encodes_fragments_canonically(&self) -> bool {
        !matches!(self.pipeline, TextPipeline::SentencePiece { add_space_prefix: true, .. })
    }

    /// Whether `text` starts with a special token (control or user-defined) that
    /// [`Tokenizer::encode`] with `parse_special` reads as one token: encoding from there gives
    /// the same ids as encoding a longer text that ends with it and keeping the tail.
    pub fn begins_with_special_token(&self, text: &str) -> bool {
        self.vocab.starts_with_partitioned(text, true)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.vocab.token_type(id)
    }

    /// The token's text as stored in the vocabulary (byte-level or `▁` form); `""` if out of range.
    pub fn piece(&self, id: u32) -> &str {
        self.vocab.piece(id).unwrap_or("")
    }

    /// Id of a vocabulary piece, e.g. `"<|im_end|>"`.
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.vocab.id_of(piece)
    }

    /// The raw bytes a token stands for (llama.cpp `token_to_piece` with `special = true`): control
    /// and user-defined tokens give their text, byte tokens their byte, normal tokens their piece
    /// mapped back through the GPT-2 byte table or with `▁` → space. Unused tokens give nothing.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let (Some(piece), Some(ty)) = (self.vocab.piece(id), self.vocab.token_type(id)) else {
            return Vec::new();
        };
        match ty {
            TokenType::Control | TokenType::Unknown | TokenType::UserDefined => piece.as_bytes().to_vec(),
            TokenType::Byte => match parse_byte_token(piece) {
                Some(b) => vec![b],
                None => byte_level_piece_bytes(piece),
            },
            TokenType::Normal => match self.piece_style {
                PieceStyle::ByteLevel => byte_level_piece_bytes(piece),
                PieceStyle::SentencePiece => spm_piece_bytes(piece),
            },
            TokenType::Unused | TokenType::Undefined => Vec::new(),
        }
    }

    /// Text of `ids`. `skip_special` drops control/unknown tokens (BOS, `<|im_end|>`, ...).
    /// Invalid UTF-8 (e.g. a sequence cut in the middle of a character) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let ty = self.vocab.token_type(id).ok_or_else(|| {
                CoreError::Tokenizer(format!("token id {id} is outside the vocabulary of {}", self.vocab.len()))
            })?;
            if skip_special && ty.is_special() {
                continue;
            }
            let piece = self.token_bytes(id);
            // SentencePiece models with a space prefix: the prefix is not part of the text.
            let strip = i == 0 && matches!(self.pipeline, TextPipeline::SentencePiece { add_space_prefix: true, .. });
            let piece = if strip { piece.strip_prefix(b" ").unwrap_or(&piece) } else { &piece[..] };
            bytes.extend_from_slice(piece);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}
