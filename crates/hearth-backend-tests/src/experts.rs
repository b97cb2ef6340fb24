//! Mixture-of-experts ops: a whole expert FFN (router mat-mul, routing, the chosen experts'
//! gate/up/down mat-muls, SwiGLU, the weighted combination) for every weight type of the expert
//! stacks against the CPU oracle, and the oracle against a host reference in f64.

use crate::case::{run_step, single, small_layout, tokens, Case, WEIGHT_TYPES};
use crate::{Rng, Subject, Tolerance};
use hearth_core::backend::Backend;
use hearth_core::graph::{BufType, ExpertGating, ExpertGroups, ExpertRouting, GluActivation, Op, WeightDesc, WeightId};
use hearth_core::model::ExpertBiases;
use hearth_core::quant::GgmlType;
use hearth_cpu::CpuBackend;

const N_EXPERT: usize = 8;
const N_USED: usize = 2;
const N_TOKENS: usize = 5;
/// Rows of the table the tokens' input rows come from.
const INPUT_ROWS: u32 = 64;

/// The weights of [`moe_case`], by id.
struct MoeWeights {
    table: WeightId,
    router: WeightId,
    gate: WeightId,
    up: WeightId,
    down: WeightId,
    biases: Option<ExpertBiases>,
    selection_bias: Option<WeightId>,
}

/// The experts' flavour.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Experts {
    /// SwiGLU experts without biases (every MoE but gpt-oss).
    SwiGlu,
    /// gpt-oss's: a bias on the router and every expert matrix, the clamped SwiGLU.
    GptOss,
}

/// An F32 weight of `dims` with random values of magnitude up to `scale`.
fn scaled_f32(c: &mut Case, dims: &[u64], scale: f32, rng: &mut Rng) -> WeightId {
    let n = dims.iter().product::<u64>() as usize;
    let bytes = (0..n).flat_map(|_| (rng.f32() * scale).to_le_bytes()).collect();
    c.weights
        .push((WeightDesc { name: format!("w{}", c.weights.len()), ty: GgmlType::F32, dims: dims.to_vec() }, bytes));
    WeightId(c.weights.len() as u32 - 1)
}

/// One MoE FFN over `n_tokens` tokens of `n_embd` values, experts of `n_ff` hidden values in
/// `ty`, the router F32 (as llama.cpp's files keep it); the output is the combined FFN output.
/// gpt-oss's gate and up biases reach ±8, so the clamp at ±7 bites. A `routing` with a
/// `selection_bias` (any id) gets a random one of ±0.5.
fn moe_case(
    n_tokens: usize,
    ty: GgmlType,
    (n_embd, n_ff): (usize, usize),
    routing: ExpertRouting,
    experts: Experts,
    rng: &mut Rng,
) -> (Case, MoeWeights) {
    let n_used = routing.n_used;
    let mut c = Case::new(n_tokens);
    let x = c.input("x", n_embd, rng);
    let table = WeightId(c.weights.len() as u32 - 1);
    let router = c.weight(GgmlType::F32, &[n_embd as u64, N_EXPERT as u64], rng);
    let (e, f, x_count) = (n_embd as u64, n_ff as u64, N_EXPERT as u64);
    let gate = c.weight(ty, &[e, f, x_count], rng);
    let up = c.weight(ty, &[e, f, x_count], rng);
    let down = c.weight(ty, &[f, e, x_count], rng);
    let (activation, biases) = match experts {
        Experts::SwiGlu => (GluActivation::Silu, None),
        Experts::GptOss => {
            let biases = ExpertBiases {
                router: scaled_f32(&mut c, &[x_count], 1.0, rng),
                gate: scaled_f32(&mut c, &[f, x_count], 8.0, rng),
                up: scaled_f32(&mut c, &[f, x_count], 8.0, rng),
                down: scaled_f32(&mut c, &[e, x_count], 1.0, rng),
            };
            (GluActivation::GPT_OSS, Some(biases))
        }
    };
    let bias = |pick: fn(&ExpertBiases) -> WeightId| biases.as_ref().map(pick);
    let selection_bias = routing.selection_bias.map(|_| scaled_f32(&mut c, &[x_count], 0.5, rng));
    let routing = ExpertRouting { selection_bias, ..routing };
    let g = &mut c.graph;
    let logits = g.buf("ffn_moe_logits", n_tokens, N_EXPERT);
    let ids = g.typed_buf("ffn_moe_topk", BufType::U32, n_tokens, n_used);
    let weights = g.buf("ffn_moe_weights", n_tokens, n_used);
    let gate_out = g.buf("gate", n_tokens, n_used * n_ff);
    let up_out = g.buf("up", n_tokens, n_used * n_ff);
    let down_out = g.buf("down", n_tokens, n_used * n_embd);
    let out = g.buf("out", n_tokens, n_embd);
    g.push(Op::MatMul { w: router, x, bias: bias(|b| b.router), out: logits });
    g.push(Op::RouteExperts { logits, routing, ids, weights, tally: Some(0) });
    g.push(Op::MatMulExperts { w: gate, x, ids, bias: bias(|b| b.gate), out: gate_out });
    g.push(Op::MatMulExperts { w: up, x, ids, bias: bias(|b| b.up), out: up_out });
    g.push(Op::Glu { activation, gate: gate_out, up: up_out, out: gate_out });
    g.push(Op::MatMulExperts { w: down, x: gate_out, ids, bias: bias(|b| b.down), out: down_out });
    g.push(Op::CombineExperts { x: down_out, weights, out });
    g.logits = out;
    (c, MoeWeights { table, router, gate, up, down, biases, selection_bias })
}

