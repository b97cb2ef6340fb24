//! Structured output end to end through `hearth serve` and `hearth run` on a real model: every
//! request dialect (OpenAI's `response_format`, vLLM's `structured_outputs`, llama-server's
//! `json_schema` and `grammar`, WebLLM's shapes) gives an answer in its language, checked by an
//! independent parser (serde_json, the `regex` crate); streaming and `hearth run` give the same
//! answer; grammars the engine cannot support are 400s naming the parameter.

mod serve_support;

use serde_json::{json, Value};
use serve_support::*;
use std::sync::OnceLock;

fn server() -> &'static str {
    static SERVER: OnceLock<Server> = OnceLock::new();
    &SERVER.get_or_init(|| Server::start(&[])).addr
}

const QUESTION: &str =
    "Give me a record for a fictional software engineer: name, age and up to three favourite programming languages.";

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 40},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "languages": {
                "type": "array",
                "items": {"enum": ["Python", "Rust", "Go", "C++", "JavaScript", "Java"]},
                "minItems": 1,
                "maxItems": 3
            }
        },
        "required": ["name", "age", "languages"],
        "additionalProperties": false
    })
}

/// Checks a value against [`person_schema`], by hand (an independent reading of the schema).
fn assert_person(text: &str) {
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    let object = value.as_object().unwrap_or_else(|| panic!("not an object: {text}"));
    let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["age", "languages", "name"], "{text}");
    let name = object["name"].as_str().unwrap_or_else(|| panic!("name: {text}"));
    assert!((1..=40).contains(&name.chars().count()), "{text}");
    let age = object["age"].as_i64().unwrap_or_else(|| panic!("age: {text}"));
    assert!((18..=99).contains(&age), "{text}");
    let languages = object["languages"].as_array().unwrap_or_else(|| panic!("languages: {text}"));
    assert!((1..=3).contains(&languages.len()), "{text}");
    let allowed = ["Python", "Rust", "Go", "C++", "JavaScript", "Java"];
    assert!(languages.iter().all(|l| l.as_str().is_some_and(|l| allowed.contains(&l))), "{text}");
}

fn chat(user: &str, max_tokens: usize, extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
    });
    body.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
    body
}

/// The answer's text and finish reason.
fn answer(body: &Value) -> (String, String) {
    let r = post(server(), "/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", r.text());
    let reply = r.json();
    let choice = &reply["choices"][0];
    (
        choice["message"]["content"].as_str().expect("content").to_string(),
        choice["finish_reason"].as_str().expect("finish").to_string(),
    )
}

