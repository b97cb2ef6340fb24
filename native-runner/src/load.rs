//! Resolving `-m`, choosing a backend and loading a model with a progress bar.

use crate::{fetch, ModelArgs};
use anyhow::{bail, Context, Result};
use hearth_core::backend::Backend;
use hearth_core::engine::{Engine, EngineOptions};
use hearth_core::kv::KvType;
use hearth_core::chat::ChatTemplate;
use hearth_core::gguf::GgufFile;
use hearth_core::runner::Runner;
use hearth_core::tokenizer::Tokenizer;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::Instant;

pub struct Loaded {
    pub engine: Engine,
    pub path: PathBuf,
    pub load_ms: f64,
}

pub fn backend(args: &ModelArgs) -> Result<Box<dyn Backend>> {
    // Mesa's Vulkan drivers print "XDG_RUNTIME_DIR is invalid" on every probe of a headless
    // machine without a session dir; give them one so `--backend auto` stays quiet.
    if args.backend != "cpu" && std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let numerics = match args.numerics.as_str() {
        "hearth" => hearth_cpu::Numerics::Hearth,
        "llama-cpp" => hearth_cpu::Numerics::LlamaCpp,
        other => bail!("unknown numerics '{other}' (expected hearth or llama-cpp)"),
    };
    let cpu = || -> Result<Box<dyn Backend>> { Ok(Box::new(hearth_cpu::CpuBackend::new(args.threads)?.with_numerics(numerics))) };
    let open_wgpu = || hearth_wgpu::WgpuBackend::new(hearth_wgpu::WgpuOptions::from_env());
    if numerics == hearth_cpu::Numerics::LlamaCpp {
        return match args.backend.as_str() {
            "auto" | "cpu" => cpu(),
            other => bail!("--numerics llama-cpp is the CPU backend's; it cannot run on backend '{other}'"),
        };
    }
    match args.backend.as_str() {
        "cpu" => cpu(),
        "wgpu" => Ok(Box::new(open_wgpu()?)),
        // wgpu when a real GPU adapter opens; a software adapter (lavapipe, WARP) would be slower
        // than the CPU backend, so then and without any adapter it is the CPU.
        "auto" => match open_wgpu() {
            Ok(b) if b.info().device_type != "Cpu" => Ok(Box::new(b)),
            _ => cpu(),
        },
        "cuda" => bail!("backend 'cuda' is not available in this build (available: auto, cpu, wgpu)"),
        other => bail!("unknown backend '{other}' (expected auto, cpu or wgpu)"),
    }
}

pub fn open(args: &ModelArgs) -> Result<(GgufFile, PathBuf)> {
    let path = fetch::resolve_model(&args.model, !args.quiet)?;
    let file = GgufFile::open(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok((file, path))
}

pub fn load(args: &ModelArgs) -> Result<Loaded> {
    let start = Instant::now();
    let (file, path) = open(args)?;
    let bar = progress_bar(&path, args.quiet);
    let options = engine_options(args, 1)?;
    let engine = Engine::load(&file, backend(args)?, &options, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .with_context(|| format!("loading {}", path.display()))?;
    bar.finish_and_clear();
    Ok(Loaded { engine, path, load_ms: start.elapsed().as_secs_f64() * 1e3 })
}

/// The stderr bar of a model's weights being loaded (hidden with `quiet`): set its length and
/// position from the loader's (done, total) bytes, clear it when done.
pub fn progress_bar(path: &std::path::Path, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {bytes}/{total_bytes}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    bar
}

/// Engine options from the command line, for `max_sequences` concurrent requests.
pub fn engine_options(args: &ModelArgs, max_sequences: usize) -> Result<EngineOptions> {
    let kv_type = KvType::parse(&args.kv_type)?;
    Ok(EngineOptions { n_ctx: args.ctx_size, kv_type, kv_memory: args.kv_memory, max_sequences, ..EngineOptions::default() })
}

/// A multi-sequence [`Runner`] (for the batching scheduler) with its tokenizer and chat template.
pub struct LoadedRunner {
    pub runner: Runner,
    pub tokenizer: Tokenizer,
    /// A second tokenizer for threads other than the runner's (Tokenizer is not Clone).
    pub tokenizer_copy: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub path: PathBuf,
    pub options: EngineOptions,
}

/// Loads the model with a KV pool for `max_sequences` concurrent sequences (no progress bar).
pub fn load_runner(args: &ModelArgs, max_sequences: usize) -> Result<LoadedRunner> {
    let (file, path) = open(args)?;
    let options = engine_options(args, max_sequences)?;
    let tokenizer = Tokenizer::from_gguf(&file.metadata).context("reading the tokenizer")?;
    let tokenizer_copy = Tokenizer::from_gguf(&file.metadata).context("reading the tokenizer")?;
    let chat_template = ChatTemplate::from_gguf(&file.metadata).context("reading the chat template")?;
    let runner = Runner::load(&file, backend(args)?, &options, &mut |_, _| {}).with_context(|| format!("loading {}", path.display()))?;
    Ok(LoadedRunner { runner, tokenizer, tokenizer_copy, chat_template, path, options })
}

/// Tokenizes text produced by a chat template: the template writes BOS itself when the model
/// wants it, so the tokenizer must not add a second one.
pub fn tokenize_prompt(engine: &Engine, text: &str, templated: bool) -> Result<Vec<u32>> {
    tokenize_with(engine.tokenizer(), text, templated)
}

pub fn tokenize_with(tok: &Tokenizer, text: &str, templated: bool) -> Result<Vec<u32>> {
    let mut add_bos = tok.add_bos_default();
    if templated {
        if let Some(bos) = tok.bos() {
            let bos_text = String::from_utf8_lossy(&tok.token_bytes(bos)).into_owned();
            if !bos_text.is_empty() && text.starts_with(&bos_text) {
                add_bos = false;
            }
        }
    }
    let ids = tok.encode(text, add_bos, true)?;
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    Ok(ids)
}
