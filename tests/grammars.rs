//! Grammars as clients write them, through structured output's compiler on Qwen's vocabulary:
//! llama.cpp's GBNF (rewritten as Lark), Lark, regular expressions and choices accept the texts
//! of their language and reject others, each text tokenized as the model would write it.

use hearth_core::constraint::{gbnf_to_lark, Activation, Grammar, GrammarCompiler, GrammarRequest, GrammarState};
use hearth_core::gguf::GgufFile;
use hearth_core::tokenizer::Tokenizer;
use hearth_tests::*;

fn compiler() -> (Tokenizer, GrammarCompiler) {
    let file = GgufFile::open(&model_path(QWEN_05B)).expect("open Qwen 0.5B");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let compiler = GrammarCompiler::new(&tokenizer, tokenizer.vocab_size()).expect("compiler");
    (tokenizer, compiler)
}

/// Whether `grammar` accepts `text` whole.
fn accepts(tokenizer: &Tokenizer, compiler: &GrammarCompiler, grammar: &Grammar, text: &str) -> bool {
    let request = GrammarRequest { grammar: grammar.clone(), param: "grammar", activation: Activation::Always };
    let compiled = compiler.compile(&request).unwrap_or_else(|e| panic!("{e}\n{grammar:?}"));
    GrammarState::new(&compiled, 0.0).accepts(&tokenizer.encode(text, false, false).expect("encode"))
}

fn check(grammar: &Grammar, valid: &[&str], invalid: &[&str]) {
    let (tokenizer, compiler) = compiler();
    for text in valid {
        assert!(accepts(&tokenizer, &compiler, grammar, text), "rejects {text:?}: {grammar:?}");
    }
    for text in invalid {
        assert!(!accepts(&tokenizer, &compiler, grammar, text), "accepts {text:?}: {grammar:?}");
    }
}

fn gbnf(text: &str) -> Grammar {
    Grammar::Lark(gbnf_to_lark(text, "grammar").unwrap_or_else(|e| panic!("{e}")))
}

#[test]
fn an_arithmetic_gbnf_grammar() {
    let grammar = gbnf(
        r#"# Arithmetic expressions, spaces allowed around operators.
root  ::= expr
expr  ::= term (ws [-+] ws term)*
term  ::= factor (ws [*/] ws factor)*
factor ::= number | "(" ws expr ws ")"
number ::= "-"? [0-9]+ ("." [0-9]+)?
ws    ::= [ \t]*
"#,
    );
    check(&grammar, &["1+2", "(3 * 4) - 5.25", "-7", "((1))/2"], &["1+", "(2", "a*b", "1 ++ 2", ""]);
}

#[test]
fn a_gbnf_list_with_bounded_repetition_and_negated_classes() {
    let grammar = gbnf("root ::= item{1,3}\nitem ::= \"- \" [^\\n]+ \"\\n\"  # one line each\n");
    check(&grammar, &["- milk\n", "- a\n- b b\n- c\n"], &["- a\n- b\n- c\n- d\n", "milk\n", "- \n"]);
}

