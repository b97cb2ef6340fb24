//! Perplexity on a fixed text (tests/fixtures/golden/ppl_gpl3_4k.txt) computed exactly as
//! `llama-perplexity -c 512` does (see tests/fixtures/golden/perplexity.json for the method), and
//! compared with llama.cpp's figure: within 1%.

use hearth_core::gguf::GgufFile;
use hearth_core::graph::LogitsMode;
use hearth_core::tokenizer::Tokenizer;
use hearth_tests::*;

const N_CTX: usize = 512;

fn perplexity(stem: &str) -> (f64, usize) {
    let text = std::fs::read_to_string(fixtures_dir().join("golden/ppl_gpl3_4k.txt")).expect("text");
    let file = GgufFile::open(&model_path(stem)).expect("open");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let add_bos = tokenizer.add_bos_default();
    let tokens = tokenizer.encode(&text, add_bos, false).expect("tokenize");
    let (_file, mut session) = cpu_session(stem, N_CTX);
    let n_vocab = session.config().n_vocab;
    let mut nll = 0f64;
    let mut count = 0usize;
    for chunk in tokens.chunks_exact(N_CTX) {
        let mut input = chunk.to_vec();
        if add_bos {
            input[0] = tokenizer.bos().expect("bos");
        }
        session.reset();
        let logits = session.eval(&input, LogitsMode::All).expect("eval");
        // Only the second half of each chunk is scored: positions 256..511 predict 257..512.
        for pos in N_CTX / 2..N_CTX - 1 {
            let lp = log_softmax(&logits[pos * n_vocab..(pos + 1) * n_vocab]);
            nll -= lp[input[pos + 1] as usize] as f64;
            count += 1;
        }
    }
    ((nll / count as f64).exp(), tokens.len())
}

fn check(stem: &str) {
    let reference = read_json("golden/perplexity.json");
    let want = reference["results"][stem]["ppl"].as_f64().expect("ppl");
    let want_tokens = reference["results"][stem]["n_tokens_in_file"].as_u64().expect("n_tokens") as usize;
    let (ppl, n_tokens) = perplexity(stem);
    eprintln!("{stem}: perplexity {ppl:.4} (llama.cpp {want:.4}), {n_tokens} tokens");
    assert_eq!(n_tokens, want_tokens, "tokenization of the text differs from llama.cpp");
    assert!((ppl - want).abs() / want < 0.01, "{stem}: perplexity {ppl:.4} is not within 1% of llama.cpp's {want:.4}");
}

#[test]
fn qwen_05b_perplexity_within_1_percent() {
    check(QWEN_05B);
}

#[test]
fn gemma_270m_perplexity_within_1_percent() {
    check(GEMMA_270M);
}
