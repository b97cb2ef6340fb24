//! One block group's pool: reference counts, a free list, and the prefix cache.
//!
//! A block is in exactly one of three states: *used* (ref count > 0), *cached* (ref count 0 but
//! holding a registered block that a later request with the same prefix can reuse; evicted
//! least-recently-released first), or *free*. A registered block is either full (found by the
//! hash chained over its tokens) or the partial last block of an ended sequence (found by its
//! parent's hash and the longest common prefix of its tokens: a chat's next turn resumes
//! exactly where the last answer's KV ends).

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
    /// How each registered block is found.
    key_of: Vec<Option<CacheKey>>,
    /// Tokens of each registered block, to rule out hash collisions (and to match partial ones).
    tokens_of: Vec<Vec<u32>>,
    by_hash: HashMap<u64, u32>,
    /// Registered partial blocks by the chained hash of the full blocks before them.
    partial_by_parent: HashMap<u64, Vec<u32>>,
    /// Unreferenced hashed blocks by release tick (oldest first).
    lru: BTreeMap<u64, u32>,
    released_at: Vec<u64>,
    tick: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CacheKey {
    /// A full block's chained hash.
    Full(u64),
    /// A partial block after the full blocks whose chained hash this is (0: none).
    Partial { parent: u64 },
}

impl BlockPool {
    pub fn new(n_blocks: usize) -> Self {
        BlockPool {
            ref_counts: vec![0; n_blocks],
            // Reversed so that block 0 is handed out first (easier to read in debug output).
            free: (0..n_blocks as u32).rev().collect(),
            key_of: vec![None; n_blocks],
            tokens_of: vec![Vec::new(); n_blocks],
            by_hash: HashMap::new(),
            partial_by_parent: HashMap::new(),
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

    /// Registered for reuse (full or partial): writing into it needs a copy first.
    pub fn is_cached(&self, block: u32) -> bool {
        self.key_of[block as usize].is_some()
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
            if self.key_of[i].is_some() {
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
        if self.key_of[i].is_some() || self.by_hash.contains_key(&hash) {
            return;
        }
        self.by_hash.insert(hash, block);
        self.key_of[i] = Some(CacheKey::Full(hash));
        self.tokens_of[i] = tokens.to_vec();
    }

    /// Makes the partial last block of an ending sequence findable: its first `tokens.len()`
    /// positions hold `tokens`, after the full blocks chained to `parent`. A block already
    /// registered, or one that a registered block under the same parent covers, is left out.
    pub fn register_partial(&mut self, block: u32, parent: u64, tokens: &[u32]) {
        let i = block as usize;
        let siblings = self.partial_by_parent.get(&parent).map_or(&[][..], Vec::as_slice);
        if self.key_of[i].is_some() || siblings.iter().any(|&b| self.tokens_of[b as usize].starts_with(tokens)) {
            return;
        }
        self.partial_by_parent.entry(parent).or_default().push(block);
        self.key_of[i] = Some(CacheKey::Partial { parent });
        self.tokens_of[i] = tokens.to_vec();
    }

    /// The registered partial block after `parent` sharing the longest prefix with `tokens`, and
    /// that prefix's length (at least 1).
    pub fn lookup_partial(&self, parent: u64, tokens: &[u32]) -> Option<(u32, usize)> {
        let common = |b: u32| self.tokens_of[b as usize].iter().zip(tokens).take_while(|(a, b)| a == b).count();
        let (block, len) =
            self.partial_by_parent.get(&parent)?.iter().map(|&b| (b, common(b))).max_by_key(|&(_, n)| n)?;
        (len > 0).then_some((block, len))
    }

    fn forget_hash(&mut self, block: u32) {
        let i = block as usize;
        match self.key_of[i].take() {
            Some(CacheKey::Full(h)) => {
                self.by_hash.remove(&h);
            }
            Some(CacheKey::Partial { parent }) => {
                if let Some(siblings) = self.partial_by_parent.get_mut(&parent) {
                    siblings.retain(|&b| b != block);
                    if siblings.is_empty() {
                        self.partial_by_parent.remove(&parent);
                    }
                }
            }
            None => return,
        }
        self.tokens_of[i].clear();
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
