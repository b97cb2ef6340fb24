//! Debug aid: one prefill of the given token ids on a model, for op-by-op comparison with
//! llama.cpp's `llama-eval-callback`. Run with `HEARTH_DUMP_TAPS=1`:
//! `cargo run --release -p hearth-tests --example dump_prefill -- <model stem> 785 6722 315 9625 374`
use hearth_core::graph::LogitsMode;
use hearth_tests::*;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let stem = args.first().map(String::as_str).unwrap_or(QWEN_05B);
    let ids: Vec<u32> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (_file, mut session) = cpu_session(stem, 512);
    let logits = session.eval(&ids, LogitsMode::Last).expect("prefill");
    let first: Vec<String> = logits.iter().take(3).map(|v| format!("{v:.4}")).collect();
    println!("logits[..3] = {}", first.join(", "));
}
