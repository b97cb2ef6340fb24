//! Attention and the paged KV pool against the CPU oracle: steps of several sequences with
//! different lengths, shuffled (non-contiguous) block tables, a sliding-window group whose old
//! blocks are released, every KV storage type, copy-on-write block copies, per-sequence RoPE
//! positions and last rows, and a steady-state step that builds nothing.

use crate::case::{run_step, single, small_layout, tokens, Case, SeqSpec, Step};
use crate::{nmse, CpuSubject, Rng, Subject, Tolerance};
use hearth_core::backend::{Capability, KvLayout};
use hearth_core::graph::{AttentionParams, BufId, Op, RopeMode, RopeParams, RopeYarn, WeightDesc, WeightId};
use hearth_core::kv::{BlockCopy, KvGroup, KvType, ValueRows, NO_BLOCK};
use hearth_core::quant::GgmlType;
use hearth_cpu::CpuBackend;

const KV_TYPES: [KvType; 4] = [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0];

/// 0..n in random order.
fn shuffled(n: usize, rng: &mut Rng) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        v.swap(i, rng.below(i as u32 + 1) as usize);
    }
    v
}

/// Layer 0 in a global group, layer 1 in a group with sliding window `window`.
fn two_groups(kv_type: KvType, width: usize, block_size: usize, window: usize, n_blocks: usize) -> KvLayout {
    KvLayout {
        n_layers: 2,
        k_width: width,
        v_width: width,
        values: ValueRows::Stored,
        kv_type,
        block_size,
        groups: vec![
            KvGroup { layers: vec![0], window: None, n_blocks },
            KvGroup { layers: vec![1], window: Some(window), n_blocks },
        ],
    }
}

/// Steps for a schedule of (n_tokens, pos0) per sequence per step: every sequence owns
/// `per_seq` blocks of each group, drawn from a shuffled pool; table entries a sliding window
/// has left behind are `NO_BLOCK`, as after a release.
fn schedule(layout: &KvLayout, per_seq: usize, plan: &[&[(usize, usize)]], rng: &mut Rng) -> Vec<Step> {
    let n_seqs = plan[0].len();
    let pools: Vec<Vec<u32>> = layout.groups.iter().map(|g| shuffled(g.n_blocks, rng)).collect();
    assert!(pools.iter().all(|p| p.len() >= n_seqs * per_seq), "pool too small for the schedule");
    plan.iter()
        .map(|seqs| {
            let specs: Vec<SeqSpec> = seqs
                .iter()
                .enumerate()
                .map(|(s, &(n_tokens, pos0))| {
                    let tables = layout
                        .groups
                        .iter()
                        .zip(&pools)
                        .map(|(g, pool)| {
                            let released = g.window.map_or(0, |w| (pos0 + 1).saturating_sub(w)) / layout.block_size;
                            let mut t = pool[s * per_seq..(s + 1) * per_seq].to_vec();
                            t[..released].iter_mut().for_each(|b| *b = NO_BLOCK);
                            t
                        })
                        .collect();
                    SeqSpec { n_tokens, pos0, tables }
                })
                .collect();
            let n: usize = specs.iter().map(|s| s.n_tokens).sum();
            Step { copies: Vec::new(), tokens: tokens(n, 64, rng), seqs: specs }
        })
        .collect()
}

/// q, k, v from random tables; K/V stored into `layer`, attention of q over it.
fn attention_case(n_tokens: usize, n_seqs: usize, params: AttentionParams, layout: KvLayout, rng: &mut Rng) -> Case {
    let mut c = Case::batched(n_tokens, n_seqs);
    let width = params.n_head_kv * params.head_dim;
    let q = c.input("q", params.n_head * params.head_dim, rng);
    let k = c.input("k", width, rng);
    let v = c.input("v", width, rng);
    c.graph.push(Op::StoreKv { layer: params.layer, k, v: Some(v), k_offset: None, v_offset: None });
    let out = c.graph.buf("out", n_tokens, params.n_head * params.head_dim);
    c.graph.push(Op::Attention { q, params, out });
    c.graph.logits = out;
    c.kv = layout;
    c
}

