//! Prometheus counters, gauges and histograms for `GET /metrics` (text exposition format 0.0.4).

use hearth_core::backend::ExpertTallies;
use hearth_core::engine::Generation;
use hearth_core::scheduler::SchedulerStats;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

/// Cumulative histogram with fixed upper bounds in seconds.
struct Histogram {
    bounds: &'static [f64],
    /// counts[i] = observations <= bounds[i]; the last slot is +Inf.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0 }
    }

    fn observe(&mut self, seconds: f64) {
        let slot = self.bounds.iter().position(|&b| seconds <= b).unwrap_or(self.bounds.len());
        self.counts[slot] += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            cumulative += count;
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.counts[self.bounds.len()];
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {cumulative}\n{name}_sum {}\n{name}_count {cumulative}",
            self.sum
        );
    }
}

const TTFT_BOUNDS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
const ITL_BOUNDS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
const MASK_BOUNDS: &[f64] = &[0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.03];

pub struct Metrics {
    /// (endpoint, status) → count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub cancelled: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Draft tokens verified, and accepted (`--lookup`, `--draft-model`, predicted outputs).
    pub draft_tokens: AtomicU64,
    pub draft_tokens_accepted: AtomicU64,
    /// Requests whose answer was constrained by a grammar (structured output).
    pub constrained_requests: AtomicU64,
    /// Tokens a grammar forced (kept without sampling).
    pub forced_tokens: AtomicU64,
    /// Choices accepted and not yet answered (queued, waiting or generating; a request with `n`
    /// choices counts `n`).
    pub accepted: AtomicI64,
    /// Jobs in the bounded queue, not yet taken by the engine thread.
    pub queue_depth: AtomicI64,
    /// A request failed because the GPU device was lost: every later step fails as well.
    pub device_lost: AtomicBool,
    /// The scheduler's state after its latest step.
    scheduler: Mutex<SchedulerStats>,
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
    /// Time to compute each structured-output token mask.
    mask: Mutex<Histogram>,
    /// Tokens routed to each expert of each layer (a mixture of experts), as last read.
    experts: Mutex<ExpertTallies>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::default(),
            cancelled: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            draft_tokens: AtomicU64::new(0),
            draft_tokens_accepted: AtomicU64::new(0),
            constrained_requests: AtomicU64::new(0),
            forced_tokens: AtomicU64::new(0),
            queue_depth: AtomicI64::new(0),
            accepted: AtomicI64::new(0),
            device_lost: AtomicBool::new(false),
            scheduler: Mutex::default(),
            ttft: Mutex::new(Histogram::new(TTFT_BOUNDS)),
            itl: Mutex::new(Histogram::new(ITL_BOUNDS)),
            mask: Mutex::new(Histogram::new(MASK_BOUNDS)),
            experts: Mutex::default(),
        }
    }
}

impl Metrics {
    pub fn count_request(&self, endpoint: &str, status: u16) {
        if let Ok(mut map) = self.requests.lock() {
            *map.entry((endpoint.to_string(), status)).or_default() += 1;
        }
    }

    /// One finished generation: token counts, time to first token (queue wait included), the
    /// inter-token latencies of its decode steps, what speculation did and what its grammar's
    /// masks cost.
    pub fn record_generation(&self, prompt_tokens: usize, generation: &Generation, ttft_s: Option<f64>) {
        self.prompt_tokens.fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.generated_tokens.fetch_add(generation.tokens.len() as u64, Ordering::Relaxed);
        if let Some(speculative) = &generation.speculative {
            self.draft_tokens.fetch_add(speculative.proposed as u64, Ordering::Relaxed);
            self.draft_tokens_accepted.fetch_add(speculative.accepted as u64, Ordering::Relaxed);
        }
        if let Some(constraint) = &generation.constraint {
            self.constrained_requests.fetch_add(1, Ordering::Relaxed);
            self.forced_tokens.fetch_add(constraint.forced_tokens as u64, Ordering::Relaxed);
            if let Ok(mut h) = self.mask.lock() {
                constraint.mask_us.iter().for_each(|&us| h.observe(us as f64 / 1e6));
            }
        }
        let itl_ms = &generation.timings.itl_ms;
        if let (Some(t), Ok(mut h)) = (ttft_s, self.ttft.lock()) {
            h.observe(t);
        }
        if let Ok(mut h) = self.itl.lock() {
            itl_ms.iter().for_each(|ms| h.observe(ms / 1e3));
        }
    }

    pub fn set_scheduler(&self, stats: SchedulerStats) {
        if let Ok(mut s) = self.scheduler.lock() {
            *s = stats;
        }
    }

