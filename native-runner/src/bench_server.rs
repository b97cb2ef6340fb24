//! `hearth bench --server URL`: a load benchmark against any OpenAI-compatible server (`hearth
//! serve`, llama.cpp's `llama-server`, ...). C client threads keep C streaming requests in flight
//! until N have been sent; each asks for exactly G tokens (`max_tokens`/`n_predict` with
//! `ignore_eos`, which both servers accept) after a synthetic prompt of about P tokens.
//!
//! Per request, from the client's clock: TTFT (send → first content event), ITL (gaps between
//! content events), TPOT (mean ITL: (last - first) / (events - 1)), end-to-end latency. Goodput:
//! completed requests per second whose TTFT ≤ --slo-ttft-ms and TPOT ≤ --slo-itl-ms.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
pub struct ServerBenchArgs {
    /// Benchmark a running OpenAI-compatible server (http://HOST:PORT[/v1]) instead of loading a
    /// model; the options below apply to this mode.
    #[arg(long)]
    pub server: Option<String>,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Requests in all.
    #[arg(long, default_value_t = 16)]
    pub requests: usize,
    /// Prompt length in (approximate) tokens; the server's count is reported when it sends usage.
    #[arg(long = "prompt-len", default_value_t = 128)]
    pub prompt_len: usize,
    /// Tokens generated per request (end-of-generation ignored).
    #[arg(long = "gen-len", default_value_t = 64)]
    pub gen_len: usize,
    /// Goodput SLO: time to first token, ms.
    #[arg(long = "slo-ttft-ms")]
    pub slo_ttft_ms: Option<f64>,
    /// Goodput SLO: mean inter-token latency (TPOT) per request, ms.
    #[arg(long = "slo-itl-ms")]
    pub slo_itl_ms: Option<f64>,
    /// chat (/v1/chat/completions) or completions (/v1/completions).
    #[arg(long, default_value = "chat")]
    pub endpoint: String,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
}

/// One finished request, times in ms from its send.
struct Sample {
    ttft_ms: f64,
    itl_ms: Vec<f64>,
    e2e_ms: f64,
    tokens: usize,
    prompt_tokens: Option<u64>,
}

impl Sample {
    fn tpot_ms(&self) -> Option<f64> {
        (!self.itl_ms.is_empty()).then(|| self.itl_ms.iter().sum::<f64>() / self.itl_ms.len() as f64)
    }
}

struct Target {
    host_port: String,
    path: String,
    chat: bool,
    api_key: Option<String>,
}

fn target(args: &ServerBenchArgs, url: &str) -> Result<Target> {
    let rest = url.strip_prefix("http://").ok_or_else(|| anyhow!("--server must be an http:// URL, got '{url}'"))?;
    let (host_port, base) = rest.split_once('/').map_or((rest, ""), |(h, p)| (h, p));
    let base = base.trim_end_matches('/');
    let base = if base.is_empty() {
        "/v1".to_string()
    } else if base.ends_with("v1") {
        format!("/{base}")
    } else {
        format!("/{base}/v1")
    };
    let chat = match args.endpoint.as_str() {
        "chat" => true,
        "completions" => false,
        other => bail!("--endpoint must be chat or completions, got '{other}'"),
    };
    let path = format!("{base}/{}", if chat { "chat/completions" } else { "completions" });
    Ok(Target { host_port: host_port.to_string(), path, chat, api_key: args.api_key.clone() })
}

/// About `len` tokens of ordinary words, distinct from the first word on so that no request
/// shares a prefix with another (beyond a chat template's).
fn prompt_text(index: usize, len: usize) -> String {
    const WORDS: [&str; 16] = [
        "river", "stone", "garden", "window", "paper", "music", "engine", "forest", "silver", "market", "winter",
        "bridge", "candle", "harbor", "planet", "letter",
    ];
    let mut text = format!("{index}");
    for i in 1..len.max(1) {
        text.push(' ');
        text.push_str(WORDS[(index * 7 + i * 13 + i / 16) % WORDS.len()]);
    }
    text
}

