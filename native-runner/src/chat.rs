//! `hearth chat`: an interactive conversation. The whole conversation is re-rendered with the chat
//! template every turn; the engine's prefix cache holds the unchanged prefix, so only the new
//! turn is evaluated. With speculative decoding prompt lookup copies from every earlier turn (an
//! edit of the last answer's code), a draft model's own prefix cache spares it the conversation
//! it has read, and what each turn's draft policy learnt (pass costs, how far copies run)
//! carries to the next.

use crate::load::{self, Loaded};
use crate::run::SamplingArgs;
use crate::speculative::SpeculativeArgs;
use crate::ModelArgs;
use anyhow::{bail, Result};
use clap::Args;
use hearth_core::chat::ChatMessage;
use hearth_core::request::Prompt;
use std::io::{BufRead, Write};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// System message.
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
}

pub fn chat(args: ChatArgs) -> Result<()> {
    args.speculative.check()?;
    let options = args.sampling.options()?;
    let Loaded { mut engine, path, .. } = load::load(&args.model)?;
    if engine.chat_template().is_none() {
        bail!("{} has no chat template, so it cannot chat; use `hearth run`", path.display());
    }
    let drafting = args.speculative.set_up(&args.model, &mut engine)?;
    let base: Vec<ChatMessage> =
        args.system.iter().map(|s| ChatMessage { role: "system".into(), content: s.clone() }).collect();
    let mut messages = base.clone();
    eprintln!("chatting with {} — /reset starts over, /exit or Ctrl-D quits", path.display());
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = base.clone();
                eprintln!("(new conversation)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage { role: "user".into(), content: line.to_string() });
        let turns = messages.iter().map(|m| serde_json::json!({"role": m.role, "content": m.content})).collect();
        // (Through the history, last turn's answer keeps the tokens the model wrote.)
        let history = engine.scheduler().token_history();
        let prompt = Prompt::Chat(turns).tokenize_with_tools(
            engine.tokenizer(),
            engine.chat_template(),
            None,
            None,
            Some(history),
        )?;
        if prompt.len() + 1 >= engine.n_ctx() {
            messages.pop();
            eprintln!("(the conversation no longer fits the {}-token context; /reset to start over)", engine.n_ctx());
            continue;
        }
        let mut on_text = |delta: &str| {
            let _ = stdout.write_all(delta.as_bytes());
            let _ = stdout.flush();
            true
        };
        let generation = engine.generate_with(&prompt, &options, drafting.clone(), &mut on_text)?;
        println!();
        let t = &generation.timings;
        eprintln!(
            "[{} new prompt tokens ({} cached), {} generated; ttft {:.0} ms; {:.1} tok/s]",
            t.prompt_evaluated,
            generation.prompt_tokens.len() - t.prompt_evaluated,
            generation.tokens.len(),
            t.ttft_ms,
            t.decode_tok_s
        );
        if let Some(m) = &generation.speculative {
            eprintln!("{}", args.speculative.summary(m));
        }
        messages.push(ChatMessage { role: "assistant".into(), content: generation.text.trim().to_string() });
    }
    Ok(())
}
