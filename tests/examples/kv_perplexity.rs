//! Perplexity of a built-in model with a given KV storage type, for docs/BENCHMARKS.md:
//! `cargo run --release -p hearth-tests --example kv_perplexity -- MODEL_STEM KV_TYPE [CHUNKS]`
//! (MODEL_STEM as in the cache, e.g. qwen2.5-coder-0.5b-instruct-q4_k_m; KV_TYPE f16|q8_0|q4_0|f32).

use hearth_core::kv::KvType;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(stem), Some(ty)) = (args.first(), args.get(1)) else {
        eprintln!("usage: kv_perplexity MODEL_STEM KV_TYPE [CHUNKS]");
        std::process::exit(2);
    };
    let kv_type = KvType::parse(ty).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let chunks = args.get(2).and_then(|c| c.parse().ok()).unwrap_or(usize::MAX);
    let (ppl, _) = hearth_tests::perplexity_with(stem, kv_type, chunks);
    println!(
        "{stem} kv={} chunks={} perplexity={ppl:.4}",
        kv_type.name(),
        if chunks == usize::MAX { "all".into() } else { chunks.to_string() }
    );
}
