//! `hearth bench --cached-prefix N`: time to first token of a request whose first N prompt tokens
//! (a long system prompt, say) are already in the prefix cache, against the same request computed
//! from scratch. Each warm request uses a different suffix, as different users would.

use crate::bench::{stat, BenchArgs};
use crate::load;
use anyhow::{bail, Result};
use hearth_core::engine::Session;
use hearth_core::graph::LogitsMode;
use hearth_core::sampling::argmax;
use std::time::Instant;

/// Evaluates `prompt` reusing whatever the KV/prefix cache holds; (TTFT ms, tokens reused).
fn time_to_first_token(session: &mut Session, prompt: &[u32]) -> Result<(f64, usize)> {
    let start = Instant::now();
    let reused = session.prepare_prompt(prompt)?;
    argmax(session.eval(&prompt[reused..], LogitsMode::Last)?);
    Ok((start.elapsed().as_secs_f64() * 1e3, reused))
}

pub fn bench_cached_prefix(args: &BenchArgs) -> Result<()> {
    let prefix_len = args.cached_prefix;
    let suffix_len = args.prompt_tokens.min(prefix_len).max(1);
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    let mut model_args = args.model.clone();
    if model_args.ctx_size == 0 {
        model_args.ctx_size = prefix_len + suffix_len + 1;
    }
    let (mut session, path, _) = load::load_session(&model_args)?;
    let session = &mut session;
    let n_vocab = session.config().n_vocab;
    let token = |i: usize| (1000 + (i * 7919) % 20000).min(n_vocab - 1) as u32;
    let prefix: Vec<u32> = (0..prefix_len).map(token).collect();
    let request = |rep: usize| -> Vec<u32> {
        prefix.iter().copied().chain((0..suffix_len).map(|i| token(50_000 + rep * 977 + i))).collect()
    };

    let (mut cold, mut warm, mut reused) = (Vec::new(), Vec::new(), 0);
    // Rep 0 is an untimed warm-up (pages weights in, builds graphs).
    for rep in 0..=args.reps {
        session.reset();
        session.clear_prefix_cache();
        let (ms, _) = time_to_first_token(session, &request(2 * rep))?;
        session.reset();
        let (warm_ms, r) = time_to_first_token(session, &request(2 * rep + 1))?;
        if rep > 0 {
            cold.push(ms);
            warm.push(warm_ms);
            reused = r;
        }
    }
    let (c, w) = (stat(&cold), stat(&warm));
    let report = serde_json::json!({
        "model": path.display().to_string(),
        "backend": session.backend().name(),
        "cached_prefix_tokens": prefix_len,
        "suffix_tokens": suffix_len,
        "tokens_reused": reused,
        "ttft_cold_ms": c,
        "ttft_cached_ms": w,
        "speedup": c.mean / w.mean.max(1e-9),
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("model        {}", path.display());
        println!(
            "prompt       {prefix_len} shared + {suffix_len} new tokens ({} reused from the prefix cache)",
            reused
        );
        println!("ttft cold    {:>9.1} ± {:.1} ms", c.mean, c.sd);
        println!("ttft cached  {:>9.1} ± {:.1} ms", w.mean, w.sd);
        println!("speedup      {:>9.1}x", c.mean / w.mean.max(1e-9));
    }
    Ok(())
}
