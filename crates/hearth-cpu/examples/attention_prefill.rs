//! Time of one layer's attention for a prompt chunk of 256 queries (positions CONTEXT - 256 ..
//! CONTEXT) over a paged KV cache, for the shapes of Qwen2.5-0.5B (14/2 heads x 64), Qwen2.5-1.5B
//! (12/2 x 128) and Gemma 3 270M (4/1 x 256, global layer), per KV type and context. Best of
//! several repetitions: the minimum filters out preemption on a shared machine.
//! `cargo run --release -p hearth-cpu --example attention_prefill [-- CONTEXTS THREADS TYPES]`
//! (CONTEXTS, TYPES: comma-separated; defaults 256,1024,4096 2 f16,q8_0).

use hearth_core::backend::KvLayout;
use hearth_core::graph::{AttentionParams, SeqStep};
use hearth_core::kv::{KvGroup, KvType};
use hearth_cpu::{paged_attention, KvStore, Numerics};
use std::time::Instant;

const CHUNK: usize = 256;
const BLOCK_SIZE: usize = 16;

/// (name, query heads, KV heads, head_dim).
const SHAPES: [(&str, usize, usize, usize); 3] =
    [("qwen2.5-0.5b", 14, 2, 64), ("qwen2.5-1.5b", 12, 2, 128), ("gemma-3-270m", 4, 1, 256)];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let contexts = args.next().unwrap_or_else(|| "256,1024,4096".into());
    let contexts: Vec<usize> = contexts.split(',').map(|c| c.parse()).collect::<Result<_, _>>()?;
    let threads: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2);
    let types = args.next().unwrap_or_else(|| "f16,q8_0".into());
    let types: Vec<KvType> = types.split(',').map(KvType::parse).collect::<Result<_, _>>()?;
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global()?;
    // Deterministic pseudo-random rows: keys with a few large channels (like Qwen's).
    let value = |i: usize| ((i.wrapping_mul(2654435761) >> 7) % 2001) as f32 / 1000.0 - 1.0;
    println!("{CHUNK} queries per layer, {threads} threads; ms per layer (best of repetitions)");
    for (name, n_head, n_head_kv, head_dim) in SHAPES {
        for &kv_type in &types {
            for &context in &contexts {
                let context = context.max(CHUNK);
                let width = n_head_kv * head_dim;
                let n_blocks = context.div_ceil(BLOCK_SIZE);
                let k: Vec<f32> =
                    (0..context * width).map(|i| value(i) * if i % 7 == 0 { 12.0 } else { 1.0 }).collect();
                let v: Vec<f32> = (0..context * width).map(|i| value(i + 17) * 2.0).collect();
                let offsets: Vec<f32> = (0..width).map(|i| value(i + 3)).collect();
                let q: Vec<f32> = (0..CHUNK * n_head * head_dim).map(|i| value(i + 5) * 1.5).collect();
                // A block table in pool order reversed, so that logical order is not memory order.
                let tables = vec![(0..n_blocks as u32).rev().collect::<Vec<_>>()];
                let group = KvGroup { layers: vec![0], window: None, n_blocks };
                let layout = KvLayout {
                    n_layers: 1,
                    k_width: width,
                    v_width: width,
                    values: hearth_core::kv::ValueRows::Stored,
                    kv_type,
                    block_size: BLOCK_SIZE,
                    groups: vec![group],
                };
                let mut kv = KvStore::new(layout)?;
                let all = SeqStep { n_tokens: context, pos0: 0, block_tables: &tables };
                let offset = kv_type.rotates().then_some(&offsets[..]);
                kv.store(0, &[all], &k, Some(&v), offset, offset)?;
                let pos0 = context - CHUNK;
                let step = SeqStep { n_tokens: CHUNK, pos0, block_tables: &tables };
                let params = AttentionParams {
                    layer: 0,
                    n_head,
                    n_head_kv,
                    head_dim,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    window: None,
                    softcap: None,
                    v_offset: None,
                    sinks: None,
                    v_head_dim: None,
                    values: hearth_core::kv::ValueRows::Stored,
                };
                let mut out = vec![0f32; CHUNK * n_head * head_dim];
                let repetitions = (40_000 / context).clamp(3, 40);
                let mut best = f64::MAX;
                for _ in 0..repetitions {
                    let start = Instant::now();
                    let paged = kv.paged(0, &step, 0, context - 1, offset)?;
                    paged_attention(&q, paged, &params, None, pos0, CHUNK, Numerics::Hearth, &mut out)?;
                    best = best.min(start.elapsed().as_secs_f64());
                }
                println!("{name:>13} {:>5} context {context:>5}: {:8.3} ms", kv_type.name(), best * 1e3);
            }
        }
    }
    Ok(())
}
