//! Hashing and the `<file>.sha256` stamp that records a verified digest, so a present model
//! (up to several GB) is hashed once rather than on every run.
//!
//! Stamp format, one line: `<sha256 hex> <size> <mtime ns since epoch>`. The stamp only counts while
//! the file still has that size and mtime; a replaced or modified file gets hashed again.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use anyhow::{Context, Result};
use indicatif::ProgressBar;
use sha2::{Digest, Sha256};

pub fn stamp_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// `(size, mtime in ns)` of `file`, the identity a stamp is tied to.
fn identity(file: &Path) -> io::Result<(u64, u128)> {
    let meta = fs::metadata(file)?;
    let mtime_ns = meta.modified()?.duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    Ok((meta.len(), mtime_ns))
}

/// The recorded digest of `file`, if a stamp exists and the file is unchanged since it was written.
pub fn read_valid(file: &Path) -> Option<String> {
    let text = fs::read_to_string(stamp_path(file)).ok()?;
    let mut fields = text.split_whitespace();
    let sha = fields.next()?.to_string();
    let size: u64 = fields.next()?.parse().ok()?;
    let mtime_ns: u128 = fields.next()?.parse().ok()?;
    let (now_size, now_mtime) = identity(file).ok()?;
    (size == now_size && mtime_ns == now_mtime).then_some(sha)
}

pub fn write(file: &Path, sha256: &str) -> Result<()> {
    let (size, mtime_ns) = identity(file).with_context(|| format!("reading metadata of {}", file.display()))?;
    let stamp = stamp_path(file);
    fs::write(&stamp, format!("{sha256} {size} {mtime_ns}\n")).with_context(|| format!("writing {}", stamp.display()))
}

/// Lower-case hex sha256 of a file's contents; `bar` (if any) advances by the bytes read.
pub fn sha256_file(path: &Path, bar: &ProgressBar) -> Result<String> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
    Ok(hex(&hasher.finalize()))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What is on disk at a model's final path.
pub enum Present {
    Missing,
    /// Right size and digest (from a valid stamp, or hashed now and stamped).
    Verified,
    /// Right size, wrong digest: the file is corrupt.
    Corrupt {
        found: String,
    },
}

/// Checks a model file at its final path against the expected size and digest. A file of the wrong
/// size counts as missing (it is replaced by the fetch); hashing happens only without a valid stamp.
pub fn check_present(file: &Path, sha256: &str, size: u64, bar: &ProgressBar) -> Result<Present> {
    match fs::metadata(file) {
        Ok(meta) if meta.len() == size => {}
        _ => return Ok(Present::Missing),
    }
    if let Some(recorded) = read_valid(file) {
        if recorded == sha256 {
            return Ok(Present::Verified);
        }
    }
    bar.set_length(size);
    bar.set_message(format!("verifying {}", file.display()));
    let found = sha256_file(file, bar)?;
    bar.finish_and_clear();
    if found == sha256 {
        write(file, &found)?;
        Ok(Present::Verified)
    } else {
        Ok(Present::Corrupt { found })
    }
}
