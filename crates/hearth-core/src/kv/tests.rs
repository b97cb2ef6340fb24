use super::*;
use crate::CoreError;

const BS: usize = 4;

fn global(n_blocks: usize) -> KvManager {
    KvManager::new(BS, vec![KvGroup { layers: vec![0, 1], window: None, n_blocks }], 0).expect("manager")
}

/// Reserve + commit, as a step does.
fn append(kv: &mut KvManager, seq: SeqId, tokens: &[u32]) -> KvPlan {
    let plan = kv.reserve(seq, tokens.len()).expect("reserve");
    kv.commit(seq, tokens).expect("commit");
    plan
}

fn idle(kv: &KvManager) -> bool {
    kv.pool_stats().iter().all(|s| s.used == 0 && s.free + s.cached == s.total)
}

#[test]
fn blocks_follow_the_sequence_and_return_to_the_pool() {
    let mut kv = global(8);
    let s = kv.add_sequence();
    append(&mut kv, s, &[1, 2, 3, 4, 5, 6]);
    assert_eq!(kv.block_tables(s)[0].len(), 2);
    assert_eq!(kv.pool_stats()[0].used, 2);
    kv.truncate(s, 3).expect("truncate");
    assert_eq!(kv.block_tables(s)[0].len(), 1);
    assert_eq!(kv.tokens(s), &[1, 2, 3]);
    kv.remove_sequence(s);
    assert!(idle(&kv));
}

#[test]
fn a_second_sequence_reuses_full_prefix_blocks() {
    let mut kv = global(8);
    let a = kv.add_sequence();
    let prompt: Vec<u32> = (0..10).collect();
    assert_eq!(kv.reuse_cached_prefix(a, &prompt).expect("reuse"), 0);
    append(&mut kv, a, &prompt);
    let b = kv.add_sequence();
    // Two full blocks (8 tokens) match; at least one token is always left to evaluate.
    assert_eq!(kv.reuse_cached_prefix(b, &prompt).expect("reuse"), 8);
    assert_eq!(kv.block_tables(b)[0][..], kv.block_tables(a)[0][..2]);
    assert_eq!(kv.pool_stats()[0].used, 3);
    // A different second block stops the match after the first.
    let c = kv.add_sequence();
    let other: Vec<u32> = [0, 1, 2, 3, 9, 9, 9, 9, 9].to_vec();
    assert_eq!(kv.reuse_cached_prefix(c, &other).expect("reuse"), 4);
    let (cached, seen) = kv.prefix_counts();
    assert_eq!((cached, seen), (12, 29));
    for s in [a, b, c] {
        kv.remove_sequence(s);
    }
    assert!(idle(&kv));
    // After every sequence ended the blocks stay cached and still serve a new request, a's
    // partial last block (tokens 8 and 9) too, but for the token left to evaluate.
    let d = kv.add_sequence();
    assert_eq!(kv.reuse_cached_prefix(d, &prompt).expect("reuse"), 9);
}

#[test]
fn writing_into_a_shared_partial_block_copies_it_first() {
    let mut kv = global(8);
    let a = kv.add_sequence();
    append(&mut kv, a, &[1, 2, 3, 4, 5]);
    let b = kv.add_sequence();
    assert_eq!(kv.reuse_cached_prefix(b, &[1, 2, 3, 4, 5]).expect("reuse"), 4);
    let shared = kv.block_tables(a)[0][0];
    // b rolls back into the shared (cached) first block and writes there: copy-on-write.
    kv.truncate(b, 2).expect("truncate");
    let plan = append(&mut kv, b, &[7, 7]);
    assert_eq!(plan.copies.len(), 1);
    let copy = plan.copies[0];
    assert_eq!((copy.src, copy.n_positions), (shared, 2));
    assert_ne!(kv.block_tables(b)[0][0], shared);
    assert_eq!(kv.block_tables(a)[0][0], shared, "the other sequence keeps its block");
    kv.remove_sequence(a);
    kv.remove_sequence(b);
    assert!(idle(&kv));
}

#[test]
fn cached_blocks_are_evicted_least_recently_released_first() {
    let mut kv = global(3);
    for first in [10u32, 20, 30] {
        let s = kv.add_sequence();
        append(&mut kv, s, &[first, 1, 2, 3]);
        kv.remove_sequence(s);
    }
    assert_eq!(kv.pool_stats()[0].cached, 3);
    let s = kv.add_sequence();
    append(&mut kv, s, &[40, 1, 2, 3]); // evicts the block of 10
    kv.remove_sequence(s);
    let probe = kv.add_sequence();
    assert_eq!(kv.reuse_cached_prefix(probe, &[10, 1, 2, 3, 0]).expect("reuse"), 0);
    assert_eq!(kv.reuse_cached_prefix(probe, &[20, 1, 2, 3, 0]).expect("reuse"), 4);
}

#[test]
fn exhaustion_is_a_typed_error_that_changes_nothing() {
    let mut kv = global(2);
    let s = kv.add_sequence();
    append(&mut kv, s, &[1, 2, 3]);
    let before = kv.pool_stats();
    match kv.reserve(s, 10) {
        Err(CoreError::KvExhausted { needed_blocks: 3, available_blocks: 1, total_blocks: 2, block_size: BS }) => {}
        other => panic!("expected KvExhausted, got {other:?}"),
    }
    assert_eq!(kv.pool_stats(), before);
    assert_eq!(kv.block_tables(s)[0].len(), 1);
}

