//! `hearth serve` end to end over real HTTP: OpenAI-shaped errors for bad input, outputs equal to
//! `hearth run` (batching and the prefix cache do not change results, so greedy and seeded
//! outputs are exact), streaming, stop sequences, the queue limit, cancellation on disconnect,
//! /v1/models, /health, /metrics, speculative decoding (`--lookup`, `--draft-model`, both: the same
//! greedy answers, drafts counted), a chat's next round resumed from the KV blocks of the
//! answer it sends back, and the official `openai` Python client.

mod serve_support;

use serde_json::{json, Value};
use serve_support::*;
use std::io::BufReader;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const SYSTEM: &str = "You are a helpful assistant.";
const QUESTION: &str = "Write a Python function that reverses a string.";

fn server() -> &'static str {
    static SERVER: OnceLock<Server> = OnceLock::new();
    &SERVER.get_or_init(|| Server::start(&[])).addr
}

fn chat_body(max_tokens: usize, extra: Value) -> Value {
    let mut body = greedy_chat(SYSTEM, QUESTION, max_tokens);
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

/// A greedy chat request with these system and user messages.
fn greedy_chat(system: &str, user: &str, max_tokens: usize) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// The streamed text of a chat or completions SSE response, and its finish reason.
fn streamed(r: &Response) -> (String, String, Vec<Value>) {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("Content-Type"), Some("text/event-stream"));
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "stream must end with [DONE]");
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("chunk JSON")).collect();
    let mut text = String::new();
    let mut finish = String::new();
    for c in &chunks {
        if let Some(choice) = c["choices"].get(0) {
            text += choice["delta"]["content"].as_str().or(choice["text"].as_str()).unwrap_or("");
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
    }
    (text, finish, chunks)
}

#[test]
fn bad_input_gets_openai_errors() {
    let addr = server();
    let chat = "/v1/chat/completions";
    let raw = |body: &str| request(addr, "POST", chat, Some(API_KEY), body);
    assert_error(&raw("{\"messages\": [ "), 400, None, None);
    assert_error(&raw("not json"), 400, None, None);
    assert_error(&post(addr, chat, &json!({"model": MODEL})), 400, None, Some("messages"));
    assert_error(&post(addr, chat, &json!({"messages": []})), 400, None, Some("messages"));
    assert_error(
        &post(addr, chat, &chat_body(4, json!({"model": "gpt-4o"}))),
        404,
        Some("model_not_found"),
        Some("model"),
    );
    let long = "word ".repeat(2000);
    let r = post(addr, chat, &json!({"messages": [{"role": "user", "content": long}], "max_tokens": 4}));
    assert_error(&r, 400, Some("context_length_exceeded"), None);
    assert_error(&post(addr, chat, &chat_body(0, json!({}))), 400, None, Some("max_tokens"));
    assert_error(&post(addr, chat, &chat_body(4, json!({"max_tokens": -3}))), 400, None, Some("max_tokens"));
    assert_error(
        &post(addr, chat, &chat_body(100_000, json!({}))),
        400,
        Some("context_length_exceeded"),
        Some("max_tokens"),
    );
    assert_error(&post(addr, chat, &chat_body(4, json!({"temperature": 3.5}))), 400, None, Some("temperature"));
    assert_error(&post(addr, chat, &chat_body(4, json!({"logit_bias": {"abc": 1}}))), 400, None, Some("logit_bias"));
    assert_error(&post(addr, "/v1/completions", &json!({"max_tokens": 4})), 400, None, Some("prompt"));
    // What the server does not implement is refused by name, never ignored with a 200.
    for (extra, param) in [
        (json!({"best_of": 3}), "best_of"),
        (json!({"suffix": "x"}), "suffix"),
        (json!({"n": 0}), "n"),
        (json!({"speculative": {"mode": "lookup"}}), "speculative"),
    ] {
        assert_error(&post(addr, chat, &chat_body(4, extra)), 400, None, Some(param));
    }
    let unknown = post(addr, chat, &chat_body(4, json!({"temprature": 0.5})));
    assert_error(&unknown, 400, None, Some("temprature"));
    assert!(unknown.text().contains("unknown field `temprature`"), "{}", unknown.text());
    // Their neutral values are accepted.
    let neutral = post(
        addr,
        chat,
        &chat_body(2, json!({"response_format": {"type": "text"}, "n": 1, "logprobs": false, "user": "u1"})),
    );
    assert_eq!(neutral.status, 200, "{}", neutral.text());
    let body = chat_body(4, json!({})).to_string();
    assert_error(&request(addr, "POST", chat, None, &body), 401, Some("invalid_api_key"), None);
    assert_error(&request(addr, "POST", chat, Some("wrong"), &body), 401, Some("invalid_api_key"), None);
    assert_error(&request(addr, "GET", "/v1/models", None, ""), 401, Some("invalid_api_key"), None);
    assert_error(&get(addr, "/v1/nothing"), 404, None, None);
    assert_error(&request(addr, "GET", chat, Some(API_KEY), ""), 405, None, None);
    // Still serving after all that.
    assert_eq!(get(addr, "/health").status, 200);
}

