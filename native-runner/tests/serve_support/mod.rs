#![allow(dead_code)]
//! A `hearth serve` child process on a free loopback port and a raw HTTP/1.1 client over
//! `std::net::TcpStream` (Content-Length and chunked bodies), for tests/serve.rs.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const MODEL: &str = "qwen2.5-coder-0.5b";
pub const API_KEY: &str = "sk-test-key";
pub const CTX: &str = "512";

pub struct Server {
    child: Child,
    pub addr: String,
}

impl Server {
    /// Starts `hearth serve` with `--port 0` and reads the bound address from its stderr. The
    /// server runs under a shell that stops it when the shell's stdin closes: when the `Server`
    /// drops, and when this test process ends (a server kept in a `static` is never dropped, and
    /// would otherwise outlive the tests).
    pub fn start(extra: &[&str]) -> Server {
        Server::start_model(MODEL, extra)
    }

    /// [`Server::start`] serving `model` (a built-in name or a GGUF path).
    pub fn start_model(model: &str, extra: &[&str]) -> Server {
        let mut child = Command::new("sh")
            .args(["-c", r#""$@" & server=$!; read -r line; kill $server; wait $server"#, "sh"])
            .arg(env!("CARGO_BIN_EXE_hearth"))
            .args(["serve", "-m", model, "--backend", "cpu", "--quiet", "--port", "0", "-c", CTX, "--api-key", API_KEY])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hearth serve");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let addr = loop {
            let line = lines.next().expect("hearth serve exited before listening").expect("stderr line");
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest.trim().to_string();
            }
        };
        // Keep draining stderr so the child never blocks on a full pipe.
        // Forward it: a server panic then shows next to the failing test.
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| eprintln!("[hearth serve] {l}")));
        Server { child, addr }
    }
}

impl Drop for Server {
    /// Closes the shell's stdin (it stops the server) and waits for both to end.
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a server-sent event stream, `[DONE]` included.
    pub fn events(&self) -> Vec<String> {
        self.text().split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_string).collect()
    }
}

/// Sends one request (`Connection: close`) with an optional bearer key and raw body.
pub fn send(addr: &str, method: &str, path: &str, key: Option<&str>, body: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(300))).expect("timeout");
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("write head");
    stream.write_all(body.as_bytes()).expect("write body");
    stream
}

pub fn request(addr: &str, method: &str, path: &str, key: Option<&str>, body: &str) -> Response {
    read_response(&mut BufReader::new(send(addr, method, path, key, body)))
}

pub fn post(addr: &str, path: &str, body: &Value) -> Response {
    request(addr, "POST", path, Some(API_KEY), &body.to_string())
}

pub fn get(addr: &str, path: &str) -> Response {
    request(addr, "GET", path, Some(API_KEY), "")
}

pub fn read_head(reader: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    reader.read_line(&mut line).expect("status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).expect("header");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    (status, headers)
}

/// Reads one HTTP chunk's payload; `None` at the terminating zero-size chunk.
pub fn read_chunk(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = String::new();
    reader.read_line(&mut line).expect("chunk size");
    let size = usize::from_str_radix(line.trim(), 16).unwrap_or_else(|_| panic!("bad chunk size {line:?}"));
    let mut data = vec![0; size + 2];
    reader.read_exact(&mut data).expect("chunk");
    data.truncate(size);
    (size > 0).then_some(data)
}

pub fn read_response(reader: &mut impl BufRead) -> Response {
    let (status, headers) = read_head(reader);
    let header = |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if header("Transfer-Encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        while let Some(chunk) = read_chunk(reader) {
            body.extend(chunk);
        }
    } else if let Some(len) = header("Content-Length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(len, 0);
        reader.read_exact(&mut body).expect("body");
    } else {
        reader.read_to_end(&mut body).expect("body");
    }
    Response { status, headers, body }
}

/// `hearth run ... --json` with the server's context size and CPU backend.
pub fn hearth_run(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["run", "-m", MODEL, "--backend", "cpu", "--quiet", "-c", CTX, "--json"])
        .args(args)
        .output()
        .expect("spawn hearth run");
    assert!(out.status.success(), "hearth run failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("run JSON")
}

/// Asserts an OpenAI-shaped error with this status (and code, when given).
pub fn assert_error(r: &Response, status: u16, code: Option<&str>, param: Option<&str>) {
    assert_eq!(r.status, status, "body: {}", r.text());
    let body = r.json();
    let error = &body["error"];
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "no message: {body}");
    assert!(error["type"].is_string(), "no type: {body}");
    assert!(error.get("param").is_some() && error.get("code").is_some(), "param/code missing: {body}");
    if let Some(code) = code {
        assert_eq!(error["code"], code, "{body}");
    }
    if let Some(param) = param {
        assert_eq!(error["param"], param, "{body}");
    }
}
