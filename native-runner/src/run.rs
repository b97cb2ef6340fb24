//! `hearth run`: one prompt, streamed.

use crate::load::{self, Loaded};
use crate::speculative::SpeculativeArgs;
use crate::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use hearth_core::chat::ToolCallFormat;
use hearth_core::engine::{GenerateOptions, Generation};
use hearth_core::request::{Prompt, Request, Stop, ToolRequest};
use std::io::Write;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// The prompt.
    #[arg(short = 'p', long, required_unless_present = "messages")]
    pub prompt: Option<String>,
    /// Wrap the prompt as a user turn with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System message (with --chat or --messages).
    #[arg(long)]
    pub system: Option<String>,
    /// A conversation to continue instead of --prompt: a JSON file holding an array of OpenAI-style
    /// messages (`[{"role": "user", "content": "…"}, {"role": "assistant", …}, …]`), rendered
    /// with the model's chat template (implies --chat; --system puts a system message first);
    /// `-` reads it from stdin.
    #[arg(long, conflicts_with = "prompt", value_name = "FILE")]
    pub messages: Option<std::path::PathBuf>,
    /// Print one JSON object with tokens, text and timings at the end instead of streaming.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
    #[command(flatten)]
    pub constraint: ConstraintArgs,
}

/// Structured output and tools: the answer constrained to a grammar (the request schema's
/// `structured_outputs`) or offered tools (`tools`, `tool_choice`), as `hearth serve` takes them.
#[derive(Args, Debug, Clone, Default)]
pub struct ConstraintArgs {
    /// The answer is JSON valid under this JSON Schema (a file; `-` reads stdin).
    #[arg(long = "json-schema", value_name = "FILE", group = "grammar_flag")]
    pub json_schema: Option<std::path::PathBuf>,
    /// The answer matches this regular expression, whole.
    #[arg(long, group = "grammar_flag")]
    pub regex: Option<String>,
    /// The answer follows this grammar: a file in Lark (llguidance's dialect) or llama.cpp's GBNF.
    #[arg(long, value_name = "FILE", group = "grammar_flag")]
    pub grammar: Option<std::path::PathBuf>,
    /// The answer is one of these strings (repeat the flag for each).
    #[arg(long, group = "grammar_flag")]
    pub choice: Vec<String>,
    /// Tools the model may call (with --chat or --messages): a JSON file holding OpenAI's `tools`
    /// array (`[{"type": "function", "function": {"name", "description", "parameters"}}]`).
    /// The calls are printed as OpenAI's `tool_calls` (with --json, in the report).
    #[arg(long, value_name = "FILE", conflicts_with = "grammar_flag")]
    pub tools: Option<std::path::PathBuf>,
    /// With --tools: none, auto (default), required, or a function's name (that function is called).
    #[arg(long = "tool-choice", requires = "tools")]
    pub tool_choice: Option<String>,
}

fn read_text(file: &std::path::Path) -> Result<String> {
    if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading stdin")
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))
    }
}

impl ConstraintArgs {
    /// The flags as the request schema's fields.
    pub fn request(&self) -> Result<Request> {
        let tools = match &self.tools {
            Some(file) => Some(
                serde_json::from_str::<serde_json::Value>(&read_text(file)?)
                    .with_context(|| format!("{} is not JSON", file.display()))?,
            ),
            None => None,
        };
        let tool_choice = self.tool_choice.as_ref().map(|choice| match choice.as_str() {
            "none" | "auto" | "required" => serde_json::json!(choice),
            name => serde_json::json!({"type": "function", "function": {"name": name}}),
        });
        Ok(Request { structured_outputs: self.structured_outputs()?, tools, tool_choice, ..Request::default() })
    }