/// An input [n_tokens, width] whose every row carries the same large constant per channel (as
/// the K and V biases make keys and values in Qwen2): a few channels of ±40, the rest within ±1.
/// Returns the buffer and the constants.
fn biased_input(c: &mut Case, name: &str, width: usize, rng: &mut Rng) -> (BufId, Vec<f32>) {
    let buf = c.input(name, width, rng);
    let big: Vec<f32> = (0..width).map(|i| if i % 16 == 5 { 40.0 * rng.f32().signum() } else { rng.f32() }).collect();
    let table = &mut c.weights.last_mut().expect("input table").1;
    for (i, chunk) in table.chunks_exact_mut(4).enumerate() {
        let value = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) + big[i % width];
        chunk.copy_from_slice(&value.to_le_bytes());
    }
    (buf, big)
}

/// An F32 vector weight holding `values`.
fn vector_weight(c: &mut Case, name: &str, values: &[f32]) -> WeightId {
    c.weights.push((
        WeightDesc { name: name.into(), ty: GgmlType::F32, dims: vec![values.len() as u64] },
        values.iter().flat_map(|b| b.to_le_bytes()).collect(),
    ));
    WeightId(c.weights.len() as u32 - 1)
}

/// `attention_case` whose keys and values carry a large constant per channel (`biased_input`),
/// stored with those constants as the key and value offsets when `with_offsets`.
fn biased_kv_case(
    n_tokens: usize,
    with_offsets: bool,
    mut params: AttentionParams,
    layout: KvLayout,
    rng: &mut Rng,
) -> Case {
    let mut c = Case::batched(n_tokens, 1);
    let width = params.n_head_kv * params.head_dim;
    let q = c.input("q", params.n_head * params.head_dim, rng);
    let (k, k_big) = biased_input(&mut c, "k", width, rng);
    let (v, v_big) = biased_input(&mut c, "v", width, rng);
    let (k_offset, v_offset) = if with_offsets {
        (Some(vector_weight(&mut c, "k_offset", &k_big)), Some(vector_weight(&mut c, "v_offset", &v_big)))
    } else {
        (None, None)
    };
    params.v_offset = v_offset;
    c.graph.push(Op::StoreKv { layer: params.layer, k, v: Some(v), k_offset, v_offset });
    let out = c.graph.buf("out", n_tokens, params.n_head * params.head_dim);
    c.graph.push(Op::Attention { q, params, out });
    c.graph.logits = out;
    c.kv = layout;
    c
}

/// The key and value offsets of `Op::StoreKv`: exact types ignore them (bit for bit),
/// quantized ones store keys and values minus them (softmax cannot see the first, attention adds
/// the second back), so attention gets much closer to the f32 oracle when keys and values share
/// large constants; the GPU stores and adds back exactly what the CPU does.
pub fn kv_offsets_are_invisible_to_attention_and_shrink_quantization_error(subject: &dyn Subject) {
    // Two steps of 12 tokens and two of 20 (a GPU backend may merge a long step's attention
    // splits where it merges a short step's in a second kernel, both adding the value offset back).
    for n_tokens in [12, 20] {
        let plan: [&[(usize, usize)]; 2] = [&[(n_tokens, 0)], &[(n_tokens, n_tokens)]];
        let run = |kv_type: KvType, with_offset: bool| {
            // Same seed: the same q, k, v and constant in every run.
            let mut rng = Rng(21);
            let layout = two_groups(kv_type, 64, 8, 8, 8);
            let c = biased_kv_case(n_tokens, with_offset, params(0, 4, 2, 32, None, None), layout.clone(), &mut rng);
            let steps = schedule(&layout, 8, &plan, &mut rng);
            let mut cpu = hearth_cpu::CpuBackend::new(Some(1)).expect("cpu");
            (c.run(&mut cpu, &steps), c, steps)
        };
        let (oracle, ..) = run(KvType::F32, false);
        for kv_type in KV_TYPES {
            let (plain, ..) = run(kv_type, false);
            let (offset, c, steps) = run(kv_type, true);
            let (e_plain, e_offset) =
                (nmse(&plain.concat(), &oracle.concat()), nmse(&offset.concat(), &oracle.concat()));
            let name = kv_type.name();
            eprintln!(
                "{name} KV vs f32, {n_tokens} a step: nmse {e_plain:.3e} without the offsets, {e_offset:.3e} with them"
            );
            if kv_type.subtracts_offsets() {
                assert!(
                    e_offset * 4.0 < e_plain,
                    "{name} KV: the offsets did not shrink the error ({e_offset:.3e} vs {e_plain:.3e})"
                );
            } else {
                assert_eq!(offset, plain, "{name} KV must store keys as they are");
            }
            c.check(subject, &format!("KV offsets, {name} KV, {n_tokens} a step"), Tolerance::ATTENTION, &steps);
        }
    }
}