#[test]
fn chat_equals_hearth_run_streaming_and_not() {
    let addr = server();
    let run = hearth_run(&["--chat", "--system", SYSTEM, "-p", QUESTION, "-n", "24", "--temperature", "0"]);
    let expected = run["text"].as_str().expect("text");
    let n_prompt = run["prompt_tokens"].as_array().expect("prompt").len();
    let n_generated = run["tokens"].as_array().expect("tokens").len();

    let r = post(addr, "/v1/chat/completions", &chat_body(24, json!({})));
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], MODEL);
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["message"]["content"], expected);
    assert_eq!(body["choices"][0]["finish_reason"], if run["finish_reason"] == "length" { "length" } else { "stop" });
    assert_eq!(body["usage"]["prompt_tokens"], n_prompt);
    assert_eq!(body["usage"]["completion_tokens"], n_generated);
    assert_eq!(body["usage"]["total_tokens"], n_prompt + n_generated);
    assert!(body["usage"].get("completion_tokens_details").is_none(), "no drafts without --lookup");

    let r = post(
        addr,
        "/v1/chat/completions",
        &chat_body(24, json!({"stream": true, "stream_options": {"include_usage": true}})),
    );
    let (text, finish, chunks) = streamed(&r);
    assert_eq!(text, expected);
    assert_eq!(finish, body["choices"][0]["finish_reason"].as_str().expect("finish"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    let last = chunks.last().expect("usage chunk");
    assert_eq!(last["choices"], json!([]));
    for field in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(last["usage"][field], body["usage"][field], "{field}");
    }
    // The same prompt again: its full blocks are in the prefix cache now.
    let cached = last["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens");
    assert!(cached > 0 && cached <= n_prompt as u64, "cached_tokens {cached} of {n_prompt}");
    // Without include_usage no chunk carries usage.
    let (_, _, chunks) = streamed(&post(addr, "/v1/chat/completions", &chat_body(4, json!({"stream": true}))));
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
}

/// A chat's next round sent back as text resumes from the first round's KV blocks, even when
/// the answer's tokens are not its text's canonical tokenization (the first seed of 60 that
/// samples one): `cached_tokens` counts the first prompt and every answer token evaluated.
#[test]
fn a_chats_next_round_resumes_from_the_answers_kv_blocks() {
    use hearth_core::gguf::GgufFile;
    use hearth_core::tokenizer::Tokenizer;
    let addr = server();
    let file = GgufFile::open(&hearth_tests::model_path(hearth_tests::QWEN_05B)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let question = json!({"role": "user", "content": "Write a haiku about caching."});
    let round = |messages: Value, seed: u64, max_tokens: usize| {
        let body = json!({"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed, "logprobs": true});
        let r = post(addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let (seed, first) = (1..=60)
        .find_map(|seed| {
            let first = round(json!([question]), seed, 24);
            let answer = first["choices"][0]["message"]["content"].as_str().expect("content");
            let sampled: Vec<Vec<u8>> = first["choices"][0]["logprobs"]["content"]
                .as_array()
                .expect("logprobs")
                .iter()
                .map(|t| {
                    t["bytes"].as_array().expect("bytes").iter().map(|b| b.as_u64().expect("byte") as u8).collect()
                })
                .collect();
            let canonical = tokenizer.encode(answer, false, false).expect("encode");
            let canonical: Vec<Vec<u8>> = canonical.iter().map(|&id| tokenizer.token_bytes(id)).collect();
            (sampled != canonical).then_some((seed, first))
        })
        .expect("one of 60 seeds samples an answer in non-canonical tokens");
    let answer = first["choices"][0]["message"]["content"].clone();
    let messages =
        json!([question, {"role": "assistant", "content": answer}, {"role": "user", "content": "And in Rust?"}]);
    let second = round(messages, seed, 1);
    let usage = &first["usage"];
    let written =
        usage["prompt_tokens"].as_u64().expect("prompt") + usage["completion_tokens"].as_u64().expect("completion");
    // (An answer cut by max_tokens ends with a token that was sampled, never evaluated.)
    let evaluated = written - u64::from(first["choices"][0]["finish_reason"] == "length");
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens");
    assert_eq!(cached, evaluated, "seed {seed}: the second round's prompt resumes after the first round's tokens");
}

#[test]
fn completions_equal_hearth_run() {
    let addr = server();
    let prompt = "def fibonacci(n):";
    let run = hearth_run(&["-p", prompt, "-n", "20", "--temperature", "0"]);
    let expected = run["text"].as_str().expect("text");
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 20, "temperature": 0});
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], expected);
    assert_eq!(v["usage"]["prompt_tokens"], run["prompt_tokens"].as_array().expect("prompt").len());
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let (text, _, chunks) = streamed(&post(addr, "/v1/completions", &stream_body));
    assert_eq!(text, expected);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
}

#[test]
fn stop_sequences_cut_the_text() {
    let addr = server();
    let full = post(addr, "/v1/chat/completions", &chat_body(32, json!({}))).json();
    let full = full["choices"][0]["message"]["content"].as_str().expect("content").to_string();
    let words: Vec<&str> = full.split_whitespace().collect();
    assert!(words.len() >= 6, "too short to test stops: {full:?}");
    // A word from the middle; the answer is everything before its first occurrence.
    let stop = words[4];
    let expected = &full[..full.find(stop).expect("stop in text")];
    for stop_field in [json!(stop), json!(["never-generated-xyz", stop])] {
        let r = post(addr, "/v1/chat/completions", &chat_body(32, json!({"stop": stop_field}))).json();
        assert_eq!(r["choices"][0]["message"]["content"], expected, "stop {stop_field}");
        assert_eq!(r["choices"][0]["finish_reason"], "stop");
        let (text, finish, _) =
            streamed(&post(addr, "/v1/chat/completions", &chat_body(32, json!({"stop": stop_field, "stream": true}))));
        assert_eq!(text, expected);
        assert_eq!(finish, "stop");
    }
}

#[test]
fn seeded_sampling_is_deterministic_and_matches_hearth_run() {
    let addr = server();
    let body = |seed: u64| json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.0, "seed": seed});
    let text = |seed: u64| {
        post(addr, "/v1/completions", &body(seed)).json()["choices"][0]["text"].as_str().expect("text").to_string()
    };
    let first = text(42);
    assert_eq!(text(42), first, "same seed, same text");
    assert!([7, 8, 9].iter().any(|&s| text(s) != first), "different seeds all gave the same text");
    // The server's defaults are plain temperature sampling (no top-k/top-p/min-p).
    let run = hearth_run(&[
        "-p",
        "Once upon a time",
        "-n",
        "16",
        "--temperature",
        "1",
        "--seed",
        "42",
        "--top-k",
        "0",
        "--top-p",
        "1",
        "--min-p",
        "0",
    ]);
    assert_eq!(run["text"].as_str(), Some(first.as_str()));
}