    /// The grammar flags as the request schema's `structured_outputs` (None: unconstrained).
    fn structured_outputs(&self) -> Result<Option<serde_json::Value>> {
        let read = read_text;
        Ok(if let Some(file) = &self.json_schema {
            let schema: serde_json::Value =
                serde_json::from_str(&read(file)?).with_context(|| format!("{} is not JSON", file.display()))?;
            Some(serde_json::json!({ "json": schema }))
        } else if let Some(regex) = &self.regex {
            Some(serde_json::json!({ "regex": regex }))
        } else if let Some(file) = &self.grammar {
            Some(serde_json::json!({ "grammar": read(file)? }))
        } else if !self.choice.is_empty() {
            Some(serde_json::json!({ "choice": self.choice }))
        } else {
            None
        })
    }
}

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Maximum tokens to generate.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// 0 = off.
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// 1.0 = off.
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// 0.0 = off.
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// 1.0 = off.
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at: -1 = the whole history, 0 = none.
    #[arg(long = "repeat-last-n", default_value_t = -1, allow_hyphen_values = true)]
    pub repeat_last_n: i64,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: from the clock; printed with --json).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this text is generated (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    /// The flags as the one request schema's fields, checked by its validation (the ranges of
    /// `hearth serve` and the browser).
    pub fn options(&self) -> Result<GenerateOptions> {
        Ok(self.options_with(Request::default())?.0)
    }

    /// [`Self::options`] with more of the request's fields (see [`ConstraintArgs`]), and the
    /// tools it offers.
    pub fn options_with(&self, extra: Request) -> Result<(GenerateOptions, Option<ToolRequest>)> {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
        });
        let request = Request {
            max_tokens: Some(i64::try_from(self.max_tokens).unwrap_or(i64::MAX)),
            temperature: Some(self.temperature),
            top_k: Some(i64::try_from(self.top_k).unwrap_or(i64::MAX)),
            top_p: Some(self.top_p),
            min_p: Some(self.min_p),
            repetition_penalty: Some(self.repeat_penalty),
            repeat_last_n: Some(self.repeat_last_n),
            presence_penalty: Some(self.presence_penalty),
            frequency_penalty: Some(self.frequency_penalty),
            seed: Some(seed as i64),
            stop: Some(Stop::Many(self.stop.clone())),
            ignore_eos: Some(self.ignore_eos),
            ..extra
        };
        let generation =
            request.validate_generation(None, seed).map_err(|e| anyhow::anyhow!("invalid request: {e}"))?;
        let options =
            GenerateOptions { max_tokens: generation.max_tokens.unwrap_or(self.max_tokens), ..generation.options };
        Ok((options, generation.tools))
    }
}

pub fn run(args: RunArgs) -> Result<()> {
    args.speculative.check()?;
    let (mut options, tools) = args.sampling.options_with(args.constraint.request()?)?;
    if tools.is_some() && !args.chat && args.messages.is_none() {
        bail!("--tools offers tools to a chat: add --chat (or give --messages)");
    }
    let conversation =
        args.messages.as_deref().map(|file| read_conversation(file, args.system.as_deref())).transpose()?;
    let Loaded { mut engine, path, load_ms } = load::load(&args.model)?;
    let prompt = match (conversation, &args.prompt) {
        (Some(conversation), _) => {
            if engine.chat_template().is_none() {
                bail!("{} has no chat template, so it cannot continue a conversation; use -p", path.display());
            }
            conversation
        }
        (None, Some(prompt)) if args.chat => {
            if engine.chat_template().is_none() {
                bail!("{} has no chat template; run without --chat", path.display());
            }
            let system = args.system.iter().map(|s| serde_json::json!({"role": "system", "content": s}));
            Prompt::Chat(system.chain([serde_json::json!({"role": "user", "content": prompt})]).collect())
        }
        (None, Some(prompt)) => Prompt::Text(prompt.clone()),
        (None, None) => bail!("give the prompt with -p TEXT, or a conversation with --messages FILE"),
    };
    let prompt = prompt.tokenize_with_tools(engine.tokenizer(), engine.chat_template(), None, tools.as_ref(), None)?;
    let tool_format = tools
        .as_ref()
        .map(|t| t.apply(engine.chat_template(), engine.tokenizer(), &mut options))
        .transpose()?
        .flatten();
    let drafting = args.speculative.set_up(&args.model, &mut engine)?;
    let stream = !args.json;
    let mut stdout = std::io::stdout();
    let mut on_text = |delta: &str| {
        if stream {
            let _ = stdout.write_all(delta.as_bytes());
            let _ = stdout.flush();
        }
        true
    };
    let generation = engine.generate_with(&prompt, &options, drafting, &mut on_text)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report(
                &generation,
                &engine,
                &path,
                load_ms,
                options.sampling.seed,
                tool_format
            ))?
        );
    } else {
        println!();
        if let Some(format) = tool_format {
            for (i, call) in format.parser().parse(&generation.text).1.iter().enumerate() {
                eprintln!("[tool call {i}: {}({})]", call.name, call.arguments);
            }
        }
        let t = &generation.timings;
        eprintln!(
            "[{} prompt tokens, {} generated ({:?}); ttft {:.0} ms; prefill {:.1} tok/s; decode {:.1} tok/s]",
            generation.prompt_tokens.len(),
            generation.tokens.len(),
            generation.finish_reason,
            t.ttft_ms,
            t.prefill_tok_s,
            t.decode_tok_s
        );
        if let Some(m) = &generation.speculative {
            eprintln!("{}", args.speculative.summary(m));
        }
        if let Some(c) = &generation.constraint {
            eprintln!(
                "[structured output: {} masks, p50 {:.0} µs, p99 {:.0} µs]",
                c.masks(),
                c.mask_percentile_us(0.5),
                c.mask_percentile_us(0.99)
            );
        }
    }
    Ok(())
}

