//! Tokenizer checks against llama.cpp (commit 0c1e570) on the real models' GGUF metadata.
//! Fixtures: tests/fixtures/tokenizer/ (llama-tokenize outputs, model-golden prompt tokens).
//! Models are read from $HEARTH_MODELS_DIR (default /root/.cache/hearth/models).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hearth_core::gguf::GgufFile;
use hearth_core::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::Value;

const QWEN_05B: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";
const QWEN_15B: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m";
const GEMMA: &str = "gemma-3-270m-q4_k_m";

fn models_dir() -> PathBuf {
    let dir = std::env::var("HEARTH_MODELS_DIR").unwrap_or_else(|_| "/root/.cache/hearth/models".into());
    PathBuf::from(dir)
}

fn load(model: &str) -> (Tokenizer, Duration) {
    let path = models_dir().join(format!("{model}.gguf"));
    assert!(
        path.is_file(),
        "model file {} is missing: set HEARTH_MODELS_DIR to the folder holding the test models",
        path.display()
    );
    let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let start = Instant::now();
    let tok = Tokenizer::from_gguf(&gguf.metadata).unwrap_or_else(|e| panic!("tokenizer of {model}: {e}"));
    (tok, start.elapsed())
}

fn tokenizer(model: &str) -> &'static Tokenizer {
    static QWEN05: OnceLock<Tokenizer> = OnceLock::new();
    static QWEN15: OnceLock<Tokenizer> = OnceLock::new();
    static GEMMA_TOK: OnceLock<Tokenizer> = OnceLock::new();
    let cell = match model {
        QWEN_05B => &QWEN05,
        QWEN_15B => &QWEN15,
        GEMMA => &GEMMA_TOK,
        other => panic!("no such test model {other}"),
    };
    cell.get_or_init(|| load(model).0)
}

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// All golden strings for a tokenizer family: the 12 shared ones plus make_more.py's.
fn golden_strings(family: &str) -> Vec<Value> {
    let mut strings: Vec<Value> = Vec::new();
    for name in [format!("tokenizer_{family}.json"), format!("tokenizer_{family}_more.json")] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer").join(&name);
        if path.exists() {
            strings.extend(fixture(&name)["strings"].as_array().expect("strings").iter().cloned());
        }
    }
    strings
}

