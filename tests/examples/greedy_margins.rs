//! Reference margins for comparisons that tolerate near-ties: greedy-decodes on the CPU backend
//! (prompt in one prefill, then one token per step, as `hearth run` does) and prints, per step,
//! the chosen token and the top-1/top-2 logit gap (= the log-probability gap, in nats).
//! `cargo run --release -p hearth-tests --example greedy_margins -- <model.gguf> <n_tokens> <prompt ids...>`
//! Prints `{"tokens": [n_tokens ids], "margins": [n_tokens gaps]}` (used by tests/fixtures/browser/generate.sh).
use hearth_core::graph::LogitsMode;
use hearth_tests::cpu_session_at;
use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(path), Some(n_tokens)) = (args.first(), args.get(1).and_then(|n| n.parse::<usize>().ok())) else {
        eprintln!("usage: greedy_margins <model.gguf> <n_tokens> <prompt ids...>");
        std::process::exit(2);
    };
    let prompt: Vec<u32> =
        args[2..].iter().map(|a| a.parse().unwrap_or_else(|_| panic!("not a token id: {a}"))).collect();
    assert!(!prompt.is_empty(), "no prompt ids");
    let (_file, mut session) = cpu_session_at(&PathBuf::from(path), 4096);
    let mut input = prompt;
    let (mut tokens, mut margins) = (Vec::new(), Vec::new());
    for _ in 0..n_tokens {
        let logits = session.eval(&input, LogitsMode::Last).expect("eval");
        let (best, gap) = top_two_gap(logits);
        tokens.push(best);
        margins.push(gap);
        input = vec![best];
    }
    let margins: Vec<String> = margins.iter().map(|m| format!("{m:.4}")).collect();
    println!("{{\"tokens\": {tokens:?}, \"margins\": [{}]}}", margins.join(", "));
}

/// The argmax of `logits` and how far the runner-up is below it.
fn top_two_gap(logits: &[f32]) -> (u32, f32) {
    let (mut best, mut first, mut second) = (0usize, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &l) in logits.iter().enumerate() {
        if l > first {
            (second, first, best) = (first, l, i);
        } else if l > second {
            second = l;
        }
    }
    (best as u32, first - second)
}
