//! Hearth as a library (the README's example): load a GGUF on the CPU backend, render a chat
//! prompt with the model's template, generate with sampling options, stream the text.
//!
//! `cargo run --release -p hearth-tests --example library -- MODEL.gguf` (or set HEARTH_MODEL)

use hearth_core::engine::{Engine, EngineOptions, GenerateOptions};
use hearth_core::gguf::GgufFile;
use hearth_core::request::Prompt;
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

    // Chat messages through the model's template, tokenized without a second BOS.
    let messages = vec![serde_json::json!({"role": "user", "content": "Write a haiku about a hearth."})];
    let prompt = Prompt::Chat(messages).tokenize(engine.tokenizer(), engine.chat_template(), None)?;

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
