//! `hearth run`: one prompt, streamed.

use crate::load::{self, Loaded};
use crate::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use hearth_core::chat::ChatMessage;
use hearth_core::engine::{Engine, EngineOptions, GenerateOptions, Generation, Session};
use hearth_core::sampling::SamplingParams;
use hearth_core::speculative::{default_draft_vocab, DraftModel, Drafter, LookupThen, PromptLookup, SpeculativeOptions};
use hearth_core::tokenizer::Tokenizer;
use std::io::Write;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// The prompt.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Wrap the prompt as a user turn with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System message (with --chat).
    #[arg(long)]
    pub system: Option<String>,
    /// Print one JSON object with tokens, text and timings at the end instead of streaming.
    #[arg(long)]
    pub json: bool,
    /// Speculative decoding with this draft model (a .gguf path or a built-in name); its
    /// vocabulary must match the model's (e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b).
    #[arg(long = "draft-model")]
    pub draft_model: Option<String>,
    /// Most draft tokens per step (default 5 with --draft-model, 15 with --lookup, whose match
    /// length also caps each proposal). Each step drafts and verifies the number within 0..=K
    /// that gives the most tokens per second at the acceptance rate and the pass costs measured
    /// so far (0 = a plain step where speculation would be slower).
    #[arg(long = "draft-tokens")]
    pub draft_tokens: Option<usize>,
    /// Draft and verify up to --draft-tokens every step instead of adapting (with sampling,
    /// this makes a seeded run reproducible: adaptive lengths depend on measured timings).
    #[arg(long = "fixed-draft-length")]
    pub fixed_draft_length: bool,
    /// With --draft-model: stop drafting where the draft model's top token is less likely than
    /// this, from 0 (draft the full length) to 1. Default 0.6.
    #[arg(long = "draft-min-p")]
    pub draft_min_p: Option<f32>,
    /// With --draft-model: the draft model predicts only the first N token ids (0 = all), a
    /// shortlist of the common pieces that shrinks its output head, the largest mat-mul of a
    /// small model. Default: 65536 for byte-level BPE vocabularies (their ids follow merge
    /// order), all for others.
    #[arg(long = "draft-vocab")]
    pub draft_vocab: Option<usize>,
    /// Speculative decoding by prompt lookup: drafts copied from the prompt and output (no model).
    /// With --draft-model, both: lookup where the output copies, the draft model elsewhere
    /// (--draft-tokens then bounds the draft model's proposals).
    #[arg(long)]
    pub lookup: bool,
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
    pub fn options(&self) -> Result<GenerateOptions> {
        if !(self.temperature >= 0.0) || !(0.0..=1.0).contains(&self.top_p) || !(0.0..=1.0).contains(&self.min_p) {
            bail!("invalid sampling parameters: temperature must be ≥ 0, top-p and min-p in [0, 1]");
        }
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
        });
        Ok(GenerateOptions {
            max_tokens: self.max_tokens,
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                seed,
                ..SamplingParams::default()
            },
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
        })
    }
}

pub fn run(args: RunArgs) -> Result<()> {
    check_speculative_flags(&args)?;
    let options = args.sampling.options()?;
    let Loaded { mut engine, path, load_ms } = load::load(&args.model)?;
    let (text, templated) = if args.chat {
        let template = match engine.chat_template() {
            Some(t) => t,
            None => bail!("{} has no chat template; run without --chat", path.display()),
        };
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage { role: "system".into(), content: system.clone() });
        }
        messages.push(ChatMessage { role: "user".into(), content: args.prompt.clone() });
        (template.render(&messages, true)?, true)
    } else {
        (args.prompt.clone(), false)
    };
    let prompt = load::tokenize_prompt(&engine, &text, templated)?;
    let mut drafter = drafter(&args, &engine)?;
    let lookup_only = args.lookup && args.draft_model.is_none();
    let speculative = if lookup_only { SpeculativeOptions::lookup() } else { SpeculativeOptions::default() };
    let speculative = SpeculativeOptions {
        max_draft_tokens: args.draft_tokens.unwrap_or(speculative.max_draft_tokens).max(1),
        adaptive: !args.fixed_draft_length,
    };
    let stream = !args.json;
    let mut stdout = std::io::stdout();
    let mut on_text = |delta: &str| {
        if stream {
            let _ = stdout.write_all(delta.as_bytes());
            let _ = stdout.flush();
        }
        true
    };
    let generation = match drafter.as_deref_mut() {
        Some(drafter) => engine.generate_speculative(&prompt, &options, drafter, &speculative, &mut on_text)?,
        None => engine.generate(&prompt, &options, &mut on_text)?,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report(&generation, &engine, &path, load_ms, options.sampling.seed))?);
    } else {
        println!();
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
            // With both drafters, the lookup's share (the rest is the draft model's); with a draft
            // model, its read of the prompt (in the decode time: it comes after the first token).
            let mut details = if args.lookup && args.draft_model.is_some() {
                format!("; prompt lookup: {} of {} in {} passes", m.free_accepted, m.free_proposed, m.free_passes)
            } else {
                String::new()
            };
            if args.draft_model.is_some() {
                details += &format!("; the draft model read the prompt in {:.0} ms, after the first token", m.drafter_prepare_ms);
            }
            eprintln!(
                "[speculative: {} of {} draft tokens accepted ({:.0}%), {:.2} per step, {} target passes{details}]",
                m.accepted,
                m.proposed,
                m.acceptance_rate * 100.0,
                m.mean_accepted_per_step,
                m.target_forward_passes
            );
        }
    }
    Ok(())
}

