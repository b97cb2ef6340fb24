use super::*;
use serde_json::json;

fn request(body: Value) -> Result<Request, CoreError> {
    Request::from_json(body.to_string().as_bytes())
}

fn chat(extra: Value) -> Result<ValidGeneration, CoreError> {
    let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
    body.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
    Ok(request(body)?.validate(Endpoint::Chat, 7)?.generation)
}

/// The parameter a refusal names.
fn refused<T>(result: Result<T, CoreError>) -> (Option<String>, String) {
    match result {
        Err(CoreError::BadRequest { param, message }) => (param, message),
        Err(other) => panic!("expected BadRequest, got {other}"),
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn defaults_are_openai_s() {
    let r = chat(json!({})).expect("valid");
    let s = &r.options.sampling;
    assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p), (1.0, 1.0, 0, 0.0));
    assert_eq!((s.repeat_penalty, s.presence_penalty, s.frequency_penalty), (1.0, 0.0, 0.0));
    assert_eq!(s.repeat_last_n, usize::MAX, "penalties see the whole history");
    assert_eq!(s.seed, 7, "the default seed");
    assert_eq!((r.max_tokens, r.stream, r.include_usage, r.options.ignore_eos), (None, false, false, false));
    assert!(r.options.stop.is_empty() && r.prediction.is_none() && r.speculative.is_none());
}

#[test]
fn every_sampling_parameter_reaches_the_options() {
    let r = chat(json!({
        "max_completion_tokens": 9, "max_tokens": 3, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
        "repeat_penalty": 1.1, "repeat_last_n": 64, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "logit_bias": {"12": -100}, "seed": 3, "stop": ["a", "b"], "ignore_eos": true,
        "stream": true, "stream_options": {"include_usage": true}
    }))
    .expect("valid");
    let s = &r.options.sampling;
    assert_eq!(r.max_tokens, Some(9), "max_completion_tokens wins over max_tokens");
    assert_eq!(
        (s.temperature, s.top_p, s.top_k, s.min_p, s.repeat_penalty, s.repeat_last_n),
        (0.5, 0.9, 40, 0.05, 1.1, 64)
    );
    assert_eq!((s.presence_penalty, s.frequency_penalty, s.seed), (0.5, -0.5, 3));
    assert_eq!(s.logit_bias.get(&12), Some(&-100.0));
    assert_eq!(r.options.stop, vec!["a".to_string(), "b".to_string()]);
    assert!(r.options.ignore_eos && r.stream && r.include_usage);
    // vLLM's name for the same penalty.
    assert_eq!(chat(json!({"repetition_penalty": 1.3})).expect("valid").options.sampling.repeat_penalty, 1.3);
}

