//! One block group's pool: reference counts, a free list, and the prefix cache.
//!
//! A block is in exactly one of three states: *used* (ref count > 0), *cached* (ref count 0 but
//! holding a full, hashed block that a later request with the same prefix can reuse; evicted
//! least-recently-released first), or *free*.

use std::collections::{BTreeMap, HashMap};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    pub total: usize,
    /// Referenced by at least one sequence.
    pub used: usize,
    /// Unreferenced, kept for prefix reuse.
    pub cached: usize,
    pub free: usize,
}

#[derive(Debug)]
pub struct BlockPool {
    ref_counts: Vec<u32>,
    /// Never-hashed (or evicted) blocks, reused first.
    free: Vec<u32>,
    /// Hash of each cached/registered block.
    hash_of: Vec<Option<u64>>,
    /// Tokens of each registered block, to rule out hash collisions.
    tokens_of: Vec<Vec<u32>>,
    by_hash: HashMap<u64, u32>,
    /// Unreferenced hashed blocks by release tick (oldest first).
    lru: BTreeMap<u64, u32>,
    released_at: Vec<u64>,
    tick: u64,
}

impl BlockPool {
    pub fn new(n_blocks: usize) -> Self {
        BlockPool {
            ref_counts: vec![0; n_blocks],
            // Reversed so that block 0 is handed out first (easier to read in debug output).
            free: (0..n_blocks as u32).rev().collect(),
            hash_of: vec![None; n_blocks],
            tokens_of: vec![Vec::new(); n_blocks],
            by_hash: HashMap::new(),
            lru: BTreeMap::new(),
            released_at: vec![0; n_blocks],
            tick: 0,
        }
    }

    pub fn n_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks an allocation can take: free ones plus cached ones (evicted on demand).
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    pub fn ref_count(&self, block: u32) -> u32 {
        self.ref_counts[block as usize]
    }

    pub fn is_cached(&self, block: u32) -> bool {
        self.hash_of[block as usize].is_some()
    }

    /// A block with ref count 1; evicts the least recently released cached block when no free
    /// block is left.
    pub fn allocate(&mut self) -> Option<u32> {
        let block = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.lru.pop_first()?;
                self.forget_hash(b);
                b
            }
        };
        self.ref_counts[block as usize] = 1;
        Some(block)
    }

    pub fn retain(&mut self, block: u32) {
        let i = block as usize;
        if self.ref_counts[i] == 0 {
            self.lru.remove(&self.released_at[i]);
        }
        self.ref_counts[i] += 1;
    }

    pub fn release(&mut self, block: u32) {
        let i = block as usize;
        debug_assert!(self.ref_counts[i] > 0, "release of an unreferenced block {block}");
        self.ref_counts[i] = self.ref_counts[i].saturating_sub(1);
        if self.ref_counts[i] == 0 {
            if self.hash_of[i].is_some() {
                self.tick += 1;
                self.released_at[i] = self.tick;
                self.lru.insert(self.tick, block);
            } else {
                self.free.push(block);
            }
        }
    }

    /// Cached block holding exactly `tokens` under `hash`.
    pub fn lookup(&self, hash: u64, tokens: &[u32]) -> Option<u32> {
        let &b = self.by_hash.get(&hash)?;
        (self.tokens_of[b as usize] == tokens).then_some(b)
    }

    /// Makes a full block findable by its chained hash. A second block with the same content
    /// stays unregistered (the first one keeps serving the prefix).
    pub fn register(&mut self, block: u32, hash: u64, tokens: &[u32]) {
        let i = block as usize;
        if self.hash_of[i].is_some() || self.by_hash.contains_key(&hash) {
            return;
        }
        self.by_hash.insert(hash, block);
        self.hash_of[i] = Some(hash);
        self.tokens_of[i] = tokens.to_vec();
    }

    fn forget_hash(&mut self, block: u32) {
        let i = block as usize;
        if let Some(h) = self.hash_of[i].take() {
            self.by_hash.remove(&h);
            self.tokens_of[i].clear();
        }
    }

    /// Drops every cached (unreferenced) block back to the free list.
    pub fn clear_cache(&mut self) {
        while let Some((_, b)) = self.lru.pop_first() {
            self.forget_hash(b);
            self.free.push(b);
        }
    }

    pub fn stats(&self) -> PoolStats {
        let used = self.ref_counts.iter().filter(|&&r| r > 0).count();
        PoolStats { total: self.n_blocks(), used, cached: self.lru.len(), free: self.free.len() }
    }
}