#[test]
fn a_json_schema_answer_is_valid_streamed_or_not_and_equals_hearth_run() {
    let format =
        json!({"type": "json_schema", "json_schema": {"name": "person", "strict": true, "schema": person_schema()}});
    let r = post(server(), "/v1/chat/completions", &chat(QUESTION, 120, json!({"response_format": format})));
    assert_eq!(r.status, 200, "{}", r.text());
    let reply = r.json();
    let text = reply["choices"][0]["message"]["content"].as_str().expect("content").to_string();
    assert_person(&text);
    // The grammar ends the answer where the object closes.
    assert_eq!(reply["choices"][0]["finish_reason"], "stop", "{text}");
    // One mask per token, timed; counted in /metrics.
    assert_eq!(reply["usage"]["grammar"]["masks"], reply["usage"]["completion_tokens"], "{reply}");
    assert!(reply["usage"]["grammar"]["mask_p50_us"].as_f64().is_some_and(|t| t > 0.0), "{reply}");
    let metrics = get(server(), "/metrics").text();
    assert!(
        metrics.lines().any(|l| l.starts_with("hearth_constrained_requests_total ") && !l.ends_with(" 0")),
        "{metrics}"
    );
    assert!(metrics.contains("hearth_grammar_mask_seconds_count"), "{metrics}");

    let r = post(
        server(),
        "/v1/chat/completions",
        &chat(QUESTION, 120, json!({"response_format": format, "stream": true})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let events = r.events();
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).expect("chunk"))
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed, text);

    let dir = std::env::temp_dir().join(format!("hearth-structured-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let schema_file = dir.join("person.json");
    std::fs::write(&schema_file, person_schema().to_string()).expect("schema file");
    let run = hearth_run(&[
        "--chat",
        "-p",
        QUESTION,
        "-n",
        "120",
        "--temperature",
        "0",
        "--json-schema",
        schema_file.to_str().expect("path"),
    ]);
    assert_eq!(run["text"], text.as_str());
    assert!(run["constraint"]["mask_us"].as_array().is_some_and(|m| !m.is_empty()), "{run}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_dialect_constrains_the_answer() {
    let question = "What is the capital of France, and when was the Eiffel Tower finished?";
    // OpenAI JSON mode: an object.
    let (text, _) = answer(&chat(question, 80, json!({"response_format": {"type": "json_object"}})));
    assert!(serde_json::from_str::<Value>(&text).is_ok_and(|v| v.is_object()), "{text}");
    // WebLLM / llama-server: JSON mode with a schema, as JSON text; llama-server's json_schema;
    // OpenAI's json_schema with strict left out.
    let person = person_schema().to_string();
    for extra in [
        json!({"response_format": {"type": "json_object", "schema": person}}),
        json!({"json_schema": person_schema()}),
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": person_schema()}}}),
        json!({"structured_outputs": {"json": person_schema()}}),
    ] {
        let (text, _) = answer(&chat(QUESTION, 120, extra.clone()));
        assert_person(&text);
    }
    // vLLM's regex and choice.
    let date = r"[0-9]{4}-[0-9]{2}-[0-9]{2}";
    let (text, _) = answer(&chat(
        "When was the Eiffel Tower finished? Give the date.",
        20,
        json!({"structured_outputs": {"regex": date}}),
    ));
    assert!(regex::Regex::new(&format!("^{date}$")).expect("regex").is_match(&text), "{text}");
    let (text, finish) =
        answer(&chat(question, 20, json!({"structured_outputs": {"choice": ["Paris", "Lyon", "Marseille"]}})));
    assert!(["Paris", "Lyon", "Marseille"].contains(&text.as_str()), "{text}");
    assert_eq!(finish, "stop");
    // llama-server's GBNF grammar, WebLLM's grammar response format, vLLM's Lark grammar.
    let gbnf = "root ::= \"The capital is \" city \". Finished in \" year \".\"\ncity ::= [A-Z] [a-z]{1,15}\nyear ::= [0-9]{4}";
    let sentence = regex::Regex::new(r"^The capital is [A-Z][a-z]{1,15}\. Finished in [0-9]{4}\.$").expect("regex");
    for extra in [
        json!({"grammar": gbnf}),
        json!({"response_format": {"type": "grammar", "grammar": gbnf}}),
        json!({"structured_outputs": {"grammar": "start: \"The capital is \" CITY \". Finished in \" YEAR \".\"\nCITY: /[A-Z][a-z]{1,15}/\nYEAR: /[0-9]{4}/"}}),
    ] {
        let (text, finish) = answer(&chat(question, 40, extra.clone()));
        assert!(sentence.is_match(&text), "{extra}: {text}");
        assert_eq!(finish, "stop", "{extra}");
    }
    // Plain text is plain.
    let free = answer(&chat(question, 12, json!({})));
    assert_eq!(answer(&chat(question, 12, json!({"response_format": {"type": "text"}}))), free);
}

#[test]
fn grammars_the_engine_cannot_support_are_refused_naming_the_parameter() {
    let refused = |extra: Value, param: &str, says: &str| {
        let r = post(server(), "/v1/chat/completions", &chat("Hi", 8, extra.clone()));
        assert_error(&r, 400, None, Some(param));
        let message = r.json()["error"]["message"].as_str().expect("message").to_string();
        assert!(message.contains(says), "{extra}: {message}");
    };
    let unknown_format = json!({"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}});
    refused(
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": unknown_format, "strict": true}}}),
        "response_format",
        "no-such-format",
    );
    refused(json!({"structured_outputs": {"regex": "[a-"}}), "structured_outputs", "regex");
    refused(json!({"structured_outputs": {"grammar": "start: missing_rule"}}), "structured_outputs", "missing_rule");
    refused(json!({"grammar": "root ::= \"a\"\nitem ::= [a-"}), "grammar", "line 2");
    refused(json!({"grammar": "item ::= \"a\""}), "grammar", "root");
    refused(
        json!({"json_schema": {"type": "object"}, "grammar": "start: \"a\""}),
        "grammar",
        "json_schema and grammar",
    );
    refused(json!({"response_format": {"type": "yaml"}}), "response_format", "response_format.type");
    refused(json!({"structured_outputs": {"structural_tag": "x"}}), "structured_outputs", "structural_tag");
    refused(json!({"structured_outputs": {"choice": []}}), "structured_outputs", "choice");
    refused(json!({"response_format": {"type": "json_object", "schema": "{not json"}}), "response_format", "not JSON");
    // Not strict: the unsupported keyword is ignored, the rest enforced.
    let lenient = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": unknown_format, "strict": false}}});
    let (text, _) = answer(&chat("Give me a JSON object with a string field a.", 30, lenient));
    assert!(serde_json::from_str::<Value>(&text).is_ok_and(|v| v.is_object()), "{text}");
}