#[test]
fn out_of_range_values_name_their_parameter() {
    for (body, param) in [
        (json!({"temperature": 2.5}), "temperature"),
        (json!({"temperature": -1}), "temperature"),
        (json!({"top_p": 1.5}), "top_p"),
        (json!({"min_p": -0.1}), "min_p"),
        (json!({"top_k": -1}), "top_k"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (json!({"frequency_penalty": -3}), "frequency_penalty"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"repeat_last_n": -2}), "repeat_last_n"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_completion_tokens": -3}), "max_completion_tokens"),
        (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
        (json!({"logit_bias": {"1": 101}}), "logit_bias"),
        (json!({"stop": ""}), "stop"),
        (json!({"stop": vec!["x"; MAX_STOP_STRINGS + 1]}), "stop"),
        (json!({"prediction": {"type": "text"}}), "prediction"),
        (json!({"speculative": {"mode": "lookup", "draft_tokens": 0}}), "speculative"),
        (json!({"speculative": {"mode": "lookup", "draftMinP": 0.5}}), "speculative"),
        (json!({"speculative": {"mode": "lookup", "lookup": true}}), "speculative"),
    ] {
        let (got, message) = refused(chat(body.clone()));
        assert_eq!(got.as_deref(), Some(param), "{body}: {message}");
    }
}

#[test]
fn wrong_types_and_unknown_fields_name_the_field() {
    let (param, message) = refused(chat(json!({"temperature": "0.7"})));
    assert_eq!(param.as_deref(), Some("temperature"), "{message}");
    assert!(message.contains("invalid type"), "{message}");
    let (param, message) = refused(chat(json!({"temprature": 1})));
    assert_eq!(param.as_deref(), Some("temprature"), "{message}");
    assert!(message.contains("unknown field `temprature`"), "{message}");
    let (param, message) = refused(chat(json!({"speculative": {"mode": "lookup", "fixed_length": 3}})));
    assert_eq!(param.as_deref(), Some("speculative"), "{message}");
    let (param, message) = refused(Request::from_json(b"{\"messages\": [").and_then(|r| r.validate(Endpoint::Chat, 0)));
    assert!(param.is_none() && message.contains("not valid JSON"), "{message}");
}

#[test]
fn unimplemented_parameters_are_refused_unless_neutral() {
    for (body, param) in
        [(json!({"best_of": 2}), "best_of"), (json!({"suffix": "x"}), "suffix"), (json!({"store": true}), "store")]
    {
        let (got, message) = refused(chat(body.clone()));
        assert_eq!(got.as_deref(), Some(param), "{body}: {message}");
        assert!(message.contains("not supported"), "{message}");
    }
    for neutral in [
        json!({"n": 1}),
        json!({"logprobs": false}),
        json!({"response_format": {"type": "text"}}),
        json!({"tools": []}),
        json!({"tool_choice": "none"}),
        json!({"user": "u-1"}),
    ] {
        chat(neutral.clone()).unwrap_or_else(|e| panic!("{neutral} refused: {e}"));
    }
}

#[test]
fn every_structured_output_dialect_reads_as_one_grammar() {
    use crate::constraint::Grammar;
    let grammar = |extra: Value| chat(extra).expect("valid").options.grammar.expect("a grammar");
    let object = json!({"type": "object"});
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    for (extra, expected, param) in [
        (
            json!({"response_format": {"type": "json_object"}}),
            Grammar::JsonSchema { schema: object.clone(), strict: true },
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_object", "schema": schema.to_string()}}),
            Grammar::JsonSchema { schema: schema.clone(), strict: true },
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": false}}}),
            Grammar::JsonSchema { schema: schema.clone(), strict: false },
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "schema": schema}}),
            Grammar::JsonSchema { schema: schema.clone(), strict: true },
            "response_format",
        ),
        (
            json!({"response_format": {"type": "grammar", "grammar": "start: \"a\""}}),
            Grammar::Lark("start: \"a\"".into()),
            "response_format",
        ),
        (
            json!({"structured_outputs": {"json": schema}}),
            Grammar::JsonSchema { schema: schema.clone(), strict: true },
            "structured_outputs",
        ),
        (
            json!({"structured_outputs": {"json_object": true}}),
            Grammar::JsonSchema { schema: object.clone(), strict: true },
            "structured_outputs",
        ),
        (json!({"structured_outputs": {"regex": "a+"}}), Grammar::Regex("a+".into()), "structured_outputs"),
        (
            json!({"structured_outputs": {"choice": ["a", "b"]}}),
            Grammar::Choice(vec!["a".into(), "b".into()]),
            "structured_outputs",
        ),
        (json!({"json_schema": schema}), Grammar::JsonSchema { schema: schema.clone(), strict: true }, "json_schema"),
        (json!({"grammar": "root ::= \"a\""}), Grammar::Lark("start: \"a\"".into()), "grammar"),
        (
            json!({"grammar": "%llguidance {}\nstart: \"a\""}),
            Grammar::Lark("%llguidance {}\nstart: \"a\"".into()),
            "grammar",
        ),
    ] {
        let got = grammar(extra.clone());
        assert_eq!((got.grammar, got.param), (expected, param), "{extra}");
    }
    assert!(chat(json!({"response_format": {"type": "text"}})).expect("valid").options.grammar.is_none());
    for (extra, param) in [
        (json!({"json_schema": object, "grammar": "start: \"a\""}), "grammar"),
        (json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}), "structured_outputs"),
        (json!({"structured_outputs": {"whitespace_pattern": " "}}), "structured_outputs"),
        (json!({"response_format": {"type": "json_schema"}}), "response_format"),
        (json!({"response_format": {"type": "json_object", "extra": 1}}), "response_format"),
        (json!({"grammar": 3}), "grammar"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}], "response_format": {"type": "json_object"}}),
            "tools",
        ),
    ] {
        let (got, message) = refused(chat(extra.clone()));
        assert_eq!(got.as_deref(), Some(param), "{extra}: {message}");
    }
}

