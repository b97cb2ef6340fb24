//! Sequences over the block pools: block tables, reservation before a step, commit after it,
//! rollback, prefix reuse and sliding-window release.

use super::pool::{BlockPool, PoolStats};
use super::types::{KvGroup, NO_BLOCK};
use crate::error::{CoreError, Result};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u32);

/// A block copy the backend performs before the next step (copy-on-write of a shared partial
/// block): positions `0..n_positions` of `src` into `dst`, in every layer of `group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    pub group: usize,
    pub src: u32,
    pub dst: u32,
    pub n_positions: usize,
}

/// What [`KvManager::reserve`] prepared: copies to run before the step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvPlan {
    pub copies: Vec<BlockCopy>,
}

#[derive(Debug, Default)]
struct Sequence {
    /// Tokens whose K/V are stored, in order.
    tokens: Vec<u32>,
    /// Per group: block of each block-sized span of positions (NO_BLOCK once released).
    tables: Vec<Vec<u32>>,
    /// Chained hash of each full block.
    hashes: Vec<u64>,
}

#[derive(Debug)]
pub struct KvManager {
    block_size: usize,
    groups: Vec<KvGroup>,
    pools: Vec<BlockPool>,
    seqs: HashMap<SeqId, Sequence>,
    next_id: u32,
    /// Positions kept beyond a sliding window so a short rollback (a rejected draft) still finds
    /// its keys.
    rollback_margin: usize,
    prompt_tokens: u64,
    cached_prompt_tokens: u64,
}