/// Compares encode() on every golden string in all three modes; returns the number of strings.
fn check_golden_strings(model: &str, family: &str) -> usize {
    let tok = tokenizer(model);
    let strings = golden_strings(family);
    let mut failures = Vec::new();
    for s in &strings {
        let text = s["text"].as_str().expect("text");
        let cases = [
            ("default", tok.add_bos_default(), true, &s["ids_default"]),
            ("no_bos", false, true, &s["ids_no_bos"]),
            ("no_bos_no_parse_special", false, false, &s["ids_no_bos_no_parse_special"]),
        ];
        for (mode, add_bos, parse_special, expected) in cases {
            let got = tok.encode(text, add_bos, parse_special).expect("encode");
            if got != ids(expected) {
                failures.push(format!(
                    "{model} {:?} [{mode}]\n  got      {got:?}\n  expected {:?}",
                    text,
                    ids(expected)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches vs llama.cpp:\n{}", failures.len(), failures.join("\n"));
    strings.len()
}

#[test]
fn qwen_matches_llama_cpp_on_golden_strings() {
    let n = check_golden_strings(QWEN_05B, "qwen");
    assert!(n >= 12, "only {n} golden strings");
    // The shared goldens say both Qwen sizes tokenize identically; check the 1.5B too.
    check_golden_strings(QWEN_15B, "qwen");
}

#[test]
fn gemma_matches_llama_cpp_on_golden_strings() {
    let n = check_golden_strings(GEMMA, "gemma");
    assert!(n >= 12, "only {n} golden strings");
}

#[test]
fn model_golden_prompts_and_generations_match_llama_cpp() {
    let goldens = fixture("model_prompts.json");
    for (model, cases) in goldens["models"].as_object().expect("models") {
        let tok = tokenizer(model);
        for case in cases.as_array().expect("cases") {
            let prompt = case["prompt"].as_str().expect("prompt");
            assert_eq!(case["bos_added"].as_bool(), Some(tok.add_bos_default()), "{model}: add_bos default");
            let with_bos = tok.encode(prompt, tok.add_bos_default(), true).expect("encode");
            assert_eq!(with_bos, ids(&case["prompt_token_ids"]), "{model} {prompt:?}");
            let without = tok.encode(prompt, false, true).expect("encode");
            assert_eq!(without, ids(&case["prompt_token_ids_without_bos"]), "{model} {prompt:?}");
            // Pieces as llama-server renders them (special tokens as their text).
            let pieces: Vec<String> =
                with_bos.iter().map(|&id| String::from_utf8_lossy(&tok.token_bytes(id)).into_owned()).collect();
            let expected: Vec<&str> =
                case["prompt_pieces"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
            assert_eq!(pieces, expected, "{model} {prompt:?} pieces");

            let generated = ids(&case["generated_token_ids"]);
            let text = tok.decode(&generated, true).expect("decode");
            assert_eq!(text, case["detokenized_generated_ids"].as_str().unwrap(), "{model} generation text");
            let mut stream = StreamDecoder::default();
            let mut streamed: String = generated.iter().map(|&id| stream.push(tok, id)).collect();
            streamed.push_str(&stream.flush());
            assert_eq!(streamed, text, "{model} streamed generation");
        }
    }
}

#[test]
fn decode_round_trips_golden_strings() {
    for (model, family) in [(QWEN_05B, "qwen"), (GEMMA, "gemma")] {
        let tok = tokenizer(model);
        for s in golden_strings(family) {
            let text = s["text"].as_str().unwrap();
            // Special-token text tokenized as plain text must come back verbatim...
            let plain = ids(&s["ids_no_bos_no_parse_special"]);
            assert_eq!(tok.decode(&plain, false).unwrap(), text, "{model} plain round trip");
            // ...and so must parsed special tokens when they are not skipped.
            let parsed = ids(&s["ids_no_bos"]);
            assert_eq!(tok.decode(&parsed, false).unwrap(), text, "{model} special round trip");
            // Streaming the same ids yields the same text, in complete characters only.
            let mut stream = StreamDecoder::with_special(true);
            let mut streamed = String::new();
            for &id in &parsed {
                streamed.push_str(&stream.push(tok, id));
            }
            assert_eq!(stream.flush(), "", "{model}: nothing may be left over after complete text");
            assert_eq!(streamed, text, "{model} streamed round trip");
        }
    }
}

/// Golden strings with characters split over several tokens (Qwen: byte-level pieces holding part of
/// an emoji; Gemma: `<0xF0>`-style byte tokens for characters outside its vocabulary).
#[test]
fn stream_decoder_holds_back_split_characters() {
    for (model, family) in [(QWEN_05B, "qwen"), (GEMMA, "gemma")] {
        let tok = tokenizer(model);
        let splits_a_char =
            |s: &Value| ids(&s["ids_no_bos"]).iter().any(|&id| std::str::from_utf8(&tok.token_bytes(id)).is_err());
        let emoji =
            golden_strings(family).into_iter().find(splits_a_char).expect("a golden string with split characters");
        let parsed = ids(&emoji["ids_no_bos"]);
        let mut stream = StreamDecoder::default();
        let mut held_back = 0;
        let mut streamed = String::new();
        for &id in &parsed {
            let bytes = tok.token_bytes(id);
            let out = stream.push(tok, id);
            if std::str::from_utf8(&bytes).is_err() {
                held_back += 1;
            }
            streamed.push_str(&out);
            // Whatever was emitted so far is a prefix of the text: nothing emitted early or replaced.
            assert!(emoji["text"].as_str().unwrap().starts_with(&streamed), "{model}: {streamed:?}");
        }
        assert!(held_back > 0, "{model}: expected tokens that are partial characters in the emoji string");
        assert_eq!(streamed, emoji["text"].as_str().unwrap());
        // Cutting the stream inside a character: flush reports the dangling bytes as U+FFFD.
        let first_partial = parsed.iter().position(|&id| std::str::from_utf8(&tok.token_bytes(id)).is_err()).unwrap();
        let mut cut = StreamDecoder::default();
        let mut prefix: String = parsed[..=first_partial].iter().map(|&id| cut.push(tok, id)).collect();
        prefix.push_str(&cut.flush());
        assert!(prefix.ends_with('\u{FFFD}'), "{model}: {prefix:?}");
    }
}

#[test]
fn special_token_ids_and_end_of_generation_follow_llama_cpp() {
    let qwen = tokenizer(QWEN_05B);
    assert_eq!(qwen.vocab_size(), 151936);
    assert_eq!(qwen.bos(), Some(151643));
    assert_eq!(qwen.eos(), Some(151645));
    assert!(!qwen.add_bos_default());
    let id = |t: &Tokenizer, piece: &str| t.token_id(piece).unwrap_or_else(|| panic!("{piece} missing"));
    // llama.cpp's EOG set for Qwen2.5: eos, <|endoftext|>, and the FIM pad/repo/file-sep tokens.
    for piece in ["<|im_end|>", "<|endoftext|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"] {
        assert!(qwen.is_end_of_generation(id(qwen, piece)), "{piece} should end generation");
    }
    for piece in ["<|im_start|>", "<|fim_prefix|>", "Hello", "<tool_call>"] {
        assert!(!qwen.is_end_of_generation(id(qwen, piece)), "{piece} should not end generation");
    }

    let gemma = tokenizer(GEMMA);
    assert_eq!(gemma.vocab_size(), 262144);
    assert_eq!(gemma.bos(), Some(2));
    assert_eq!(gemma.eos(), Some(1));
    assert!(gemma.add_bos_default());
    for piece in ["<eos>", "<end_of_turn>"] {
        assert!(gemma.is_end_of_generation(id(gemma, piece)), "{piece} should end generation");
    }
    for piece in ["<bos>", "<start_of_turn>", "<pad>", "\n"] {
        assert!(!gemma.is_end_of_generation(id(gemma, piece)), "{piece:?} should not end generation");
    }
    // Piece conventions: `▁` is a space, `<0xNN>` is a byte; byte-level pieces map back through GPT-2's table.
    assert_eq!(gemma.token_bytes(id(gemma, "<0xF0>")), vec![0xF0]);
    assert_eq!(gemma.token_bytes(id(gemma, "▁capital")), b" capital");
    assert_eq!(qwen.token_bytes(id(qwen, "Ġcapital")), b" capital");
    assert_eq!(qwen.token_bytes(id(qwen, "Ċ")), b"\n");
    assert_eq!(qwen.piece(id(qwen, "Ġcapital")), "Ġcapital");
    // Skipping special tokens when decoding.
    let ids = gemma.encode("<start_of_turn>user\nhi<end_of_turn>", true, true).unwrap();
    assert_eq!(gemma.decode(&ids, true).unwrap(), "user\nhi");
    assert_eq!(gemma.decode(&ids, false).unwrap(), "<bos><start_of_turn>user\nhi<end_of_turn>");
    assert!(gemma.decode(&[u32::MAX], false).is_err());
}

#[test]
fn gemma_vocabulary_loads_quickly() {
    let (_, elapsed) = load(GEMMA);
    // 262k tokens; the engine loads this on every start. Debug builds get more slack.
    let limit = if cfg!(debug_assertions) { Duration::from_secs(30) } else { Duration::from_millis(1500) };
    eprintln!("gemma tokenizer load: {elapsed:?}");
    assert!(elapsed < limit, "loading the Gemma tokenizer took {elapsed:?} (limit {limit:?})");
}
