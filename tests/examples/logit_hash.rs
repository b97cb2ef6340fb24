//! A hash of every bit of the logits of a 600-token prefill (three chunks) and 24 greedy decode
//! steps, per real model and KV type (f16, q8_0, f32), on the CPU backend. For a change that must
//! keep the CPU oracle's results bit for bit (a faster kernel): run it before and after and
//! compare. (A hash is not a test: it differs between CPUs with different kernels.)
//! `cargo run --release -p hearth-tests --example logit_hash`
use hearth_core::engine::EngineOptions;
use hearth_core::graph::LogitsMode;
use hearth_core::kv::KvType;
use hearth_tests::*;

/// FNV-1a over the bits of `values`.
fn feed(values: &[f32], h: &mut u64) {
    for x in values {
        *h = (*h ^ x.to_bits() as u64).wrapping_mul(0x100000001b3);
    }
}

fn main() {
    for stem in [QWEN_05B, GEMMA_270M, QWEN_15B] {
        for kv in [KvType::F16, KvType::Q8_0, KvType::F32] {
            let options = EngineOptions { n_ctx: 1024, kv_type: kv, ..EngineOptions::default() };
            let (_f, mut s) = cpu_session_with(stem, &options);
            let ids: Vec<u32> = (0..600u32).map(|i| (i.wrapping_mul(2654435761) >> 8) % 30000 + 100).collect();
            let mut h = 0xcbf29ce484222325u64;
            let logits = s.eval(&ids, LogitsMode::All).expect("prefill").to_vec();
            feed(&logits, &mut h);
            let n_vocab = s.config().n_vocab;
            let mut next = argmax(&logits[logits.len() - n_vocab..]) as u32;
            for _ in 0..24 {
                let l = s.eval(&[next], LogitsMode::Last).expect("decode").to_vec();
                feed(&l, &mut h);
                next = argmax(&l) as u32;
            }
            println!("{stem} {kv:?}: {h:016x}");
        }
    }
}