impl KvManager {
    pub fn new(block_size: usize, groups: Vec<KvGroup>, rollback_margin: usize) -> Result<Self> {
        if block_size == 0 || groups.is_empty() || groups.iter().any(|g| g.n_blocks == 0) {
            return Err(CoreError::InvalidArgument(
                "a KV pool needs a block size and at least one block per group".into(),
            ));
        }
        let pools = groups.iter().map(|g| BlockPool::new(g.n_blocks)).collect();
        Ok(KvManager {
            block_size,
            groups,
            pools,
            seqs: HashMap::new(),
            next_id: 0,
            rollback_margin,
            prompt_tokens: 0,
            cached_prompt_tokens: 0,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn groups(&self) -> &[KvGroup] {
        &self.groups
    }

    pub fn add_sequence(&mut self) -> SeqId {
        let id = SeqId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1);
        let tables = vec![Vec::new(); self.groups.len()];
        self.seqs.insert(id, Sequence { tables, ..Default::default() });
        id
    }

    /// Ends a sequence: its blocks go back to the pool; full ones and a partial last one stay
    /// cached for reuse.
    pub fn remove_sequence(&mut self, seq: SeqId) {
        let Some(s) = self.seqs.remove(&seq) else { return };
        let bs = self.block_size;
        let (full, filled) = (s.tokens.len() / bs, s.tokens.len() % bs);
        let parent = s.hashes.get(full.wrapping_sub(1)).copied().unwrap_or(0);
        for (pool, table) in self.pools.iter_mut().zip(&s.tables) {
            match table.get(full) {
                Some(&b) if filled > 0 && b != NO_BLOCK => pool.register_partial(b, parent, &s.tokens[full * bs..]),
                _ => {}
            }
            table.iter().filter(|&&b| b != NO_BLOCK).for_each(|&b| pool.release(b));
        }
    }

    fn seq(&self, seq: SeqId) -> Result<&Sequence> {
        self.seqs.get(&seq).ok_or_else(|| CoreError::InvalidArgument(format!("unknown KV sequence {}", seq.0)))
    }

    fn seq_mut(&mut self, seq: SeqId) -> Result<&mut Sequence> {
        self.seqs.get_mut(&seq).ok_or_else(|| CoreError::InvalidArgument(format!("unknown KV sequence {}", seq.0)))
    }

    pub fn tokens(&self, seq: SeqId) -> &[u32] {
        self.seqs.get(&seq).map_or(&[], |s| &s.tokens)
    }

    pub fn len(&self, seq: SeqId) -> usize {
        self.tokens(seq).len()
    }

    pub fn is_empty(&self, seq: SeqId) -> bool {
        self.len(seq) == 0
    }

    /// Per group, the block table of `seq` (covers the reserved positions after [`Self::reserve`]).
    pub fn block_tables(&self, seq: SeqId) -> &[Vec<u32>] {
        self.seqs.get(&seq).map_or(&[], |s| &s.tables)
    }

    /// First position a query at `pos` still needs in group `g` (0 without a window).
    fn first_needed(&self, g: usize, pos: usize) -> usize {
        match self.groups[g].window {
            Some(w) => (pos + 1).saturating_sub(w + self.rollback_margin),
            None => 0,
        }
    }

    /// Attaches cached blocks continuing the sequence along `prompt` (whose first `len` tokens
    /// must be the sequence's): full ones, then the positions of an ended sequence's partial
    /// block that `prompt` repeats, leaving at least one prompt token to evaluate. Returns the
    /// number of tokens gained. Also records the prompt for the hit-rate metric.
    pub fn reuse_cached_prefix(&mut self, seq: SeqId, prompt: &[u32]) -> Result<usize> {
        let bs = self.block_size;
        let s = self.seq(seq)?;
        let len = s.tokens.len();
        let matches = prompt.len() > len && prompt[..len] == s.tokens[..];
        let mut parent = s.hashes.last().copied().unwrap_or(0);
        self.prompt_tokens += prompt.len() as u64;
        if !matches {
            return Ok(0);
        }
        // Tokens the sequence already holds count as served from cache too.
        self.cached_prompt_tokens += len as u64;
        if len % bs != 0 {
            return Ok(0);
        }
        let first_block = len / bs;
        let mut candidates = Vec::new(); // (hash, per-group block or NO_BLOCK if missing)
        let mut b = first_block;
        while (b + 1) * bs < prompt.len() {
            let tokens = &prompt[b * bs..(b + 1) * bs];
            let h = chain_hash(parent, tokens);
            let blocks: Vec<u32> = self.pools.iter().map(|p| p.lookup(h, tokens).unwrap_or(NO_BLOCK)).collect();
            candidates.push((h, blocks));
            parent = h;
            b += 1;
        }
        // Global groups need every block; windowed groups only those a query at the new end sees.
        let mut n = candidates.iter().take_while(|(_, blocks)| self.global_groups_hit(blocks)).count();
        while n > 0 && !self.window_tail_hit(&candidates, first_block, n) {
            n -= 1;
        }
        let new_len = (first_block + n) * bs;
        for (i, (h, blocks)) in candidates.iter().take(n).enumerate() {
            let block_index = first_block + i;
            for (g, &block) in blocks.iter().enumerate() {
                let needed = block != NO_BLOCK && (block_index + 1) * bs > self.first_needed(g, new_len);
                let entry = if needed {
                    self.pools[g].retain(block);
                    block
                } else {
                    NO_BLOCK
                };
                self.seqs.get_mut(&seq).expect("checked above").tables[g].push(entry);
            }
            let s = self.seqs.get_mut(&seq).expect("checked above");
            s.hashes.push(*h);
            s.tokens.extend_from_slice(&prompt[block_index * bs..(block_index + 1) * bs]);
        }
        let gained = n * bs + self.reuse_partial_block(seq, &prompt[new_len..prompt.len() - 1]);
        self.cached_prompt_tokens += gained as u64;
        Ok(gained)
    }

    /// A new sequence holding what `source` holds of `prompt`, leaving at least one prompt token
    /// to evaluate, its blocks shared with `source` (a write into a shared partial block copies it
    /// first, [`Self::reserve`]): the choices of one prompt (`n` > 1) read it once. Where a
    /// sliding window has already released keys that position needs, it shares nothing. Returns
    /// the sequence and the tokens gained; records the prompt for the hit-rate metric.
    pub fn share_prefix(&mut self, source: SeqId, prompt: &[u32]) -> Result<(SeqId, usize)> {
        let bs = self.block_size;
        let s = self.seq(source)?;
        let common = s.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let len = common.min(prompt.len().saturating_sub(1));
        let len = if self.can_truncate(source, len) { len } else { 0 };
        let shared = Sequence {
            tokens: s.tokens[..len].to_vec(),
            tables: s.tables.iter().map(|t| t[..len.div_ceil(bs)].to_vec()).collect(),
            hashes: s.hashes[..len / bs].to_vec(),
        };
        for (pool, table) in self.pools.iter_mut().zip(&shared.tables) {
            table.iter().filter(|&&b| b != NO_BLOCK).for_each(|&b| pool.retain(b));
        }
        let id = self.add_sequence();
        self.seqs.insert(id, shared);
        self.prompt_tokens += prompt.len() as u64;
        self.cached_prompt_tokens += len as u64;
        Ok((id, len))
    }

    /// Attaches, in every group, a cached partial block continuing `seq` (at a block boundary)
    /// with a prefix of `tokens`; the sequence's next write into it copies it first
    /// ([`Self::reserve`]). Returns the positions gained.
    fn reuse_partial_block(&mut self, seq: SeqId, tokens: &[u32]) -> usize {
        let Some(s) = self.seqs.get(&seq) else { return 0 };
        let parent = s.hashes.last().copied().unwrap_or(0);
        let hits: Option<Vec<(u32, usize)>> = self.pools.iter().map(|p| p.lookup_partial(parent, tokens)).collect();
        let Some(hits) = hits else { return 0 };
        // Groups may have cached different sequences' blocks: the positions all of them hold.
        let n = hits.iter().map(|&(_, n)| n).min().unwrap_or(0);
        let s = self.seqs.get_mut(&seq).expect("checked above");
        for (g, &(block, _)) in hits.iter().enumerate() {
            self.pools[g].retain(block);
            s.tables[g].push(block);
        }
        s.tokens.extend_from_slice(&tokens[..n]);
        n
    }

    fn global_groups_hit(&self, blocks: &[u32]) -> bool {
        self.groups.iter().zip(blocks).all(|(g, &b)| g.window.is_some() || b != NO_BLOCK)
    }

    /// Whether windowed groups hold every block a query at position `(first + n) * bs` needs.
    fn window_tail_hit(&self, candidates: &[(u64, Vec<u32>)], first: usize, n: usize) -> bool {
        let new_len = (first + n) * self.block_size;
        (0..self.groups.len()).all(|g| {
            let Some(w) = self.groups[g].window else { return true };
            // Strictly the window here: the rollback margin is kept when present, not required.
            let lo_block = (new_len + 1).saturating_sub(w) / self.block_size;
            candidates[..n].iter().enumerate().all(|(i, (_, blocks))| first + i < lo_block || blocks[g] != NO_BLOCK)
        })
    }

    /// Makes room for `n_new` tokens after the current end: allocates blocks, and copies a partial
    /// last block that is shared or cached before it is written (copy-on-write). Either everything
    /// is reserved or nothing changes.
    pub fn reserve(&mut self, seq: SeqId, n_new: usize) -> Result<KvPlan> {
        let bs = self.block_size;
        let s = self.seq(seq)?;
        let len = s.tokens.len();
        let blocks_after = (len + n_new).div_ceil(bs);
        let partial = len % bs != 0;
        let mut needed = vec![0usize; self.groups.len()];
        for (g, table) in s.tables.iter().enumerate() {
            needed[g] = blocks_after.saturating_sub(table.len());
            if partial {
                let b = table[len / bs];
                if b != NO_BLOCK && (self.pools[g].ref_count(b) > 1 || self.pools[g].is_cached(b)) {
                    needed[g] += 1;
                }
            }
        }
        for (g, &n) in needed.iter().enumerate() {
            let available = self.pools[g].available();
            if n > available {
                return Err(CoreError::KvExhausted {
                    needed_blocks: n,
                    available_blocks: available,
                    total_blocks: self.pools[g].n_blocks(),
                    block_size: bs,
                });
            }
        }
        let mut plan = KvPlan::default();
        let s = self.seqs.get_mut(&seq).expect("checked above");
        for (g, table) in s.tables.iter_mut().enumerate() {
            let pool = &mut self.pools[g];
            if partial {
                let i = len / bs;
                let b = table[i];
                if b != NO_BLOCK && (pool.ref_count(b) > 1 || pool.is_cached(b)) {
                    let copy = pool.allocate().expect("counted above");
                    plan.copies.push(BlockCopy { group: g, src: b, dst: copy, n_positions: len % bs });
                    pool.release(b);
                    table[i] = copy;
                }
            }
            while table.len() < blocks_after {
                table.push(pool.allocate().expect("counted above"));
            }
        }
        Ok(plan)
    }

    /// Records that the positions after the current end now hold `tokens` (after a successful
    /// step): hashes newly full blocks into the prefix cache, then releases blocks that every
    /// future query's sliding window has left behind.
    pub fn commit(&mut self, seq: SeqId, tokens: &[u32]) -> Result<()> {
        let bs = self.block_size;
        let s = self.seq_mut(seq)?;
        let new_len = s.tokens.len() + tokens.len();
        if s.tables.iter().any(|t| t.len() * bs < new_len) {
            return Err(CoreError::InvalidArgument("commit of KV positions that were not reserved".into()));
        }
        s.tokens.extend_from_slice(tokens);
        let s = self.seqs.get_mut(&seq).expect("checked above");
        while s.hashes.len() < new_len / bs {
            let b = s.hashes.len();
            let block_tokens = &s.tokens[b * bs..(b + 1) * bs];
            let h = chain_hash(s.hashes.last().copied().unwrap_or(0), block_tokens);
            s.hashes.push(h);
            for (pool, table) in self.pools.iter_mut().zip(&s.tables) {
                if table[b] != NO_BLOCK {
                    pool.register(table[b], h, block_tokens);
                }
            }
        }
        for g in 0..self.groups.len() {
            if self.groups[g].window.is_none() {
                continue;
            }
            // Keys a query at the next position (new_len) no longer sees.
            let release_below = self.first_needed(g, new_len) / bs;
            let s = self.seqs.get_mut(&seq).expect("checked above");
            for entry in s.tables[g].iter_mut().take(release_below) {
                if *entry != NO_BLOCK {
                    self.pools[g].release(*entry);
                    *entry = NO_BLOCK;
                }
            }
        }
        Ok(())
    }

    /// Whether [`Self::truncate`] to `len` keeps every key a query at `len` needs (a sliding
    /// window may already have released them).
    pub fn can_truncate(&self, seq: SeqId, len: usize) -> bool {
        let Ok(s) = self.seq(seq) else { return false };
        if len > s.tokens.len() {
            return false;
        }
        (0..self.groups.len()).all(|g| {
            let lo = self.groups[g].window.map_or(0, |w| (len + 1).saturating_sub(w)) / self.block_size;
            let hi = len.div_ceil(self.block_size);
            s.tables[g][lo.min(hi)..hi].iter().all(|&b| b != NO_BLOCK)
        })
    }

    /// Keeps the first `len` positions (rollback of a rejected draft, regenerate, a new prompt
    /// sharing a prefix). Blocks past the end go back to the pool.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<()> {
        if !self.can_truncate(seq, len) {
            return Err(CoreError::InvalidArgument(format!(
                "cannot roll the KV cache back to {len} tokens (longer than the sequence, or past what the sliding window kept)"
            )));
        }
        let bs = self.block_size;
        let s = self.seqs.get_mut(&seq).expect("checked above");
        s.tokens.truncate(len);
        s.hashes.truncate(len / bs);
        for (pool, table) in self.pools.iter_mut().zip(s.tables.iter_mut()) {
            for b in table.drain(len.div_ceil(bs)..) {
                if b != NO_BLOCK {
                    pool.release(b);
                }
            }
        }
        Ok(())
    }

    pub fn pool_stats(&self) -> Vec<PoolStats> {
        self.pools.iter().map(|p| p.stats()).collect()
    }

    /// Blocks referenced by live sequences, over all groups.
    pub fn used_blocks(&self) -> usize {
        self.pools.iter().map(|p| p.stats().used).sum()
    }

    /// Blocks an allocation could take now in group `g` (free + evictable cached).
    pub fn available_blocks(&self, g: usize) -> usize {
        self.pools[g].available()
    }

    /// Prompt tokens served from the prefix cache / prompt tokens seen.
    pub fn prefix_hit_rate(&self) -> f64 {
        if self.prompt_tokens == 0 {
            0.0
        } else {
            self.cached_prompt_tokens as f64 / self.prompt_tokens as f64
        }
    }

    pub fn prefix_counts(&self) -> (u64, u64) {
        (self.cached_prompt_tokens, self.prompt_tokens)
    }

    /// Forgets every cached block (sequences keep theirs).
    pub fn clear_cache(&mut self) {
        self.pools.iter_mut().for_each(|p| p.clear_cache());
    }
}

/// Hash of a block chained over its predecessors, so equal hashes mean equal prefixes.
fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    // SipHash with fixed keys: stable for the life of the process, which is all a cache needs.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}