#[test]
fn n_choices_are_the_answers_of_requests_seeded_in_turn_streaming_and_not() {
    let addr = server();
    let body = |seed: u64, extra: Value| {
        let mut body = json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "seed": seed});
        body.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
        body
    };
    let single: Vec<String> = (0..3)
        .map(|i| {
            let r = post(addr, "/v1/completions", &body(42 + i, json!({})));
            r.json()["choices"][0]["text"].as_str().expect("text").to_string()
        })
        .collect();
    assert!(single.windows(2).any(|w| w[0] != w[1]), "the seeds should give different texts");
    let r = post(addr, "/v1/completions", &body(42, json!({"n": 3})));
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    let choices = answer["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        assert_eq!(choice["text"].as_str(), Some(single[i].as_str()), "choice {i}");
    }
    assert_eq!(answer["usage"]["completion_tokens"], 36, "{answer}");
    // The prompt is evaluated once; the other choices find it in KV.
    assert_eq!(answer["usage"]["prompt_tokens"], answer["usage"]["total_tokens"].as_u64().unwrap_or(0) - 36);

    let r = post(addr, "/v1/chat/completions", &{
        let mut chat = chat_body(8, json!({"n": 2, "temperature": 1.0, "seed": 3, "stream": true}));
        chat["stream_options"] = json!({"include_usage": true});
        chat
    });
    let (_, _, chunks) = streamed(&r);
    let mut texts = [String::new(), String::new()];
    let mut finished = [false, false];
    for chunk in &chunks {
        for choice in chunk["choices"].as_array().expect("choices") {
            let i = choice["index"].as_u64().expect("index") as usize;
            texts[i] += choice["delta"]["content"].as_str().unwrap_or("");
            finished[i] |= choice["finish_reason"].as_str() == Some("length");
        }
    }
    assert_eq!(finished, [true, true], "each choice ends with its finish_reason");
    let usage = &chunks.last().expect("a usage chunk")["usage"];
    assert_eq!(usage["completion_tokens"], 16, "{usage}");
    for (i, text) in texts.iter().enumerate() {
        let alone = post(addr, "/v1/chat/completions", &chat_body(8, json!({"temperature": 1.0, "seed": 3 + i})));
        assert_eq!(Some(text.as_str()), alone.json()["choices"][0]["message"]["content"].as_str(), "choice {i}");
    }
}

