//! `hearth serve`: an OpenAI-compatible HTTP server with continuous batching: up to `--max-batch`
//! requests generate together (a [`Scheduler`](hearth_core::scheduler::Scheduler) over a paged KV
//! cache whose prefix cache serves repeated prompt prefixes); more wait in a bounded queue.
//!
//! Threads: the accept loop spawns one thread per request (parsing, tokenizing, waiting,
//! streaming); one worker thread owns the scheduler and runs every step.

mod api;
mod completion;
mod error;
mod metrics;
mod worker;

use crate::load;
use crate::speculative::SpeculativeArgs;
use crate::ModelArgs;
use anyhow::{anyhow, Context, Result};
use api::Endpoint;
use clap::Args;
use error::ApiError;
use hearth_core::scheduler::{Scheduler, SchedulerOptions};
use hearth_core::speculative::{BatchedDraftModel, SpeculativeOptions};
use metrics::Metrics;
use serde_json::json;
use std::io::Read;
use std::sync::{mpsc, Arc};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (loopback by default; 0.0.0.0 exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/ endpoints.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Requests that may wait for a place in the batch; more are refused with 429.
    #[arg(long = "max-queue", default_value_t = 16)]
    pub max_queue: usize,
    /// Requests generated together (continuous batching); the KV pool is sized for this many
    /// full contexts unless --kv-memory says otherwise.
    #[arg(long = "max-batch", default_value_t = 8)]
    pub max_batch: usize,
    /// While requests stream, a step that also prefills new prompts may take at most this many
    /// times as long as the decode step alone (the step cost is learned as the server runs).
    /// Lower: smoother streams, slower first tokens for new requests. At least 1.
    #[arg(long = "max-stall", default_value_t = 2.0)]
    pub max_stall: f64,
    // Speculative decoding for every request (greedy outputs are unchanged): `--lookup` copies
    // drafts from the request's prompt and output, `--draft-model` drafts with a smaller model
    // of the same vocabulary (every request's drafts in shared passes), both draft by lookup
    // where the output copies and with the model elsewhere; each step verifies as many as pay
    // at the measured pass costs, weighed across the requests of the step. A request with a
    // prediction drafts from it by prompt lookup either way.
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
    /// The model's id in /v1/models and responses (default: the built-in name given to -m, or
    /// the file's name without .gguf; never a local path). Requests may name it by this id, the
    /// -m argument or the file name.
    #[arg(long)]
    pub alias: Option<String>,
}

impl ServeArgs {
    /// The scheduler's lookup settings; a flag that would be ignored is an error.
    fn lookup(&self) -> Result<Option<SpeculativeOptions>> {
        self.speculative.check()?;
        Ok(self.speculative.lookup_options())
    }
}

/// What every request thread shares.
pub struct State {
    queue: worker::Queue,
    prompter: worker::Prompter,
    metrics: Arc<Metrics>,
    /// The id reported by /v1/models.
    model_id: String,
    /// Names a request may use for the model: the id, the `-m` argument and the file name.
    model_names: Vec<String>,
    api_key: Option<String>,
}

pub fn serve(args: ServeArgs) -> Result<()> {
    let metrics = Arc::new(Metrics::default());
    let max_batch = args.max_batch.max(1);
    let (sender, jobs) = mpsc::sync_channel(max_batch + args.max_queue);
    let options = SchedulerOptions {
        max_batch,
        max_stall: args.max_stall,
        lookup: args.lookup()?,
        ..SchedulerOptions::default()
    };
    let (model_id, model_names, prompter) =
        spawn_worker(&args.model, &args.speculative, args.alias.clone(), options, jobs, metrics.clone())?;
    let server = tiny_http::Server::http((args.host.as_str(), args.port))
        .map_err(|e| anyhow!("cannot listen on {}:{}: {e}", args.host, args.port))?;
    let address = server.server_addr().to_ip().context("the server has no IP address")?;
    eprintln!("hearth serve: {model_id} listening on http://{address}");
    if let Some(draft) = &args.speculative.draft_model {
        eprintln!("hearth serve: every request drafts with {draft} (--draft-model), loaded");
    }
    let state = Arc::new(State {
        queue: worker::Queue::new(sender, max_batch, args.max_queue, metrics.clone()),
        prompter,
        metrics,
        model_id,
        model_names,
        api_key: args.api_key,
    });
    for request in server.incoming_requests() {
        let state = state.clone();
        std::thread::spawn(move || route(&state, request));
    }
    Ok(())
}

