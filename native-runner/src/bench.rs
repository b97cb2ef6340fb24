//! `hearth bench`: prefill and decode throughput on synthetic prompts, llama-bench style
//! (pp = prompt processing of P tokens, tg = generation of N tokens), repeated R times. With
//! `--server URL` it load-tests a running server instead (see [`crate::bench_server`]).

use crate::load;
use crate::ModelArgs;
use anyhow::{bail, Result};
use clap::Args;
use hearth_core::backend::{KernelTime, Readback};
use hearth_core::engine::Session;
use hearth_core::runner::StepOutput;
use hearth_core::sampling::argmax;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens to prefill.
    #[arg(short = 'p', long = "prompt-tokens", default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens to generate.
    #[arg(short = 'n', long = "gen-tokens", default_value_t = 128)]
    pub gen_tokens: usize,
    /// Repetitions.
    #[arg(short = 'r', long = "reps", default_value_t = 3)]
    pub reps: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Measure time to first token with this many prompt tokens already in the prefix cache
    /// (vs computed from scratch); --prompt-tokens is then the new suffix.
    #[arg(long = "cached-prefix", default_value_t = 0)]
    pub cached_prefix: usize,
    /// Read every step's whole logits row back and take the argmax on the host (the default
    /// reads back only the backend's top 1, as greedy generation does).
    #[arg(long = "full-logits")]
    pub full_logits: bool,
    /// Time every GPU kernel with device timestamps (wgpu, natively): device time per kernel
    /// family per decode token, dispatches per token and the weight bytes each family reads.
    /// Steps wait for their timestamps, so tok/s is lower while profiling.
    #[arg(long)]
    pub profile: bool,
    #[command(flatten)]
    pub server: crate::bench_server::ServerBenchArgs,
}

#[derive(serde::Serialize)]
pub(crate) struct Stat {
    pub mean: f64,
    pub sd: f64,
}

pub(crate) fn stat(v: &[f64]) -> Stat {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 { v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    Stat { mean, sd: var.sqrt() }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// CPU time this thread has run (Linux: /proc/thread-self/schedstat, in ns); None elsewhere.
fn thread_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse::<u64>().ok().map(Duration::from_nanos)
}

/// One greedy step: evaluates `tokens`, returns the next token.
fn greedy_step(session: &mut Session, tokens: &[u32], readback: Readback) -> Result<u32> {
    Ok(match session.eval_for(tokens, readback)? {
        StepOutput::Logits(logits) => argmax(logits),
        StepOutput::TopK(top) => top.ids.first().copied().unwrap_or(0),
    })
}

/// Peak resident set size of this process (VmHWM), in bytes; 0 where unavailable.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()))
        })
        .map_or(0, |kb| kb * 1024)
}