/// gpt-oss's routing: the two largest logits, weighed by a softmax over them.
fn gpt_oss_top2() -> ExpertRouting {
    ExpertRouting::top(N_USED, ExpertGating::SoftmaxOfChosen)
}

/// DeepSeek-V3's routing: sigmoid probabilities, a selection bias, 3 experts from the 2 best of 4
/// groups, weights renormalised and scaled.
fn deepseek_v3_top3() -> ExpertRouting {
    ExpertRouting {
        normalize: true,
        scale: 2.5,
        selection_bias: Some(WeightId(u32::MAX)),
        groups: Some(ExpertGroups { n_group: 4, n_used: 2 }),
        ..ExpertRouting::top(3, ExpertGating::Sigmoid)
    }
}

fn softmax_top2() -> ExpertRouting {
    ExpertRouting { normalize: true, ..ExpertRouting::top(N_USED, ExpertGating::Softmax) }
}

/// Every routing variant, with its experts: softmax renormalised, softmax scaled, sigmoid, more
/// experts per token, gpt-oss's softmax over the chosen with its biased, clamped experts, and
/// DeepSeek-V3's grouped sigmoid with a selection bias.
fn routing_variants() -> [(ExpertRouting, Experts); 6] {
    [
        (softmax_top2(), Experts::SwiGlu),
        (ExpertRouting { normalize: false, scale: 2.5, ..softmax_top2() }, Experts::SwiGlu),
        (ExpertRouting { normalize: true, ..ExpertRouting::top(N_USED, ExpertGating::Sigmoid) }, Experts::SwiGlu),
        (ExpertRouting { scale: 0.5, ..ExpertRouting::top(5, ExpertGating::Sigmoid) }, Experts::SwiGlu),
        (gpt_oss_top2(), Experts::GptOss),
        (deepseek_v3_top3(), Experts::SwiGlu),
    ]
}

pub fn mixture_of_experts_every_type(subject: &dyn Subject) {
    let mut rng = Rng(21);
    for ty in WEIGHT_TYPES {
        let width = ty.block_len().max(32) * 2;
        let (c, _) = moe_case(N_TOKENS, ty, (width, width), softmax_top2(), Experts::SwiGlu, &mut rng);
        let steps = [single(tokens(N_TOKENS, INPUT_ROWS, &mut rng), 0, &small_layout())];
        c.check(subject, &format!("moe ffn {ty:?} {width}"), Tolerance::SUM_ORDER, &steps);
    }
}

/// Every routing variant ([`routing_variants`]) over a step of several tokens and a decode step
/// of one, the experts' ids and weights computed and used where the backend keeps its buffers.
pub fn mixture_of_experts_routing_variants(subject: &dyn Subject) {
    let mut rng = Rng(23);
    let routings = routing_variants();
    for ty in [GgmlType::F32, GgmlType::Q4_K, GgmlType::MXFP4] {
        for (routing, experts) in &routings {
            let width = ty.block_len().max(32) * 2;
            let (c, _) = moe_case(N_TOKENS, ty, (width, width), routing.clone(), *experts, &mut rng);
            let steps = [single(tokens(N_TOKENS, INPUT_ROWS, &mut rng), 0, &small_layout())];
            c.check(subject, &format!("moe ffn {ty:?} {routing:?}"), Tolerance::SUM_ORDER, &steps);
            let mut decode = Case::new(1);
            decode.weights = c.weights.clone();
            decode.graph = with_tokens(&c, 1);
            let steps = [single(tokens(1, INPUT_ROWS, &mut rng), 0, &small_layout())];
            decode.check(subject, &format!("moe ffn {ty:?} {routing:?} one token"), Tolerance::SUM_ORDER, &steps);
        }
    }
}