/// Loads the model on the worker thread (which then owns it) and waits until it is ready.
type Loaded = (String, Vec<String>, worker::Prompter);

fn spawn_worker(
    args: &ModelArgs,
    speculative: &SpeculativeArgs,
    alias: Option<String>,
    options: SchedulerOptions,
    jobs: mpsc::Receiver<worker::Job>,
    metrics: Arc<Metrics>,
) -> Result<Loaded> {
    let max_batch = options.max_batch;
    let (ready, loaded) = mpsc::channel::<Result<Loaded>>();
    let args = args.clone();
    let speculative = speculative.clone();
    std::thread::Builder::new().name("engine".into()).spawn(move || {
        match load_scheduler(&args, &speculative, max_batch) {
            Ok((l, draft)) => {
                let file = l.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let stem = l.path.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let n_ctx = l.runner.n_ctx();
                let options = SchedulerOptions { prefill_chunk: l.options.prefill_chunk, ..options };
                let mut scheduler = Scheduler::new(l.runner, l.tokenizer, options);
                let history = scheduler.token_history().clone();
                let prompter =
                    worker::Prompter { tokenizer: l.tokenizer_copy, chat_template: l.chat_template, n_ctx, history };
                if let Some(draft) = draft {
                    scheduler.set_draft_model(draft, speculative.options());
                }
                // Drafting requests' policies start from the costs of this machine's passes.
                let drafts = speculative.lookup || speculative.draft_model.is_some();
                if let Err(e) = drafts.then(|| crate::pass_costs::measure(&mut scheduler, args.quiet)).transpose() {
                    let _ = ready.send(Err(e));
                    return;
                }
                metrics.set_scheduler(scheduler.stats());
                // A path given to -m is not an id to show clients; the file's stem is.
                let given_a_path =
                    args.model.contains(['/', '\\']) || args.model.ends_with(".gguf") || args.model.contains("://");
                let id = alias.unwrap_or_else(|| if given_a_path { stem.clone() } else { args.model.clone() });
                let names = vec![id.clone(), args.model.clone(), file, stem];
                if !args.quiet {
                    let backend = scheduler.runner().backend();
                    let variant = backend.variant().map(|v| format!(" ({v})")).unwrap_or_default();
                    eprintln!("hearth serve: {id}: {} on {}{variant}", scheduler.runner().parameters(), backend.name());
                }
                let _ = ready.send(Ok((id, names, prompter)));
                worker::run(scheduler, jobs, metrics, max_batch);
            }
            Err(e) => {
                let _ = ready.send(Err(e));
            }
        }
    })?;
    loaded.recv().context("the engine thread stopped while loading")?
}

/// The model and, with `--draft-model`, its draft model, both with a KV pool for `max_batch`
/// requests.
fn load_scheduler(
    args: &ModelArgs,
    speculative: &SpeculativeArgs,
    max_batch: usize,
) -> Result<(load::LoadedRunner, Option<BatchedDraftModel>)> {
    let loaded = load::load_runner(args, max_batch)?;
    let draft = speculative.batched_draft_model(args, &loaded.tokenizer, max_batch)?;
    Ok((loaded, draft))
}

