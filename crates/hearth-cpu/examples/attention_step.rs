//! Time of the attention of one decode step (all layers, one token) over a paged KV cache at
//! about 1k context, per KV type, with Qwen2.5-0.5B's shapes (24 layers, 14 query heads over 2 KV
//! heads of 64, value offsets on the quantized types). Best of many repetitions: the minimum
//! filters out preemption on a shared machine.
//! `cargo run --release -p hearth-cpu --example attention_step [-- CONTEXT THREADS TYPES]`
//! (TYPES: comma-separated, default f16,q8_0,q4_0).

use hearth_core::backend::KvLayout;
use hearth_core::graph::{AttentionParams, SeqStep};
use hearth_core::kv::{KvGroup, KvType};
use hearth_cpu::{paged_attention, KvStore, Numerics};
use std::time::Instant;

const N_LAYERS: usize = 24;
const N_HEAD: usize = 14;
const N_HEAD_KV: usize = 2;
const HEAD_DIM: usize = 64;
const BLOCK_SIZE: usize = 16;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let context: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1024);
    let threads: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2);
    let types = args.next().unwrap_or_else(|| "f16,q8_0,q4_0".into());
    let types: Vec<KvType> = types.split(',').map(KvType::parse).collect::<Result<_, _>>()?;
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global()?;
    let width = N_HEAD_KV * HEAD_DIM;
    let n_blocks = context.div_ceil(BLOCK_SIZE);
    // Deterministic pseudo-random rows: keys with a few large channels (like Qwen's).
    let value = |i: usize| ((i.wrapping_mul(2654435761) >> 7) % 2001) as f32 / 1000.0 - 1.0;
    let k: Vec<f32> = (0..context * width).map(|i| value(i) * if i % 7 == 0 { 12.0 } else { 1.0 }).collect();
    let v: Vec<f32> = (0..context * width).map(|i| value(i + 17) * 2.0).collect();
    let offsets: Vec<f32> = (0..width).map(|i| value(i + 3)).collect();
    let q: Vec<f32> = (0..N_HEAD * HEAD_DIM).map(|i| value(i + 5) * 1.5).collect();
    // A block table in pool order reversed, so that logical order is not memory order.
    let tables = vec![(0..n_blocks as u32).rev().collect::<Vec<_>>()];
    println!("context {context}, {threads} threads, {N_LAYERS} layers of {N_HEAD}/{N_HEAD_KV} heads x {HEAD_DIM}");
    for kv_type in types {
        let group = KvGroup { layers: (0..N_LAYERS).collect(), window: None, n_blocks };
        let layout = KvLayout {
            n_layers: N_LAYERS,
            k_width: width,
            v_width: width,
            values: hearth_core::kv::ValueRows::Stored,
            kv_type,
            block_size: BLOCK_SIZE,
            groups: vec![group],
        };
        let mut kv = KvStore::new(layout)?;
        let all = SeqStep { n_tokens: context, pos0: 0, block_tables: &tables };
        for layer in 0..N_LAYERS {
            kv.store(layer, &[all], &k, Some(&v), Some(&offsets), Some(&offsets))?;
        }
        let pos = context - 1;
        let step = SeqStep { n_tokens: 1, pos0: pos, block_tables: &tables };
        let mut out = vec![0f32; N_HEAD * HEAD_DIM];
        let mut best = f64::MAX;
        for _ in 0..200 {
            let start = Instant::now();
            for layer in 0..N_LAYERS {
                let params = AttentionParams {
                    layer,
                    n_head: N_HEAD,
                    n_head_kv: N_HEAD_KV,
                    head_dim: HEAD_DIM,
                    scale: 1.0 / (HEAD_DIM as f32).sqrt(),
                    window: None,
                    softcap: None,
                    v_offset: None,
                    sinks: None,
                    v_head_dim: None,
                    values: hearth_core::kv::ValueRows::Stored,
                };
                let paged = kv.paged(layer, &step, 0, pos, Some(&offsets))?;
                paged_attention(&q, paged, &params, None, pos, 1, Numerics::Hearth, &mut out)?;
            }
            best = best.min(start.elapsed().as_secs_f64());
        }
        println!("{:>5}: {:.3} ms per step (best of 200)", kv_type.name(), best * 1e3);
    }
    Ok(())
}
