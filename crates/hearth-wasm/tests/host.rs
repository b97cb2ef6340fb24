//! Native tests of the platform-independent half of the bindings (`EngineHost`, request parsing):
//! the same code the browser runs, minus the JS value conversions.

use hearth_core::request::Prompt;
use hearth_cpu::CpuBackend;
use hearth_wasm::host::{EngineHost, HostEvent, OwnedBytes};
use hearth_wasm::request::{parse_prompt, parse_request, LoadOptions, RequestOptions};
use std::path::PathBuf;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn gemma_bytes() -> Vec<u8> {
    model_bytes("gemma-3-270m-q4_k_m.gguf")
}

fn model_bytes(name: &str) -> Vec<u8> {
    let dir = std::env::var("HEARTH_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|_| {
        PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cache/hearth/models")
    });
    let path = dir.join(name);
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `hearth models fetch all` or set HEARTH_MODELS_DIR)", path.display()))
}

fn load(bytes: Vec<u8>, options_json: &str) -> Result<EngineHost, String> {
    let options = LoadOptions::parse(options_json).map_err(|e| e.to_string())?;
    EngineHost::load(bytes, &options, Box::new(CpuBackend::new(Some(2)).unwrap()), &mut |_, _| {})
        .map_err(|e| e.to_string())
}