    pub fn set_expert_tallies(&self, tallies: ExpertTallies) {
        if let Ok(mut e) = self.experts.lock() {
            *e = tallies;
        }
    }

    pub fn scheduler(&self) -> SchedulerStats {
        self.scheduler.lock().map(|s| *s).unwrap_or_default()
    }

    /// Requests waiting to run: in the queue, or admitted but waiting for KV blocks.
    pub fn waiting(&self) -> u64 {
        self.queue_depth.load(Ordering::SeqCst).max(0) as u64 + self.scheduler().waiting as u64
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP hearth_requests_total HTTP requests by endpoint and status code.\n# TYPE hearth_requests_total counter\n");
        if let Ok(map) = self.requests.lock() {
            for ((endpoint, status), n) in map.iter() {
                let _ = writeln!(out, "hearth_requests_total{{endpoint=\"{endpoint}\",code=\"{status}\"}} {n}");
            }
        }
        let counters = [
            ("hearth_requests_cancelled_total", "Generations cancelled because the client went away.", &self.cancelled),
            ("hearth_prompt_tokens_total", "Prompt tokens processed.", &self.prompt_tokens),
            ("hearth_generation_tokens_total", "Tokens generated.", &self.generated_tokens),
            (
                "hearth_draft_tokens_total",
                "Draft tokens verified (--lookup, --draft-model, predicted outputs).",
                &self.draft_tokens,
            ),
            (
                "hearth_draft_tokens_accepted_total",
                "Draft tokens accepted (--lookup, --draft-model, predicted outputs).",
                &self.draft_tokens_accepted,
            ),
            (
                "hearth_constrained_requests_total",
                "Requests whose answer a grammar constrained (structured output).",
                &self.constrained_requests,
            ),
            (
                "hearth_grammar_forced_tokens_total",
                "Tokens a grammar forced: kept without sampling, the only token it allowed.",
                &self.forced_tokens,
            ),
        ];
        for (name, help, value) in counters {
            let _ =
                writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", value.load(Ordering::Relaxed));
        }
        let stats = self.scheduler();
        let gauges = [
            (
                "hearth_queue_depth",
                "Requests in the queue, not yet taken by the engine.",
                self.queue_depth.load(Ordering::SeqCst).to_string(),
            ),
            ("hearth_requests_running", "Requests in the running batch.", stats.running.to_string()),
            (
                "hearth_requests_waiting",
                "Requests waiting: queued, or admitted but waiting for KV blocks.",
                self.waiting().to_string(),
            ),
            ("hearth_kv_blocks_used", "KV cache blocks in use.", stats.kv_blocks_used.to_string()),
            ("hearth_kv_blocks_total", "KV cache blocks in the pool.", stats.kv_blocks_total.to_string()),
            (
                "hearth_prefix_cache_hit_rate",
                "Share of looked-up prompt blocks found in the prefix cache.",
                stats.prefix_hit_rate.to_string(),
            ),
            (
                "hearth_step_prompt_budget_tokens",
                "Prompt tokens the last step could carry (small while streams decode).",
                stats.last_step.prompt_budget.to_string(),
            ),
            (
                "hearth_step_cost_per_row_ms",
                "Learned step cost per row (0 until learned).",
                stats.step_cost_ms.map_or(0.0, |(_, per_row)| per_row).to_string(),
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        }
        let name = "hearth_preemptions_total";
        let _ = writeln!(out, "# HELP {name} Requests preempted (KV dropped, recomputed later) for lack of KV blocks.\n# TYPE {name} counter\n{name} {}", stats.preemptions);
        if let Ok(h) = self.ttft.lock() {
            h.render(&mut out, "hearth_time_to_first_token_seconds", "Time from request arrival to the first token.");
        }
        if let Ok(h) = self.itl.lock() {
            h.render(&mut out, "hearth_inter_token_latency_seconds", "Time between consecutive generated tokens.");
        }
        if let Ok(h) = self.mask.lock() {
            h.render(&mut out, "hearth_grammar_mask_seconds", "Time to compute a structured-output token mask.");
        }
        if let Ok(tallies) = self.experts.lock() {
            if !tallies.counts.is_empty() {
                let name = "hearth_expert_tokens_total";
                let _ = writeln!(out, "# HELP {name} Tokens routed to each expert, by layer (the load balance of a mixture of experts).\n# TYPE {name} counter");
                for (layer, experts) in tallies.counts.iter().enumerate() {
                    for (expert, n) in experts.iter().enumerate() {
                        let _ = writeln!(out, "{name}{{layer=\"{layer}\",expert=\"{expert}\"}} {n}");
                    }
                }
            }
        }
        out
    }
}
