//! The one request schema on every surface: the same chat requests through `hearth run --json`,
//! `hearth serve` and the browser's engine host (run natively, on the CPU backend, as the wasm
//! build runs it) give the same tokens, sampled with penalties and stop strings included, the
//! same log-probabilities (server and browser), and the same refusals. The model must be in the cache (`hearth models fetch all`).

mod serve_support;

use hearth_cpu::CpuBackend;
use hearth_wasm::host::EngineHost;
use hearth_wasm::request::{parse_request, LoadOptions};
use serde_json::{json, Value};
use serve_support::{post, Server, CTX, MODEL};
use std::process::Command;

const SYSTEM: &str = "You are a terse assistant.";
const USER: &str = "Name three colours, then say why the sky is blue.";

/// Requests that set every sampling field (the surfaces' defaults differ: `hearth run` samples
/// with llama.cpp's, the API with OpenAI's).
fn cases() -> Vec<Value> {
    vec![
        json!({"temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0, "max_tokens": 40, "stop": ["\n\n"], "seed": 1}),
        json!({"temperature": 0.9, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "presence_penalty": 0.6, "frequency_penalty": 0.4,
               "repetition_penalty": 1.15, "max_tokens": 32, "seed": 1234}),
        json!({"temperature": 0.7, "top_k": 20, "top_p": 1, "min_p": 0.1, "repetition_penalty": 1.3, "repeat_last_n": 16,
               "max_tokens": 32, "seed": 7, "stop": ["sky"]}),
    ]
}

/// The request's fields as `hearth run` flags.
fn flags(params: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for (field, value) in params.as_object().expect("object") {
        let flag = match field.as_str() {
            "temperature" => "--temperature",
            "top_k" => "--top-k",
            "top_p" => "--top-p",
            "min_p" => "--min-p",
            "presence_penalty" => "--presence-penalty",
            "frequency_penalty" => "--frequency-penalty",
            "repetition_penalty" => "--repeat-penalty",
            "repeat_last_n" => "--repeat-last-n",
            "max_tokens" => "-n",
            "seed" => "--seed",
            "stop" => {
                for stop in value.as_array().expect("stops") {
                    out.extend(["--stop".to_string(), stop.as_str().expect("stop").to_string()]);
                }
                continue;
            }
            other => panic!("no flag for {other}"),
        };
        out.extend([flag.to_string(), value.to_string()]);
    }
    out
}

fn messages() -> Value {
    json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}])
}

fn with_messages(params: &Value) -> Value {
    let mut body = params.clone();
    body["messages"] = messages();
    body
}

/// (tokens, text) from `hearth run --json`, or its error output.
fn run_cli(params: &Value) -> Result<(Vec<u64>, String), String> {
    run_cli_with(params, &[])
}