#[test]
fn models_health_and_metrics() {
    let addr = server();
    let models = get(addr, "/v1/models").json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["object"], "model");
    let health = request(addr, "GET", "/health", None, "");
    assert_eq!((health.status, health.json()["status"].clone()), (200, json!("ok")));

    let r = post(addr, "/v1/completions", &json!({"prompt": "1, 2, 3,", "max_tokens": 5, "temperature": 0}));
    assert_eq!(r.status, 200);
    let metrics = request(addr, "GET", "/metrics", None, "").text();
    let value = |name: &str| -> f64 {
        let line =
            metrics.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} missing:\n{metrics}"));
        line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("value")
    };
    assert!(value("hearth_requests_total{endpoint=\"/v1/completions\",code=\"200\"}") >= 1.0);
    assert!(value("hearth_generation_tokens_total") >= 5.0);
    assert!(value("hearth_prompt_tokens_total") >= r.json()["usage"]["prompt_tokens"].as_f64().expect("usage"));
    assert!(value("hearth_time_to_first_token_seconds_count") >= 1.0);
    assert!(value("hearth_inter_token_latency_seconds_count") >= 4.0);
    assert!(metrics.contains("hearth_inter_token_latency_seconds_bucket{le=\"+Inf\"}"));
    assert!(metrics.contains("# TYPE hearth_queue_depth gauge"));
    assert!(metrics.contains("hearth_requests_cancelled_total"));
    for gauge in [
        "hearth_requests_running",
        "hearth_requests_waiting",
        "hearth_kv_blocks_used",
        "hearth_kv_blocks_total",
        "hearth_prefix_cache_hit_rate",
        "hearth_step_prompt_budget_tokens",
        "hearth_step_cost_per_row_ms",
    ] {
        assert!(metrics.contains(&format!("# TYPE {gauge} gauge")), "{gauge} missing");
    }
    assert!(value("hearth_kv_blocks_total") > 0.0);
    assert!(metrics.contains("# TYPE hearth_preemptions_total counter"));
    let health = request(addr, "GET", "/health", None, "").json();
    assert!(health["kv_blocks_used"].is_u64() && health["running"].is_u64() && health["waiting"].is_u64(), "{health}");
}

/// Polls /metrics until `name` has `value`.
fn wait_for_metric(addr: &str, name: &str, value: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let metrics = request(addr, "GET", "/metrics", None, "").text();
        if metrics.lines().any(|l| l == format!("{name} {value}")) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{name} never reached {value}");
}

#[test]
fn full_queue_refuses_and_disconnect_cancels() {
    // One request generates at a time, so the next waits in the queue of one.
    let server = Server::start(&["--max-queue", "1", "--max-batch", "1"]);
    let addr = server.addr.as_str();
    // Long generations: end-of-text tokens banned so each runs for its full max_tokens.
    let long = chat_body(400, json!({"stream": true, "logit_bias": {"151643": -100, "151645": -100}})).to_string();
    let path = "/v1/chat/completions";
    let mut running = BufReader::new(send(addr, "POST", path, Some(API_KEY), &long));
    assert_eq!(read_head(&mut running).0, 200);
    read_chunk(&mut running).expect("first event");
    let mut waiting = BufReader::new(send(addr, "POST", path, Some(API_KEY), &long));
    wait_for_metric(addr, "hearth_queue_depth", "1");
    assert_error(&post(addr, path, &chat_body(4, json!({}))), 429, Some("queue_full"), None);
    // Hanging up cancels the running request; the waiting one starts.
    let started = Instant::now();
    drop(running);
    wait_for_metric(addr, "hearth_requests_cancelled_total", "1");
    assert_eq!(read_head(&mut waiting).0, 200);
    read_chunk(&mut waiting).expect("first event of the waiting request");
    drop(waiting);
    wait_for_metric(addr, "hearth_requests_cancelled_total", "2");
    wait_for_metric(addr, "hearth_requests_running", "0");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(post(addr, path, &chat_body(2, json!({}))).status, 200);
}

#[test]
fn lookup_keeps_outputs_and_reports_accepted_drafts() {
    let server = Server::start(&["--lookup"]);
    let addr = server.addr.as_str();
    let system = "You are a code editor. Reply with the whole edited code only, in one code block.";
    let edit = "Rename `first` to `left`:\ndef merge_counts(first, second):\n    result = dict(first)\n    \
                for key, value in second.items():\n        result[key] = result.get(key, 0) + value\n    return result\n";
    let run = hearth_run(&["--chat", "--system", system, "-p", edit, "-n", "48", "--temperature", "0"]);
    let expected = run["text"].as_str().expect("text");
    let body = greedy_chat(system, edit, 48);
    let r = post(addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    assert_eq!(answer["choices"][0]["message"]["content"], expected, "lookup changed the greedy answer");
    // OpenAI's predicted-output fields count the drafts (how many the adaptive rule verifies
    // depends on this machine's pass costs: the counts are checked, not their size).
    let details = &answer["usage"]["completion_tokens_details"];
    let accepted = details["accepted_prediction_tokens"].as_u64().expect("accepted_prediction_tokens");
    assert!(details["rejected_prediction_tokens"].is_u64(), "{details}");

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (text, _, _) = streamed(&post(addr, "/v1/chat/completions", &streaming));
    assert_eq!(text, expected, "lookup changed the streamed greedy answer");
    let metrics = request(addr, "GET", "/metrics", None, "").text();
    let value = |name: &str| -> f64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"));
        line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("value")
    };
    assert!(value("hearth_draft_tokens_accepted_total") >= accepted as f64);
    assert!(value("hearth_draft_tokens_total") >= value("hearth_draft_tokens_accepted_total"));
}

