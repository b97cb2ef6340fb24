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
    // One mask per token (a forced token's row is masked too: the model may spell it otherwise),
    // timed; the forced ones counted; counted in /metrics.
    let grammar = &reply["usage"]["grammar"];
    let (masks, forced) =
        (grammar["masks"].as_u64().expect("masks"), grammar["forced_tokens"].as_u64().expect("forced"));
    assert!(masks >= reply["usage"]["completion_tokens"].as_u64().expect("tokens"), "{reply}");
    assert!(forced > 0, "a schema's punctuation is forced: {reply}");
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

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
            "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
    ])
}

/// Checks a call against [`weather_tools`]: a known function, arguments JSON valid under its
/// parameters (by hand).
fn assert_weather_call(call: &Value) -> String {
    assert_eq!(call["type"], "function", "{call}");
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{call}");
    let name = call["function"]["name"].as_str().expect("name").to_string();
    let arguments: Value = serde_json::from_str(call["function"]["arguments"].as_str().expect("arguments text"))
        .unwrap_or_else(|e| panic!("arguments are not JSON ({e}): {call}"));
    let object = arguments.as_object().expect("arguments object");
    match name.as_str() {
        "get_weather" => {
            assert!(object["city"].is_string(), "{call}");
            assert!(object.get("unit").is_none_or(|u| u == "celsius" || u == "fahrenheit"), "{call}");
            assert!(object.keys().all(|k| k == "city" || k == "unit"), "{call}");
        }
        "get_time" => {
            assert!(object["timezone"].is_string(), "{call}");
            assert!(object.keys().all(|k| k == "timezone"), "{call}");
        }
        other => panic!("unknown function {other}: {call}"),
    }
    name
}

const TOOL_QUESTION: &str = "What's the weather like in Paris, and what time is it in Tokyo?";

