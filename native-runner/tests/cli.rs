//! The `hearth` binary end to end: greedy `run --json` against llama.cpp's tokens (tests/fixtures/golden),
//! and clear errors (non-zero exit, a message naming the problem) for bad input.
//! The named models must be in the cache (`hearth models fetch all`, done by .ci/run).

use std::path::PathBuf;
use std::process::{Command, Output};

fn hearth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth")).args(args).output().expect("spawn hearth")
}

fn golden_case(model_file: &str, id: &str) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/golden").join(model_file);
    let golden: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).expect("golden")).expect("json");
    golden["cases"].as_array().expect("cases").iter().find(|c| c["id"] == id).expect("case").clone()
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id")).collect()
}

fn run_json(args: &[&str]) -> serde_json::Value {
    let out = hearth(args);
    assert!(out.status.success(), "hearth {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// Steps before llama.cpp's top-1/top-2 margin first drops below `margin` nats: up to there greedy
/// decoding must reproduce its tokens (tests/support/golden.rs explains the tolerance).
fn decisive_prefix(case: &serde_json::Value, margin: f64) -> usize {
    let steps = case["top5_logprobs_per_step"].as_array().expect("steps");
    steps
        .iter()
        .take(32)
        .take_while(|s| {
            let top = s["top"].as_array().expect("top");
            top[0]["logprob"].as_f64().expect("lp") - top[1]["logprob"].as_f64().expect("lp") >= margin
        })
        .count()
}

#[test]
fn run_plain_prompt_matches_llama_cpp_gemma() {
    let case = golden_case("gemma-3-270m-q4_k_m.json", "b");
    let prompt = case["prompt"].as_str().expect("prompt");
    let out =
        run_json(&["run", "-m", "gemma-3-270m", "-p", prompt, "-n", "32", "--temperature", "0", "--json", "--quiet"]);
    assert_eq!(ids(&out["prompt_tokens"]), ids(&case["prompt_token_ids"]), "prompt tokenization");
    let n = decisive_prefix(&case, 0.25);
    assert!(n >= 8, "fixture has only {n} decisive steps");
    assert_eq!(ids(&out["tokens"])[..n], ids(&case["generated_token_ids"])[..n]);
    assert_eq!(ids(&out["tokens"]).len(), 32);
    assert!(out["decode_tok_s"].as_f64().expect("decode_tok_s") > 0.0);
    assert!(out["ttft_ms"].as_f64().expect("ttft_ms") > 0.0);
    assert!(out["prefill_tok_s"].as_f64().expect("prefill_tok_s") > 0.0);
    let text = out["text"].as_str().expect("text");
    assert!(!text.is_empty(), "no text streamed");
}

#[test]
fn run_chat_matches_llama_cpp_qwen() {
    let case = golden_case("qwen2.5-coder-0.5b-instruct-q4_k_m.json", "d");
    let out = run_json(&[
        "run",
        "-m",
        "qwen2.5-coder-0.5b",
        "--chat",
        "--system",
        "You are a helpful assistant.",
        "-p",
        "Write a Python function that reverses a string.",
        "-n",
        "32",
        "--temperature",
        "0",
        "--json",
        "--quiet",
    ]);
    assert_eq!(ids(&out["prompt_tokens"]), ids(&case["prompt_token_ids"]), "chat template + tokenization");
    let n = decisive_prefix(&case, 0.25);
    assert!(n >= 16, "fixture has only {n} decisive steps");
    assert_eq!(ids(&out["tokens"])[..n], ids(&case["generated_token_ids"])[..n]);
}

/// With `--numerics llama-cpp` the CPU backend computes llama.cpp's logits bit for bit, so greedy
/// decoding gives all of its 32 tokens, past the near-tie where our own arithmetic parts (Gemma's
/// case c, at step 18, on a 0.06-nat margin).
#[test]
fn run_with_llama_cpp_numerics_gives_all_of_its_tokens() {
    let case = golden_case("gemma-3-270m-q4_k_m.json", "c");
    let prompt = case["prompt"].as_str().expect("prompt");
    let out = run_json(&[
        "run",
        "-m",
        "gemma-3-270m",
        "-p",
        prompt,
        "-n",
        "32",
        "--temperature",
        "0",
        "--numerics",
        "llama-cpp",
        "--json",
        "--quiet",
    ]);
    assert_eq!(ids(&out["prompt_tokens"]), ids(&case["prompt_token_ids"]), "prompt tokenization");
    assert_eq!(ids(&out["tokens"]), ids(&case["generated_token_ids"])[..32]);
}

#[test]
fn same_seed_same_tokens() {
    let args = [
        "run",
        "-m",
        "gemma-3-270m",
        "-p",
        "Once upon a time",
        "-n",
        "12",
        "--seed",
        "7",
        "--temperature",
        "1.0",
        "--json",
        "--quiet",
    ];
    let (a, b) = (run_json(&args), run_json(&args));
    assert_eq!(a["tokens"], b["tokens"]);
    assert_eq!(a["seed"], 7);
}

/// A speculating run measures the pass costs its policy starts from once and keeps them in the
/// cache: the next run with the same models and settings reads them instead (same tokens).
#[test]
fn pass_costs_are_measured_once_and_kept() {
    let cache = std::env::temp_dir().join(format!("hearth-pass-costs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let model = hearth_tests::model_path(hearth_tests::QWEN_05B);
    let model = model.to_str().expect("utf-8 path");
    let args = ["run", "-m", model, "-p", "def add(a, b):", "-n", "8", "--temperature", "0", "--lookup", "--json"];
    let run = || {
        let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(args)
            .env("HEARTH_CACHE_DIR", &cache)
            .output()
            .expect("spawn hearth");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        (json["tokens"].clone(), stderr.contains("verification pass ms by rows"))
    };
    let (first, measured) = run();
    assert!(measured, "the first run measures");
    let kept: Vec<_> = std::fs::read_dir(cache.join("pass-costs")).expect("kept costs").collect();
    assert_eq!(kept.len(), 1);
    let (second, measured_again) = run();
    assert!(!measured_again, "the second run reads them");
    assert_eq!(first, second);
    let _ = std::fs::remove_dir_all(&cache);
}

/// `--lookup --draft-model`: prompt lookup where the output copies the prompt, the draft model
/// elsewhere; greedy gives plain greedy's tokens, and the JSON report counts the lookup's share.
#[test]
fn lookup_then_draft_model_gives_the_greedy_tokens() {
    let prompt = "Rewrite this function with type hints:\ndef add(first, second):\n    total = first + second\n    return total\n";
    let base = [
        "run",
        "-m",
        "qwen2.5-coder-0.5b",
        "--chat",
        "-p",
        prompt,
        "-n",
        "40",
        "--temperature",
        "0",
        "--ignore-eos",
        "--json",
        "--quiet",
    ];
    let plain = run_json(&base);
    // The 0.5B drafting for itself (same vocabulary), whole-length drafts verified every step.
    let both: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--lookup", "--draft-model", "qwen2.5-coder-0.5b", "--draft-tokens", "3", "--fixed-draft-length"])
        .collect();
    let spec = run_json(&both);
    assert_eq!(spec["tokens"], plain["tokens"], "{}\nvs\n{}", spec["text"], plain["text"]);
    let m = &spec["speculative"];
    let (passes, free_passes) =
        (m["target_forward_passes"].as_u64().unwrap_or(0), m["free_passes"].as_u64().unwrap_or(0));
    assert!(free_passes > 0 && free_passes < passes, "both drafters should have drafted: {m}");
    assert_fails_with(
        &["run", "-m", "qwen2.5-coder-0.5b", "-p", "hi", "--draft-model", "gemma-3-270m", "--quiet"],
        "cannot draft",
    );
    // Flags that would be ignored are errors that say what is missing.
    assert_fails_with(
        &["run", "-m", "qwen2.5-coder-0.5b", "-p", "hi", "--lookup", "--draft-vocab", "100", "--quiet"],
        "--draft-vocab sets up the draft model",
    );
    assert_fails_with(
        &["run", "-m", "qwen2.5-coder-0.5b", "-p", "hi", "--draft-min-p", "0.5", "--quiet"],
        "add --draft-model",
    );
    assert_fails_with(
        &["run", "-m", "qwen2.5-coder-0.5b", "-p", "hi", "--draft-tokens", "4", "--quiet"],
        "add --draft-model MODEL or --lookup",
    );
    assert_fails_with(
        &[
            "run",
            "-m",
            "qwen2.5-coder-0.5b",
            "-p",
            "hi",
            "--draft-model",
            "qwen2.5-coder-0.5b",
            "--draft-min-p",
            "1.5",
            "--quiet",
        ],
        "not a probability",
    );
}

fn assert_fails_with(args: &[&str], needle: &str) {
    let out = hearth(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "hearth {args:?} should fail");
    assert!(stderr.contains(needle), "hearth {args:?}: expected {needle:?} in: {stderr}");
    assert!(!stderr.contains("panicked"), "hearth {args:?} panicked: {stderr}");
}

#[test]
fn bad_input_gives_clear_errors() {
    let dir = std::env::temp_dir().join(format!("hearth-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let not_gguf = dir.join("not-a-model.gguf");
    std::fs::write(&not_gguf, b"definitely not a gguf file").expect("write");
    let truncated = dir.join("truncated.gguf");
    std::fs::write(&truncated, b"GGUF\x03\x00\x00\x00\x01").expect("write");
    let p = |x: &PathBuf| x.to_string_lossy().into_owned();

    assert_fails_with(&["run", "-m", &p(&not_gguf), "-p", "hi", "--quiet"], "not a GGUF file");
    assert_fails_with(&["run", "-m", &p(&truncated), "-p", "hi", "--quiet"], "truncated");
    assert_fails_with(&["run", "-m", "no-such-model", "-p", "hi", "--quiet"], "no-such-model");
    assert_fails_with(&["run", "-m", "gemma-3-270m", "-p", "hi", "--backend", "tpu", "--quiet"], "unknown backend");
    assert_fails_with(&["run", "-m", "gemma-3-270m", "-p", "hi", "--numerics", "exact", "--quiet"], "unknown numerics");
    assert_fails_with(
        &["run", "-m", "gemma-3-270m", "-p", "hi", "--numerics", "llama-cpp", "--backend", "wgpu", "--quiet"],
        "CPU backend",
    );
    assert_fails_with(
        &["run", "-m", "gemma-3-270m", "-p", "hi", "--moe-offload", "--backend", "cpu", "--quiet"],
        "--moe-offload keeps the experts on the CPU beside a GPU backend",
    );
    let long_prompt = "word ".repeat(200);
    assert_fails_with(&["run", "-m", "gemma-3-270m", "-c", "64", "-p", &long_prompt, "--quiet"], "context overflow");
    assert_fails_with(&["run", "-m", "gemma-3-270m", "-p", "hi", "--top-p", "2", "--quiet"], "invalid request");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `hearth chat` with `args`, the turns of `input` written to its stdin: (stdout, stderr).
fn chat(args: &[&str], input: &str) -> (String, String) {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hearth chat");
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write turns");
    let out = child.wait_with_output().expect("chat output");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "hearth chat {args:?} failed: {stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

/// Two turns through `hearth chat` on stdin: both get answers, and the second turn reuses the KV
/// cache of the first (only the new turn's tokens are evaluated).
#[test]
fn chat_keeps_the_kv_cache_between_turns() {
    let (stdout, stderr) = chat(
        &["-m", "qwen2.5-coder-0.5b", "-n", "8", "--temperature", "0", "--quiet"],
        "What is 2+2?\nAnd 3+3?\n/exit\n",
    );
    let stats: Vec<(usize, usize)> = stderr
        .lines()
        .filter_map(|l| {
            let rest = l.trim_start_matches("> ").strip_prefix('[')?;
            let (new, rest) = rest.split_once(" new prompt tokens (")?;
            let (cached, _) = rest.split_once(" cached")?;
            Some((new.parse().ok()?, cached.parse().ok()?))
        })
        .collect();
    assert_eq!(stats.len(), 2, "expected two turn summaries in: {stderr}");
    assert_eq!(stats[0].1, 0, "nothing is cached before the first turn");
    assert!(stats[1].1 >= stats[0].0, "second turn should reuse the first turn's tokens: {stats:?}");
    assert!(!stdout.trim().is_empty(), "no answer text");
}

/// `hearth chat --lookup` and `--lookup --draft-model`: greedy answers equal plain greedy's turn
/// after turn, and each turn reports what speculation did; the second turn edits the first
/// answer's code, which prompt lookup copies from the conversation.
#[test]
fn chat_with_speculative_decoding_gives_the_greedy_answers() {
    let base = ["-m", "qwen2.5-coder-0.5b", "-n", "48", "--temperature", "0", "--quiet"];
    let turns = "Write a Python function that returns the sum of a list of numbers.\nNow rename the function to total.\n/exit\n";
    let (plain, _) = chat(&base, turns);
    let speculative_summaries = |stderr: &str| stderr.lines().filter(|l| l.contains("[speculative: ")).count();
    for extra in [&["--lookup"][..], &["--lookup", "--draft-model", "qwen2.5-coder-0.5b", "--draft-tokens", "3"][..]] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let (stdout, stderr) = chat(&args, turns);
        assert_eq!(stdout, plain, "hearth chat {extra:?} changed the greedy answers");
        assert_eq!(speculative_summaries(&stderr), 2, "one speculative summary per turn expected in: {stderr}");
        let accepted: usize = stderr
            .lines()
            .filter_map(|l| l.split("[speculative: ").nth(1)?.split(' ').next()?.parse::<usize>().ok())
            .sum();
        assert!(accepted > 0, "no draft token was accepted over two turns: {stderr}");
    }
    assert_fails_with(
        &["chat", "-m", "qwen2.5-coder-0.5b", "--draft-tokens", "4", "--quiet"],
        "add --draft-model MODEL or --lookup",
    );
}

/// `run --messages FILE` continues a conversation: one user message renders as `--chat -p` does
/// (same prompt tokens, same greedy answer); a follow-up turn after an assistant answer is
/// rendered with the earlier turns; a bad file is a clear error before the model loads.
#[test]
fn run_continues_a_conversation_from_a_messages_file() {
    let dir = std::env::temp_dir().join(format!("hearth-cli-messages-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path.to_string_lossy().into_owned()
    };
    let question = "Write a Python function that adds two numbers.";
    let one_turn = write("one.json", &serde_json::json!([{ "role": "user", "content": question }]).to_string());
    let base = ["run", "-m", "qwen2.5-coder-0.5b", "-n", "12", "--temperature", "0", "--json", "--quiet"];
    let run_with = |extra: &[&str]| run_json(&base.iter().chain(extra).copied().collect::<Vec<&str>>());
    let from_file = run_with(&["--messages", &one_turn, "--system", "Be brief."]);
    let from_flag = run_with(&["--chat", "-p", question, "--system", "Be brief."]);
    assert_eq!(from_file["prompt_tokens"], from_flag["prompt_tokens"]);
    assert_eq!(from_file["tokens"], from_flag["tokens"]);
    // `--messages -`: the same conversation from stdin.
    let from_stdin = {
        use std::io::Write;
        use std::process::Stdio;
        let args: Vec<&str> = base.iter().copied().chain(["--messages", "-", "--system", "Be brief."]).collect();
        let mut child = Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn");
        child.stdin.take().expect("stdin").write_all(&std::fs::read(&one_turn).expect("read")).expect("write");
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "hearth run --messages - failed");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("json")
    };
    assert_eq!(from_stdin["tokens"], from_flag["tokens"]);

    let answer = from_flag["text"].as_str().expect("text");
    let follow_up = serde_json::json!([
        { "role": "user", "content": question },
        { "role": "assistant", "content": answer },
        { "role": "user", "content": "Now name it plus." },
    ]);
    let two_turns = write("two.json", &follow_up.to_string());
    let second = run_with(&["--messages", &two_turns]);
    let second_prompt = ids(&second["prompt_tokens"]);
    let first_prompt = ids(&from_flag["prompt_tokens"]);
    assert!(
        second_prompt.len() > first_prompt.len() + 10,
        "the follow-up prompt should hold the first turn and its answer"
    );
    assert!(!second["tokens"].as_array().expect("tokens").is_empty());

    let bad = |name: &str, text: &str, needle: &str| {
        assert_fails_with(&["run", "--messages", &write(name, text), "--quiet"], needle)
    };
    bad("not-json.json", "not json", "is not JSON");
    bad("object.json", r#"{"role": "user"}"#, "must hold a JSON array");
    bad("empty.json", "[]", "holds no messages");
    bad("no-role.json", r#"[{"content": "hi"}]"#, "has no \"role\"");
    let system = write("system.json", r#"[{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]"#);
    assert_fails_with(&["run", "--messages", &system, "--system", "c", "--quiet"], "keep one");
    assert_fails_with(&["run", "--messages", &one_turn, "-p", "hi", "--quiet"], "cannot be used with");
    assert_fails_with(&["run", "-m", "gemma-3-270m", "--messages", &one_turn, "--quiet"], "no chat template");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Output piped into a reader that closes early (`hearth run … | head`) ends hearth quietly
/// instead of a panic in `println!`.
#[test]
fn a_closed_stdout_ends_run_without_a_panic() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args([
            "run",
            "-m",
            "gemma-3-270m",
            "-p",
            "Once upon a time",
            "-n",
            "8",
            "--temperature",
            "0",
            "--json",
            "--quiet",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hearth run");
    // The reader goes away before anything is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "hearth panicked on a closed stdout: {stderr}");
}

/// `--moe-offload` on WebGPU (lavapipe in CI): the experts computed on the CPU, the rest on the
/// device, gives the CPU backend's greedy tokens on synthetic mixtures of experts with long and
/// short steps.
#[test]
fn moe_offload_gives_the_cpus_greedy_tokens() {
    for stem in ["qwen3moe-q8_0", "deepseek2-f32", "gpt-oss-mxfp4"] {
        let model = format!("{}/../tests/fixtures/synthetic/{stem}.gguf", env!("CARGO_MANIFEST_DIR"));
        let prompt = "a prompt of more than sixteen tokens, so that its experts run as one long step";
        let common = ["run", "-m", &model, "-p", prompt, "-n", "8", "--temperature", "0", "--json", "--quiet"];
        let cpu = run_json(&[&common[..], &["--backend", "cpu"]].concat());
        let offload = run_json(&[&common[..], &["--backend", "wgpu", "--moe-offload"]].concat());
        assert_eq!(offload["backend"], "wgpu+cpu experts", "{stem}");
        let variant = offload["backend_variant"].as_str().unwrap_or_default();
        assert!(
            variant.contains(" MB on the device, ") && variant.ends_with(" MB of experts in host memory"),
            "{variant}"
        );
        assert_eq!(ids(&offload["tokens"]), ids(&cpu["tokens"]), "{stem}");
    }
}