fn params(
    layer: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    window: Option<usize>,
    softcap: Option<f32>,
) -> AttentionParams {
    AttentionParams {
        layer,
        n_head,
        n_head_kv,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        window,
        softcap,
        v_offset: None,
        sinks: None,
        v_head_dim: None,
        values: ValueRows::Stored,
    }
}

pub fn attention_one_sequence_gqa_window_softcap(subject: &dyn Subject) {
    let mut rng = Rng(6);
    // 70 queries in one step as well as a few: one numerics path for any count. Seven and eight
    // query heads a KV head (Qwen2.5-0.5B's and more than a GPU workgroup may group at once).
    for (n_head, n_head_kv, head_dim, window, softcap, rows) in [
        (4, 2, 64, None, None, 5),
        (14, 2, 64, None, None, 3),
        (8, 1, 256, Some(20), None, 18),
        (2, 2, 256, Some(3), None, 4),
        (6, 1, 32, None, Some(5.0), 3),
        (3, 3, 48, Some(200), None, 7),
        (2, 1, 64, Some(40), None, 70),
    ] {
        let layer = usize::from(window.is_some());
        let layout = two_groups(KvType::F16, n_head_kv * head_dim, 16, window.unwrap_or(1), 20);
        let c = attention_case(
            rows,
            1,
            params(layer, n_head, n_head_kv, head_dim, window, softcap),
            layout.clone(),
            &mut rng,
        );
        // Later steps see keys written by earlier ones; 130+ keys span more than one key tile.
        let plan: [&[(usize, usize)]; 3] = [&[(rows, 0)], &[(rows, rows)], &[(rows, 150)]];
        let steps = schedule(&layout, 20, &plan, &mut rng);
        let what = format!("attention h{n_head}/{n_head_kv} hd{head_dim} w{window:?} cap{softcap:?} rows{rows}");
        c.check(subject, &what, Tolerance::ATTENTION, &steps);
    }
}

pub fn attention_several_sequences_every_kv_type(subject: &dyn Subject) {
    let mut rng = Rng(11);
    // Three sequences of different lengths per step (prompt chunks and decodes mixed), blocks
    // of 4 positions.
    let plan: [&[(usize, usize)]; 3] =
        [&[(5, 0), (1, 0), (9, 0)], &[(2, 5), (12, 1), (1, 9)], &[(7, 7), (3, 13), (5, 10)]];
    for kv_type in KV_TYPES {
        for (layer, window) in [(0, None), (1, Some(5))] {
            let layout = two_groups(kv_type, 64, 4, 5, 20);
            let c = attention_case(15, 3, params(layer, 4, 2, 32, window, None), layout.clone(), &mut rng);
            let steps = schedule(&layout, 6, &plan, &mut rng);
            let what = format!("3 sequences, {} KV, layer {layer} window {window:?}", kv_type.name());
            c.check(subject, &what, Tolerance::ATTENTION, &steps);
        }
    }
    // A long sequence next to a short one in the same step.
    let plan: [&[(usize, usize)]; 2] = [&[(70, 0), (3, 0)], &[(1, 70), (72, 3)]];
    for kv_type in KV_TYPES {
        let layout = two_groups(kv_type, 64, 16, 40, 12);
        let c = attention_case(73, 2, params(1, 2, 1, 64, Some(40), None), layout.clone(), &mut rng);
        let steps = schedule(&layout, 6, &plan, &mut rng);
        c.check(subject, &format!("long + short sequences, {} KV", kv_type.name()), Tolerance::ATTENTION, &steps);
    }
}

