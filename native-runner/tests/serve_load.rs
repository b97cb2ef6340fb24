//! `hearth serve --max-batch 32` under load (Qwen 0.5B, CPU): 32 concurrent streaming requests
//! each produce exactly the text they produce when sent alone, none is lost; then 32 more where
//! half the clients hang up after the first chunks: the other half still match, the hung-up ones
//! are cancelled, and afterwards no request runs and no KV block is held.

mod serve_support;

use serde_json::{json, Value};
use serve_support::*;
use std::io::BufReader;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const CONCURRENT: usize = 32;
const MAX_TOKENS: usize = 12;
const PATH: &str = "/v1/completions";

fn prompt(i: usize) -> String {
    let subjects = [
        "a linked list",
        "binary search",
        "a web server",
        "quicksort",
        "a hash map",
        "JSON parsing",
        "a trie",
        "matrix multiplication",
    ];
    // Distinct prompts of different lengths.
    format!("# Task {i}: {}{}\ndef ", subjects[i % subjects.len()], " with comments".repeat(i % 3))
}

fn body(i: usize, max_tokens: usize) -> String {
    // End-of-text tokens are banned so that a request is still running when its client hangs up.
    let mut body =
        json!({"model": MODEL, "prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0, "stream": true});
    if max_tokens > MAX_TOKENS {
        body["logit_bias"] = json!({"151643": -100, "151645": -100});
    }
    body.to_string()
}

/// Streams one request to its end; the concatenated text (and that it ended with [DONE]).
fn stream_text(addr: &str, body: &str) -> String {
    let mut reader = BufReader::new(send(addr, "POST", PATH, Some(API_KEY), body));
    let response = read_response(&mut reader);
    assert_eq!(response.status, 200, "{}", response.text());
    let events = response.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "stream must end with [DONE]: {}", response.text());
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).expect("chunk JSON"))
        .filter_map(|c| c["choices"].get(0).and_then(|choice| choice["text"].as_str().map(str::to_string)))
        .collect()
}

/// Reads the head and the first `chunks` events, then closes the connection.
fn hang_up_after(addr: &str, body: &str, chunks: usize) {
    let mut reader = BufReader::new(send(addr, "POST", PATH, Some(API_KEY), body));
    assert_eq!(read_head(&mut reader).0, 200);
    for _ in 0..chunks {
        read_chunk(&mut reader).expect("an event before hanging up");
    }
}

fn metric(addr: &str, name: &str) -> f64 {
    let metrics = request(addr, "GET", "/metrics", None, "").text();
    let line = metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"));
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("metric value")
}

/// Runs `f(i)` for every request at once (released together by a barrier), in request order.
fn all_at_once<T: Send + 'static>(f: impl Fn(usize) -> T + Send + Sync + 'static) -> Vec<T> {
    let f = Arc::new(f);
    let barrier = Arc::new(Barrier::new(CONCURRENT));
    let threads: Vec<_> = (0..CONCURRENT)
        .map(|i| {
            let (f, barrier) = (f.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                f(i)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("client thread")).collect()
}

#[test]
fn concurrent_streams_match_solo_runs_and_cancellation_frees_everything() {
    let server = Server::start(&["--max-batch", "32"]);
    let addr: Arc<str> = server.addr.as_str().into();

    let solo: Vec<String> = (0..CONCURRENT).map(|i| stream_text(&addr, &body(i, MAX_TOKENS))).collect();
    assert!(solo.iter().all(|t| !t.is_empty()), "every solo run generates text: {solo:?}");

    let a = addr.clone();
    let together = all_at_once(move |i| stream_text(&a, &body(i, MAX_TOKENS)));
    for (i, (got, want)) in together.iter().zip(&solo).enumerate() {
        assert_eq!(got, want, "request {i}: batched output differs from its solo run");
    }

    // Odd requests hang up after two chunks of a long generation; even ones run to the end.
    let a = addr.clone();
    let second = all_at_once(move |i| {
        if i % 2 == 1 {
            hang_up_after(&a, &body(i, 400), 2);
            None
        } else {
            Some(stream_text(&a, &body(i, MAX_TOKENS)))
        }
    });
    for (i, got) in second.iter().enumerate() {
        if let Some(got) = got {
            assert_eq!(got, &solo[i], "request {i}: output differs after its neighbours hung up");
        }
    }

    // Cancellation is noticed at the next token each hung-up stream fails to write.
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric(&addr, "hearth_requests_cancelled_total") < (CONCURRENT / 2) as f64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(metric(&addr, "hearth_requests_cancelled_total"), (CONCURRENT / 2) as f64);
    // The engine publishes its pool state at the end of each step, just after the events that
    // ended the last streams: give it that step to settle (a leak never settles).
    let settled = || metric(&addr, "hearth_requests_running") == 0.0 && metric(&addr, "hearth_kv_blocks_used") == 0.0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !settled() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(metric(&addr, "hearth_requests_running"), 0.0);
    assert_eq!(metric(&addr, "hearth_requests_waiting"), 0.0);
    assert_eq!(metric(&addr, "hearth_kv_blocks_used"), 0.0);
    let health = request(&addr, "GET", "/health", None, "").json();
    assert_eq!((health["running"].as_u64(), health["kv_blocks_used"].as_u64()), (Some(0), Some(0)), "{health}");
    // A request is counted when its handler returns, which can be just after its client has read
    // the end of the stream: wait for the handlers, as above.
    let completed = || metric(&addr, "hearth_requests_total{endpoint=\"/v1/completions\",code=\"200\"}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while completed() < (3 * CONCURRENT) as f64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(completed(), (3 * CONCURRENT) as f64);
}
