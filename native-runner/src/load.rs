//! Resolving `-m`, choosing a backend and loading a model with a progress bar.

use crate::{fetch, ModelArgs};
use anyhow::{bail, Context, Result};
use hearth_core::backend::{Backend, BackendKind};
use hearth_core::chat::ChatTemplate;
use hearth_core::engine::{Engine, EngineOptions, Session};
use hearth_core::gguf::GgufFile;
use hearth_core::runner::Runner;
use hearth_core::tokenizer::Tokenizer;
use hearth_core::CoreError;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::Instant;

pub struct Loaded {
    pub engine: Engine,
    pub path: PathBuf,
    pub load_ms: f64,
}

/// Opens the backend `--backend` names. For `auto`: wgpu when a real GPU adapter opens (a software
/// adapter such as lavapipe or WARP is slower than the CPU backend), else the CPU.
fn backend(args: &ModelArgs) -> Result<Box<dyn Backend>> {
    // Mesa's Vulkan drivers print "XDG_RUNTIME_DIR is invalid" on every probe of a headless
    // machine without a session dir; give them one so `--backend auto` stays quiet.
    if args.backend != BackendKind::Cpu && std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let numerics = args.numerics;
    if numerics == hearth_cpu::Numerics::LlamaCpp && !matches!(args.backend, BackendKind::Auto | BackendKind::Cpu) {
        bail!("--numerics llama-cpp is the CPU backend's; it cannot run on backend '{}'", args.backend);
    }
    let env = hearth_wgpu::WgpuOptions::from_env();
    let wgpu_options = hearth_wgpu::WgpuOptions { profile: args.wgpu_profile || env.profile, ..env };
    let open_wgpu = || hearth_wgpu::WgpuBackend::new(wgpu_options.clone());
    if args.moe_offload {
        let device: Box<dyn Backend> = match args.backend {
            BackendKind::Wgpu => Box::new(open_wgpu()?),
            BackendKind::Auto => match open_wgpu() {
                Ok(b) if b.info().device_type != "Cpu" => Box::new(b),
                _ => {
                    if !args.quiet {
                        eprintln!("--moe-offload: no GPU adapter; everything runs on the CPU");
                    }
                    return cpu_backend(args);
                }
            },
            other => bail!(
                "--moe-offload keeps the experts on the CPU beside a GPU backend; it cannot run on backend '{other}'"
            ),
        };
        return Ok(Box::new(hearth_core::offload::ExpertOffload::new(device, cpu_backend(args)?)));
    }
    match args.backend {
        BackendKind::Cpu => cpu_backend(args),
        BackendKind::Auto if numerics == hearth_cpu::Numerics::LlamaCpp => cpu_backend(args),
        BackendKind::Wgpu => Ok(Box::new(open_wgpu()?)),
        BackendKind::Auto => match open_wgpu() {
            Ok(b) if b.info().device_type != "Cpu" => Ok(Box::new(b)),
            _ => cpu_backend(args),
        },
        BackendKind::Cuda => bail!("backend 'cuda' is not available in this build (available: auto, cpu, wgpu)"),
    }
}

fn cpu_backend(args: &ModelArgs) -> Result<Box<dyn Backend>> {
    let options =
        hearth_cpu::CpuOptions { threads: args.threads, numerics: args.numerics, ..hearth_cpu::CpuOptions::from_env() };
    Ok(Box::new(hearth_cpu::CpuBackend::with_options(options)?))
}

/// Loads onto the backend `--backend` names; with `auto`, a model the GPU backend refuses (a
/// weight type it has no kernel for) is loaded on the CPU instead, with a note on stderr.
pub fn load_with<T>(args: &ModelArgs, mut load: impl FnMut(Box<dyn Backend>) -> hearth_core::Result<T>) -> Result<T> {
    let backend = backend(args)?;
    let name = backend.name().to_string();
    match load(backend) {
        Err(CoreError::Unsupported { what, .. }) if args.backend == BackendKind::Auto && name != "cpu" => {
            if !args.quiet {
                eprintln!("the {name} backend does not support {what}; running on the CPU");
            }
            Ok(load(cpu_backend(args)?)?)
        }
        other => Ok(other?),
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
    let engine = load_with(args, |backend| {
        Engine::load(&file, backend, &options, &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        })
    })
    .with_context(|| format!("loading {}", path.display()))?;
    bar.finish_and_clear();
    Ok(Loaded { engine, path, load_ms: start.elapsed().as_secs_f64() * 1e3 })
}

/// [`load`], as a [`Session`] that evaluates tokens directly (benchmarks): the engine's runner
/// with one sequence.
pub fn load_session(args: &ModelArgs) -> Result<(Session, PathBuf, f64)> {
    let Loaded { engine, path, load_ms } = load(args)?;
    let (runner, _, _) = engine.into_parts();
    Ok((Session::from_runner(runner, engine_options(args, 1)?.prefill_chunk), path, load_ms))
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
    let kv_type = args.kv_type;
    Ok(EngineOptions {
        n_ctx: args.ctx_size,
        kv_type,
        kv_memory: args.kv_memory,
        max_sequences,
        ..EngineOptions::default()
    })
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
    let runner = load_with(args, |backend| Runner::load(&file, backend, &options, &mut |_, _| {}))
        .with_context(|| format!("loading {}", path.display()))?;
    Ok(LoadedRunner { runner, tokenizer, tokenizer_copy, chat_template, path, options })
}