#[test]
fn tools_and_tool_choice_are_checked() {
    use crate::request::ToolChoice;
    let f = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
    let g = json!({"type": "function", "function": {"name": "g"}});
    let tools = |extra: Value| chat(extra).expect("valid").tools.expect("tools");
    let both = json!([f, g]);
    assert_eq!(tools(json!({"tools": both})).choice, ToolChoice::Auto);
    assert!(tools(json!({"tools": both})).parallel);
    assert_eq!(
        tools(json!({"tools": both, "tool_choice": "required", "parallel_tool_calls": false})).choice,
        ToolChoice::Required
    );
    assert!(!tools(json!({"tools": both, "parallel_tool_calls": false})).parallel);
    let named = tools(json!({"tools": both, "tool_choice": {"type": "function", "function": {"name": "g"}}}));
    assert_eq!(named.choice, ToolChoice::Function("g".into()));
    assert_eq!(named.callable().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["g"]);
    // A tool without parameters takes an empty object.
    assert_eq!(named.functions[1].parameters, json!({"type": "object", "properties": {}}));
    assert!(chat(json!({"tools": [], "tool_choice": "none"})).expect("valid").tools.is_none());
    for (extra, param) in [
        (json!({"tools": [f, f]}), "tools"),
        (json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}), "tools"),
        (json!({"tools": [{"type": "code_interpreter"}]}), "tools"),
        (json!({"tools": [f], "tool_choice": "sometimes"}), "tool_choice"),
        (json!({"tools": [f], "tool_choice": {"type": "function", "function": {"name": "h"}}}), "tool_choice"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"tools": [f], "parallel_tool_calls": "yes"}), "parallel_tool_calls"),
    ] {
        let (got, message) = refused(chat(extra.clone()));
        assert_eq!(got.as_deref(), Some(param), "{extra}: {message}");
    }
}

#[test]
fn choices_are_counted_from_one_to_the_limit() {
    assert_eq!(chat(json!({})).expect("valid").n, 1);
    assert_eq!(chat(json!({"n": 3})).expect("valid").n, 3);
    for n in [0, -1, MAX_CHOICES as i64 + 1] {
        let (param, message) = refused(chat(json!({ "n": n })));
        assert_eq!(param.as_deref(), Some("n"), "{message}");
    }
}

#[test]
fn echo_is_a_completions_parameter_and_allows_no_completion() {
    let completion = |extra: Value| {
        let mut body = json!({"prompt": "Once"});
        body.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
        request(body).expect("parse").validate(Endpoint::Completions, 0).map(|v| v.generation)
    };
    let echoed = completion(json!({"echo": true, "logprobs": 2, "max_tokens": 0})).expect("valid");
    assert!(echoed.echo);
    assert_eq!((echoed.max_tokens, echoed.options.prompt_logprobs), (Some(0), Some(2)));
    assert_eq!(completion(json!({"echo": true})).expect("valid").options.prompt_logprobs, None);
    assert!(completion(json!({"echo": true, "stream": true})).expect("valid").echo);
    assert_eq!(refused(completion(json!({"max_tokens": 0}))).0.as_deref(), Some("max_tokens"));
    assert_eq!(refused(chat(json!({"echo": true}))).0.as_deref(), Some("echo"));
    // A bare generation (the CLI's flags, the browser's generate(prompt, options)) has no request
    // kind to read echo or logprobs by.
    for bare in [json!({"echo": true}), json!({"logprobs": 2}), json!({"top_logprobs": 2})] {
        let (param, message) = refused(request(bare).expect("parse").validate_generation(None, 0));
        assert!(matches!(param.as_deref(), Some("echo" | "logprobs")), "{message}");
    }
}

#[test]
fn each_endpoint_takes_its_own_prompt() {
    let text = request(json!({"prompt": "Once"})).expect("parse");
    assert_eq!(text.validate(Endpoint::Completions, 0).expect("valid").prompt, Prompt::Text("Once".into()));
    assert_eq!(refused(text.validate(Endpoint::Chat, 0)).0.as_deref(), Some("prompt"));
    assert_eq!(
        refused(request(json!({"prompt": ["a", "b"]})).expect("parse").validate(Endpoint::Completions, 0)).0.as_deref(),
        Some("prompt")
    );
    assert_eq!(refused(request(json!({})).expect("parse").validate(Endpoint::Chat, 0)).0.as_deref(), Some("messages"));
    assert_eq!(
        refused(request(json!({"messages": []})).expect("parse").validate(Endpoint::Chat, 0)).0.as_deref(),
        Some("messages")
    );
    assert_eq!(
        refused(request(json!({"messages": [{"content": "x"}]})).expect("parse").validate(Endpoint::Chat, 0))
            .0
            .as_deref(),
        Some("messages")
    );
}

#[test]
fn content_parts_are_joined_and_other_fields_kept() {
    let r = request(json!({"messages": [{"role": "user", "name": "ann", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, {"role": "assistant", "content": null}]}))
        .expect("parse")
        .validate(Endpoint::Chat, 0)
        .expect("valid");
    assert_eq!(
        r.prompt,
        Prompt::Chat(vec![
            json!({"role": "user", "name": "ann", "content": "ab"}),
            json!({"role": "assistant", "content": ""})
        ])
    );
    let image = json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]});
    assert_eq!(refused(request(image).expect("parse").validate(Endpoint::Chat, 0)).0.as_deref(), Some("messages"));
}