/// Speculation flags that would be ignored are errors: a user who set them expects an effect.
fn check_speculative_flags(args: &RunArgs) -> Result<()> {
    if args.draft_model.is_none() {
        for (set, flag) in [(args.draft_vocab.is_some(), "--draft-vocab"), (args.draft_min_p.is_some(), "--draft-min-p")] {
            if set {
                bail!("{flag} sets up the draft model: add --draft-model MODEL, or drop {flag}");
            }
        }
        if !args.lookup {
            for (set, flag) in [(args.draft_tokens.is_some(), "--draft-tokens"), (args.fixed_draft_length, "--fixed-draft-length")] {
                if set {
                    bail!("{flag} applies to speculative decoding: add --draft-model MODEL or --lookup, or drop {flag}");
                }
            }
        }
    }
    if let Some(p) = args.draft_min_p.filter(|p| !(0.0..=1.0).contains(p)) {
        bail!("--draft-min-p {p} is not a probability: use a value from 0 to 1");
    }
    Ok(())
}

/// The drafter asked for on the command line: a draft model on the same backend, prompt lookup,
/// both (lookup first), or none.
fn drafter(args: &RunArgs, engine: &Engine) -> Result<Option<Box<dyn Drafter>>> {
    let Some(draft) = &args.draft_model else {
        return Ok(args.lookup.then(|| Box::new(PromptLookup::default()) as Box<dyn Drafter>));
    };
    let draft_args = crate::ModelArgs { model: draft.clone(), ..args.model.clone() };
    let (file, path) = load::open(&draft_args)?;
    let tokenizer = Tokenizer::from_gguf(&file.metadata).with_context(|| format!("reading the tokenizer of {}", path.display()))?;
    let logits_vocab = match args.draft_vocab {
        None => default_draft_vocab(&file.metadata),
        Some(0) => None,
        Some(n) => Some(n),
    };
    let options = EngineOptions { n_ctx: args.model.ctx_size, logits_vocab, ..EngineOptions::default() };
    let session = Session::load(&file, load::backend(&draft_args)?, &options, &mut |_, _| {})
        .with_context(|| format!("loading the draft model {}", path.display()))?;
    let mut model = DraftModel::new(session, &tokenizer, engine.tokenizer())
        .with_context(|| format!("{} cannot draft for this model", path.display()))?;
    model.min_confidence = args.draft_min_p.unwrap_or(hearth_core::speculative::DEFAULT_MIN_CONFIDENCE);
    if args.lookup {
        return Ok(Some(Box::new(LookupThen::new(model))));
    }
    Ok(Some(Box::new(model)))
}

fn report(
    g: &Generation,
    engine: &hearth_core::engine::Engine,
    path: &std::path::Path,
    load_ms: f64,
    seed: u64,
) -> serde_json::Value {
    let t = &g.timings;
    let session = engine.session();
    let layout = session.runner().kv_layout();
    serde_json::json!({
        "model": path.display().to_string(),
        "backend": engine.session().backend().name(),
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
        // Prompt tokens whose K/V were reused (session history or the prefix cache).
        "prompt_cached_tokens": g.prompt_tokens.len() - t.prompt_evaluated,
        "prefix_hit_rate": session.runner().kv().prefix_hit_rate(),
        "kv": {
            "type": layout.kv_type,
            "bytes_per_token": layout.bytes_per_token(),
            "pool_bytes": layout.total_bytes(),
            "n_ctx": session.n_ctx(),
        },
    })
}
