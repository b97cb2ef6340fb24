//! Construction of the HF `tokenizers` pipelines that tokenize the text between special tokens.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use super::pre_tokenizer::PreTokenizerSpec;
use crate::error::{CoreError, Result};

fn hf_err(what: &str) -> impl Fn(tokenizers::Error) -> CoreError + '_ {
    move |e| CoreError::Tokenizer(format!("{what}: {e}"))
}

fn piece_map(pieces: &[String]) -> Vocab {
    pieces.iter().enumerate().map(|(id, p)| (p.clone(), id as u32)).collect()
}

/// GGUF `gpt2` models: byte-level BPE with GGUF merges ("left right", ranked by position) behind
/// the regex pre-tokenizers llama.cpp uses for `tokenizer.ggml.pre`.
pub fn byte_level_bpe(pieces: &[String], merges: &[&str], spec: &PreTokenizerSpec) -> Result<tokenizers::Tokenizer> {
    let mut merge_pairs = Vec::with_capacity(merges.len());
    for merge in merges {
        // llama.cpp splits at the first space after the first byte, so a merge may start with ' '.
        let split_at = merge.as_bytes().iter().skip(1).position(|&b| b == b' ').map(|i| i + 1);
        let Some(at) = split_at else {
            return Err(CoreError::Tokenizer(format!("BPE merge '{merge}' has no separating space")));
        };
        merge_pairs.push((merge[..at].to_string(), merge[at + 1..].to_string()));
    }
    let model = BPE::builder()
        .vocab_and_merges(piece_map(pieces), merge_pairs)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(hf_err("building byte-level BPE"))?;

    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(spec.regexes.len() + 1);
    for regex in &spec.regexes {
        let split = Split::new(SplitPattern::Regex(regex.clone()), SplitDelimiterBehavior::Isolated, false)
            .map_err(hf_err("compiling pre-tokenizer regex"))?;
        steps.push(split.into());
    }
    // Regex splitting is done above; ByteLevel only maps bytes to GPT-2's printable characters.
    steps.push(ByteLevel::new(false, false, false).into());

    let mut tokenizer = tokenizers::Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Sequence::new(steps)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(tokenizer)
}