/// gpt-oss's attention sinks: a logit per query head that joins its softmax's denominator, one
/// far above the scores (it takes most of the weight), one far below, over two sequences (a
/// prompt chunk and decodes), with and without a sliding window, for every KV type.
pub fn attention_with_sinks(subject: &dyn Subject) {
    let mut rng = Rng(31);
    let plan: [&[(usize, usize)]; 3] = [&[(9, 0), (1, 0)], &[(1, 9), (9, 1)], &[(5, 10), (5, 10)]];
    for kv_type in KV_TYPES {
        for (layer, window) in [(0, None), (1, Some(5))] {
            let layout = two_groups(kv_type, 64, 4, 5, 20);
            let mut c = attention_case(10, 2, params(layer, 4, 2, 32, window, None), layout.clone(), &mut rng);
            let sinks = vector_weight(&mut c, "attn_sinks", &[0.5, 9.0, -1.5, -30.0]);
            for op in &mut c.graph.ops {
                if let Op::Attention { params, .. } = op {
                    params.sinks = Some(sinks);
                }
            }
            let steps = schedule(&layout, 6, &plan, &mut rng);
            let what = format!("attention sinks, {} KV, window {window:?}", kv_type.name());
            c.check(subject, &what, Tolerance::ATTENTION, &steps);
        }
    }
}

/// MLA's attention: many query heads over one KV head whose values are narrower than its keys
/// (keys of [latent, rotated part], values of the latent), over three sequences (prompt chunks
/// and decodes mixed), with and without a window, for every KV type, V2-Lite's head sizes too.
/// The values are the start of the keys, read once from value rows of their own and once from
/// the key rows (`ValueRows::KeyPrefix`, a pool without value rows): every backend's second
/// matches the CPU oracle's first.
pub fn attention_with_values_narrower_than_keys(subject: &dyn Subject) {
    let mut rng = Rng(33);
    let plan: [&[(usize, usize)]; 3] =
        [&[(5, 0), (1, 0), (9, 0)], &[(2, 5), (12, 1), (1, 9)], &[(7, 7), (3, 13), (5, 10)]];
    // V2-Lite's head sizes (keys of 576, values of 512), and smaller ones with and without a window.
    let n_head = 4;
    for kv_type in KV_TYPES {
        for (head_dim, v_dim, window) in [(96, 64, None), (96, 64, Some(5)), (576, 512, None)] {
            let layer = usize::from(window.is_some());
            let mut layout = two_groups(kv_type, head_dim, 4, 5, 20);
            layout.v_width = v_dim;
            let case = |values: ValueRows| {
                let mut c = Case::batched(15, 3);
                let mut rng = Rng(34);
                let q = c.input("q", n_head * head_dim, &mut rng);
                let k = c.input("k", head_dim, &mut rng);
                let v = match values {
                    ValueRows::Stored => Some(prefix_columns(&mut c, k, v_dim)),
                    ValueRows::KeyPrefix => None,
                };
                c.graph.push(Op::StoreKv { layer, k, v, k_offset: None, v_offset: None });
                let out = c.graph.buf("out", 15, n_head * v_dim);
                let params = AttentionParams {
                    v_head_dim: Some(v_dim),
                    values,
                    ..params(layer, n_head, 1, head_dim, window, None)
                };
                c.graph.push(Op::Attention { q, params, out });
                c.graph.logits = out;
                c.kv = KvLayout { values, ..layout.clone() };
                c
            };
            let (stored, key_prefix) = (case(ValueRows::Stored), case(ValueRows::KeyPrefix));
            assert!(key_prefix.kv.total_bytes() < stored.kv.total_bytes());
            let steps = schedule(&layout, 6, &plan, &mut rng);
            let what = format!("values of {v_dim} under keys of {head_dim}, {} KV, window {window:?}", kv_type.name());
            stored.check(subject, &format!("{what}, stored"), Tolerance::ATTENTION, &steps);
            let mut cpu = CpuBackend::new(Some(1)).expect("cpu");
            let want = stored.run(&mut cpu, &steps);
            let what = format!("{what}, read from the keys");
            key_prefix.check_variants(&CpuSubject, &what, Tolerance::EXACT, &steps, &want, &mut cpu);
            key_prefix.check_variants(subject, &what, Tolerance::ATTENTION, &steps, &want, &mut cpu);
        }
    }
}

