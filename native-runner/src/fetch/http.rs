//! Resumable HTTP downloads: bytes go to `<dest>.partial`, a restart continues with
//! `Range: bytes=N-`, and only a complete (and, when a digest is known, verified) file is renamed to
//! `dest`, so the presence of `dest` means "complete".

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use super::stamp::{hex, sha256_file};
use super::FetchContext;

pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(30))
        .timeout_read(Duration::from_secs(60))
        .user_agent(concat!("hearth/", env!("CARGO_PKG_VERSION")))
        .try_proxy_from_env(true)
        .build()
}

/// A byte-count progress bar, or a hidden one when progress output is off.
pub fn byte_bar(progress: bool, label: &str) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    ProgressBar::new(0).with_style(style).with_message(label.to_string())
}

/// What is known in advance about a download; checked before the file is accepted.
#[derive(Default)]
pub struct Expected {
    pub sha256: Option<String>,
    pub size: Option<u64>,
}

/// Why one attempt failed: transient failures are retried (resuming), fatal ones are reported at once.
enum AttemptError {
    Transient(anyhow::Error),
    Fatal(anyhow::Error),
}

pub fn partial_path(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// Downloads `url` to `dest` (resuming `<dest>.partial` if present), retrying transient failures.
/// On a digest or size mismatch the partial file is deleted and an error says so.
pub fn download_resumable(ctx: &FetchContext, url: &str, dest: &Path, expected: &Expected, label: &str) -> Result<()> {
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let partial = partial_path(dest);
    let bar = byte_bar(ctx.progress, label);
    let mut attempt = 0;
    loop {
        match attempt_download(ctx, url, &partial, expected, &bar) {
            Ok(()) => break,
            Err(AttemptError::Transient(err)) if attempt < ctx.retries => {
                attempt += 1;
                bar.suspend(|| {
                    if ctx.progress {
                        eprintln!("{label}: {err:#}; resuming (retry {attempt}/{})", ctx.retries)
                    }
                });
                std::thread::sleep(ctx.retry_delay * attempt);
            }
            Err(AttemptError::Transient(err)) => {
                bar.abandon();
                return Err(err.context(format!(
                    "downloading {label} failed after {} retries; the partial file {} is kept \
                     and the next run resumes it",
                    ctx.retries,
                    partial.display()
                )));
            }
            Err(AttemptError::Fatal(err)) => {
                bar.abandon();
                return Err(err.context(format!("downloading {label} from {url}")));
            }
        }
    }
    bar.finish_and_clear();
    verify_partial(&partial, expected, label)?;
    fs::rename(&partial, dest).with_context(|| format!("renaming {} to {}", partial.display(), dest.display()))
}

/// Checks a finished partial file against `expected`; a mismatching file is deleted.
fn verify_partial(partial: &Path, expected: &Expected, label: &str) -> Result<()> {
    let len = fs::metadata(partial).with_context(|| format!("reading metadata of {}", partial.display()))?.len();
    if let Some(size) = expected.size {
        if len != size {
            let _ = fs::remove_file(partial);
            bail!("size mismatch for {label}: expected {size} bytes, got {len}; deleted {}", partial.display());
        }
    }
    if let Some(sha) = &expected.sha256 {
        let found = sha256_file(partial, &ProgressBar::hidden())?;
        if !found.eq_ignore_ascii_case(sha) {
            let _ = fs::remove_file(partial);
            bail!("sha256 mismatch for {label}: expected {sha}, got {found}; deleted {}", partial.display());
        }
    }
    Ok(())
}

/// Total length from a `Content-Range: bytes a-b/total` (or `bytes */total`) header.
fn content_range(resp: &ureq::Response) -> Option<(Option<u64>, Option<u64>)> {
    let value = resp.header("Content-Range")?.trim();
    let rest = value.strip_prefix("bytes")?.trim_start();
    let (range, total) = rest.split_once('/')?;
    let start = range.split_once('-').and_then(|(a, _)| a.trim().parse().ok());
    Some((start, total.trim().parse().ok()))
}

fn attempt_download(
    ctx: &FetchContext,
    url: &str,
    partial: &Path,
    expected: &Expected,
    bar: &ProgressBar,
) -> Result<(), AttemptError> {
    let fatal_io = |err: std::io::Error, what: &str| {
        AttemptError::Fatal(anyhow!(err).context(format!("{what} {}", partial.display())))
    };
    let mut have = fs::metadata(partial).map(|m| m.len()).unwrap_or(0);
    if let Some(size) = expected.size {
        if have == size {
            return Ok(());
        }
        if have > size {
            fs::remove_file(partial).map_err(|e| fatal_io(e, "removing oversized"))?;
            have = 0;
        }
    }
    // Compressed transfer encodings would make byte offsets meaningless for Range.
    let mut request = ctx.agent.get(url).set("Accept-Encoding", "identity");
    if have > 0 {
        request = request.set("Range", &format!("bytes={have}-"));
    }
    let response = match request.call() {
        Ok(response) => response,
        Err(ureq::Error::Status(416, response)) if have > 0 => {
            // Nothing left past `have`: either the partial file is already complete, or it is longer
            // than the resource (stale); the latter restarts from scratch.
            let total = content_range(&response).and_then(|(_, total)| total);
            if total == Some(have) {
                return Ok(());
            }
            fs::remove_file(partial).map_err(|e| fatal_io(e, "removing stale"))?;
            return Err(AttemptError::Transient(anyhow!(
                "server refused to resume at byte {have} (HTTP 416); restarting"
            )));
        }
        Err(ureq::Error::Status(code, response)) => {
            let err = anyhow!("HTTP {code} {} for {url}", response.status_text());
            return Err(if code >= 500 || code == 429 {
                AttemptError::Transient(err)
            } else {
                AttemptError::Fatal(err)
            });
        }
        Err(ureq::Error::Transport(transport)) => {
            return Err(AttemptError::Transient(anyhow!(transport)));
        }
    };

    let body_len: Option<u64> = response.header("Content-Length").and_then(|v| v.trim().parse().ok());
    let (mut file, start, total) = if response.status() == 206 {
        let (start, total) = content_range(&response).unwrap_or((None, None));
        if start != Some(have) {
            fs::remove_file(partial).map_err(|e| fatal_io(e, "removing"))?;
            return Err(AttemptError::Transient(anyhow!(
                "server answered a resume at byte {have} with a different range; restarting"
            )));
        }
        let file = OpenOptions::new().append(true).open(partial).map_err(|e| fatal_io(e, "opening"))?;
        (file, have, total.or(body_len.map(|len| len + have)))
    } else {
        // A plain 200 carries the whole resource, also when we asked for a range (server ignores Range).
        let file = File::create(partial).map_err(|e| fatal_io(e, "creating"))?;
        (file, 0, body_len)
    };

    bar.set_length(total.or(expected.size).unwrap_or(0));
    bar.set_position(start);
    let mut reader = response.into_reader();
    let mut buf = vec![0u8; 256 * 1024];
    let mut received: u64 = 0;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => {
                let _ = file.flush();
                return Err(AttemptError::Transient(
                    anyhow!(err).context(format!("connection lost after {} bytes", start + received)),
                ));
            }
        };
        file.write_all(&buf[..n]).map_err(|e| fatal_io(e, "writing"))?;
        received += n as u64;
        bar.inc(n as u64);
    }
    file.sync_all().map_err(|e| fatal_io(e, "syncing"))?;
    if let Some(total) = total {
        if start + received != total {
            return Err(AttemptError::Transient(anyhow!(
                "connection closed after {} of {total} bytes",
                start + received
            )));
        }
    }
    Ok(())
}

/// File name for a URL download: the last path segment, reduced to safe characters.
fn url_file_name(url: &str) -> String {
    let without_query = url.split(['?', '#']).next().unwrap_or(url);
    let last = without_query.rsplit('/').next().unwrap_or("");
    let safe: String =
        last.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' }).collect();
    let safe = safe.trim_start_matches('.').to_string();
    if safe.is_empty() {
        "model.gguf".to_string()
    } else {
        safe
    }
}

/// Downloads an http(s) URL to `models/url/<16 hex of sha256(url)>-<file name>`; a completed file
/// is reused without contacting the server.
pub fn download_url_in(ctx: &FetchContext, url: &str) -> Result<PathBuf> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        bail!("not an http(s) URL: {url}");
    }
    let key = hex(&Sha256::digest(url.as_bytes()));
    let file_name = url_file_name(url);
    let dest = ctx.models_dir().join("url").join(format!("{}-{file_name}", &key[..16]));
    if dest.is_file() {
        return Ok(dest);
    }
    download_resumable(ctx, url, &dest, &Expected::default(), &file_name)?;
    Ok(dest)
}
