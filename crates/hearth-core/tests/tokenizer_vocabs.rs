//! llama.cpp's own tokenizer test (its tests/test-tokenizer-0.cpp): vocabulary-only GGUFs
//! (models/ggml-vocab-NAME.gguf) with texts (`.inp`, separated by `__ggml_vocab_test__` lines:
//! whitespace runs, digits, accents, emoji, code, mixed scripts) and the ids llama.cpp gives each
//! (`.out`, a line per text), tokenized without special tokens. Every pre-tokenizer family these
//! files cover must give llama.cpp's ids exactly; among them deepseek-llm (DeepSeek-V2 and
//! V2-Lite), llama-bpe (Llama 3), qwen2 and qwen35. The files come from
//! scripts/fetch-llama-vocabs.sh (run by scripts/test.sh) into ~/.cache/hearth/llama-vocabs, or
//! $HEARTH_LLAMA_VOCABS.

use hearth_core::gguf::GgufFile;
use hearth_core::tokenizer::Tokenizer;
use std::path::PathBuf;

/// The vocabularies with expected outputs that use a tokenizer model we implement (BPE, SPM).
/// Not here: bert-bge (WordPiece) and gemma-4 (its own model), which hearth does not load.
const VOCABS: [&str; 13] = [
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

fn vocab_dir() -> PathBuf {
    match std::env::var_os("HEARTH_LLAMA_VOCABS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/hearth/llama-vocabs"),
    }
}

#[test]
fn every_text_of_llama_cpps_vocabulary_tests_gets_its_ids() {
    let dir = vocab_dir();
    for name in VOCABS {
        let path = |ext: &str| dir.join(format!("ggml-vocab-{name}.gguf{ext}"));
        let read = |ext: &str| {
            std::fs::read_to_string(path(ext)).unwrap_or_else(|e| {
                panic!("{}: {e} (scripts/fetch-llama-vocabs.sh fetches the files)", path(ext).display())
            })
        };
        let (inputs, outputs) = (read(".inp"), read(".out"));
        let file = GgufFile::open(&path("")).unwrap_or_else(|e| panic!("{name}: {e}"));
        let tokenizer = Tokenizer::from_gguf(&file.metadata).unwrap_or_else(|e| panic!("{name}: {e}"));
        // As test-tokenizer-0 splits them: the texts between separators, none after the last.
        let texts: Vec<&str> = inputs
            .strip_suffix("\n__ggml_vocab_test__\n")
            .unwrap_or(&inputs)
            .split("\n__ggml_vocab_test__\n")
            .collect();
        let want: Vec<Vec<u32>> = outputs
            .lines()
            .map(|line| line.split_whitespace().map(|id| id.parse().expect("an id")).collect())
            .collect();
        assert_eq!(texts.len(), want.len(), "{name}: texts and outputs differ in number");
        for (text, want) in texts.iter().zip(&want) {
            let got = tokenizer.encode(text, false, false).unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"));
            assert_eq!(&got, want, "{name}: {text:?}");
        }
        eprintln!("{name}: {} texts, llama.cpp's ids", texts.len());
    }
}