#[test]
fn speculation_defaults_depend_on_the_drafter() {
    let lookup = chat(json!({"speculative": {"mode": "lookup"}})).expect("valid").speculative.expect("speculation");
    assert_eq!(lookup.options, SpeculativeOptions::lookup());
    let draft =
        chat(json!({"speculative": {"mode": "draft-model", "draftTokens": 4, "fixedLength": true, "lookup": true}}))
            .expect("valid")
            .speculative
            .expect("speculation");
    assert_eq!(draft.options, SpeculativeOptions { max_draft_tokens: 4, adaptive: false });
    assert!(draft.lookup_first);
    assert_eq!(draft.draft_min_p, DEFAULT_MIN_CONFIDENCE);
}

#[test]
fn max_tokens_is_resolved_against_the_context() {
    let asked = chat(json!({"max_tokens": 10})).expect("valid");
    assert_eq!(asked.options_for(5, 100).expect("fits").max_tokens, 10);
    assert!(matches!(asked.options_for(95, 100), Err(CoreError::ContextOverflow { needed: 105, capacity: 100 })));
    let rest = chat(json!({})).expect("valid");
    assert_eq!(rest.options_for(60, 100).expect("fits").max_tokens, 40);
    assert!(matches!(rest.options_for(100, 100), Err(CoreError::ContextOverflow { .. })));
}

#[test]
fn predictions_take_text_or_text_parts() {
    let text = chat(json!({"prediction": {"type": "content", "content": "x = 1"}})).expect("valid");
    assert_eq!(text.prediction.as_deref(), Some("x = 1"));
    let parts = chat(json!({"prediction": {"type": "content", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": " = 1"}]}})).expect("valid");
    assert_eq!(parts.prediction.as_deref(), Some("x = 1"));
}

#[test]
fn a_prediction_and_speculative_together_are_refused() {
    let body = json!({"prediction": {"type": "content", "content": "x"}, "speculative": {"mode": "lookup"}});
    assert_eq!(refused(chat(body)).0.as_deref(), Some("prediction"));
}

#[test]
fn the_limit_is_named_as_the_client_named_it() {
    assert_eq!(chat(json!({"max_completion_tokens": 5})).expect("valid").max_tokens_param, "max_completion_tokens");
    assert_eq!(chat(json!({"max_tokens": 5})).expect("valid").max_tokens_param, "max_tokens");
}

#[test]
fn a_body_that_is_not_an_object_says_so() {
    let (param, message) = refused(Request::from_json(b"[]").and_then(|r| r.validate(Endpoint::Chat, 0)));
    assert!(param.is_none() && message.contains("must be a JSON object"), "{message}");
}

#[test]
fn logprobs_take_each_endpoint_s_form() {
    let logprobs = |endpoint: Endpoint, extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Hi"}], "prompt": "Hi"});
        body.as_object_mut().expect("object").remove(if endpoint == Endpoint::Chat { "prompt" } else { "messages" });
        body.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
        request(body).and_then(|r| r.validate(endpoint, 0)).map(|v| v.generation)
    };
    let ok = |endpoint, extra: Value| {
        logprobs(endpoint, extra.clone()).unwrap_or_else(|e| panic!("{extra}: {e}")).options.logprobs
    };
    assert_eq!(ok(Endpoint::Chat, json!({})), None);
    assert_eq!(ok(Endpoint::Chat, json!({"logprobs": false})), None);
    assert_eq!(ok(Endpoint::Chat, json!({"logprobs": true})), Some(0));
    assert_eq!(ok(Endpoint::Chat, json!({"logprobs": true, "top_logprobs": 20})), Some(20));
    assert_eq!(ok(Endpoint::Completions, json!({"logprobs": 5})), Some(5));
    assert_eq!(ok(Endpoint::Completions, json!({"logprobs": 0})), Some(0));
    for (endpoint, extra, param) in [
        (Endpoint::Chat, json!({"top_logprobs": 3}), "top_logprobs"),
        (Endpoint::Chat, json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        (Endpoint::Chat, json!({"logprobs": 3}), "logprobs"),
        (Endpoint::Completions, json!({"logprobs": 21}), "logprobs"),
        (Endpoint::Completions, json!({"logprobs": -1}), "logprobs"),
        (Endpoint::Completions, json!({"logprobs": 2, "top_logprobs": 2}), "top_logprobs"),
    ] {
        let (got, message) = refused(logprobs(endpoint, extra.clone()));
        assert_eq!(got.as_deref(), Some(param), "{extra}: {message}");
    }
}
