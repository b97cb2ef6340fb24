//! Debug aid: one prefill of the given token ids on a model, then optionally (after a `+`) ids
//! decoded one at a time, for op-by-op comparison with llama.cpp
//! (tests/fixtures/numerics/llama_dump_taps.cpp takes the same arguments). Run with
//! `HEARTH_DUMP_TAPS=/tmp/taps` (every step writes its taps; the last one's remain):
//! `cargo run --release -p hearth-tests --example dump_prefill -- <model stem> 785 6722 315 9625 374 + 12095`
//! (`--llama-cpp-numerics` anywhere: the CPU backend in `Numerics::LlamaCpp`).
use hearth_core::graph::LogitsMode;
use hearth_tests::*;

fn main() {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let numerics = if all.iter().any(|a| a == "--llama-cpp-numerics") { Numerics::LlamaCpp } else { Numerics::Hearth };
    let args: Vec<String> = all.into_iter().filter(|a| a != "--llama-cpp-numerics").collect();
    let stem = args.first().map(String::as_str).unwrap_or(QWEN_05B);
    let split = args.iter().position(|a| a == "+").unwrap_or(args.len());
    let ids = |args: &[String]| -> Vec<u32> { args.iter().filter_map(|a| a.parse().ok()).collect() };
    let (prompt, decode) = (ids(&args[1.min(split)..split]), ids(&args[split.min(args.len())..]));
    let (_file, mut session) = cpu_session_numerics(&model_path(stem), 512, numerics);
    let mut logits = session.eval(&prompt, LogitsMode::Last).expect("prefill").to_vec();
    for &token in &decode {
        logits = session.eval(&[token], LogitsMode::Last).expect("decode").to_vec();
    }
    let first: Vec<String> = logits.iter().take(3).map(|v| format!("{v:.4}")).collect();
    println!("logits[..3] = {}", first.join(", "));
}
