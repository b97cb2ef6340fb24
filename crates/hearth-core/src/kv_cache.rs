//! KV-cache bookkeeping, owned outside the model. The storage lives in the backend (allocated
//! once, at full capacity); this type tracks how many positions are valid, so rolling back after a
//! rejected speculative draft or a regenerated chat turn is just [`KvCache::truncate`].

use crate::backend::{Backend, KvId, KvLayout};
use crate::error::{CoreError, Result};

#[derive(Debug)]
pub struct KvCache {
    id: KvId,
    layout: KvLayout,
    len: usize,
}

impl KvCache {
    pub fn new(backend: &mut dyn Backend, layout: KvLayout) -> Result<Self> {
        if layout.capacity == 0 {
            return Err(CoreError::InvalidArgument("KV cache capacity must be at least 1".into()));
        }
        let id = backend.alloc_kv(layout.clone())?;
        Ok(KvCache { id, layout, len: 0 })
    }

    pub fn id(&self) -> KvId {
        self.id
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Positions currently holding valid K/V.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.layout.capacity
    }

    /// Positions still free.
    pub fn remaining(&self) -> usize {
        self.layout.capacity - self.len
    }

    /// Checks that `n_new` more tokens fit and returns the position of the first.
    pub fn reserve(&self, n_new: usize) -> Result<usize> {
        let needed = self.len.checked_add(n_new).unwrap_or(usize::MAX);
        if needed > self.layout.capacity {
            return Err(CoreError::ContextOverflow { needed, capacity: self.layout.capacity });
        }
        Ok(self.len)
    }

    /// Marks `n_new` positions written (after a successful step).
    pub fn advance(&mut self, n_new: usize) -> Result<()> {
        self.reserve(n_new)?;
        self.len += n_new;
        Ok(())
    }

    /// Keeps the first `len` positions; later ones are overwritten by the next step.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(CoreError::InvalidArgument(format!(
                "cannot truncate a KV cache of {} positions to {len}",
                self.len
            )));
        }
        self.len = len;
        Ok(())
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Bytes per position across all layers at `bytes_per_value` (2 for f16).
    pub fn bytes_per_token(&self, bytes_per_value: usize) -> usize {
        self.layout.n_layers * (self.layout.k_width + self.layout.v_width) * bytes_per_value
    }
}