/// [`run_cli`] with more flags.
fn run_cli_with(params: &Value, extra: &[&str]) -> Result<(Vec<u64>, String), String> {
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args([
            "run",
            "-m",
            MODEL,
            "--backend",
            "cpu",
            "-c",
            CTX,
            "--quiet",
            "--json",
            "--chat",
            "--system",
            SYSTEM,
            "-p",
            USER,
        ])
        .args(flags(params))
        .args(extra)
        .output()
        .expect("spawn hearth run");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let report: Value = serde_json::from_slice(&out.stdout).expect("run --json output");
    let tokens = report["tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().expect("id")).collect();
    Ok((tokens, report["text"].as_str().expect("text").to_string()))
}

fn model_bytes() -> Vec<u8> {
    let path = hearth_tests::model_path(hearth_tests::QWEN_05B);
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{} ({e}): run `hearth models fetch qwen2.5-coder-0.5b`", path.display()))
}

/// `value` with every float rounded to f32, the precision log-probabilities have: serde_json's
/// default float parsing may land one f64 ulp away from what was printed.
fn as_f32(value: &Value) -> Value {
    match value {
        Value::Number(n) if n.is_f64() => json!(n.as_f64().map(|x| x as f32)),
        Value::Array(items) => Value::Array(items.iter().map(as_f32).collect()),
        Value::Object(fields) => Value::Object(fields.iter().map(|(k, v)| (k.clone(), as_f32(v))).collect()),
        other => other.clone(),
    }
}

/// The browser's engine host on the CPU backend, with the server's context size.
fn cpu_host() -> EngineHost {
    let load =
        LoadOptions::parse(&json!({"n_ctx": CTX.parse::<usize>().expect("ctx")}).to_string()).expect("load options");
    EngineHost::load(model_bytes(), &load, Box::new(CpuBackend::new(None).expect("cpu")), &mut |_, _| {})
        .expect("load host")
}

#[test]
fn the_same_request_gives_the_same_tokens_on_every_surface() {
    let server = Server::start(&[]);
    let mut host = cpu_host();
    for params in cases() {
        let (cli_tokens, cli_text) = run_cli(&params).unwrap_or_else(|e| panic!("hearth run {params}: {e}"));

        let (prompt, options) = parse_request("chat", &with_messages(&params).to_string()).expect("host request");
        let report = host.generate(&prompt, &options, 0, None, &mut |_| true).expect("host generate");
        assert_eq!(
            report.token_ids.iter().map(|&t| t as u64).collect::<Vec<_>>(),
            cli_tokens,
            "browser host vs hearth run: {params}"
        );
        assert_eq!(report.text, cli_text, "{params}");

        let answer = post(&server.addr, "/v1/chat/completions", &with_messages(&params));
        assert_eq!(answer.status, 200, "{}", answer.text());
        let answer = answer.json();
        assert_eq!(answer["choices"][0]["message"]["content"], cli_text, "hearth serve vs hearth run: {params}");
        assert_eq!(answer["usage"]["completion_tokens"], cli_tokens.len(), "{params}");
        eprintln!("{params}: {} tokens, the same on all three: {cli_text:?}", cli_tokens.len());

        // With log-probabilities: the same tokens, and the same values in the browser and the server.
        let mut with_logprobs = with_messages(&params);
        with_logprobs["logprobs"] = json!(true);
        with_logprobs["top_logprobs"] = json!(3);
        let (prompt, options) = parse_request("chat", &with_logprobs.to_string()).expect("host request");
        let report = host.generate(&prompt, &options, 0, None, &mut |_| true).expect("host generate");
        assert_eq!(report.token_ids.iter().map(|&t| t as u64).collect::<Vec<_>>(), cli_tokens, "logprobs: {params}");
        let answer = post(&server.addr, "/v1/chat/completions", &with_logprobs).json();
        let served = &answer["choices"][0]["logprobs"];
        assert_eq!(served["content"].as_array().map(Vec::len), Some(cli_tokens.len()), "{params}");
        assert_eq!(
            report.logprobs.as_ref().map(as_f32),
            Some(as_f32(served)),
            "browser host vs hearth serve log-probabilities: {params}"
        );
    }
}

/// Completions' `echo` with log-probabilities: the browser host's answer (streamed text and
/// report) is the server's, the prompt first.
#[test]
fn an_echoed_completion_is_the_same_in_the_browser_and_the_server() {
    let server = Server::start(&[]);
    let mut host = cpu_host();
    let prompt_text = "The sky is blue because";
    for max_tokens in [0, 6] {
        let body =
            json!({"prompt": prompt_text, "echo": true, "logprobs": 2, "max_tokens": max_tokens, "temperature": 0});
        let (prompt, options) = parse_request("text", &body.to_string()).expect("host request");
        let mut streamed = Vec::new();
        let report = host
            .generate(&prompt, &options, 0, None, &mut |delta| {
                streamed.push(delta.to_string());
                true
            })
            .expect("host generate");
        assert_eq!(streamed.first().map(String::as_str), Some(prompt_text), "the echo streams first");
        assert_eq!(streamed.concat(), report.text);
        let answer = post(&server.addr, "/v1/completions", &body);
        assert_eq!(answer.status, 200, "{}", answer.text());
        let choice = &answer.json()["choices"][0];
        assert_eq!(choice["text"].as_str(), Some(report.text.as_str()), "max_tokens {max_tokens}");
        assert!(report.text.starts_with(prompt_text));
        assert_eq!(
            report.logprobs.as_ref().map(as_f32),
            Some(as_f32(&choice["logprobs"])),
            "browser host vs hearth serve echoed log-probabilities, max_tokens {max_tokens}"
        );
    }
}

/// Structured output, greedy and sampled: the grammar's mask is applied the same way everywhere,
/// so the browser host, the server and `hearth run --json-schema` give the same tokens.
#[test]
fn a_constrained_answer_is_the_same_on_every_surface() {
    let server = Server::start(&[]);
    let mut host = cpu_host();
    let schema = json!({
        "type": "object",
        "properties": {
            "colours": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 3},
            "reason": {"type": "string", "maxLength": 80}
        },
        "required": ["colours", "reason"],
        "additionalProperties": false
    });
    let schema_file = std::env::temp_dir().join(format!("hearth-surfaces-schema-{}.json", std::process::id()));
    std::fs::write(&schema_file, schema.to_string()).expect("schema file");
    let cases = [
        json!({"temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0, "max_tokens": 60, "seed": 1}),
        json!({"temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "presence_penalty": 0.5, "max_tokens": 60, "seed": 11}),
    ];
    for params in cases {
        let (cli_tokens, cli_text) = run_cli_with(&params, &["--json-schema", schema_file.to_str().expect("path")])
            .unwrap_or_else(|e| panic!("hearth run {params}: {e}"));
        let value: Value = serde_json::from_str(&cli_text).unwrap_or_else(|e| panic!("{e}: {cli_text}"));
        assert_eq!(value["colours"].as_array().map(Vec::len), Some(3), "{cli_text}");

        let mut body = with_messages(&params);
        body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "colours", "schema": schema}});
        let (prompt, options) = parse_request("chat", &body.to_string()).expect("host request");
        let report = host.generate(&prompt, &options, 0, None, &mut |_| true).expect("host generate");
        assert_eq!(
            report.token_ids.iter().map(|&t| t as u64).collect::<Vec<_>>(),
            cli_tokens,
            "browser host vs hearth run: {params}"
        );
        let answer = post(&server.addr, "/v1/chat/completions", &body);
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.json()["choices"][0]["message"]["content"], cli_text, "hearth serve vs hearth run: {params}");
    }
    std::fs::remove_file(&schema_file).ok();
}

