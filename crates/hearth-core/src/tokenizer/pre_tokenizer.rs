//! Byte-level BPE pre-tokenization chosen by GGUF `tokenizer.ggml.pre`, following llama.cpp's
//! `llm_tokenizer_bpe` table. llama.cpp applies its regexes one after another, each splitting the
//! pieces left by the previous one and keeping the unmatched stretches as pieces too; that is a HF
//! `Sequence` of `Split(.., Isolated)`. Where llama.cpp rewrote a regex for `std::regex`, the original
//! `tokenizer.json` regex is used here (fancy-regex supports lookarounds and `\p{..}` classes).

use crate::error::{CoreError, Result};

/// `(?i:'s|..)` spelt out, as llama.cpp does (identical meaning).
const CONTRACTIONS: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// How a `tokenizer.ggml.pre` value tokenizes, beyond the regexes.
pub struct PreTokenizerSpec {
    pub regexes: Vec<String>,
    /// A whole pre-token that is itself in the vocabulary is emitted without merging (llama3 & co).
    pub ignore_merges: bool,
    /// llama.cpp's `add_bos` default for this pre-tokenizer when the GGUF does not say.
    pub add_bos_default: bool,
}

fn llama3_like(digits: &str) -> String {
    format!(
        r"{CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{digits}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
}

pub fn spec_for(pre: &str) -> Result<PreTokenizerSpec> {
    let mut ignore_merges = false;
    let mut add_bos_default = false;
    let regexes: Vec<String> = match pre {
        "default" | "" => vec![
            r"[\p{P}\$\+<=>\^~\|]+".into(),
            GPT2.into(),
            r"\p{N}+".into(),
            "[0-9][0-9][0-9]".into(),
        ],
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" => {
            ignore_merges = true;
            add_bos_default = true;
            vec![llama3_like("{1,3}")]
        }
        "dbrx" | "smaug-bpe" => vec![llama3_like("{1,3}")],
        "chatglm-bpe" => vec![llama3_like("{1,3}")],
        "glm4" | "glm5" => {
            ignore_merges = true;
            vec![llama3_like("{1,3}")]
        }
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan" | "solar-open" => {
            vec![llama3_like("")]
        }
        "qwen35" => vec![format!(
            r"{CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?[\p{{L}}\p{{M}}]+|\p{{N}}| ?[^\s\p{{L}}\p{{M}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )],
        "deepseek-llm" => vec![
            "[\r\n]".into(),
            // llama.cpp's letter ranges, written as escapes (some endpoints are not NFC-stable).
            "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+".into(),
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+".into(),
            r"\s+$".into(),
            "[一-龥ࠀ-一가-퟿]+".into(),
            r"\p{N}+".into(),
        ],
        "deepseek-coder" => vec![
            "[\r\n]".into(),
            r"\s?\p{L}+".into(),
            r"\s?\p{P}+".into(),
            "[一-龥ࠀ-一가-퟿]+".into(),
            r"\p{N}".into(),
        ],
        "deepseek-v3" => vec![
            r"\p{N}{1,3}".into(),
            "[一-龥぀-ゟ゠-ヿ]+".into(),
            r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##.into(),
        ],
        "falcon" => vec![
            r"[\p{P}\$\+<=>\^~\|`]+".into(),
            r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)".into(),
            "[0-9][0-9][0-9]".into(),
        ],
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            vec![r"\p{N}".into(), GPT2.into()]
        }
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
        | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "exaone4" | "mpt" | "olmo" | "jais"
        | "trillion" | "granite-docling" => vec![GPT2.into()],
        "poro-chat" | "bloom" | "gpt3-finnish" => vec![r" ?[^(\s|.,!?…。，、।۔،)]+".into()],
        "viking" => vec![r" ?[^(\s|.,!?…。，、।۔،)]+".into(), r"\p{N}".into()],
        "tekken" => {
            ignore_merges = true;
            add_bos_default = true;
            vec![r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+".into()]
        }
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => vec![format!(
            r"[^\r\n\p{{L}}\p{{N}}]?[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}]*[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}]+{CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}]+[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}]*{CONTRACTIONS}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )],
        other => {
            return Err(CoreError::Tokenizer(format!(
                "unsupported pre-tokenizer '{other}' (tokenizer.ggml.pre); supported: default, llama-bpe/llama3, \
                 qwen2, qwen35, gpt-2, smollm, starcoder, deepseek-llm, deepseek-coder, deepseek-v3, falcon, \
                 dbrx, tekken, gpt-4o, bloom, viking, chatglm-bpe, glm4, ..."
            )))
        }
    };
    Ok(PreTokenizerSpec { regexes, ignore_merges, add_bos_default })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_pre_tokenizer_compiles() {
        for pre in [
            "default",
            "llama-bpe",
            "qwen2",
            "qwen35",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "falcon",
            "smollm",
            "gpt-2",
            "bloom",
            "viking",
            "tekken",
            "gpt-4o",
            "dbrx",
            "glm4",
        ] {
            let spec = spec_for(pre).unwrap();
            for re in &spec.regexes {
                fancy_regex_compiles(re).unwrap_or_else(|e| panic!("{pre}: {re}: {e}"));
            }
        }
        assert!(spec_for("no-such-pre").is_err());
    }

    fn fancy_regex_compiles(re: &str) -> std::result::Result<(), String> {
        tokenizers::pre_tokenizers::split::Split::new(
            tokenizers::pre_tokenizers::split::SplitPattern::Regex(re.to_string()),
            tokenizers::SplitDelimiterBehavior::Isolated,
            false,
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    }
}