fn request_body(t: &Target, index: usize, args: &ServerBenchArgs) -> Value {
    let text = prompt_text(index, args.prompt_len);
    let mut body = json!({
        "max_tokens": args.gen_len,
        "n_predict": args.gen_len,
        "ignore_eos": true,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if t.chat {
        body["messages"] = json!([{"role": "user", "content": text}]);
    } else {
        body["prompt"] = json!(text);
    }
    body
}

/// Sends one streaming request and times its server-sent events.
fn one_request(t: &Target, body: &Value) -> Result<Sample> {
    let start = Instant::now();
    let mut stream = TcpStream::connect(&t.host_port).with_context(|| format!("connecting to {}", t.host_port))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(600)))?;
    let body = body.to_string();
    let auth = t.api_key.as_ref().map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        t.path,
        t.host_port,
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {line:?}"))?;
    let mut chunked = false;
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            chunked |= k.trim().eq_ignore_ascii_case("transfer-encoding") && v.trim().eq_ignore_ascii_case("chunked");
        }
    }
    let mut events = SseEvents { pending: String::new() };
    let (mut first, mut last, mut tokens, mut itl, mut prompt_tokens, mut usage_tokens) =
        (None, None, 0, Vec::new(), None, None);
    let mut error_body = String::new();
    let mut on_data = |data: &str, now: Instant| {
        if status != 200 {
            error_body.push_str(data);
            return;
        }
        for payload in events.push(data) {
            if payload == "[DONE]" {
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(&payload) else { continue };
            if let Some(usage) = v.get("usage").filter(|u| !u.is_null()) {
                prompt_tokens = usage["prompt_tokens"].as_u64();
                usage_tokens = usage["completion_tokens"].as_u64();
            }
            let choice = &v["choices"][0];
            let content = choice["delta"]["content"].as_str().or(choice["text"].as_str()).unwrap_or("");
            if content.is_empty() {
                continue;
            }
            tokens += 1;
            match last {
                None => first = Some(now),
                Some(prev) => itl.push(ms(prev, now)),
            }
            last = Some(now);
        }
    };
    if chunked {
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim(), 16).map_err(|_| anyhow!("bad chunk size {line:?}"))?;
            let mut data = vec![0; size + 2];
            reader.read_exact(&mut data)?;
            if size == 0 {
                break;
            }
            on_data(&String::from_utf8_lossy(&data[..size]), Instant::now());
        }
    } else {
        let mut buf = [0u8; 8192];
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                break;
            }
            on_data(&String::from_utf8_lossy(&buf[..n]), Instant::now());
        }
    }
    if status != 200 {
        bail!("HTTP {status}: {error_body}");
    }
    let first = first.ok_or_else(|| anyhow!("the stream carried no text"))?;
    Ok(Sample {
        ttft_ms: ms(start, first),
        itl_ms: itl,
        e2e_ms: ms(start, Instant::now()),
        tokens: usage_tokens.map_or(tokens, |n| n as usize),
        prompt_tokens,
    })
}

fn ms(a: Instant, b: Instant) -> f64 {
    b.duration_since(a).as_secs_f64() * 1e3
}

/// Splits a byte stream into `data:` payloads (events end with a blank line).
struct SseEvents {
    pending: String,
}

impl SseEvents {
    fn push(&mut self, data: &str) -> Vec<String> {
        self.pending.push_str(&data.replace("\r\n", "\n"));
        let mut out = Vec::new();
        while let Some(end) = self.pending.find("\n\n") {
            let event: String = self.pending.drain(..end + 2).collect();
            out.extend(event.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| d.trim().to_string()));
        }
        out
    }
}

/// p-th percentile with linear interpolation between ranks.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n => {
            let rank = p / 100.0 * (n - 1) as f64;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

fn summary(mut values: Vec<f64>) -> Value {
    values.sort_by(|a, b| a.total_cmp(b));
    let mean = if values.is_empty() { 0.0 } else { values.iter().sum::<f64>() / values.len() as f64 };
    json!({"mean": mean, "p50": percentile(&values, 50.0), "p95": percentile(&values, 95.0), "p99": percentile(&values, 99.0)})
}

pub fn run(url: &str, args: &ServerBenchArgs, as_json: bool) -> Result<()> {
    if args.concurrency == 0 || args.requests == 0 || args.gen_len == 0 {
        bail!("--concurrency, --requests and --gen-len must be at least 1");
    }
    let target = target(args, url)?;
    let next = AtomicUsize::new(0);
    let samples = Mutex::new(Vec::new());
    let errors = Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..args.concurrency.min(args.requests) {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::SeqCst);
                if index >= args.requests {
                    break;
                }
                match one_request(&target, &request_body(&target, index, args)) {
                    Ok(s) => samples.lock().map(|mut v| v.push(s)).unwrap_or(()),
                    Err(e) => errors.lock().map(|mut v| v.push(format!("{e:#}"))).unwrap_or(()),
                }
            });
        }
    });
    let wall_s = start.elapsed().as_secs_f64();
    let samples = samples.into_inner().map_err(|_| anyhow!("a client thread panicked"))?;
    let errors = errors.into_inner().map_err(|_| anyhow!("a client thread panicked"))?;
    let report = report(url, args, &samples, &errors, wall_s);
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    if samples.is_empty() {
        bail!("every request failed; first error: {}", errors.first().map_or("none", String::as_str));
    }
    Ok(())
}

