//! Chat templates against Python jinja2 configured like HF transformers (fixtures from
//! `tests/fixtures/chat/make_expected.py`), against the prompts llama.cpp's goldens were run on,
//! and against the templates stored in the real GGUFs.

use hearth_core::chat::{python_float_repr, ChatMessage, ChatTemplate};
#[cfg(feature = "real-models")]
use hearth_core::gguf::GgufFile;
use hearth_core::CoreError;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
}

fn read_fixture(name: &str) -> String {
    let path = fixture_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()))
}

#[cfg(feature = "real-models")]
fn models_dir() -> PathBuf {
    let dir = std::env::var_os("HEARTH_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root/.cache/hearth/models"));
    assert!(
        dir.is_dir(),
        "model directory {} is absent: download the models (see DEVELOPERS.md) or set HEARTH_MODELS_DIR",
        dir.display()
    );
    dir
}

#[cfg(feature = "real-models")]
fn open_model(file: &str) -> GgufFile {
    let path = models_dir().join(file);
    GgufFile::open(&path).unwrap_or_else(|e| panic!("cannot open model {}: {e}", path.display()))
}

/// Messages that are plain `{role, content: string}` objects, as `ChatMessage`s.
fn as_plain_messages(messages: &Json) -> Option<Vec<ChatMessage>> {
    messages
        .as_array()?
        .iter()
        .map(|m| {
            let object = m.as_object()?;
            if object.len() != 2 {
                return None;
            }
            Some(ChatMessage::new(object.get("role")?.as_str()?, object.get("content")?.as_str()?))
        })
        .collect()
}

#[test]
fn renders_like_python_jinja2() {
    let expected: Json = serde_json::from_str(&read_fixture("expected.json")).expect("expected.json is JSON");
    let now = expected["now_unix_seconds"].as_i64().expect("now_unix_seconds");
    let cases = expected["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20, "expected.json has only {} cases", cases.len());
    let mut plain_cases = 0;
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let template = ChatTemplate::new(
            read_fixture(case["template"].as_str().expect("template")),
            case["bos_token"].as_str().map(String::from),
            case["eos_token"].as_str().map(String::from),
        )
        .unwrap_or_else(|e| panic!("{name}: template does not compile: {e}"))
        .with_now(now);
        let gen = case["add_generation_prompt"].as_bool().expect("add_generation_prompt");
        let tools = (!case["tools"].is_null()).then_some(&case["tools"]);
        let rendered = template.render_json(&case["messages"], gen, tools);
        match (&case["expected"], &case["error"]) {
            (Json::String(want), _) => {
                let got = rendered.unwrap_or_else(|e| panic!("{name}: render failed: {e}"));
                assert_eq!(got, *want, "{name}: differs from jinja2");
                if let Some(plain) = as_plain_messages(&case["messages"]) {
                    plain_cases += 1;
                    let got = template.render_with_tools(&plain, gen, tools).expect("plain render");
                    assert_eq!(got, *want, "{name}: ChatMessage path differs from jinja2");
                    if tools.is_none() {
                        assert_eq!(template.render(&plain, gen).expect("render"), *want, "{name}");
                    }
                }
            }
            (_, Json::String(message)) => match rendered {
                Err(CoreError::ChatTemplate(got)) => {
                    assert!(got.contains(message.as_str()), "{name}: error '{got}' lacks '{message}'")
                }
                other => panic!("{name}: expected template error '{message}', got {other:?}"),
            },
            _ => panic!("{name}: case has neither expected nor error"),
        }
    }
    assert!(plain_cases >= 10, "only {plain_cases} cases exercised the ChatMessage path");
}

fn golden_prompt(model: &str) -> (String, bool) {
    let prompts: Json = serde_json::from_str(&read_fixture("llama_cpp_prompts.json")).expect("JSON");
    let entry = &prompts[model];
    (entry["prompt"].as_str().expect("prompt").to_string(), entry["bos_added"].as_bool().expect("bos_added"))
}

fn golden_conversation(with_system: bool) -> Vec<ChatMessage> {
    let mut messages = Vec::new();
    if with_system {
        messages.push(ChatMessage::new("system", "You are a helpful assistant."));
    }
    messages.push(ChatMessage::new("user", "Write a Python function that reverses a string."));
    messages
}