/// The conversation in `file` (a JSON array of messages), `system` first when given: checked
/// before the model loads, rendered with its chat template after.
fn read_conversation(file: &std::path::Path, system: Option<&str>) -> Result<Prompt> {
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the conversation from stdin")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading the conversation {}", file.display()))?
    };
    let messages: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    let Some(list) = messages.as_array() else {
        bail!(
            "{} must hold a JSON array of messages, like [{{\"role\": \"user\", \"content\": \"Hi\"}}]",
            file.display()
        );
    };
    if list.is_empty() {
        bail!("{} holds no messages", file.display());
    }
    for (i, message) in list.iter().enumerate() {
        if !message.get("role").is_some_and(|r| r.is_string()) {
            bail!("message {i} of {} has no \"role\" string (user, assistant, system, tool)", file.display());
        }
    }
    if system.is_some() && list[0]["role"] == "system" {
        bail!("{} starts with a system message and --system gives another: keep one", file.display());
    }
    let system = system.map(|s| serde_json::json!({ "role": "system", "content": s }));
    let messages: Vec<serde_json::Value> = system.into_iter().chain(list.iter().cloned()).collect();
    Prompt::from_messages(Some(&messages)).with_context(|| format!("the conversation in {}", file.display()))
}

fn report(
    g: &Generation,
    engine: &hearth_core::engine::Engine,
    path: &std::path::Path,
    load_ms: f64,
    seed: u64,
    tool_format: Option<ToolCallFormat>,
) -> serde_json::Value {
    let t = &g.timings;
    let runner = engine.runner();
    let layout = runner.kv_layout();
    let (content, tool_calls) = match tool_format {
        Some(format) => {
            let (content, calls) = format.parser().parse(&g.text);
            let calls: Vec<serde_json::Value> =
                calls.iter().enumerate().map(|(i, c)| c.to_json(&format!("call_{i}"))).collect();
            (serde_json::json!(content), serde_json::json!(calls))
        }
        None => (serde_json::Value::Null, serde_json::Value::Null),
    };
    serde_json::json!({
        "content": content,
        "tool_calls": tool_calls,
        "model": path.display().to_string(),
        "backend": engine.backend().name(),
        "backend_variant": engine.backend().variant(),
        "prompt_tokens": g.prompt_tokens,
        "tokens": g.tokens,
        "text": g.text,
        "finish_reason": g.finish_reason,
        "seed": seed,
        "load_ms": load_ms,
        "ttft_ms": t.ttft_ms,
        "prefill_tok_s": t.prefill_tok_s,
        "decode_tok_s": t.decode_tok_s,
        "prompt_ms": t.prompt_ms,
        "decode_ms": t.decode_ms,
        "speculative": g.speculative,
        "constraint": g.constraint,
        // Prompt tokens whose K/V were reused (the prefix cache).
        "prompt_cached_tokens": g.prompt_tokens.len() - t.prompt_evaluated,
        "prefix_hit_rate": runner.kv().prefix_hit_rate(),
        "kv": {
            "type": layout.kv_type,
            "bytes_per_token": layout.bytes_per_token(),
            "pool_bytes": layout.total_bytes(),
            "n_ctx": engine.n_ctx(),
        },
    })
}
