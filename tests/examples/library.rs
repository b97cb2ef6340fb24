//! Hearth as a library (the README's example): load a GGUF on the CPU backend, render a chat
//! prompt with the model's template, generate with sampling options, stream the text.
//!
//! `cargo run --release -p hearth-tests --example library -- MODEL.gguf` (or set HEARTH_MODEL)

use hearth_core::chat::ChatMessage;
use hearth_core::engine::{Engine, EngineOptions, GenerateOptions};
use hearth_core::gguf::GgufFile;
use hearth_core::sampling::SamplingParams;
use hearth_cpu::CpuBackend;
use std::io::Write;

fn main() {
    let Some(path) = std::env::args().nth(1).or_else(|| std::env::var("HEARTH_MODEL").ok()) else {
        eprintln!("usage: library MODEL.gguf (or set HEARTH_MODEL to a .gguf path)");
        std::process::exit(2);
    };
    if let Err(e) = run(&path) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(path: &str) -> Result<(), Box<dyn std::error::Error>> {
    let file = GgufFile::open(std::path::Path::new(path))?;
    let backend = Box::new(CpuBackend::new(None)?); // None: one thread per core
    let mut engine = Engine::load(&file, backend, &EngineOptions::default(), &mut |_, _| {})?;

    let messages = [ChatMessage::new("user", "Write a haiku about a hearth.")];
    let template = engine.chat_template().ok_or("this model has no chat template")?;
    let text = template.render(&messages, true)?;
    // A template that writes the BOS text itself must not get a second BOS token.
    let tok = engine.tokenizer();
    let bos_text = tok.bos().map(|id| tok.token_bytes(id)).unwrap_or_default();
    let bos_written = !bos_text.is_empty() && text.as_bytes().starts_with(&bos_text);
    let prompt = tok.encode(&text, tok.add_bos_default() && !bos_written, true)?;

    let sampling = SamplingParams { temperature: 0.7, top_p: 0.95, seed: 42, ..Default::default() };
    let options = GenerateOptions { max_tokens: 128, sampling, ..Default::default() };
    let generation = engine.generate(&prompt, &options, &mut |delta: &str| {
        print!("{delta}");
        std::io::stdout().flush().is_ok() // returning false stops the generation
    })?;
    let (n, t) = (generation.tokens.len(), &generation.timings);
    println!("\n[{n} tokens, {:?}, {:.1} tok/s]", generation.finish_reason, t.decode_tok_s);
    Ok(())
}