#[test]
fn qwen_matches_llama_cpp_golden_prompt() {
    for (model, fixture) in [
        ("qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen2.5-0.5b.jinja"),
        ("qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-1.5b.jinja"),
    ] {
        let template = ChatTemplate::new(read_fixture(fixture), None, Some("<|im_end|>".into())).expect("compile");
        let (prompt, bos_added) = golden_prompt(model);
        assert!(!bos_added);
        assert_eq!(template.render(&golden_conversation(true), true).expect("render"), prompt, "{model}");
    }
}

#[test]
fn gemma_matches_llama_cpp_golden_prompt() {
    // llama.cpp added <bos> while tokenizing; the Gemma template writes it itself.
    let (prompt, bos_added) = golden_prompt("gemma-3-270m-q4_k_m");
    assert!(bos_added);
    let template =
        ChatTemplate::new(read_fixture("gemma3.jinja"), Some("<bos>".into()), Some("<eos>".into())).expect("compile");
    let rendered = template.render(&golden_conversation(false), true).expect("render");
    assert_eq!(rendered, format!("<bos>{prompt}"));
}

#[test]
#[cfg(feature = "real-models")]
fn qwen_gguf_template_and_tokens() {
    for (file, fixture) in [
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-0.5b.jinja"),
        ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-1.5b.jinja"),
    ] {
        let fixture = read_fixture(fixture);
        let gguf = open_model(file);
        let template =
            ChatTemplate::from_gguf(&gguf.metadata).expect("from_gguf").expect("Qwen GGUFs carry a template");
        assert_eq!(template.source(), fixture, "{file}: fixture is not the GGUF's template");
        assert_eq!(template.bos_token(), Some("<|endoftext|>"), "{file}");
        assert_eq!(template.eos_token(), Some("<|im_end|>"), "{file}");
        let (prompt, _) = golden_prompt(file.trim_end_matches(".gguf"));
        assert_eq!(template.render(&golden_conversation(true), true).expect("render"), prompt, "{file}");
    }
}

#[test]
#[cfg(feature = "real-models")]
fn gemma_base_gguf_has_no_template_but_its_tokens_fill_a_supplied_one() {
    let gguf = open_model("gemma-3-270m-q4_k_m.gguf");
    assert!(ChatTemplate::from_gguf(&gguf.metadata).expect("from_gguf").is_none());
    let template = ChatTemplate::from_gguf_with_source(&gguf.metadata, &read_fixture("gemma3.jinja")).expect("compile");
    assert_eq!(template.bos_token(), Some("<bos>"));
    assert_eq!(template.eos_token(), Some("<eos>"));
    let (prompt, _) = golden_prompt("gemma-3-270m-q4_k_m");
    assert_eq!(template.render(&golden_conversation(false), true).expect("render"), format!("<bos>{prompt}"));
}

#[test]
fn syntax_errors_are_chat_template_errors() {
    match ChatTemplate::new("{% for m in messages %}{{ m.content }}", None, None) {
        Err(CoreError::ChatTemplate(message)) => assert!(message.contains("syntax error"), "{message}"),
        other => panic!("expected a ChatTemplate error, got {:?}", other.map(|t| t.source().to_string())),
    }
    let template = ChatTemplate::new("{{ messages | no_such_filter }}", None, None);
    match template.and_then(|t| t.render(&[], false)) {
        Err(CoreError::ChatTemplate(message)) => assert!(message.contains("no_such_filter"), "{message}"),
        other => panic!("expected a ChatTemplate error, got {other:?}"),
    }
    let template = ChatTemplate::new("x", None, None).expect("compile");
    assert!(matches!(
        template.render_json(&serde_json::json!({"role": "user"}), false, None),
        Err(CoreError::ChatTemplate(_))
    ));
}

#[test]
fn float_repr_matches_python() {
    // Values and their Python 3 `repr`.
    let cases = [
        (1.0, "1.0"),
        (0.1, "0.1"),
        (-2.5, "-2.5"),
        (1e-4, "0.0001"),
        (1e-5, "1e-05"),
        (1.5e-7, "1.5e-07"),
        (123456789012345.6, "123456789012345.6"),
        (1e16, "1e+16"),
        (1.2345e20, "1.2345e+20"),
        (1e100, "1e+100"),
        (0.0, "0.0"),
        (f64::INFINITY, "Infinity"),
    ];
    for (value, want) in cases {
        assert_eq!(python_float_repr(value), want, "repr({value:e})");
    }
}
