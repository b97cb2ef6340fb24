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
            r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+".into(),
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
            "default", "llama-bpe", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon",
            "smollm", "gpt-2", "bloom", "viking", "tekken", "gpt-4o", "dbrx", "glm4",
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
