//! Deterministic mutation smoke test: the stable-Rust stand-in for the `fuzz/` target, so CI
//! exercises thousands of corrupt inputs without nightly. Each mutant must parse to Ok or Err —
//! a panic fails the test — and, when it parses, model config and tokenizer construction must not
//! panic either.

use super::{model_like, parse};
use hearth_core::model::ModelConfig;
use hearth_core::tokenizer::Tokenizer;

/// xorshift64*: tiny, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Values that hit edges of lengths, counts and type ids.
const INTERESTING: [u64; 10] = [0, 1, 2, 3, 9, 13, 255, 1 << 31, u32::MAX as u64, u64::MAX];

fn mutate(rng: &mut Rng, base: &[u8], header_end: usize) -> Vec<u8> {
    let mut bytes = base.to_vec();
    // Mostly aim at the header, where the parser lives.
    let pos =
        |rng: &mut Rng, len: usize| if rng.below(4) == 0 { rng.below(len) } else { rng.below(header_end.min(len)) };
    for _ in 0..1 + rng.below(4) {
        if bytes.is_empty() {
            break;
        }
        match rng.below(6) {
            0 => {
                let p = pos(rng, bytes.len());
                bytes[p] ^= 1 << rng.below(8);
            }
            1 => {
                let p = pos(rng, bytes.len());
                bytes[p] = rng.next() as u8;
            }
            2 => {
                let p = pos(rng, bytes.len().saturating_sub(8).max(1));
                let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let n = if rng.below(2) == 0 { 4 } else { 8 };
                let end = (p + n).min(bytes.len());
                bytes[p..end].copy_from_slice(&v[..end - p]);
            }
            3 => {
                let cut = rng.below(bytes.len());
                bytes.truncate(cut);
            }
            4 => {
                let p = pos(rng, bytes.len());
                let n = 1 + rng.below(16);
                let end = (p + n).min(bytes.len());
                bytes.drain(p..end);
            }
            _ => {
                let p = pos(rng, bytes.len());
                let n = 1 + rng.below(16);
                let chunk: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                bytes.splice(p..p, chunk);
            }
        }
    }
    bytes
}

fn exercise(bytes: &[u8]) -> bool {
    let Ok(file) = parse(bytes) else { return false };
    let _ = ModelConfig::from_metadata(&file.metadata);
    let _ = Tokenizer::from_gguf(&file.metadata);
    for t in &file.tensors {
        assert!(file.tensor_bytes(t).is_ok(), "tensor '{}' accepted but unreadable", t.name);
    }
    true
}

fn run(seed: u64, base: &[u8], header_end: usize, n: usize) {
    assert!(exercise(base), "the unmutated file must parse");
    let mut rng = Rng(seed);
    let mut n_ok = 0;
    for _ in 0..n {
        let mutant = mutate(&mut rng, base, header_end);
        n_ok += exercise(&mutant) as usize;
    }
    // Some mutants (a flipped bit in a value) still parse; most must not. Both paths are exercised.
    assert!(n_ok > 0 && n_ok < n, "{n_ok} of {n} mutants parsed");
}

#[test]
fn seeded_mutations_never_panic() {
    let written = model_like(3).write();
    run(0x5EED_1234_ABCD_0001, &written.bytes, written.header_end, 5000);
}

/// gguf-py-written files with tokenizer metadata, so mutants reach `Tokenizer::from_gguf`.
#[test]
fn seeded_mutations_of_tokenizer_files_never_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf");
    for (i, name) in ["tok_spm.gguf", "tok_bpe.gguf"].into_iter().enumerate() {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let file = parse(&bytes).unwrap();
        let tokenizer = Tokenizer::from_gguf(&file.metadata).unwrap();
        assert_eq!(tokenizer.vocab_size(), if i == 0 { 7 } else { 6 });
        assert_eq!(ModelConfig::from_metadata(&file.metadata).unwrap().n_head_kv, 1);
        let len = bytes.len();
        run(0xC0FFEE + i as u64, &bytes, len, 2000);
    }
}