/// A buffer of the first `cols` columns of the input `of` (an Embed of a table), as an input of
/// its own: the same rows of a table holding the start of `of`'s table's rows.
fn prefix_columns(c: &mut Case, of: BufId, cols: usize) -> BufId {
    let Some(Op::Embed { table, .. }) = c.graph.ops.iter().find(|op| op.outputs() == [of]) else {
        panic!("not an input");
    };
    let (desc, bytes) = &c.weights[table.0 as usize];
    let width = desc.dims[0] as usize * 4;
    let rows: Vec<u8> = bytes.chunks_exact(width).flat_map(|row| row[..cols * 4].to_vec()).collect();
    let n_rows = desc.dims[1];
    c.weights.push((
        WeightDesc { name: format!("w{}", c.weights.len()), ty: GgmlType::F32, dims: vec![cols as u64, n_rows] },
        rows,
    ));
    let table = WeightId(c.weights.len() as u32 - 1);
    let out = c.graph.buf("prefix", c.graph.n_tokens, cols);
    c.graph.push(Op::Embed { table, out });
    out
}

/// What the models run between the q/k/v projections and attention, as one chain (a GPU
/// backend may run it as one dispatch): per-head q/k norms, RoPE and the query scale (Gemma 3),
/// RoPE with key and value offsets (Qwen2), RoPE of adjacent pairs over part of each head with
/// frequency factors (llama 3), then the KV store and attention, over three sequences and every
/// KV type.
pub fn heads_prepared_for_attention(subject: &dyn Subject) {
    let mut rng = Rng(14);
    let plan: [&[(usize, usize)]; 3] =
        [&[(5, 0), (1, 0), (6, 0)], &[(2, 5), (9, 1), (1, 6)], &[(1, 7), (2, 10), (9, 7)]];
    struct Chain {
        what: &'static str,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        n_rot: usize,
        mode: RopeMode,
        norms: bool,
        offsets: bool,
        freq_factors: bool,
        yarn: bool,
        query_scale: bool,
    }
    let chains = [
        Chain {
            what: "q/k norms, rope, query scale",
            n_head: 4,
            n_head_kv: 1,
            head_dim: 256,
            n_rot: 256,
            mode: RopeMode::Neox,
            norms: true,
            offsets: false,
            freq_factors: false,
            yarn: false,
            query_scale: true,
        },
        Chain {
            what: "YaRN rope, KV offsets",
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_rot: 64,
            mode: RopeMode::Neox,
            norms: false,
            offsets: true,
            freq_factors: false,
            yarn: true,
            query_scale: false,
        },
        Chain {
            what: "partial adjacent-pair rope, frequency factors",
            n_head: 3,
            n_head_kv: 1,
            head_dim: 96,
            n_rot: 64,
            mode: RopeMode::Normal,
            norms: false,
            offsets: false,
            freq_factors: true,
            yarn: false,
            query_scale: false,
        },
    ];
    for chain in &chains {
        for kv_type in KV_TYPES {
            let hd = chain.head_dim;
            let (q_width, kv_width) = (chain.n_head * hd, chain.n_head_kv * hd);
            let mut c = Case::batched(12, 3);
            let q = c.input("q", q_width, &mut rng);
            let ((k, k_big), (v, v_big)) = if chain.offsets {
                (biased_input(&mut c, "k", kv_width, &mut rng), biased_input(&mut c, "v", kv_width, &mut rng))
            } else {
                ((c.input("k", kv_width, &mut rng), Vec::new()), (c.input("v", kv_width, &mut rng), Vec::new()))
            };
            if chain.norms {
                for x in [q, k] {
                    let weight = c.weight(GgmlType::F32, &[hd as u64], &mut rng);
                    c.graph.push(Op::RmsNorm { x, weight: Some(weight), eps: 1e-6, group: hd, out: x });
                }
            }
            let freq_factors = chain.freq_factors.then(|| {
                let factors: Vec<f32> = (0..chain.n_rot / 2).map(|i| 1.0 + (i % 5) as f32).collect();
                vector_weight(&mut c, "rope_freqs", &factors)
            });
            // YaRN stretching a 32-position context 4 times.
            let yarn = chain.yarn.then(|| RopeYarn::new(chain.n_rot, 32, 10000.0, 4.0, [32.0, 1.0], 1.0, None));
            let rope = RopeParams {
                mode: chain.mode,
                head_dim: hd,
                n_rot: chain.n_rot,
                freq_base: 10000.0,
                freq_scale: if chain.yarn { 0.25 } else { 1.0 },
                freq_factors,
                yarn,
            };
            c.graph.push(Op::Rope { x: q, params: rope.clone() });
            c.graph.push(Op::Rope { x: k, params: rope });
            let mut attention = params(1, chain.n_head, chain.n_head_kv, hd, Some(6), None);
            if chain.query_scale {
                c.graph.push(Op::Scale { x: q, factor: attention.scale });
                attention.scale = 1.0;
            }
            let (k_offset, v_offset) = if chain.offsets {
                (Some(vector_weight(&mut c, "k_offset", &k_big)), Some(vector_weight(&mut c, "v_offset", &v_big)))
            } else {
                (None, None)
            };
            attention.v_offset = v_offset;
            c.graph.push(Op::StoreKv { layer: 1, k, v: Some(v), k_offset, v_offset });
            let out = c.graph.buf("out", 12, q_width);
            c.graph.push(Op::Attention { q, params: attention, out });
            c.graph.logits = out;
            let layout = two_groups(kv_type, kv_width, 4, 6, 12);
            c.kv = layout.clone();
            let steps = schedule(&layout, 4, &plan, &mut rng);
            c.check(subject, &format!("{}, {} KV", chain.what, kv_type.name()), Tolerance::ATTENTION, &steps);
        }
    }
}