pub fn bench(args: BenchArgs) -> Result<()> {
    if let Some(url) = &args.server.server {
        return crate::bench_server::run(url, &args.server, args.json);
    }
    if args.cached_prefix > 0 {
        return crate::bench_prefix::bench_cached_prefix(&args);
    }
    if args.prompt_tokens == 0 || args.reps == 0 {
        bail!("--prompt-tokens and --reps must be at least 1");
    }
    let mut model_args = args.model.clone();
    model_args.wgpu_profile = args.profile;
    if model_args.ctx_size == 0 {
        model_args.ctx_size = args.prompt_tokens + args.gen_tokens + 1;
    }
    let (mut session, path, load_ms) = load::load_session(&model_args)?;
    let load_peak_rss = peak_rss_bytes();
    let session = &mut session;
    if args.profile && session.kernel_profile().is_none() {
        bail!("--profile needs --backend wgpu on an adapter with GPU timestamps inside compute passes");
    }
    let mut profile = Vec::new();
    let n_vocab = session.config().n_vocab;
    // Ordinary tokens (skipping the low ids some vocabularies reserve), deterministic across runs.
    let prompt: Vec<u32> =
        (0..args.prompt_tokens).map(|i| (1000 + (i * 7919) % 20000).min(n_vocab - 1) as u32).collect();

    let readback = if args.full_logits { Readback::Logits } else { Readback::TopK(1) };
    let (mut pp, mut tg, mut ttft, mut itl) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Per decode token: wall time minus the time spent waiting for the backend to finish the
    // step (the host's share: recording, submitting, reading back, sampling), and this thread's
    // CPU time.
    let (mut host_ms, mut thread_cpu_ms) = (Vec::new(), Vec::new());
    // Backend counters over the decode steps of the last repetition (after warm-up): what one
    // token costs in dispatched ops, submits and (should be zero) pipeline/bind-group creations.
    let mut decode_counters = (session.backend().counters(), session.backend().counters());
    // One untimed warm-up round pages the weights in and builds the graphs.
    for rep in 0..=args.reps {
        session.reset();
        let start = Instant::now();
        let mut next = greedy_step(session, &prompt, readback)?;
        let prefill_s = start.elapsed().as_secs_f64();
        let mut steps = Vec::with_capacity(args.gen_tokens);
        decode_counters.0 = session.backend().counters();
        session.kernel_profile();
        let (wait0, cpu0, decode_start) = (session.runner().device_wait(), thread_cpu_time(), Instant::now());
        for _ in 0..args.gen_tokens {
            let t = Instant::now();
            next = greedy_step(session, &[next], readback)?;
            steps.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (wait1, cpu1, decode_wall) = (session.runner().device_wait(), thread_cpu_time(), decode_start.elapsed());
        decode_counters.1 = session.backend().counters();
        profile = session.kernel_profile().unwrap_or_default();
        if rep == 0 {
            continue;
        }
        let per_token_ms = |d: Duration| d.as_secs_f64() * 1e3 / args.gen_tokens.max(1) as f64;
        host_ms.push(per_token_ms(decode_wall.saturating_sub(wait1 - wait0)));
        if let (Some(a), Some(b)) = (cpu0, cpu1) {
            thread_cpu_ms.push(per_token_ms(b.saturating_sub(a)));
        }
        pp.push(args.prompt_tokens as f64 / prefill_s);
        ttft.push(prefill_s * 1e3);
        if !steps.is_empty() {
            tg.push(steps.len() as f64 / (steps.iter().sum::<f64>() / 1e3));
        }
        itl.extend(steps);
    }
    itl.sort_by(|a, b| a.total_cmp(b));
    let counters = session.backend().counters();
    let (before, after) = &decode_counters;
    let per_token = |a: u64, b: u64| (b - a) as f64 / args.gen_tokens.max(1) as f64;
    let report = serde_json::json!({
        "model": path.display().to_string(),
        "parameters": { "total": session.parameters().total, "active": session.parameters().active },
        "backend": session.backend().name(),
        "backend_variant": session.backend().variant(),
        "threads": args.model.threads,
        "prompt_tokens": args.prompt_tokens,
        "gen_tokens": args.gen_tokens,
        "reps": args.reps,
        "load_ms": load_ms,
        "prefill_tok_s": stat(&pp),
        "decode_tok_s": stat(&tg),
        "ttft_ms": stat(&ttft),
        "itl_ms": { "p50": percentile(&itl, 50.0), "p95": percentile(&itl, 95.0), "p99": percentile(&itl, 99.0) },
        "peak_rss_bytes": peak_rss_bytes(),
        "load_peak_rss_bytes": load_peak_rss,
        "backend_memory_bytes": session.backend().memory_bytes(),
        "kv_bytes_per_token": session.kv_bytes_per_token(),
        "graphs_compiled": counters.graphs_compiled,
        "per_decode_token": {
            "graph_ops": per_token(before.ops_executed, after.ops_executed),
            "dispatches": per_token(before.dispatches, after.dispatches),
            "submits": per_token(before.submits, after.submits),
            "pipelines_created": per_token(before.pipelines_created, after.pipelines_created),
            "bind_groups_created": per_token(before.bind_groups_created, after.bind_groups_created),
            "bytes_read_back": per_token(before.bytes_read_back, after.bytes_read_back),
            "host_ms": stat(&host_ms),
            "thread_cpu_ms": stat(&thread_cpu_ms),
        },
        "readback": if args.full_logits { "logits" } else { "top1" },
        "profile_per_decode_token": profile_rows(&profile, args.gen_tokens),
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let (p, g) = (stat(&pp), stat(&tg));
        println!("model      {} ({})", path.display(), session.parameters());
        let variant = session.backend().variant().map(|v| format!(", {v}")).unwrap_or_default();
        println!("backend    {}{variant} ({} reps after 1 warm-up)", session.backend().name(), args.reps);
        println!("prefill    pp{:<5} {:>8.1} ± {:.1} tok/s", args.prompt_tokens, p.mean, p.sd);
        println!("decode     tg{:<5} {:>8.1} ± {:.1} tok/s", args.gen_tokens, g.mean, g.sd);
        println!("ttft       {:>8.1} ms", stat(&ttft).mean);
        println!(
            "itl        p50 {:.2} ms  p95 {:.2} ms  p99 {:.2} ms",
            percentile(&itl, 50.0),
            percentile(&itl, 95.0),
            percentile(&itl, 99.0)
        );
        println!(
            "peak rss   {:.0} MiB (after load {:.0} MiB)",
            peak_rss_bytes() as f64 / 1048576.0,
            load_peak_rss as f64 / 1048576.0
        );
        println!("load       {load_ms:.0} ms");
        println!(
            "per token  {:.0} graph ops, {:.0} dispatches, {:.1} submits, {:.1} pipelines and {:.1} bind groups created",
            per_token(before.ops_executed, after.ops_executed),
            per_token(before.dispatches, after.dispatches),
            per_token(before.submits, after.submits),
            per_token(before.pipelines_created, after.pipelines_created),
            per_token(before.bind_groups_created, after.bind_groups_created)
        );
        println!(
            "per token  {:.0} bytes read back ({}), host {:.2} ms (wall minus GPU wait), thread CPU {:.2} ms",
            per_token(before.bytes_read_back, after.bytes_read_back),
            if args.full_logits { "whole logits row" } else { "top 1" },
            stat(&host_ms).mean,
            stat(&thread_cpu_ms).mean
        );
        print_profile(&profile, args.gen_tokens);
    }
    Ok(())
}

/// Per decode token, by kernel family (most time first): dispatches, device µs, weight bytes.
fn profile_rows(profile: &[KernelTime], tokens: usize) -> Vec<serde_json::Value> {
    let per_token = |v: u64| v as f64 / tokens.max(1) as f64;
    let mut rows: Vec<&KernelTime> = profile.iter().collect();
    rows.sort_by_key(|k| std::cmp::Reverse(k.nanos));
    rows.iter()
        .map(|k| {
            serde_json::json!({
                "family": k.family,
                "dispatches": per_token(k.dispatches),
                "device_us": per_token(k.nanos) / 1e3,
                "weight_bytes": per_token(k.weight_bytes),
            })
        })
        .collect()
}

fn print_profile(profile: &[KernelTime], tokens: usize) {
    if profile.is_empty() {
        return;
    }
    let per_token = |v: u64| v as f64 / tokens.max(1) as f64;
    let total_ns: u64 = profile.iter().map(|k| k.nanos).sum();
    let total_bytes: u64 = profile.iter().map(|k| k.weight_bytes).sum();
    println!(
        "profile    device time per decode token by kernel family (GPU timestamps): {:.0} µs in {:.0} dispatches, {:.1} MB of weights ({:.1} GB/s)",
        per_token(total_ns) / 1e3,
        per_token(profile.iter().map(|k| k.dispatches).sum()),
        per_token(total_bytes) / 1e6,
        total_bytes as f64 / total_ns.max(1) as f64
    );
    println!("  {:<26} {:>10} {:>12} {:>7} {:>12} {:>8}", "family", "dispatches", "µs", "share", "weights MB", "GB/s");
    let mut rows: Vec<&KernelTime> = profile.iter().collect();
    rows.sort_by_key(|k| std::cmp::Reverse(k.nanos));
    for k in rows {
        let gbps = if k.weight_bytes > 0 {
            format!("{:.1}", k.weight_bytes as f64 / k.nanos.max(1) as f64)
        } else {
            "-".into()
        };
        println!(
            "  {:<26} {:>10.0} {:>12.1} {:>6.1}% {:>12.2} {:>8}",
            k.family,
            per_token(k.dispatches),
            per_token(k.nanos) / 1e3,
            100.0 * k.nanos as f64 / total_ns.max(1) as f64,
            per_token(k.weight_bytes) / 1e6,
            gbps
        );
    }
}
