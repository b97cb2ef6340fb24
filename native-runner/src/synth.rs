//! `hearth models skeleton` and `hearth models synth`: a model's header without its weights, and
//! a full model from such a header with random weights of the same shapes and types. A machine
//! the real files cannot reach (the GPU machine receives 64 MiB per run) gets the skeletons and
//! benchmarks models that cost what the real ones cost.

use anyhow::{bail, Context, Result};
use hearth_core::gguf::{GgufFile, MmapSource};
use hearth_core::quant::synthetic::random_bytes;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

/// Writes the first `data_offset` bytes of `model` (metadata, tokenizer, tensor table) to `out`.
pub fn skeleton(model: &Path, out: &Path) -> Result<()> {
    let file = GgufFile::open(model).with_context(|| format!("reading {}", model.display()))?;
    let header = header_bytes(&file)?;
    std::fs::write(out, &header).with_context(|| format!("writing {}", out.display()))?;
    println!("{}: {} tensors, {} header bytes", out.display(), file.tensors.len(), header.len());
    Ok(())
}

/// Writes `skeleton`'s header followed by random weights for every tensor it lists (each tensor
/// from its own stream of `seed`, so a model is the same whatever the order it is written in).
pub fn synthesize(skeleton: &Path, out: &Path, seed: u64) -> Result<()> {
    let source = Arc::new(MmapSource::open(skeleton).with_context(|| format!("reading {}", skeleton.display()))?);
    let file = GgufFile::read_header(source).with_context(|| format!("parsing {}", skeleton.display()))?;
    let mut writer =
        std::io::BufWriter::new(std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?);
    let header = header_bytes(&file)?;
    writer.write_all(&header)?;
    let mut written = header.len() as u64;
    let mut tensors: Vec<_> = file.tensors.iter().collect();
    tensors.sort_by_key(|t| t.offset);
    for t in tensors {
        if t.offset < written {
            bail!("tensor '{}' overlaps the one before it", t.name);
        }
        writer.write_all(&vec![0u8; (t.offset - written) as usize])?;
        let mut state = seed ^ fnv1a(t.name.as_bytes()) | 1;
        let mut next = || {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let bytes =
            random_bytes(t.ty, t.n_elements() as usize, &mut next).with_context(|| format!("tensor '{}'", t.name))?;
        writer.write_all(&bytes)?;
        written = t.offset + bytes.len() as u64;
    }
    writer.flush()?;
    println!("{}: {} tensors, {} bytes of random weights", out.display(), file.tensors.len(), written);
    Ok(())
}

fn header_bytes(file: &GgufFile) -> Result<Vec<u8>> {
    let mut header = vec![0u8; file.data_offset as usize];
    file.source().read_at(0, &mut header).context("reading the header")?;
    Ok(header)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}