/// Long contexts, whose keys attention may cut into splits merged afterwards (flash decoding): one
/// sequence of 384 positions fed 48 and 16 tokens a step, in a global layer (f16 KV) and a
/// windowed one (q8_0). Against the CPU oracle, and each variant against itself: a query's result
/// is the same bits whichever step size computed it (batch invariance).
pub fn attention_over_long_contexts(subject: &dyn Subject) {
    let total = 384;
    let mut rng = Rng(15);
    let all_tokens = tokens(total, 64, &mut rng);
    for (kv_type, layer, window) in [(KvType::F16, 0, None), (KvType::Q8_0, 1, Some(300))] {
        let layout = two_groups(kv_type, 64, 16, 300, 24);
        let what = format!("long context, {} KV, layer {layer} window {window:?}", kv_type.name());
        // Per step size: the case (the same inputs: the same seed) and its steps.
        let runs: Vec<(usize, Case, Vec<Step>)> = [48usize, 16]
            .into_iter()
            .map(|chunk| {
                let c = attention_case(chunk, 1, params(layer, 4, 2, 32, window, None), layout.clone(), &mut Rng(16));
                let plan: Vec<Vec<(usize, usize)>> = (0..total / chunk).map(|i| vec![(chunk, i * chunk)]).collect();
                let plan_refs: Vec<&[(usize, usize)]> = plan.iter().map(Vec::as_slice).collect();
                let mut steps = schedule(&layout, 24, &plan_refs, &mut rng);
                for (i, step) in steps.iter_mut().enumerate() {
                    step.tokens = all_tokens[i * chunk..(i + 1) * chunk].to_vec();
                }
                (chunk, c, steps)
            })
            .collect();
        let mut cpu = hearth_cpu::CpuBackend::new(Some(1)).expect("cpu");
        let want = runs[0].1.run(&mut cpu, &runs[0].2).concat();
        for ((variant, mut first), (_, mut second)) in subject.variants().into_iter().zip(subject.variants()) {
            let ((chunk_a, case_a, steps_a), (chunk_b, case_b, steps_b)) = (&runs[0], &runs[1]);
            let a = case_a.run(first.as_mut(), steps_a).concat();
            let b = case_b.run(second.as_mut(), steps_b).concat();
            Tolerance::ATTENTION.assert_close(&format!("{what}, {chunk_a} a step [{variant}]"), &a, &want);
            assert!(a == b, "{what} [{variant}]: {chunk_a} and {chunk_b} tokens a step give different results");
        }
    }
}