#[test]
fn a_json_like_gbnf_grammar_with_alternatives_across_lines() {
    let grammar = gbnf(
        r#"root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::=
  "{" (
    string ":" value
    ("," string ":" value)*
  )? "}"
array  ::= "[" (value ("," value)*)? "]"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\""
number ::= ("-"? ([0-9] | [1-9] [0-9]*)) ("." [0-9]+)?
"#,
    );
    check(
        &grammar,
        &[r#"{"a":[1,2.5,"x\n"],"b":{"c":null}}"#, "{}", r#"{"u":"\u00e9"}"#],
        &[r#"{"a":}"#, "[1]", r#"{"a":tru}"#, r#"{"a":"x"#],
    );
}

#[test]
fn lark_regex_and_choices() {
    let lark =
        Grammar::Lark("start: greeting \", \" NAME \"!\"\ngreeting: \"Hello\" | \"Hi\"\nNAME: /[A-Z][a-z]+/".into());
    check(&lark, &["Hello, World!", "Hi, Ada!"], &["Hey, World!", "Hello, world!", "Hello, World"]);
    let regex = Grammar::Regex(r"\d{4}-\d{2}-\d{2}".into());
    check(&regex, &["2024-02-29"], &["2024-2-29", "2024-02-29T"]);
    let choice = Grammar::Choice(vec!["yes".into(), "no".into(), "say \"maybe\"".into()]);
    check(&choice, &["yes", "no", "say \"maybe\""], &["maybe", "yesno", "y"]);
}

/// The grammars of Llama 3.x tool calls: `required` is one `{"name", "parameters"}` call valid
/// under the tool's schema; `auto` also lets an answer that does not begin a call be any text.
#[test]
fn llama3_tool_call_grammars() {
    use hearth_core::chat::ToolCallFormat;
    use hearth_core::request::{Function, ToolChoice, ToolRequest};
    let parameters = serde_json::json!({
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false
    });
    let tools = |choice| ToolRequest {
        tools: vec![],
        functions: vec![Function { name: "get_weather".into(), parameters: parameters.clone(), strict: true }],
        choice,
        parallel: true,
    };
    let call = r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#;
    let cases = [
        (
            ToolChoice::Required,
            vec![call],
            vec![
                "It is sunny.",
                r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
                r#"{"name": "get_time", "parameters": {}}"#,
                r#"{"name": "get_weather", "parameters": {"town": "Paris"}}"#,
            ],
        ),
        (
            ToolChoice::Auto,
            vec![call, "It is sunny.", "Call {\"name\": 1}"],
            vec![r#"{"name": "get_weather", "parameters": {}}"#, r#"{"city": "Paris"}"#],
        ),
    ];
    for (choice, valid, invalid) in cases {
        check_tool_grammar(ToolCallFormat::Llama3, &tools(choice), &valid, &invalid);
    }
}

/// Whether `format`'s grammar for `tools` accepts each of `valid` whole and none of `invalid`
/// (tool-call markers written in the texts are their tokens).
fn check_tool_grammar(
    format: hearth_core::chat::ToolCallFormat,
    tools: &hearth_core::request::ToolRequest,
    valid: &[&str],
    invalid: &[&str],
) {
    let (tokenizer, compiler) = compiler();
    let request = format.grammar(tools, &tokenizer).expect("a grammar");
    let compiled = compiler.compile(&request).unwrap_or_else(|e| panic!("{e}"));
    let accepts =
        |text: &str| GrammarState::new(&compiled, 0.0).accepts(&tokenizer.encode(text, false, true).expect("encode"));
    let choice = &tools.choice;
    for text in valid {
        assert!(accepts(text), "{format:?} {choice:?} rejects {text}");
    }
    for text in invalid {
        assert!(!accepts(text), "{format:?} {choice:?} accepts {text}");
    }
}

/// The grammars of Hermes tool calls: `required` is `<tool_call>` calls valid under the tools'
/// schemas; under `auto` text may come first, and an answer that begins as calls fenced as a JSON
/// code block is held to the same schemas, while any other code block stays free.
#[test]
fn hermes_tool_call_grammars() {
    use hearth_core::chat::ToolCallFormat;
    use hearth_core::request::{Function, ToolChoice, ToolRequest};
    let parameters = serde_json::json!({
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false
    });
    let tools = |choice| ToolRequest {
        tools: vec![],
        functions: vec![Function { name: "get_weather".into(), parameters: parameters.clone(), strict: true }],
        choice,
        parallel: true,
    };
    let call = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
    let tagged = format!("<tool_call>\n{call}\n</tool_call>");
    let fenced = format!("```json\n{call}\n```");
    let two_fenced = format!("\n```\n{call}\n{call}\n```");
    let bad_call = r#"{"name": "get_weather", "arguments": {"town": "Paris"}}"#;
    let (bad_tagged, bad_fenced) =
        (format!("<tool_call>\n{bad_call}\n</tool_call>"), format!("```json\n{bad_call}\n```"));
    let prefaced = format!("Let me check.\n{tagged}");
    check_tool_grammar(
        ToolCallFormat::Hermes,
        &tools(ToolChoice::Required),
        &[&tagged, &format!("{tagged}\n{tagged}")],
        &["It is sunny.", &fenced, &bad_tagged, &prefaced],
    );
    check_tool_grammar(
        ToolCallFormat::Hermes,
        &tools(ToolChoice::Auto),
        &[&tagged, &prefaced, &fenced, &two_fenced, "It is sunny.", "```python\nprint(1)\n```"],
        &[&bad_tagged, &bad_fenced, &format!("{fenced} and more")],
    );
}