fn expected() -> serde_json::Value {
    let path = repo_root().join("tests/fixtures/browser/gemma_fibonacci_greedy.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn greedy_text_prompt_matches_the_native_runner_and_streams_the_same_text() {
    let expected = expected();
    let mut host = load(gemma_bytes(), r#"{"n_ctx": 512}"#).unwrap();
    let input = parse_prompt(r#""def fibonacci(n):""#).unwrap();
    let options = RequestOptions::parse(r#"{"temperature": 0, "max_tokens": 16}"#).unwrap();
    let mut streamed = String::new();
    let report = host
        .generate(&input, &options, 7, None, &mut |delta| {
            streamed.push_str(delta);
            true
        })
        .unwrap();
    assert_eq!(report.prompt_token_ids, ids(&expected["prompt_tokens"]));
    assert_eq!(report.token_ids, ids(&expected["tokens"]));
    assert_eq!(streamed, expected["text"].as_str().unwrap());
    assert_eq!(report.completion_tokens, 16);
    assert_eq!(serde_json::to_value(report.finish_reason).unwrap(), "length");
    assert!(report.ttft_ms > 0.0 && report.decode_tok_s > 0.0);
}

#[test]
fn chat_messages_use_the_template_and_the_callback_interrupts() {
    let input = parse_prompt(r#"[{"role": "user", "content": "Say hi."}]"#).unwrap();
    // The Gemma 270M GGUF carries no chat template: a clear error, not a guess.
    let gemma = load(gemma_bytes(), r#"{"n_ctx": 64}"#).unwrap();
    let no_template = gemma.tokenize(&input, Some(0)).err().unwrap().to_string();
    assert!(no_template.contains("no chat template"), "{no_template}");

    let mut host = load(model_bytes("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), r#"{"n_ctx": 512}"#).unwrap();
    let prompt = host.tokenize(&input, Some(0)).unwrap();
    // Qwen's template starts with <|im_start|>system (its default system prompt); no BOS token.
    assert_eq!(prompt[0], 151644);
    let text = host_text(&host, &prompt);
    assert!(text.contains("<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"), "{text}");
    let options = RequestOptions::parse(r#"{"temperature": 0, "max_tokens": 64, "ignore_eos": true}"#).unwrap();
    let mut chunks = 0;
    let report = host
        .generate(&input, &options, 0, Some(0), &mut |_| {
            chunks += 1;
            chunks < 3
        })
        .unwrap();
    assert_eq!(serde_json::to_value(report.finish_reason).unwrap(), "cancelled");
    assert_eq!(chunks, 3);
    assert!(report.completion_tokens < 64);
}

#[test]
fn bad_inputs_are_errors_with_clear_messages() {
    let not_gguf = load(b"this is not a model file at all".to_vec(), "").err().unwrap();
    assert!(not_gguf.contains("not a GGUF file"), "{not_gguf}");

    let truncated = load(gemma_bytes()[..100_000].to_vec(), "").err().unwrap();
    assert!(truncated.contains("truncated"), "{truncated}");

    let bad_load = load(Vec::new(), r#"{"n_ctxx": 5}"#).err().unwrap();
    assert!(bad_load.starts_with("invalid load options") && bad_load.contains("n_ctxx"), "{bad_load}");

    for (json, needle) in [
        (r#"{"temperature": -1}"#, "temperature"),
        (r#"{"top_p": 2}"#, "top_p"),
        (r#"{"max_tokens": 0}"#, "max_tokens"),
        (r#"{"temprature": 0.5}"#, "temprature"),
        (r#"{"stop": 5}"#, "stop"),
        ("{not json", "not valid JSON"),
        (r#"{"structured_outputs": {"regex": 5}}"#, "structured_outputs.regex must be a string"),
        (r#"{"messages": []}"#, "prompt argument"),
        (r#"{"echo": true}"#, "echo belongs to completions requests"),
        (r#"{"logprobs": 2}"#, "read by the request's kind"),
    ] {
        let message = RequestOptions::parse(json)
            .and_then(|o| o.generate_options(1, 16, 0).map(|_| ()))
            .err()
            .unwrap()
            .to_string();
        assert!(message.contains(needle), "{json}: {message}");
    }
    for (json, needle) in
        [("42", "a number"), ("[]", "at least one message"), (r#"[{"content": "x"}]"#, "role"), ("{", "not JSON")]
    {
        let message = parse_prompt(json).err().unwrap().to_string();
        assert!(message.contains(needle), "{json}: {message}");
    }
    // A whole request, as the JS API sends it: the endpoint's own prompt field is required.
    for (kind, json, needle) in [
        ("chat", r#"{"prompt": "x"}"#, "belongs to completions"),
        ("text", r#"{"messages": [{"role": "user", "content": "x"}]}"#, "belongs to chat"),
        ("text", r#"{"prompt": "x", "n": 17}"#, "n must be between 1 and 16"),
        ("chat", r#"{"messages": [{"role": "user", "content": "x"}], "echo": true}"#, "echo belongs to completions"),
        ("json", r#"{"prompt": "x"}"#, "'chat' or 'text'"),
    ] {
        let message = parse_request(kind, json).err().unwrap().to_string();
        assert!(message.contains(needle), "{kind} {json}: {message}");
    }
    let (prompt, options) = parse_request("chat", r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "temperature": 0, "max_tokens": 3}"#).unwrap();
    assert_eq!(prompt, Prompt::Chat(vec![serde_json::json!({"role": "user", "content": "hi"})]));
    assert_eq!(options.generate_options(1, 16, 0).unwrap().max_tokens, 3);
    // As on the server: no limit is the rest of the context, a limit past it an overflow.
    let unlimited = RequestOptions::parse(r#"{"temperature": 0}"#).unwrap();
    assert_eq!(unlimited.generate_options(10, 16, 0).unwrap().max_tokens, 6);
    let message = options.generate_options(14, 16, 0).err().unwrap().to_string();
    assert!(message.contains("context"), "{message}");
}

#[test]
fn unknown_architecture_and_context_overflow_are_reported() {
    // A committed synthetic llama model with general.architecture rewritten to an unknown name
    // of the same length ("llama" → "xlama").
    let mut bytes = std::fs::read(repo_root().join("tests/fixtures/synthetic/llama-gqa-q8_0.gguf")).unwrap();
    let key = b"general.architecture";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    // value: u32 type (8 = string), u64 length, bytes
    let value = at + 4 + 8;
    assert_eq!(&bytes[value..value + 5], b"llama");
    bytes[value] = b'x';
    let unknown = load(bytes, "").err().unwrap();
    assert!(unknown.contains("unsupported architecture 'xlama'"), "{unknown}");

    let mut host = load(gemma_bytes(), r#"{"n_ctx": 8}"#).unwrap();
    let long = Prompt::Text("one two three four five six seven eight nine ten".into());
    let overflow = host.generate(&long, &RequestOptions::default(), 0, None, &mut |_| true).err().unwrap().to_string();
    assert!(overflow.contains("context overflow"), "{overflow}");
}

fn host_text(host: &EngineHost, ids: &[u32]) -> String {
    host.decode(ids)
}

/// `WasmError::code` is what JS sees as `HearthError.code`: corrupt files, unsupported models,
/// bad options and context overflow each get their stable code.
#[test]
fn errors_carry_stable_codes_for_js() {
    let code_of_load = |bytes: Vec<u8>, options_json: &str| {
        let options = LoadOptions::parse(options_json)?;
        EngineHost::load(bytes, &options, Box::new(CpuBackend::new(Some(2)).unwrap()), &mut |_, _| {}).map(|_| ())
    };
    assert_eq!(code_of_load(b"not a model".to_vec(), "").unwrap_err().code(), "invalid-model");
    assert_eq!(code_of_load(gemma_bytes()[..100_000].to_vec(), "").unwrap_err().code(), "invalid-model");
    assert_eq!(code_of_load(Vec::new(), r#"{"n_ctxx": 5}"#).unwrap_err().code(), "bad-argument");

    let mut bytes = std::fs::read(repo_root().join("tests/fixtures/synthetic/llama-gqa-q8_0.gguf")).unwrap();
    let key = b"general.architecture";
    let value = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4 + 8;
    bytes[value] = b'x';
    assert_eq!(code_of_load(bytes, "").unwrap_err().code(), "unsupported-model");

    assert_eq!(RequestOptions::parse(r#"{"temperature": -1}"#).unwrap_err().code(), "bad-argument");

    let mut host = EngineHost::load(
        gemma_bytes(),
        &LoadOptions::parse(r#"{"n_ctx": 8}"#).unwrap(),
        Box::new(CpuBackend::new(Some(2)).unwrap()),
        &mut |_, _| {},
    )
    .unwrap();
    let long = Prompt::Text("one two three four five six seven eight nine ten".into());
    let overflow = host.generate(&long, &RequestOptions::default(), 0, None, &mut |_| true).unwrap_err();
    assert_eq!(overflow.code(), "context-overflow");
}

const BATCH_PROMPTS: [&str; 3] =
    ["def fibonacci(n):", "The capital of France is", "Here is a list of prime numbers: 2, 3, 5, 7, 11,"];

/// Steps every queued request to its end; reports by request id.
fn run_batch(host: &mut EngineHost) -> std::collections::HashMap<u64, hearth_wasm::host::Report> {
    let mut reports = std::collections::HashMap::new();
    while !host.is_idle() {
        let mut on_event = |event| {
            if let HostEvent::Finished { id, report } = event {
                reports.insert(id, *report);
            }
        };
        hearth_core::block_on::block_on(async { Ok(host.step_async(&mut on_event).await) }).unwrap().unwrap();
    }
    reports
}

/// What the browser engine does with concurrent calls: one batch, each request's greedy tokens
/// as when it runs alone (the first prompt's: the native runner's fixture).
#[test]
fn concurrent_requests_run_as_one_batch_with_their_solo_tokens() {
    let expected = expected();
    let mut host = load(gemma_bytes(), r#"{"n_ctx": 512}"#).unwrap();
    let options = RequestOptions::parse(r#"{"temperature": 0, "max_tokens": 10}"#).unwrap();
    let input = |p: &str| Prompt::Text(p.to_string());
    let solo: Vec<Vec<u32>> = BATCH_PROMPTS
        .iter()
        .map(|p| host.generate(&input(p), &options, 0, None, &mut |_| true).unwrap().token_ids)
        .collect();
    assert_eq!(solo[0], ids(&expected["tokens"])[..10]);
    assert_eq!(host.batch_stats().max_batch_observed, 1);
    let request_ids: Vec<u64> =
        BATCH_PROMPTS.iter().map(|p| host.submit(&input(p), &options, 0, None).unwrap()[0]).collect();
    // One more, cancelled at once: its blocks must come back.
    let cancelled = host.submit(&input("A long story about a dragon:"), &options, 0, None).unwrap()[0];
    let mut reports = std::collections::HashMap::new();
    let mut on_event = |event| {
        if let HostEvent::Finished { id, report } = event {
            reports.insert(id, *report);
        }
    };
    hearth_core::block_on::block_on(async { Ok(host.step_async(&mut on_event).await) }).unwrap().unwrap();
    let report = host.cancel(cancelled).unwrap();
    assert_eq!(serde_json::to_value(report.finish_reason).unwrap(), "cancelled");
    reports.extend(run_batch(&mut host));
    for (i, id) in request_ids.iter().enumerate() {
        assert_eq!(reports[id].token_ids, solo[i], "prompt {i}");
    }
    let stats = host.batch_stats();
    assert!(stats.max_batch_observed >= 3, "{stats:?}");
    assert_eq!((stats.running, stats.waiting, stats.kv_blocks_used), (0, 0, 0), "{stats:?}");
}

/// `speculative` requests: prompt lookup and a draft model keep the greedy output; a draft model
/// of another vocabulary is refused with `bad-argument`.
#[test]
fn speculative_requests_keep_the_greedy_output() {
    let mut host = load(gemma_bytes(), r#"{"n_ctx": 512}"#).unwrap();
    let input = Prompt::Text("red green blue red green blue red green blue red green blue red".into());
    let plain = RequestOptions::parse(r#"{"temperature": 0, "max_tokens": 16, "ignore_eos": true}"#).unwrap();
    let reference = host.generate(&input, &plain, 0, None, &mut |_| true).unwrap();
    assert!(reference.speculative.is_none());
    // Fixed lengths, so that drafts are verified whatever this machine's pass costs.
    let lookup = RequestOptions::parse(r#"{"temperature": 0, "max_tokens": 16, "ignore_eos": true, "speculative": {"mode": "lookup", "draft_tokens": 4, "fixed_length": true}}"#).unwrap();
    let report = host.generate(&input, &lookup, 0, None, &mut |_| true).unwrap();
    assert_eq!(report.token_ids, reference.token_ids);
    let metrics = report.speculative.unwrap();
    assert!(metrics.accepted > 0 && metrics.target_forward_passes < report.completion_tokens - 1, "{metrics:?}");
    // The default, cost-driven lengths: whatever they choose, the greedy output stays.
    let adaptive = RequestOptions::parse(r#"{"temperature": 0, "max_tokens": 16, "ignore_eos": true, "speculative": {"mode": "lookup", "draft_tokens": 4}}"#).unwrap();
    assert_eq!(host.generate(&input, &adaptive, 0, None, &mut |_| true).unwrap().token_ids, reference.token_ids);
    let bad = RequestOptions::parse(r#"{"speculative": {"mode": "lookup", "fixed_length": 3}}"#).unwrap_err();
    assert_eq!(bad.code(), "bad-argument", "{bad}");

    let draft = RequestOptions::parse(r#"{"temperature": 0, "max_tokens": 16, "ignore_eos": true, "speculative": {"mode": "draft-model", "fixed_length": true}}"#).unwrap();
    let no_draft = host.generate(&input, &draft, 0, None, &mut |_| true).unwrap_err();
    assert_eq!(no_draft.code(), "bad-argument");

    let synthetic = std::fs::read(repo_root().join("tests/fixtures/synthetic/llama-gqa-q8_0.gguf")).unwrap();
    let cpu = || Box::new(CpuBackend::new(Some(2)).unwrap());
    let mismatch = host.load_draft(std::sync::Arc::new(OwnedBytes(synthetic)), cpu(), &mut |_, _| {}).unwrap_err();
    assert_eq!(mismatch.code(), "bad-argument");
    assert!(mismatch.to_string().contains("cannot draft for this model"), "{mismatch}");

    host.load_draft(std::sync::Arc::new(OwnedBytes(gemma_bytes())), cpu(), &mut |_, _| {}).unwrap();
    assert_eq!(host.draft_backend().map(|(name, bytes)| (name, bytes > 0)), Some(("cpu".to_string(), true)));
    let report = host.generate(&input, &draft, 0, None, &mut |_| true).unwrap();
    assert_eq!(report.token_ids, reference.token_ids);
    assert!(report.speculative.unwrap().accepted > 0);
    // Prompt lookup first, the draft model where nothing matches.
    let both = RequestOptions::parse(r#"{"temperature": 0, "max_tokens": 16, "ignore_eos": true, "speculative": {"mode": "draft-model", "lookup": true, "draft_tokens": 3, "fixed_length": true}}"#).unwrap();
    let report = host.generate(&input, &both, 0, None, &mut |_| true).unwrap();
    assert_eq!(report.token_ids, reference.token_ids);
    let metrics = report.speculative.unwrap();
    assert!(metrics.accepted > 0 && metrics.free_proposed <= metrics.proposed, "{metrics:?}");
    // draft_min_p 0 (with a fixed length) drafts the full length whatever the draft's confidence;
    // out of [0, 1] is refused.
    let full = RequestOptions::parse(r#"{"temperature": 0, "max_tokens": 16, "ignore_eos": true, "speculative": {"mode": "draft-model", "draft_tokens": 3, "draft_min_p": 0, "fixed_length": true}}"#).unwrap();
    let report = host.generate(&input, &full, 0, None, &mut |_| true).unwrap();
    assert_eq!(report.token_ids, reference.token_ids);
    let metrics = report.speculative.unwrap();
    // Every step proposes (a last step with one token left has no budget for a draft).
    assert!(metrics.proposed + 1 >= metrics.target_forward_passes && metrics.accepted > 0, "{metrics:?}");
    // Refused when parsed, before it reaches the engine.
    let error = RequestOptions::parse(
        r#"{"temperature": 0, "max_tokens": 4, "speculative": {"mode": "draft-model", "draft_min_p": 1.5}}"#,
    )
    .unwrap_err();
    assert_eq!(error.code(), "bad-argument");
    assert!(error.to_string().contains("draft_min_p"), "{error}");

    // Every speculative kind batches with plain requests: all in one pass, each with its greedy
    // tokens and its own drafts.
    let ids: Vec<u64> =
        [&plain, &lookup, &draft, &full, &both].iter().map(|o| host.submit(&input, o, 0, None).unwrap()[0]).collect();
    let reports = run_batch(&mut host);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(reports[id].token_ids, reference.token_ids, "request {i} in the batch");
    }
    assert!(reports[&ids[0]].speculative.is_none());
    for id in &ids[1..] {
        assert!(reports[id].speculative.as_ref().is_some_and(|m| m.accepted > 0), "{:?}", reports[id].speculative);
    }
    // Each request drafts within its own bounds, not those of an earlier request's policy: `full`
    // (3 a step, every step) after `draft` (up to 5).
    let full_metrics = reports[&ids[3]].speculative.as_ref().expect("metrics");
    assert!(full_metrics.proposed <= 3 * full_metrics.target_forward_passes, "{full_metrics:?}");
    assert!(full_metrics.proposed + 1 >= full_metrics.target_forward_passes, "{full_metrics:?}");
    assert!(host.batch_stats().max_batch_observed >= 4, "{:?}", host.batch_stats());
    // Lookup-then-draft in the batch still drafts from both sources within its bounds.
    let both_metrics = reports[&ids[4]].speculative.as_ref().expect("metrics");
    assert!(both_metrics.free_proposed <= both_metrics.proposed, "{both_metrics:?}");
}
