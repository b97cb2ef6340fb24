//! Paged KV cache, owned outside the model (vLLM's block manager, mistral.rs's snapshot/rollback).
//!
//! The backend holds one pool of fixed-size blocks per *block group* (for gemma3, the sliding-window
//! layers form their own group, so blocks that fall out of the window can be released without
//! touching the global layers). This module decides which block holds which positions:
//! - [`BlockPool`]: ref-counted blocks, a free list, and the prefix cache — full blocks keyed by a
//!   hash chained over their tokens, and the partial last block of each ended sequence (so a
//!   conversation's next turn resumes where the last one's KV ends), kept after their sequences
//!   end and evicted LRU when needed;
//! - [`KvManager`]: the sequences, their block tables and token history, reservation, rollback,
//!   copy-on-write of a shared partial block, sliding-window release, and metrics.
//!
//! Backends see only [`crate::backend::KvLayout`] (the pool shapes) and per-step block tables.

mod manager;
mod pool;
mod types;

pub use manager::{BlockCopy, KvManager, KvPlan, SeqId};
pub use pool::{BlockPool, PoolStats};
pub use types::{hadamard32, KvGroup, KvType, ValueRows, NO_BLOCK};

#[cfg(test)]
mod tests;