#[test]
fn tool_choice_required_and_named_answer_with_valid_calls_streamed_or_not() {
    let tools = weather_tools();
    // Parallel calls (the default): every call the answer holds is valid (a small model may go on
    // calling until the token limit).
    let body = chat(TOOL_QUESTION, 100, json!({"tools": tools, "tool_choice": "required"}));
    let reply = post(server(), "/v1/chat/completions", &body).json();
    let calls = reply["choices"][0]["message"]["tool_calls"].as_array().expect("tool_calls");
    assert!(calls.len() >= 2, "{reply}");
    calls.iter().for_each(|c| drop(assert_weather_call(c)));
    for choice in [json!("required"), json!({"type": "function", "function": {"name": "get_time"}})] {
        let body =
            chat(TOOL_QUESTION, 100, json!({"tools": tools, "tool_choice": choice, "parallel_tool_calls": false}));
        let r = post(server(), "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let reply = r.json();
        let choice_reply = &reply["choices"][0];
        assert_eq!(choice_reply["finish_reason"], "tool_calls", "{reply}");
        assert!(choice_reply["message"]["content"].is_null(), "{reply}");
        let calls = choice_reply["message"]["tool_calls"].as_array().expect("tool_calls");
        let names: Vec<String> = calls.iter().map(assert_weather_call).collect();
        assert_eq!(names.len(), 1, "one call without parallel calls: {reply}");
        if choice.is_object() {
            assert_eq!(names, ["get_time"], "{reply}");
        }

        // Streamed: the name first, then the arguments in pieces, adding up to the same calls.
        let mut streaming = body.clone();
        streaming["stream"] = json!(true);
        let r = post(server(), "/v1/chat/completions", &streaming);
        assert_eq!(r.status, 200, "{}", r.text());
        let events = r.events();
        let chunks: Vec<Value> =
            events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("chunk")).collect();
        let mut streamed: Vec<(String, String, String)> = Vec::new();
        let mut finish = None;
        for chunk in &chunks {
            let choice = &chunk["choices"][0];
            finish = choice["finish_reason"].as_str().map(str::to_string).or(finish);
            for call in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let index = call["index"].as_u64().expect("index") as usize;
                if let Some(id) = call["id"].as_str() {
                    assert_eq!(index, streamed.len(), "calls start in order");
                    streamed.push((
                        id.to_string(),
                        call["function"]["name"].as_str().expect("name").to_string(),
                        String::new(),
                    ));
                }
                streamed[index].2 += call["function"]["arguments"].as_str().unwrap_or("");
            }
        }
        assert_eq!(finish.as_deref(), Some("tool_calls"));
        let whole: Vec<(String, String, String)> = calls
            .iter()
            .map(|c| {
                (
                    c["id"]
                        .as_str()
                        .unwrap_or_default()
                        .replace(reply["id"].as_str().unwrap_or_default().rsplit('-').next().unwrap_or_default(), ""),
                    c["function"]["name"].as_str().unwrap_or_default().to_string(),
                    c["function"]["arguments"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        let streamed_calls: Vec<(String, String, String)> = streamed
            .iter()
            .map(|(id, name, arguments)| {
                (
                    id.replace(chunks[0]["id"].as_str().unwrap_or_default().rsplit('-').next().unwrap_or_default(), ""),
                    name.clone(),
                    arguments.clone(),
                )
            })
            .collect();
        assert_eq!(streamed_calls, whole, "the stream's calls are the answer's");
    }
}

#[test]
fn tool_choice_auto_constrains_a_call_once_the_model_opens_one_and_none_bans_calls() {
    let tools = weather_tools();
    // The model is pushed to open a call (a bias on `<tool_call>`): from there the grammar holds
    // it to one valid call (no parallel calls), and the answer ends with it.
    let open = 151657; // Qwen2.5's `<tool_call>`
    let body = chat(
        TOOL_QUESTION,
        100,
        json!({"tools": tools, "tool_choice": "auto", "parallel_tool_calls": false, "logit_bias": {open.to_string(): 100}}),
    );
    let reply = post(server(), "/v1/chat/completions", &body).json();
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    let calls = choice["message"]["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{reply}");
    assert_weather_call(&calls[0]);
    // Under "none" the same bias cannot open a call.
    let body =
        chat(TOOL_QUESTION, 30, json!({"tools": tools, "tool_choice": "none", "logit_bias": {open.to_string(): 100}}));
    let reply = post(server(), "/v1/chat/completions", &body).json();
    let choice = &reply["choices"][0];
    assert!(choice["message"].get("tool_calls").is_none(), "{reply}");
    assert!(!choice["message"]["content"].as_str().expect("content").contains("<tool_call>"), "{reply}");
}

/// Qwen2.5-Coder under `auto` writes its call as a JSON code block, not as its template's
/// `<tool_call>`: from the block's `{"name":` on, the grammar holds it to a valid call, and the
/// answer is that call, streamed or not.
#[test]
fn tool_choice_auto_reads_a_call_fenced_as_a_json_code_block() {
    let body = chat("What's the weather like in Paris?", 100, json!({"tools": weather_tools(), "tool_choice": "auto"}));
    let reply = post(server(), "/v1/chat/completions", &body).json();
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    assert!(choice["message"]["content"].is_null(), "{reply}");
    let calls = choice["message"]["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{reply}");
    assert_eq!(assert_weather_call(&calls[0]), "get_weather", "{reply}");
    assert!(reply["usage"]["grammar"]["masks"].as_u64().is_some_and(|m| m > 0), "constrained: {reply}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = post(server(), "/v1/chat/completions", &streamed);
    assert_eq!(r.status, 200, "{}", r.text());
    let (mut name, mut arguments) = (String::new(), String::new());
    for event in r.events().iter().filter(|e| e.as_str() != "[DONE]") {
        let event: Value = serde_json::from_str(event).expect("a JSON event");
        let delta = &event["choices"][0]["delta"];
        assert!(delta["content"].as_str().is_none_or(str::is_empty), "no content: {event}");
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            name.push_str(call["function"]["name"].as_str().unwrap_or_default());
            arguments.push_str(call["function"]["arguments"].as_str().unwrap_or_default());
        }
    }
    assert_eq!(
        (name.as_str(), arguments.as_str()),
        ("get_weather", calls[0]["function"]["arguments"].as_str().expect("text"))
    );
}

#[test]
fn a_tool_result_goes_back_through_the_template() {
    let tools = weather_tools();
    let messages = json!([
        {"role": "user", "content": "What's the weather like in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 18, \"sky\": \"cloudy\"}"}
    ]);
    let body = json!({"model": MODEL, "messages": messages, "tools": tools, "max_tokens": 8, "temperature": 0});
    let with_result = post(server(), "/v1/chat/completions", &body).json();
    let mut without = body.clone();
    without["messages"] = json!([messages[0]]);
    let without = post(server(), "/v1/chat/completions", &without).json();
    // The call and its result are in the prompt: (the template renders the arguments as JSON,
    // and the result in a tool turn).
    let longer = with_result["usage"]["prompt_tokens"].as_u64().expect("prompt")
        - without["usage"]["prompt_tokens"].as_u64().expect("prompt");
    assert!(longer > 20, "{with_result} vs {without}");
}

#[test]
fn bad_tools_are_refused_naming_the_parameter() {
    let refused = |extra: Value, param: &str, says: &str| {
        let r = post(server(), "/v1/chat/completions", &chat("Hi", 8, extra.clone()));
        assert_error(&r, 400, None, Some(param));
        let message = r.json()["error"]["message"].as_str().expect("message").to_string();
        assert!(message.contains(says), "{extra}: {message}");
    };
    let tools = weather_tools();
    refused(json!({"tools": [{"type": "retrieval"}]}), "tools", "function");
    refused(json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]}), "tools", "name");
    refused(
        json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
        "tool_choice",
        "nope",
    );
    refused(json!({"tools": tools, "tool_choice": "sometimes"}), "tool_choice", "sometimes");
    refused(json!({"tool_choice": "required"}), "tool_choice", "no tools");
    refused(json!({"tools": tools, "response_format": {"type": "json_object"}}), "tools", "one way");
    let r =
        post(server(), "/v1/completions", &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 4, "tools": tools}));
    assert_error(&r, 400, None, Some("tools"));
}

