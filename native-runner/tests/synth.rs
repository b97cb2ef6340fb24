//! `hearth models skeleton` and `hearth models synth` on a committed synthetic model: the
//! hermetic part of the binary's end-to-end tests (tests/cli.rs needs the real models).

use std::path::PathBuf;
use std::process::{Command, Output};

fn hearth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth")).args(args).output().expect("spawn hearth")
}

fn run_json(args: &[&str]) -> serde_json::Value {
    let out = hearth(args);
    assert!(out.status.success(), "hearth {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// `models skeleton` keeps a model's header byte for byte and nothing else; `models synth` fills it
/// with random weights of every tensor's type and size: the result parses as the same model (same
/// metadata and tensor table), differs from the real weights, is the same for the same seed, and
/// runs (its tokens are noise, its cost is the real model's).
#[test]
fn synthetic_model_from_a_skeleton_has_the_real_shapes() {
    let real = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/synthetic/llama-gqa-q8_0.gguf");
    let dir = std::env::temp_dir().join(format!("hearth-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (skel, a, b) = (dir.join("skel.gguf"), dir.join("a.gguf"), dir.join("b.gguf"));
    let path = |p: &PathBuf| p.to_str().expect("utf-8 path").to_string();
    for args in [
        vec!["models".into(), "skeleton".into(), path(&real), "-o".into(), path(&skel)],
        vec!["models".into(), "synth".into(), path(&skel), "-o".into(), path(&a)],
        vec!["models".into(), "synth".into(), path(&skel), "-o".into(), path(&b)],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = hearth(&args);
        assert!(out.status.success(), "hearth {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let real_file = hearth_core::gguf::GgufFile::open(&real).expect("real");
    let (real_bytes, skel_bytes) = (std::fs::read(&real).expect("read"), std::fs::read(&skel).expect("read"));
    assert_eq!(skel_bytes, real_bytes[..real_file.data_offset as usize], "the skeleton is the header");
    let synth_bytes = std::fs::read(&a).expect("read");
    assert_eq!(synth_bytes.len(), real_bytes.len(), "same size as the real model");
    assert_eq!(synth_bytes[..skel_bytes.len()], skel_bytes[..], "same header");
    assert_ne!(synth_bytes, real_bytes, "random weights, not the real ones");
    assert_eq!(synth_bytes, std::fs::read(&b).expect("read"), "the same seed gives the same model");
    let synth_file = hearth_core::gguf::GgufFile::open(&a).expect("the synthetic model parses");
    let table = |f: &hearth_core::gguf::GgufFile| -> Vec<_> {
        f.tensors.iter().map(|t| (t.name.clone(), t.dims.clone(), t.ty, t.offset)).collect()
    };
    assert_eq!(table(&synth_file), table(&real_file));
    let out = run_json(&["run", "-m", &path(&a), "-p", "hello", "-n", "4", "--temperature", "0", "--json", "--quiet"]);
    assert_eq!(out["tokens"].as_array().map(Vec::len), Some(4), "the synthetic model generates");
    let _ = std::fs::remove_dir_all(&dir);
}