/// Concurrent greedy chat requests to a server started with `server_args`: each answer is
/// `hearth run`'s, and drafts were accepted.
fn concurrent_answers_equal_hearth_run(server_args: &[&str], questions: &[&str]) {
    let server = Server::start(server_args);
    let addr = server.addr.clone();
    let expected: Vec<String> = questions
        .iter()
        .map(|q| {
            let run = hearth_run(&["--chat", "--system", SYSTEM, "-p", q, "-n", "24", "--temperature", "0"]);
            run["text"].as_str().expect("text").to_string()
        })
        .collect();
    let answers: Vec<Value> = std::thread::scope(|scope| {
        let threads: Vec<_> = questions
            .iter()
            .map(|q| {
                let addr = addr.as_str();
                scope.spawn(move || {
                    let r = post(addr, "/v1/chat/completions", &greedy_chat(SYSTEM, q, 24));
                    assert_eq!(r.status, 200, "{}", r.text());
                    r.json()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("request thread")).collect()
    });
    let mut accepted = 0;
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer["choices"][0]["message"]["content"], expected[i], "request {i}: drafting changed it");
        accepted += answer["usage"]["completion_tokens_details"]["accepted_prediction_tokens"].as_u64().unwrap_or(0);
    }
    assert!(accepted > 0, "no draft was accepted: {answers:?}");
}

/// `--draft-model` (here the model itself, whose drafts are mostly kept): concurrent requests
/// draft in shared passes and verify in shared steps, with the answers of `hearth run`.
#[test]
fn a_draft_model_keeps_the_answers_of_concurrent_requests() {
    let questions = [QUESTION, "Write a Python function that sums a list.", "What is a hash map? One sentence."];
    concurrent_answers_equal_hearth_run(&["--draft-model", MODEL, "--max-batch", "3"], &questions);
}

/// `--lookup --draft-model`: each request drafts by prompt lookup where its answer copies the
/// prompt and with the draft model elsewhere, verified in shared steps: `hearth run`'s answers.
#[test]
fn lookup_then_a_draft_model_keeps_the_answers_of_concurrent_requests() {
    let copy = "Repeat exactly: def add(a, b):\n    return a + b";
    let questions = [copy, "What is a hash map? One sentence."];
    concurrent_answers_equal_hearth_run(&["--lookup", "--draft-model", MODEL, "--max-batch", "2"], &questions);
}

#[test]
fn a_predicted_output_is_drafted_from_without_lookup() {
    let addr = server();
    let run = hearth_run(&["--chat", "--system", SYSTEM, "-p", QUESTION, "-n", "32", "--temperature", "0"]);
    let expected = run["text"].as_str().expect("text");
    // OpenAI's predicted output: the answer the client expects (here, exactly the answer).
    let r = post(
        addr,
        "/v1/chat/completions",
        &chat_body(32, json!({"prediction": {"type": "content", "content": expected}})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    assert_eq!(answer["choices"][0]["message"]["content"], expected, "a prediction changed the greedy answer");
    let accepted = answer["usage"]["completion_tokens_details"]["accepted_prediction_tokens"]
        .as_u64()
        .expect("accepted_prediction_tokens");
    assert!(accepted > 0, "{}", answer["usage"]);
    let parts = json!({"prediction": {"type": "content", "content": [{"type": "text", "text": expected}]}});
    assert_eq!(
        post(addr, "/v1/chat/completions", &chat_body(32, parts)).json()["choices"][0]["message"]["content"],
        expected
    );
    for bad in [json!({"type": "text", "content": "x"}), json!({"type": "content", "content": 5}), json!("x")] {
        assert_error(
            &post(addr, "/v1/chat/completions", &chat_body(4, json!({"prediction": bad}))),
            400,
            None,
            Some("prediction"),
        );
    }
}

/// Completions' `logprobs: 5` against llama.cpp's top-5 log-probabilities on its golden prompts
/// (greedy, step by step while the two runs pick the same tokens), with the tolerances of the
/// golden test (tests/support/golden.rs: 8-bit activations on both sides).
#[test]
fn completion_logprobs_match_llama_cpp() {
    let addr = server();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/golden/qwen2.5-coder-0.5b-instruct-q4_k_m.json");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("golden file")).expect("json");
    let (mut err_sum, mut compared, mut max_err) = (0.0f64, 0usize, 0.0f64);
    // (Case d is a chat-templated prompt: its special tokens are a chat request's.)
    for case in golden["cases"].as_array().expect("cases").iter().filter(|c| c["id"] != "d") {
        let body = json!({"model": MODEL, "prompt": case["prompt"], "max_tokens": 16, "temperature": 0, "logprobs": 5});
        let r = post(addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let answer = r.json();
        let logprobs = &answer["choices"][0]["logprobs"];
        let tokens = logprobs["tokens"].as_array().expect("tokens");
        let n = answer["usage"]["completion_tokens"].as_u64().expect("usage") as usize;
        assert_eq!(tokens.len(), n, "one entry per token");
        let text: String = tokens.iter().map(|t| t.as_str().expect("token text")).collect();
        assert_eq!(text, answer["choices"][0]["text"].as_str().expect("text"), "the tokens spell the text");
        let offsets: Vec<u64> =
            logprobs["text_offset"].as_array().expect("offsets").iter().filter_map(Value::as_u64).collect();
        let mut offset = 0;
        for (i, t) in tokens.iter().enumerate() {
            assert_eq!(offsets[i], offset, "text_offset of token {i}");
            offset += t.as_str().expect("token").chars().count() as u64;
        }
        for (i, step) in case["top5_logprobs_per_step"].as_array().expect("steps").iter().enumerate().take(n) {
            if tokens[i] != step["token"] {
                break; // the runs part on a near-tie (the golden tests check that it is one)
            }
            let top = logprobs["top_logprobs"][i].as_object().expect("top_logprobs entry");
            assert_eq!(top.len(), 5, "step {i}: {top:?}");
            let ours = logprobs["token_logprobs"][i].as_f64().expect("token_logprob");
            let mut errors = vec![(ours - step["logprob"].as_f64().expect("logprob")).abs()];
            for t in step["top"].as_array().expect("top") {
                if let Some(lp) = top.get(t["token"].as_str().expect("token")).and_then(Value::as_f64) {
                    errors.push((lp - t["logprob"].as_f64().expect("logprob")).abs());
                }
            }
            for e in errors {
                (err_sum, compared, max_err) = (err_sum + e, compared + 1, max_err.max(e));
            }
        }
    }
    let mean = err_sum / compared.max(1) as f64;
    eprintln!("{compared} log-probabilities against llama.cpp's: mean |error| {mean:.4}, max {max_err:.4}");
    assert!(compared >= 60, "only {compared} log-probabilities compared");
    assert!(mean < 0.08 && max_err < 0.6, "mean |error| {mean:.4}, max {max_err:.4}");
}

/// Streamed, an echo is each choice's first chunk: the prompt's text, with (`logprobs`) the
/// prompt's log-probabilities; the chunks after it carry the answer's, their text offsets
/// continuing the prompt's. Text and log-probabilities equal the unstreamed answer's.
#[test]
fn a_streamed_echo_comes_first() {
    let addr = server();
    let prompt = "def fib(n):";
    for logprobs in [Value::Null, json!(2)] {
        let body =
            json!({"prompt": prompt, "max_tokens": 4, "temperature": 0, "echo": true, "logprobs": logprobs, "n": 2});
        let whole = post(addr, "/v1/completions", &body);
        assert_eq!(whole.status, 200, "{}", whole.text());
        let whole = whole.json();
        let mut streamed_body = body.clone();
        streamed_body["stream"] = json!(true);
        let (_, _, chunks) = streamed(&post(addr, "/v1/completions", &streamed_body));
        for index in 0..2 {
            let of_choice: Vec<&Value> =
                chunks.iter().filter_map(|c| c["choices"].get(0)).filter(|c| c["index"] == index).collect();
            assert_eq!(of_choice[0]["text"].as_str(), Some(prompt), "logprobs {logprobs}: the echo first");
            let text: String = of_choice.iter().filter_map(|c| c["text"].as_str()).collect();
            let want = &whole["choices"][index];
            assert_eq!(text.as_str(), want["text"].as_str().expect("text"), "logprobs {logprobs}, choice {index}");
            if logprobs.is_null() {
                assert!(of_choice.iter().all(|c| c["logprobs"].is_null()));
                continue;
            }
            let prompt_tokens = whole["usage"]["prompt_tokens"].as_u64().expect("usage") as usize;
            let echoed = &of_choice[0]["logprobs"];
            assert_eq!(echoed["tokens"].as_array().expect("tokens").len(), prompt_tokens);
            // Every chunk's entries, joined, are the unstreamed answer's.
            for key in ["tokens", "token_logprobs", "text_offset"] {
                let joined: Vec<Value> = of_choice
                    .iter()
                    .filter_map(|c| c["logprobs"][key].as_array())
                    .flat_map(|a| a.iter().cloned())
                    .collect();
                assert_eq!(Value::Array(joined), want["logprobs"][key], "logprobs {key}, choice {index}");
            }
        }
    }
}

/// Completions' `echo` with `logprobs: 5` and `max_tokens: 0`, as lm-evaluation-harness scores a
/// continuation: the golden prompts followed by llama.cpp's first greedy tokens, scored as prompt
/// tokens, against llama.cpp's log-probabilities of those tokens (the tolerances of
/// `completion_logprobs_match_llama_cpp`). The echoed answer is the prompt, with a null first
/// entry; echo with `max_tokens` > 0 continues after it.
#[test]
fn echoed_prompt_logprobs_match_llama_cpp() {
    let addr = server();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/golden/qwen2.5-coder-0.5b-instruct-q4_k_m.json");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("golden file")).expect("json");
    let (mut err_sum, mut compared, mut max_err) = (0.0f64, 0usize, 0.0f64);
    const SCORED: usize = 8;
    for case in golden["cases"].as_array().expect("cases").iter().filter(|c| c["id"] != "d") {
        let steps = &case["top5_logprobs_per_step"].as_array().expect("steps")[..SCORED];
        let continuation: String = steps.iter().map(|s| s["token"].as_str().expect("token")).collect();
        let prompt = format!("{}{continuation}", case["prompt"].as_str().expect("prompt"));
        let body = json!({"prompt": prompt, "max_tokens": 0, "temperature": 0, "logprobs": 5, "echo": true});
        let r = post(addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let answer = r.json();
        let choice = &answer["choices"][0];
        assert_eq!(choice["text"].as_str(), Some(prompt.as_str()), "max_tokens 0: the prompt alone");
        let logprobs = &choice["logprobs"];
        let tokens = logprobs["tokens"].as_array().expect("tokens");
        assert_eq!(tokens.len() as u64, answer["usage"]["prompt_tokens"].as_u64().expect("usage"));
        let text: String = tokens.iter().map(|t| t.as_str().expect("token text")).collect();
        assert_eq!(text, prompt, "the tokens spell the prompt");
        assert!(logprobs["token_logprobs"][0].is_null() && logprobs["top_logprobs"][0].is_null());
        let first_scored = tokens.len() - SCORED;
        let ours: Vec<&str> = tokens[first_scored..].iter().filter_map(Value::as_str).collect();
        let theirs: Vec<&str> = steps.iter().filter_map(|s| s["token"].as_str()).collect();
        if ours != theirs {
            continue; // the continuation's text tokenizes differently from llama.cpp's tokens
        }
        for (i, step) in steps.iter().enumerate() {
            let at = first_scored + i;
            let top = logprobs["top_logprobs"][at].as_object().expect("top_logprobs entry");
            assert_eq!(top.len(), 5, "token {at}: {top:?}");
            let lp = logprobs["token_logprobs"][at].as_f64().expect("token_logprob");
            let mut errors = vec![(lp - step["logprob"].as_f64().expect("logprob")).abs()];
            for t in step["top"].as_array().expect("top") {
                if let Some(lp) = top.get(t["token"].as_str().expect("token")).and_then(Value::as_f64) {
                    errors.push((lp - t["logprob"].as_f64().expect("logprob")).abs());
                }
            }
            for e in errors {
                (err_sum, compared, max_err) = (err_sum + e, compared + 1, max_err.max(e));
            }
        }
        // With a completion after it: the same prompt entries, then the completion's.
        let body = json!({"prompt": prompt, "max_tokens": 2, "temperature": 0, "logprobs": 1, "echo": true});
        let longer = post(addr, "/v1/completions", &body).json();
        let longer_choice = &longer["choices"][0];
        assert!(longer_choice["text"].as_str().expect("text").starts_with(&prompt));
        let longer_logprobs = longer_choice["logprobs"]["token_logprobs"].as_array().expect("token_logprobs");
        assert_eq!(longer_logprobs.len(), tokens.len() + 2);
        assert_eq!(longer_logprobs[first_scored], logprobs["token_logprobs"][first_scored]);
    }
    let mean = err_sum / compared.max(1) as f64;
    eprintln!("{compared} prompt log-probabilities against llama.cpp's: mean |error| {mean:.4}, max {max_err:.4}");
    assert!(compared >= 60, "only {compared} log-probabilities compared");
    assert!(mean < 0.08 && max_err < 0.6, "mean |error| {mean:.4}, max {max_err:.4}");
    // Echo is a completions parameter; max_tokens 0 goes with it.
    let chat = chat_body(4, json!({"echo": true}));
    assert_error(&post(addr, "/v1/chat/completions", &chat), 400, None, Some("echo"));
    assert_error(
        &post(addr, "/v1/completions", &json!({"prompt": "x", "max_tokens": 0})),
        400,
        None,
        Some("max_tokens"),
    );
}

/// Chat's `logprobs: true, top_logprobs: 3`: one entry per token, spelling the answer, the chosen
/// token most likely (greedy), the same alone and streamed; refusals name their parameter.
#[test]
fn chat_logprobs_stream_and_not() {
    let addr = server();
    let r = post(addr, "/v1/chat/completions", &chat_body(12, json!({"logprobs": true, "top_logprobs": 3})));
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    let content = answer["choices"][0]["logprobs"]["content"].as_array().expect("logprobs.content").clone();
    assert_eq!(content.len() as u64, answer["usage"]["completion_tokens"].as_u64().expect("usage"));
    let text: String = content.iter().map(|t| t["token"].as_str().expect("token")).collect();
    assert_eq!(text, answer["choices"][0]["message"]["content"].as_str().expect("content"));
    for t in &content {
        let top = t["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(top.len(), 3, "{t}");
        assert_eq!(top[0]["token"], t["token"], "greedy picks the most likely token: {t}");
        assert_eq!(top[0]["logprob"], t["logprob"]);
        let logprob = t["logprob"].as_f64().expect("logprob");
        assert!(logprob <= 0.0 && top[1]["logprob"].as_f64().expect("logprob") <= logprob, "{t}");
        let bytes: Vec<u8> =
            t["bytes"].as_array().expect("bytes").iter().map(|b| b.as_u64().expect("byte") as u8).collect();
        assert_eq!(String::from_utf8_lossy(&bytes), t["token"].as_str().expect("token"));
    }
    let mut body = chat_body(12, json!({"logprobs": true, "top_logprobs": 3}));
    body["stream"] = json!(true);
    let (_, _, chunks) = streamed(&post(addr, "/v1/chat/completions", &body));
    let streamed_content: Vec<Value> =
        chunks.iter().filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array()).flatten().cloned().collect();
    assert_eq!(streamed_content, content, "streamed log-probabilities differ");
    assert!(answer["choices"][0]["logprobs"].is_object());
    let plain = post(addr, "/v1/chat/completions", &chat_body(2, json!({}))).json();
    assert!(plain["choices"][0]["logprobs"].is_null(), "no logprobs unless asked");
    for (extra, param) in [
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        (json!({"logprobs": 2}), "logprobs"),
    ] {
        assert_error(&post(addr, "/v1/chat/completions", &chat_body(2, extra)), 400, None, Some(param));
    }
}

#[test]
fn the_model_id_is_a_name_and_alias_sets_it() {
    let server = Server::start(&["--alias", "coder"]);
    let models = get(&server.addr, "/v1/models").json();
    assert_eq!(models["data"][0]["id"], "coder");
    for name in ["coder", MODEL] {
        let r = post(
            &server.addr,
            "/v1/completions",
            &json!({"model": name, "prompt": "1, 2,", "max_tokens": 2, "temperature": 0}),
        );
        assert_eq!(r.status, 200, "model {name}: {}", r.text());
        assert_eq!(r.json()["model"], "coder");
    }
}

#[test]
fn draft_tokens_without_lookup_is_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["serve", "-m", MODEL, "--port", "0", "--draft-tokens", "4"])
        .output()
        .expect("spawn hearth serve");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--draft-tokens") && stderr.contains("--lookup"), "{stderr}");
}

#[test]
fn official_openai_python_client() {
    let addr = server();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/server/openai_client_test.py");
    let out = std::process::Command::new("python3")
        .args([script, "--base-url", &format!("http://{addr}/v1"), "--api-key", API_KEY, "--model", MODEL])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "openai client test failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A mixture of experts' /metrics counts the tokens each layer routed to each expert: every
/// token the model forwarded (the prompt, then each generated token but the last) picks
/// `expert_used_count` experts in every layer.
#[test]
fn metrics_count_the_tokens_routed_to_each_expert() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/synthetic/qwen3moe-f32.gguf");
    let (n_layer, n_expert, n_used) = (3, 8, 2);
    let server = Server::start_model(model, &[]);
    let addr = server.addr.as_str();
    let r = post(addr, "/v1/completions", &json!({"prompt": "the quick brown fox", "max_tokens": 6, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.text());
    let usage = &r.json()["usage"];
    let forwarded = usage["prompt_tokens"].as_u64().expect("prompt tokens")
        + usage["completion_tokens"].as_u64().expect("completion tokens")
        - 1;
    // [layer][expert], parsed from hearth_expert_tokens_total{layer="l",expert="e"} n.
    let tallies = || -> Vec<Vec<u64>> {
        let metrics = request(addr, "GET", "/metrics", None, "").text();
        let mut counts = vec![vec![0u64; n_expert]; n_layer];
        for line in metrics.lines().filter(|l| l.starts_with("hearth_expert_tokens_total{")) {
            let field = |key: &str| -> usize {
                let start = line.find(&format!("{key}=\"")).expect(key) + key.len() + 2;
                line[start..].split('"').next().and_then(|v| v.parse().ok()).expect("an index")
            };
            let n = line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a count");
            counts[field("layer")][field("expert")] = n;
        }
        counts
    };
    // The engine publishes the counts once it falls idle, right after the response.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut counts = tallies();
    while counts.iter().any(|layer| layer.iter().sum::<u64>() == 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        counts = tallies();
    }
    for (layer, experts) in counts.iter().enumerate() {
        assert_eq!(experts.iter().sum::<u64>(), n_used * forwarded, "layer {layer}: {experts:?}");
        assert!(
            experts.iter().filter(|&&n| n > 0).count() > n_used as usize,
            "layer {layer} uses one pair of experts only: {experts:?}"
        );
    }
}