/// Steps long enough for a backend to group the pairs by expert (hearth-wgpu:
/// GROUPED_EXPERTS_MIN_TOKENS), for 32-value, 256-value and MXFP4 blocks, and with a slice of x
/// per slot (the down projection's input): against the oracle, and each token's output the same
/// bits as that token alone in a decode step on the same backend.
pub fn mixture_of_experts_long_steps(subject: &dyn Subject) {
    let mut rng = Rng(24);
    const LONG: usize = 37;
    for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::MXFP4] {
        let width = ty.block_len().max(32) * 2;
        let experts = if ty == GgmlType::MXFP4 { Experts::GptOss } else { Experts::SwiGlu };
        let (c, _) = moe_case(LONG, ty, (width, width), softmax_top2(), experts, &mut rng);
        let ids = tokens(LONG, INPUT_ROWS, &mut rng);
        let steps = [single(ids.clone(), 0, &small_layout())];
        c.check(subject, &format!("moe ffn {ty:?} {LONG} tokens"), Tolerance::SUM_ORDER, &steps);
        let alone = with_tokens(&c, 1);
        for (variant, mut backend) in subject.variants() {
            let (kv, g) = c.load(backend.as_mut());
            let long = run_step(backend.as_mut(), g, kv, &steps[0]).expect("execute");
            // The same weights, a one-token graph.
            let g1 = backend.compile(&alone).expect("compile");
            for (t, &token) in ids.iter().enumerate() {
                let solo =
                    run_step(backend.as_mut(), g1, kv, &single(vec![token], 0, &small_layout())).expect("execute");
                let row = &long[t * width..(t + 1) * width];
                Tolerance::EXACT.assert_close(&format!("moe ffn {ty:?} [{variant}] token {t} alone"), &solo, row);
            }
        }
    }
}

