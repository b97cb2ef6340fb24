//! The official JSON-Schema-Test-Suite (draft 2020-12, tests/fixtures/json-schema-test-suite) through
//! structured output's grammar on Qwen's real vocabulary: for every schema the compiler accepts
//! (strict: a keyword it cannot enforce refuses the schema), each instance is tokenized as the model
//! would write it and must be accepted whole when valid and rejected when invalid.
//!
//! llguidance enforces most of the suite but not all of it (properties in the schema's order, some
//! `oneOf`/`not` cases are approximations); the cases where it differs are listed in
//! `expected.json` beside the data, and this test fails when a case that passed stops passing, or a
//! schema that compiled is refused. `HEARTH_UPDATE_SCHEMA_BASELINE=1` rewrites the list (review the
//! diff: a case leaving the list is an improvement).

use hearth_core::constraint::{Activation, Grammar, GrammarCompiler, GrammarRequest, GrammarState};
use hearth_core::gguf::GgufFile;
use hearth_core::tokenizer::Tokenizer;
use hearth_tests::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;

#[test]
fn json_schema_test_suite_cases_are_accepted_or_rejected_as_specified() {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open Qwen 0.5B");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let compiler = GrammarCompiler::new(&tokenizer, tokenizer.vocab_size()).expect("compiler");
    let dir = fixtures_dir().join("json-schema-test-suite");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("suite directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json") && n != "expected.json")
        .collect();
    names.sort();
    assert!(names.len() >= 30, "suite files: {names:?}");

    // "file / group / case" (or "file / group" for a refused schema) → what happened instead of a pass.
    let mut outcomes: BTreeMap<String, String> = BTreeMap::new();
    let (mut groups, mut compiled, mut cases, mut passed) = (0, 0, 0, 0);
    for name in &names {
        let text = std::fs::read_to_string(dir.join(name)).expect("suite file");
        let suite: Vec<Value> = serde_json::from_str(&text).expect("suite JSON");
        for group in suite {
            groups += 1;
            let label = format!("{name} / {}", group["description"].as_str().expect("description"));
            // (Remote references need the suite's HTTP server: not a local-engine case.)
            if group["schema"].to_string().contains("localhost:1234") {
                continue;
            }
            let request = GrammarRequest {
                grammar: Grammar::JsonSchema { schema: group["schema"].clone(), strict: true },
                param: "response_format",
                activation: Activation::Always,
            };
            let grammar = match compiler.compile(&request) {
                Ok(grammar) => grammar,
                Err(_) => {
                    outcomes.insert(label, "refused".into());
                    continue;
                }
            };
            compiled += 1;
            for case in group["tests"].as_array().expect("tests") {
                cases += 1;
                let valid = case["valid"].as_bool().expect("valid");
                let instance = serde_json::to_string(&case["data"]).expect("instance");
                let tokens = tokenizer.encode(&instance, false, false).expect("encode");
                let accepted = GrammarState::new(&grammar, 0.0).accepts(&tokens);
                if accepted == valid {
                    passed += 1;
                } else {
                    let what = if valid { "valid instance rejected" } else { "invalid instance accepted" };
                    outcomes.insert(
                        format!("{label} / {}", case["description"].as_str().expect("description")),
                        what.into(),
                    );
                }
            }
        }
    }
    eprintln!(
        "JSON-Schema-Test-Suite draft 2020-12: {compiled} of {groups} schemas compiled; {passed} of their {cases} cases as specified"
    );

    let expected_path = dir.join("expected.json");
    if std::env::var_os("HEARTH_UPDATE_SCHEMA_BASELINE").is_some() {
        let summary = json!({"schemas": groups, "compiled": compiled, "cases": cases, "passed": passed});
        let baseline = json!({"summary": summary, "differences": outcomes});
        std::fs::write(&expected_path, serde_json::to_string_pretty(&baseline).expect("JSON") + "\n")
            .expect("write baseline");
        return;
    }
    let baseline = read_json("json-schema-test-suite/expected.json");
    let known: BTreeMap<String, String> =
        serde_json::from_value(baseline["differences"].clone()).expect("differences map");
    let regressions: Vec<String> = outcomes
        .iter()
        .filter(|(case, what)| known.get(*case) != Some(what))
        .map(|(case, what)| format!("{case}: {what}"))
        .collect();
    assert!(regressions.is_empty(), "cases that no longer pass:\n{}", regressions.join("\n"));
    let improved: Vec<&String> = known.keys().filter(|case| !outcomes.contains_key(*case)).collect();
    if !improved.is_empty() {
        eprintln!("now as specified (update the baseline): {improved:?}");
    }
}