/// Tool calls: the browser host's calls (and their streamed pieces) are the server's.
#[test]
fn tool_calls_are_the_same_in_the_browser_and_the_server() {
    let server = Server::start(&[]);
    let mut host = cpu_host();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let body = json!({"messages": [{"role": "user", "content": "Weather in Oslo and in Lima?"}], "tools": tools,
        "tool_choice": "required", "temperature": 0, "max_tokens": 60});
    let answer = post(&server.addr, "/v1/chat/completions", &body);
    assert_eq!(answer.status, 200, "{}", answer.text());
    let message = answer.json()["choices"][0]["message"].clone();
    let served: Vec<(String, String)> = message["tool_calls"]
        .as_array()
        .expect("tool_calls")
        .iter()
        .map(|c| {
            (
                c["function"]["name"].as_str().expect("name").into(),
                c["function"]["arguments"].as_str().expect("args").into(),
            )
        })
        .collect();
    assert!(!served.is_empty());

    let (prompt, options) = parse_request("chat", &body.to_string()).expect("host request");
    let report = host.generate(&prompt, &options, 0, None, &mut |_| true).expect("host generate");
    let hosted: Vec<(String, String)> =
        report.tool_calls.expect("tool calls").into_iter().map(|c| (c.name, c.arguments)).collect();
    assert_eq!(hosted, served, "browser host vs hearth serve");
    assert_eq!(report.content, Some(message["content"].as_str().map(str::to_string)));
}

#[test]
fn a_refused_value_is_refused_with_the_same_words_everywhere() {
    let server = Server::start(&[]);
    for (params, param) in [
        (json!({"temperature": 3, "top_k": 0, "top_p": 1, "min_p": 0}), "temperature"),
        (json!({"temperature": 0, "top_k": 0, "top_p": 1.5, "min_p": 0}), "top_p"),
        (json!({"temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0, "repeat_last_n": -5}), "repeat_last_n"),
    ] {
        let Err(host) = parse_request("chat", &with_messages(&params).to_string()) else {
            panic!("the host accepted {params}")
        };
        let host = host.to_string();
        let response = post(&server.addr, "/v1/chat/completions", &with_messages(&params));
        assert_eq!(response.status, 400);
        let error = &response.json()["error"];
        assert_eq!(error["param"], param, "{params}");
        assert_eq!(error["message"].as_str(), Some(host.as_str()), "server vs browser host: {params}");
        let Err(cli) = run_cli(&params) else { panic!("hearth run accepted {params}") };
        assert!(cli.contains(&host), "hearth run: {cli} (expected {host})");
    }
}