/// The oracle's MoE FFN against the same FFN computed here in f64 from the F32 weights (F32
/// mat-muls round no activations), for every routing variant ([`routing_variants`]), and its
/// expert tallies against the reference's picks; each token's result equals its
/// result alone in a step (nothing depends on which tokens share the experts).
pub fn mixture_of_experts_match_a_host_reference() {
    let mut rng = Rng(22);
    let (n_embd, n_ff) = (48, 40);
    for (routing, experts) in routing_variants() {
        let (c, w) = moe_case(N_TOKENS, GgmlType::F32, (n_embd, n_ff), routing.clone(), experts, &mut rng);
        let ids = tokens(N_TOKENS, INPUT_ROWS, &mut rng);
        let mut cpu = CpuBackend::new(Some(1)).expect("cpu");
        let (kv, g) = c.load(&mut cpu);
        let got = run_step(&mut cpu, g, kv, &single(ids.clone(), 0, &small_layout())).expect("execute");
        let mut alone = Case::new(1);
        alone.weights = c.weights.clone();
        alone.graph = with_tokens(&c, 1);
        let mut solo_cpu = CpuBackend::new(Some(1)).expect("cpu");
        let (kv1, g1) = alone.load(&mut solo_cpu);
        let values = |id: WeightId| -> Vec<f64> {
            c.weights[id.0 as usize]
                .1
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
                .collect()
        };
        let (table, router) = (values(w.table), values(w.router));
        let (gate, up, down) = (values(w.gate), values(w.up), values(w.down));
        // [n_expert] and [n_expert][rows] biases; zeros where the experts have none.
        let bias_values = |pick: fn(&ExpertBiases) -> WeightId, len: usize| {
            w.biases.as_ref().map_or_else(|| vec![0f64; len], |b| values(pick(b)))
        };
        let router_bias = bias_values(|b| b.router, N_EXPERT);
        let selection_bias = w.selection_bias.map_or_else(|| vec![0f64; N_EXPERT], values);
        let (gate_bias, up_bias) = (bias_values(|b| b.gate, N_EXPERT * n_ff), bias_values(|b| b.up, N_EXPERT * n_ff));
        let down_bias = bias_values(|b| b.down, N_EXPERT * n_embd);
        let mut want_tallies = hearth_core::backend::ExpertTallies::default();
        let dot = |m: &[f64], row: usize, x: &[f64]| -> f64 {
            m[row * x.len()..(row + 1) * x.len()].iter().zip(x).map(|(a, b)| a * b).sum()
        };
        for (t, &token) in ids.iter().enumerate() {
            let x = &table[token as usize * n_embd..(token as usize + 1) * n_embd];
            let logits: Vec<f64> = (0..N_EXPERT).map(|e| dot(&router, e, x) + router_bias[e]).collect();
            let softmax = |values: &[f64]| -> Vec<f64> {
                let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = values.iter().map(|l| (l - max).exp()).sum();
                values.iter().map(|l| (l - max).exp() / z).collect()
            };
            let mut probs: Vec<f64> = match routing.gating {
                ExpertGating::Softmax => softmax(&logits),
                ExpertGating::Sigmoid => logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect(),
                ExpertGating::SoftmaxOfChosen => logits.clone(),
            };
            // Chosen by the probabilities plus the selection bias, from the best groups only.
            let mut selection: Vec<f64> = probs.iter().zip(&selection_bias).map(|(p, b)| p + b).collect();
            if let Some(groups) = routing.groups {
                let per_group = N_EXPERT / groups.n_group;
                let score = |g: usize| {
                    let mut s: Vec<f64> = selection[g * per_group..(g + 1) * per_group].to_vec();
                    s.sort_by(|a, b| b.total_cmp(a));
                    s[0] + s[1]
                };
                let mut by_score: Vec<usize> = (0..groups.n_group).collect();
                by_score.sort_by(|&a, &b| score(b).total_cmp(&score(a)));
                for &g in &by_score[groups.n_used..] {
                    selection[g * per_group..(g + 1) * per_group].fill(f64::NEG_INFINITY);
                }
            }
            let mut order: Vec<usize> = (0..N_EXPERT).collect();
            order.sort_by(|&a, &b| selection[b].total_cmp(&selection[a]));
            let chosen = &order[..routing.n_used];
            if routing.gating == ExpertGating::SoftmaxOfChosen {
                let chosen_logits: Vec<f64> = chosen.iter().map(|&e| logits[e]).collect();
                for (&e, p) in chosen.iter().zip(softmax(&chosen_logits)) {
                    probs[e] = p;
                }
            }
            want_tallies.add_picks(0, N_EXPERT, chosen.iter().map(|&e| e as u32));
            let sum: f64 = chosen.iter().map(|&e| probs[e]).sum();
            let mut want = vec![0f64; n_embd];
            for &e in chosen {
                let weight = if routing.normalize { probs[e] / sum } else { probs[e] } * routing.scale as f64;
                let hidden: Vec<f64> = (0..n_ff)
                    .map(|j| {
                        let row = e * n_ff + j;
                        let (g, u) = (dot(&gate, row, x) + gate_bias[row], dot(&up, row, x) + up_bias[row]);
                        match experts {
                            Experts::SwiGlu => g / (1.0 + (-g).exp()) * u,
                            Experts::GptOss => {
                                let (g, u) = (g.min(7.0), u.clamp(-7.0, 7.0));
                                g / (1.0 + (-1.702 * g).exp()) * (u + 1.0)
                            }
                        }
                    })
                    .collect();
                for (i, o) in want.iter_mut().enumerate() {
                    let row = e * n_embd + i;
                    *o += weight * (dot(&down, row, &hidden) + down_bias[row]);
                }
            }
            let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
            let row = &got[t * n_embd..(t + 1) * n_embd];
            Tolerance::ELEMENTWISE.assert_close(&format!("moe ffn {routing:?} token {t} vs f64"), row, &want);

            // The token alone in its step: the same values, bit for bit.
            let solo = run_step(&mut solo_cpu, g1, kv1, &single(vec![token], 0, &small_layout())).expect("execute");
            Tolerance::EXACT.assert_close(&format!("moe ffn {routing:?} token {t} alone"), &solo, row);
        }
        // Every pick counted once, under the router's tally.
        assert_eq!(cpu.expert_tallies().expect("tallies"), want_tallies, "moe ffn {routing:?} expert tallies");
    }
}

/// `case`'s graph rebuilt for `n_tokens` tokens: every buffer's rows become `n_tokens`.
fn with_tokens(case: &Case, n_tokens: usize) -> hearth_core::graph::Graph {
    let mut g = case.graph.clone();
    g.n_tokens = n_tokens;
    for b in &mut g.bufs {
        b.rows = n_tokens;
    }
    g
}