#[test]
fn sliding_window_blocks_are_released_and_limit_rollback() {
    let groups = vec![
        KvGroup { layers: vec![0], window: None, n_blocks: 16 },
        KvGroup { layers: vec![1], window: Some(4), n_blocks: 16 },
    ];
    let mut kv = KvManager::new(BS, groups, 0).expect("manager");
    let s = kv.add_sequence();
    let tokens: Vec<u32> = (0..20).collect();
    append(&mut kv, s, &tokens);
    // A query at position 20 sees 17..=20: blocks 0..4 (positions 0..16) are released.
    let local = &kv.block_tables(s)[1];
    assert_eq!(local.iter().filter(|&&b| b == NO_BLOCK).count(), 4);
    assert!(kv.block_tables(s)[0].iter().all(|&b| b != NO_BLOCK));
    assert_eq!(kv.pool_stats()[1].used, 1);
    // Rolling back to 19 keeps the window (16..=19); to 18 it would need the released 15.
    assert!(kv.can_truncate(s, 19));
    assert!(!kv.can_truncate(s, 18));
    assert!(kv.truncate(s, 10).is_err());
    kv.truncate(s, 0).expect("truncate to empty");
    assert!(idle(&kv));
}

#[test]
fn an_ended_sequences_partial_block_serves_the_next_prompt_that_repeats_it() {
    let mut kv = global(8);
    let a = kv.add_sequence();
    // A turn: 6 tokens, the second block holding 2 of 4 positions.
    append(&mut kv, a, &[1, 2, 3, 4, 5, 6]);
    let partial = kv.block_tables(a)[0][1];
    kv.remove_sequence(a);
    assert!(idle(&kv));
    // The next turn repeats it and goes on: the full block and both partial positions are reused.
    let b = kv.add_sequence();
    assert_eq!(kv.reuse_cached_prefix(b, &[1, 2, 3, 4, 5, 6, 7, 8, 9]).expect("reuse"), 6);
    assert_eq!(kv.block_tables(b)[0][1], partial);
    // Its first write copies the two positions out, leaving the cached block as it was.
    let plan = append(&mut kv, b, &[7]);
    assert_eq!(plan.copies.len(), 1);
    assert_eq!((plan.copies[0].src, plan.copies[0].n_positions), (partial, 2));
    assert_ne!(kv.block_tables(b)[0][1], partial);
    // A prompt repeating only one of the two positions reuses that one; one that differs there
    // reuses none of them; one that would be served whole still leaves a token to evaluate.
    for (prompt, want) in [(&[1, 2, 3, 4, 5, 0, 0][..], 5), (&[1, 2, 3, 4, 0, 0][..], 4), (&[1, 2, 3, 4, 5, 6][..], 5)]
    {
        let c = kv.add_sequence();
        assert_eq!(kv.reuse_cached_prefix(c, prompt).expect("reuse"), want, "{prompt:?}");
        assert_eq!(kv.tokens(c), &prompt[..want]);
        kv.remove_sequence(c);
    }
    kv.remove_sequence(b);
    assert!(idle(&kv));
    // Cached partial blocks are evicted like full ones when the pool needs them.
    let d = kv.add_sequence();
    append(&mut kv, d, &(100..132).collect::<Vec<u32>>());
    kv.remove_sequence(d);
    let e = kv.add_sequence();
    assert_eq!(kv.reuse_cached_prefix(e, &[1, 2, 3, 4, 5, 6, 7]).expect("reuse"), 0);
}

#[test]
fn partial_blocks_are_reused_only_where_every_group_holds_them() {
    let groups = vec![
        KvGroup { layers: vec![0], window: None, n_blocks: 8 },
        KvGroup { layers: vec![1], window: Some(4), n_blocks: 8 },
    ];
    let mut kv = KvManager::new(BS, groups, 0).expect("manager");
    let a = kv.add_sequence();
    append(&mut kv, a, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    kv.remove_sequence(a);
    let b = kv.add_sequence();
    assert_eq!(kv.reuse_cached_prefix(b, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]).expect("reuse"), 10);
    // The windowed group holds only what a query at position 10 sees (7..=10): blocks 1 and 2.
    assert_eq!(kv.block_tables(b)[1][0], NO_BLOCK);
    assert!(kv.block_tables(b)[1][1..].iter().all(|&x| x != NO_BLOCK));
    kv.remove_sequence(b);
    assert!(idle(&kv));
}

#[test]
fn a_shared_prefix_holds_the_sources_blocks_until_either_writes() {
    let mut kv = global(8);
    let a = kv.add_sequence();
    let prompt: Vec<u32> = (0..6).collect();
    append(&mut kv, a, &prompt);
    append(&mut kv, a, &[42]);
    // Everything but the prompt's last token, the partial second block included.
    let (b, gained) = kv.share_prefix(a, &prompt).expect("share");
    assert_eq!(gained, 5);
    assert_eq!(kv.tokens(b), &prompt[..5]);
    assert_eq!(kv.block_tables(b)[0][..], kv.block_tables(a)[0][..2]);
    assert_eq!(kv.pool_stats()[0].used, 2, "no block was allocated");
    // b writes its prompt's last token into the shared partial block: it copies it first.
    let plan = append(&mut kv, b, &prompt[5..]);
    assert_eq!(plan.copies.len(), 1);
    assert_eq!((plan.copies[0].src, plan.copies[0].n_positions), (kv.block_tables(a)[0][1], 1));
    assert_eq!(kv.block_tables(b)[0][0], kv.block_tables(a)[0][0], "full blocks stay shared");
    // A prompt that parts from the source early shares up to where they part.
    let (c, gained) = kv.share_prefix(a, &[0, 1, 9, 9]).expect("share");
    assert_eq!((gained, kv.tokens(c)), (2, &[0u32, 1][..]));
    for s in [a, b, c] {
        kv.remove_sequence(s);
    }
    assert!(idle(&kv));
}