fn route(state: &State, request: tiny_http::Request) {
    let received = Instant::now();
    let method = request.method().as_str().to_ascii_uppercase();
    let path = request.url().split('?').next().unwrap_or("").to_string();
    let protected = path.starts_with("/v1/");
    let status = if protected && !authorized(state, &request) {
        respond_error(request, &ApiError::unauthorized())
    } else {
        match (method.as_str(), path.as_str()) {
            ("POST", "/v1/chat/completions") => completion::handle(state, request, Endpoint::Chat, received),
            ("POST", "/v1/completions") => completion::handle(state, request, Endpoint::Completions, received),
            ("GET", "/v1/models") => respond_json(request, 200, &models(state)),
            ("GET", "/health") => {
                let status =
                    if state.metrics.device_lost.load(std::sync::atomic::Ordering::SeqCst) { 503 } else { 200 };
                respond_json(request, status, &health(state))
            }
            ("GET", "/metrics") => respond_text(request, 200, &state.metrics.render(), "text/plain; version=0.0.4"),
            (_, "/v1/chat/completions" | "/v1/completions" | "/v1/models" | "/health" | "/metrics") => {
                respond_error(request, &ApiError::method_not_allowed(&method, &path))
            }
            _ => {
                respond_error(request, &ApiError::not_found(format!("No route {method} {path}."), None, "unknown_url"))
            }
        }
    };
    state.metrics.count_request(&path_label(&path), status);
}

/// Unknown paths share one label so that scanners cannot grow the metrics without bound.
fn path_label(path: &str) -> String {
    match path {
        "/v1/chat/completions" | "/v1/completions" | "/v1/models" | "/health" | "/metrics" => path.to_string(),
        _ => "other".to_string(),
    }
}

fn authorized(state: &State, request: &tiny_http::Request) -> bool {
    let Some(key) = &state.api_key else { return true };
    request
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .and_then(|h| h.value.as_str().strip_prefix("Bearer "))
        .is_some_and(|given| given.trim() == key)
}

fn health(state: &State) -> serde_json::Value {
    let stats = state.metrics.scheduler();
    let lost = state.metrics.device_lost.load(std::sync::atomic::Ordering::SeqCst);
    json!({
        "status": if lost { "device_lost" } else { "ok" },
        "running": stats.running,
        "waiting": state.metrics.waiting(),
        "kv_blocks_used": stats.kv_blocks_used,
        "kv_blocks_total": stats.kv_blocks_total,
    })
}

fn models(state: &State) -> serde_json::Value {
    json!({"object": "list", "data": [{"id": state.model_id, "object": "model", "created": completion::unix_now(), "owned_by": "hearth"}]})
}

/// Request bodies above this are refused (a prompt filling any supported context is far smaller).
const MAX_BODY_BYTES: u64 = 32 << 20;

fn read_body(request: &mut tiny_http::Request) -> Result<Vec<u8>, ApiError> {
    let mut body = Vec::new();
    request
        .as_reader()
        .take(MAX_BODY_BYTES + 1)
        .read_to_end(&mut body)
        .map_err(|e| ApiError::bad_request(format!("Cannot read the request body: {e}"), None, None))?;
    if body.len() as u64 > MAX_BODY_BYTES {
        return Err(ApiError { status: 413, ..ApiError::bad_request("The request body is too large.", None, None) });
    }
    Ok(body)
}

fn respond_text(request: tiny_http::Request, status: u16, body: &str, content_type: &str) -> u16 {
    let header = tiny_http::Header::from_bytes("Content-Type", content_type).ok();
    let mut response = tiny_http::Response::from_string(body).with_status_code(status);
    if let Some(h) = header {
        response = response.with_header(h);
    }
    // The client may have gone; there is no one left to tell.
    let _ = request.respond(response);
    status
}

fn respond_json(request: tiny_http::Request, status: u16, body: &serde_json::Value) -> u16 {
    respond_text(request, status, &body.to_string(), "application/json")
}

fn respond_error(request: tiny_http::Request, error: &ApiError) -> u16 {
    respond_json(request, error.status, &error.body())
}