/// Speculative decoding (prompt lookup) with a grammar: drafts are cut to what the grammar
/// allows and every verified row is masked, so the greedy answer is the one decoded without
/// drafts, and copied drafts are accepted.
#[test]
fn prompt_lookup_keeps_a_constrained_answer_and_its_drafts_are_accepted() {
    let lookup = Server::start(&["--lookup"]);
    let record = r#"{"name": "Ada Lovelace", "age": 36, "languages": ["Python", "Rust", "Go"]}"#;
    let question = format!("Repeat this record exactly as JSON: {record}");
    let format = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": person_schema()}}});
    let body = chat(&question, 80, format);
    let plain = post(server(), "/v1/chat/completions", &body).json();
    let drafted = post(&lookup.addr, "/v1/chat/completions", &body).json();
    assert_eq!(drafted["choices"][0]["message"], plain["choices"][0]["message"]);
    assert_person(drafted["choices"][0]["message"]["content"].as_str().expect("content"));
    let accepted = drafted["usage"]["completion_tokens_details"]["accepted_prediction_tokens"].as_u64();
    assert!(accepted.is_some_and(|a| a > 0), "{drafted}");
    // Tool calls too (a lazy grammar: drafts stop before the call opens, then are masked).
    for choice in ["required", "auto"] {
        let body = chat(TOOL_QUESTION, 80, json!({"tools": weather_tools(), "tool_choice": choice}));
        let functions = |reply: &Value| -> Value {
            let message = &reply["choices"][0]["message"];
            json!([
                message["content"],
                message["tool_calls"].as_array().map(|c| c.iter().map(|c| c["function"].clone()).collect::<Vec<_>>())
            ])
        };
        let plain = post(server(), "/v1/chat/completions", &body).json();
        let drafted = post(&lookup.addr, "/v1/chat/completions", &body).json();
        assert_eq!(functions(&drafted), functions(&plain), "{choice}");
    }
}
