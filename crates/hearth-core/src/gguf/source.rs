//! Where GGUF bytes come from. The reader only ever asks for byte ranges, so a file never has to
//! be in memory as a whole: natively it is memory-mapped, in the browser it can be a range-fetched
//! URL or a `Blob` behind the same trait.

use crate::error::{CoreError, Result};
use std::sync::Arc;

pub trait ByteSource: Send + Sync {
    /// Total length in bytes.
    fn len(&self) -> u64;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` from `offset`; a range past the end is [`CoreError::Truncated`], never a panic.
    /// Sources that can lend their bytes get this for free from [`ByteSource::slice`].
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let slice = self.slice(offset, buf.len()).ok_or_else(|| CoreError::Truncated {
            what: "read".into(),
            offset,
            needed: buf.len() as u64,
            file_len: self.len(),
        })?;
        buf.copy_from_slice(slice);
        Ok(())
    }

    /// Zero-copy view of a range when the bytes are already addressable (mmap, in-memory).
    fn slice(&self, _offset: u64, _len: usize) -> Option<&[u8]> {
        None
    }

    /// A hint that the caller has copied what it needs of a range and will not read it soon
    /// (a backend that repacked a weight): a memory map drops the range's pages from this
    /// process, so they stop counting in its memory (read again, they come back from the file).
    /// Other sources ignore it.
    fn release(&self, _offset: u64, _len: usize) {}
}

/// The bytes of `offset..offset+len` in `bytes`, if the range is inside it.
fn range(bytes: &[u8], offset: u64, len: usize) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(len)?;
    bytes.get(start..end)
}

/// Bytes held in memory (tests, wasm after a download, fuzzing).
pub struct MemorySource {
    bytes: Arc<[u8]>,
}

impl MemorySource {
    pub fn new(bytes: impl Into<Arc<[u8]>>) -> Self {
        MemorySource { bytes: bytes.into() }
    }
}

impl ByteSource for MemorySource {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn slice(&self, offset: u64, len: usize) -> Option<&[u8]> {
        range(&self.bytes, offset, len)
    }
}

/// A memory-mapped file (native only).
#[cfg(not(target_arch = "wasm32"))]
pub struct MmapSource {
    map: memmap2::Mmap,
}

#[cfg(not(target_arch = "wasm32"))]
impl MmapSource {
    pub fn open(path: &std::path::Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| CoreError::io(format!("opening {}", path.display()), e))?;
        // SAFETY: the map is read-only; a file truncated underneath us by another process is the
        // one hazard of mmap, and every model loader (llama.cpp included) accepts it.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| CoreError::io(format!("memory-mapping {}", path.display()), e))?;
        Ok(MmapSource { map })
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl ByteSource for MmapSource {
    fn len(&self) -> u64 {
        self.map.len() as u64
    }

    fn slice(&self, offset: u64, len: usize) -> Option<&[u8]> {
        range(&self.map, offset, len)
    }

    fn release(&self, offset: u64, len: usize) {
        #[cfg(not(unix))]
        let _ = (offset, len);
        #[cfg(unix)]
        if range(&self.map, offset, len).is_some() {
            // SAFETY: the map is a read-only shared mapping of the file: after MADV_DONTNEED a
            // read faults the same bytes back in from the file, so every slice lent out keeps
            // its contents. A failure only leaves the pages resident.
            let _ =
                unsafe { self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset as usize, len) };
        }
    }
}