/// Attention read only by a quantized output projection, as in every model (a backend may write
/// attention's output already rounded for the projection): 8-bit activations in blocks of 32
/// (Q5_0 weights), of 32 with code sums (Q4_1) and of 256 (Q4_K, Q3_K), three sequences, a
/// quantized and an f16 cache; then once more with a second reader after two mat-muls that round
/// other activations.
pub fn attention_feeding_an_output_projection(subject: &dyn Subject) {
    let mut rng = Rng(17);
    let plan: [&[(usize, usize)]; 2] = [&[(5, 0), (1, 0), (6, 0)], &[(2, 5), (9, 1), (1, 6)]];
    for (kv_type, weight_type, late_reader) in [
        (KvType::F16, GgmlType::Q4_K, false),
        (KvType::Q4_0, GgmlType::Q5_0, false),
        (KvType::F16, GgmlType::Q5_0, true),
        (KvType::Q8_0, GgmlType::Q4_1, false),
        (KvType::F16, GgmlType::Q3_K, true),
    ] {
        let layout = two_groups(kv_type, 128, 4, 5, 12);
        let mut c = attention_case(12, 3, params(0, 4, 2, 64, None, None), layout.clone(), &mut rng);
        let attention_out = c.graph.logits;
        let projected = c.graph.buf("projected", 12, 48);
        let w = c.weight(weight_type, &[256, 48], &mut rng);
        c.graph.push(Op::MatMul { w, x: attention_out, bias: None, out: projected });
        if late_reader {
            let other = c.input("other", 256, &mut rng);
            for ty in [GgmlType::Q4_0, GgmlType::Q4_K] {
                let product = c.graph.buf(format!("other {ty:?}"), 12, 48);
                let w = c.weight(ty, &[256, 48], &mut rng);
                c.graph.push(Op::MatMul { w, x: other, bias: None, out: product });
                c.graph.push(Op::Add { a: projected, b: product, out: projected });
            }
            let again = c.graph.buf("again", 12, 48);
            let w = c.weight(weight_type, &[256, 48], &mut rng);
            c.graph.push(Op::MatMul { w, x: attention_out, bias: None, out: again });
            c.graph.push(Op::Add { a: projected, b: again, out: projected });
        }
        c.graph.logits = projected;
        let steps = schedule(&layout, 4, &plan, &mut rng);
        let what = format!("attention → {weight_type:?} projection, {} KV, late reader {late_reader}", kv_type.name());
        c.check(subject, &what, Tolerance::ROUNDED_AFTER_REORDER, &steps);
    }
}

pub fn copied_blocks_are_seen_by_the_new_owner(subject: &dyn Subject) {
    let mut rng = Rng(12);
    for kv_type in KV_TYPES {
        let layout = KvLayout {
            n_layers: 1,
            k_width: 32,
            v_width: 32,
            values: ValueRows::Stored,
            kv_type,
            block_size: 4,
            groups: vec![KvGroup { layers: vec![0], window: None, n_blocks: 16 }],
        };
        let c = attention_case(8, 2, params(0, 2, 1, 32, None, None), layout.clone(), &mut rng);
        let pool = shuffled(16, &mut rng);
        let (a, b, other) = (&pool[0..4], &pool[4..8], &pool[8..12]);
        // B shares A's first block and gets a copy of the first 2 positions of A's second
        // block (copy-on-write of a shared partial block); both then write positions 6.. in
        // their own blocks.
        let b_table = vec![a[0], b[1], b[2], b[3]];
        let seq = |n_tokens, pos0, table: &[u32]| SeqSpec { n_tokens, pos0, tables: vec![table.to_vec()] };
        let steps = vec![
            Step { copies: vec![], tokens: tokens(8, 64, &mut rng), seqs: vec![seq(6, 0, a), seq(2, 0, other)] },
            Step {
                copies: vec![BlockCopy { group: 0, src: a[1], dst: b[1], n_positions: 2 }],
                tokens: tokens(8, 64, &mut rng),
                seqs: vec![seq(4, 6, a), seq(4, 6, &b_table)],
            },
            Step { copies: vec![], tokens: tokens(8, 64, &mut rng), seqs: vec![seq(1, 10, a), seq(7, 9, &b_table)] },
        ];
        c.check(subject, &format!("copy_kv_blocks, {} KV", kv_type.name()), Tolerance::ATTENTION, &steps);
    }
}

