//! How far a KV storage type moves a model's predictions from the f32 KV cache (the exact
//! oracle): mean KL divergence of the next-token distributions and top-1 agreement over the
//! scored positions of the perplexity text (512-token chunks, second halves, as
//! `kv_perplexity`). Far less noisy than a perplexity difference, which can go either way.
//! `cargo run --release -p hearth-tests --example kv_kld -- MODEL_STEM KV_TYPE [CHUNKS]`

use hearth_core::engine::EngineOptions;
use hearth_core::graph::LogitsMode;
use hearth_core::kv::KvType;
use hearth_tests::*;

const N_CTX: usize = 512;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(stem), Some(ty)) = (args.first(), args.get(1)) else {
        eprintln!("usage: kv_kld MODEL_STEM KV_TYPE [CHUNKS]");
        std::process::exit(2);
    };
    let kv_type = KvType::parse(ty).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let chunks = args.get(2).and_then(|c| c.parse().ok()).unwrap_or(usize::MAX);
    let text = std::fs::read_to_string(fixtures_dir().join("golden/ppl_gpl3_4k.txt")).expect("text");
    let (file, mut oracle) =
        cpu_session_with(stem, &EngineOptions { n_ctx: N_CTX, kv_type: KvType::F32, ..EngineOptions::default() });
    let (_, mut tested) = cpu_session_with(stem, &EngineOptions { n_ctx: N_CTX, kv_type, ..EngineOptions::default() });
    let tokenizer = hearth_core::tokenizer::Tokenizer::from_gguf(&file.metadata).expect("tokenizer");
    let add_bos = tokenizer.add_bos_default();
    let tokens = tokenizer.encode(&text, add_bos, false).expect("tokenize");
    let n_vocab = oracle.config().n_vocab;
    let (mut kld, mut same_top, mut count) = (0f64, 0usize, 0usize);
    let (mut nll_oracle, mut nll_tested) = (0f64, 0f64);
    for chunk in tokens.chunks_exact(N_CTX).take(chunks) {
        let mut input = chunk.to_vec();
        if add_bos {
            input[0] = tokenizer.bos().expect("bos");
        }
        oracle.reset();
        tested.reset();
        let want = oracle.eval(&input, LogitsMode::All).expect("eval f32");
        let got = tested.eval(&input, LogitsMode::All).expect("eval");
        for pos in N_CTX / 2..N_CTX - 1 {
            let row = pos * n_vocab..(pos + 1) * n_vocab;
            let (p, q) = (log_softmax(&want[row.clone()]), log_softmax(&got[row.clone()]));
            kld += p.iter().zip(&q).map(|(&lp, &lq)| (lp as f64).exp() * (lp - lq) as f64).sum::<f64>();
            same_top += usize::from(argmax(&want[row.clone()]) == argmax(&got[row]));
            nll_oracle -= p[input[pos + 1] as usize] as f64;
            nll_tested -= q[input[pos + 1] as usize] as f64;
            count += 1;
        }
    }
    let n = count as f64;
    println!(
        "{stem} kv={} vs f32: mean KLD {:.6}, same top-1 {:.2}%, perplexity {:.4} (f32 {:.4}), {count} positions",
        kv_type.name(),
        kld / n,
        100.0 * same_top as f64 / n,
        (nll_tested / n).exp(),
        (nll_oracle / n).exp()
    );
}