fn report(url: &str, args: &ServerBenchArgs, samples: &[Sample], errors: &[String], wall_s: f64) -> Value {
    let generated: usize = samples.iter().map(|s| s.tokens).sum();
    let prompt_tokens: Vec<f64> = samples.iter().filter_map(|s| s.prompt_tokens.map(|n| n as f64)).collect();
    let slo_met = samples
        .iter()
        .filter(|s| {
            args.slo_ttft_ms.is_none_or(|x| s.ttft_ms <= x)
                && args.slo_itl_ms.is_none_or(|y| s.tpot_ms().is_none_or(|t| t <= y))
        })
        .count();
    json!({
        "server": url,
        "endpoint": args.endpoint,
        "concurrency": args.concurrency,
        "requests": args.requests,
        "completed": samples.len(),
        "failed": errors.len(),
        "first_error": errors.first(),
        "prompt_len": args.prompt_len,
        "prompt_tokens_mean": if prompt_tokens.is_empty() { Value::Null } else { json!(prompt_tokens.iter().sum::<f64>() / prompt_tokens.len() as f64) },
        "gen_len": args.gen_len,
        "generated_tokens": generated,
        "duration_s": wall_s,
        "request_throughput": samples.len() as f64 / wall_s,
        "output_tok_s": generated as f64 / wall_s,
        "ttft_ms": summary(samples.iter().map(|s| s.ttft_ms).collect()),
        "itl_ms": summary(samples.iter().flat_map(|s| s.itl_ms.iter().copied()).collect()),
        "tpot_ms": summary(samples.iter().filter_map(Sample::tpot_ms).collect()),
        "e2e_ms": summary(samples.iter().map(|s| s.e2e_ms).collect()),
        "slo": {"ttft_ms": args.slo_ttft_ms, "itl_ms": args.slo_itl_ms, "met": slo_met, "goodput_rps": slo_met as f64 / wall_s},
    })
}

fn print_report(r: &Value) {
    let row = |name: &str, v: &Value| {
        println!(
            "{name:<6} mean {:>8.1}  p50 {:>8.1}  p95 {:>8.1}  p99 {:>8.1} ms",
            f(&v["mean"]),
            f(&v["p50"]),
            f(&v["p95"]),
            f(&v["p99"])
        );
    };
    println!("server       {} ({})", r["server"].as_str().unwrap_or(""), r["endpoint"].as_str().unwrap_or(""));
    println!("requests     {} completed, {} failed, concurrency {}", r["completed"], r["failed"], r["concurrency"]);
    if let Some(e) = r["first_error"].as_str() {
        println!("first error  {e}");
    }
    println!(
        "throughput   {:.2} req/s, {:.1} output tok/s over {:.1} s",
        f(&r["request_throughput"]),
        f(&r["output_tok_s"]),
        f(&r["duration_s"])
    );
    row("ttft", &r["ttft_ms"]);
    row("itl", &r["itl_ms"]);
    row("tpot", &r["tpot_ms"]);
    row("e2e", &r["e2e_ms"]);
    println!("goodput      {:.2} req/s ({} met the SLO)", f(&r["slo"]["goodput_rps"]), r["slo"]["met"]);
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_split_across_reads_and_line_endings() {
        let mut events = SseEvents { pending: String::new() };
        assert!(events.push("data: {\"a\"").is_empty());
        assert_eq!(events.push(":1}\r\n\r\ndata: [DONE]\n"), vec!["{\"a\":1}".to_string()]);
        assert_eq!(events.push("\n"), vec!["[DONE]".to_string()]);
    }

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let v = [10.0, 20.0, 30.0, 40.0, 50.0];
        assert_eq!(percentile(&v, 50.0), 30.0);
        assert!((percentile(&v, 99.0) - 49.6).abs() < 1e-9);
        assert_eq!(percentile(&v, 0.0), 10.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn server_urls_resolve_to_the_v1_paths() {
        let args = |endpoint: &str| ServerBenchArgs {
            server: None,
            concurrency: 1,
            requests: 1,
            prompt_len: 4,
            gen_len: 4,
            slo_ttft_ms: None,
            slo_itl_ms: None,
            endpoint: endpoint.to_string(),
            api_key: None,
        };
        let t = target(&args("chat"), "http://127.0.0.1:8080").expect("target");
        assert_eq!((t.host_port.as_str(), t.path.as_str()), ("127.0.0.1:8080", "/v1/chat/completions"));
        let t = target(&args("completions"), "http://localhost:9/v1/").expect("target");
        assert_eq!((t.host_port.as_str(), t.path.as_str()), ("localhost:9", "/v1/completions"));
        assert!(target(&args("chat"), "https://x").is_err());
        assert!(target(&args("embeddings"), "http://x:1").is_err());
    }
}