pub fn rope_and_last_rows_per_sequence(subject: &dyn Subject) {
    let mut rng = Rng(13);
    let plan = [(3usize, 0usize), (1, 40), (5, 17)];
    let layout = small_layout();
    let step = |rng: &mut Rng| {
        let mut s = single(tokens(9, 64, rng), 0, &layout);
        s.seqs =
            plan.iter().map(|&(n_tokens, pos0)| SeqSpec { n_tokens, pos0, tables: vec![(0..4).collect()] }).collect();
        s
    };
    let mut c = Case::batched(9, 3);
    let x = c.input("x", 64 * 2, &mut rng);
    c.graph.push(Op::Rope {
        x,
        params: RopeParams {
            mode: RopeMode::Neox,
            head_dim: 64,
            n_rot: 64,
            freq_base: 10000.0,
            freq_scale: 1.0,
            freq_factors: None,
            yarn: None,
        },
    });
    c.graph.logits = x;
    c.check(subject, "rope over 3 sequences", Tolerance::SUM_ORDER, &[step(&mut rng)]);
    let mut c = Case::batched(9, 3);
    let x = c.input("x", 300, &mut rng);
    let last = c.graph.buf("last", 3, 300);
    c.graph.push(Op::LastRows { x, out: last });
    c.graph.logits = last;
    c.check(subject, "last rows of 3 sequences", Tolerance::EXACT, &[step(&mut rng)]);
}

/// A warm batched decode step creates no pipelines or bind groups and submits at most once: the
/// step is recorded once and replayed.
pub fn steady_state_batched_decode_builds_nothing(subject: &dyn Subject) {
    for (variant, mut backend) in subject.variants() {
        let backend = backend.as_mut();
        let mut rng = Rng(14);
        let layout = two_groups(KvType::F16, 64, 4, 5, 20);
        let c = attention_case(3, 3, params(1, 4, 2, 32, Some(5), None), layout.clone(), &mut rng);
        let plan: [&[(usize, usize)]; 3] =
            [&[(1, 0), (1, 4), (1, 9)], &[(1, 1), (1, 5), (1, 10)], &[(1, 2), (1, 6), (1, 11)]];
        let steps = schedule(&layout, 6, &plan, &mut rng);
        let (kv, g) = c.load(backend);
        run_step(backend, g, kv, &steps[0]).expect("warm-up step");
        for step in &steps[1..] {
            let before = backend.counters();
            run_step(backend, g, kv, step).expect("step");
            let after = backend.counters();
            assert_eq!(
                after.pipelines_created, before.pipelines_created,
                "[{variant}] a decode step created pipelines"
            );
            assert_eq!(
                after.bind_groups_created, before.bind_groups_created,
                "[{variant}] a decode step created bind groups"
            );
            assert!(after.submits <= before.submits + 1, "[{variant}] a decode step submits more than once");
            assert_eq!(after.steps_executed, before.steps_executed + 1, "[{variant}] steps are counted");
        }
    }
}

/// The KV pool a backend allocates holds exactly the storage type's bytes.
pub fn kv_memory_follows_the_storage_type(subject: &dyn Subject) {
    for (variant, mut backend) in subject.variants() {
        let mut last = backend.memory_bytes();
        for kv_type in KV_TYPES {
            // Rows of 64 values: q8_0 rows (2 blocks of 34 bytes) and q4_0 rows (2 blocks of 18)
            // stay 4-byte aligned, so a device holds exactly the GGML format's bytes.
            let layout = two_groups(kv_type, 64, 16, 8, 10);
            if let Err(reason) = backend.supports(Capability::Kv(&layout)) {
                eprintln!("[{variant}] {} KV: refused ({reason})", kv_type.name());
                continue;
            }
            backend.alloc_kv(layout.clone()).expect("kv");
            let now = backend.memory_bytes();
            eprintln!("[{variant}] {} KV: {} bytes", kv_type.name(), now - last);
            assert_eq!(now - last, layout.total_bytes(), "[{variant}] {} KV pool size", kv_type.name());
            last = now;
        }
    }
}
