//! A minimal HTTP/1.1 server on 127.0.0.1 for the fetch tests: static routes, `Range: bytes=N-`
//! support, and failure modes (ignore Range, drop the connection halfway, fixed error status).
//! Every response closes the connection, so each request is one connection.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Behavior {
    /// Honour `Range: bytes=N-` with 206 (416 when N is past the end).
    Normal,
    /// Always answer 200 with the whole body, like servers without range support.
    IgnoreRange,
    /// The first request gets headers for the full (ranged) body but only half of it, then the
    /// connection is closed; later requests behave like `Normal`.
    DropHalfwayOnce,
}

struct Route {
    body: Vec<u8>,
    content_type: String,
    behavior: Behavior,
    served: usize,
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct LoggedRequest {
    pub path: String,
    pub range: Option<String>,
    pub accept: Option<String>,
}

#[derive(Default)]
struct State {
    routes: HashMap<String, Route>,
    log: Vec<LoggedRequest>,
}

pub struct TestServer {
    pub base: String,
    state: Arc<Mutex<State>>,
}

impl TestServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let base = format!("http://{}", listener.local_addr().expect("local addr"));
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = Arc::clone(&shared);
                thread::spawn(move || handle(stream, &state));
            }
        });
        Self { base, state }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn add(&self, path: &str, body: Vec<u8>, content_type: &str, behavior: Behavior) {
        let route = Route { body, content_type: content_type.to_string(), behavior, served: 0 };
        self.state.lock().unwrap().routes.insert(path.to_string(), route);
    }

    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.state.lock().unwrap().log.clone()
    }

    pub fn requests_for(&self, path: &str) -> Vec<LoggedRequest> {
        self.requests().into_iter().filter(|r| r.path == path).collect()
    }
}

fn handle(stream: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone stream"));
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if line.trim().is_empty() => break,
            Ok(_) => {
                if let Some((name, value)) = line.split_once(':') {
                    headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
                }
            }
        }
    }
    let range = headers.get("range").cloned();
    let (body, content_type, behavior, first) = {
        let mut state = state.lock().unwrap();
        state.log.push(LoggedRequest {
            path: path.clone(),
            range: range.clone(),
            accept: headers.get("accept").cloned(),
        });
        match state.routes.get_mut(&path) {
            Some(route) => {
                route.served += 1;
                (route.body.clone(), route.content_type.clone(), route.behavior, route.served == 1)
            }
            None => {
                respond(stream, "404 Not Found", &[], b"not found", None);
                return;
            }
        }
    };

    let start: Option<u64> = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split('-').next())
        .and_then(|n| n.parse().ok());
    let len = body.len() as u64;
    let honour_range = behavior != Behavior::IgnoreRange;
    match start {
        Some(start) if honour_range && start >= len => {
            let extra = [("Content-Range", format!("bytes */{len}"))];
            respond(stream, "416 Range Not Satisfiable", &extra, b"", None);
        }
        Some(start) if honour_range => {
            let extra = [("Content-Type", content_type), ("Content-Range", format!("bytes {start}-{}/{len}", len - 1))];
            let cut = drop_point(behavior, first, len - start);
            respond(stream, "206 Partial Content", &extra, &body[start as usize..], cut);
        }
        _ => {
            let extra = [("Content-Type", content_type)];
            let cut = drop_point(behavior, first, len);
            respond(stream, "200 OK", &extra, &body, cut);
        }
    }
}

/// How many body bytes to send before dropping the connection, if this response is to be cut.
fn drop_point(behavior: Behavior, first: bool, body_len: u64) -> Option<usize> {
    (behavior == Behavior::DropHalfwayOnce && first).then_some((body_len / 2) as usize)
}

fn respond(mut stream: TcpStream, status: &str, extra: &[(&str, String)], body: &[u8], cut_after: Option<usize>) {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let sent = cut_after.unwrap_or(body.len()).min(body.len());
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(&body[..sent]);
    let _ = stream.flush();
    let _ = stream.shutdown(Shutdown::Both);
}
