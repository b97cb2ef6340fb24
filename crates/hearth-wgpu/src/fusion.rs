//! Which ops of a graph run in one dispatch: the plan `compile` follows.

use crate::compile::{ActRounding, GRID_SPLIT_TOKENS, MAX_HEAD_DIM};
use crate::weights::GpuWeight;
use hearth_core::graph::{BufId, Graph, Op, RopeParams, WeightId};
use hearth_core::quant::GgmlType;

/// How an op is compiled: as its own dispatch, or folded into a neighbour's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fusion {
    Own,
    /// Runs as the prologue of its output's rounding (act_quant.wgsl): an RMS norm over whole
    /// rows, a SwiGLU or a GeGLU whose output is read only by mat-muls that round their
    /// activations alike (q/k/v after the attention norm, gate/up after the FFN norm, ffn_down
    /// after the activation), all before the op's own inputs change (a rounding may be recomputed
    /// from them) and none of them an output of the graph (the logits, `Graph::outputs`).
    Prologue,
    /// A quantized mat-mul or a whole-row RMS norm whose result only the next op reads, an Add:
    /// the sum is written in its epilogue (matmul_q8.wgsl and norm.wgsl RESIDUAL),
    /// `out = residual + x · Wᵀ` or `out = residual + norm(x)` (Gemma's post-norms).
    AddInEpilogue {
        residual: BufId,
        out: BufId,
    },
    /// A whole-row RMS norm with an Add folded in, as `AddInEpilogue`, whose sum is read first by
    /// the next op, a whole-row norm run as the prologue of the next op's rounding (Gemma's
    /// post-norm, its residual add and the next pre-norm): that rounding's dispatch computes and
    /// writes the sum, then normalises and rounds it (act_quant.wgsl SUM), so the norm and the Add
    /// cost no dispatch.
    SumBeforeRounding {
        residual: BufId,
        out: BufId,
    },
    /// An attention of a short step (whose splits a reduce merges) whose output only mat-muls
    /// read, all rounding their activations to 8 bits alike (the output projection): its reduce
    /// writes the rounded row (attention.wgsl ROUND_*)
    /// instead of the f32 one, and the mat-muls use it.
    RoundsOutput {
        rounding: ActRounding,
    },
    /// A RoPE followed by another with the same parameters on another buffer (q, then k): one
    /// dispatch rotates both.
    RopeWithNext {
        other: BufId,
    },
    /// The first of two or three consecutive mat-muls that read the same input with weights of
    /// one rounding (Q4_0/Q5_0/Q8_0, Q4_1/Q5_1, or the K-quants), row length and bias presence, each in one
    /// chunk (q/k/v, gate/up): one dispatch computes all their products (matmul_q8.wgsl
    /// SEGMENTS, each segment decoding its own type).
    Siblings {
        others: [Option<MatMulPart>; 2],
    },
    /// The first op of a `HeadsChain` ending at the StoreKv at op `store`: one dispatch
    /// (kv_store.wgsl prepare_heads) runs the chain.
    Heads {
        store: usize,
    },
    /// An op that runs inside the dispatch of an op before it (that Add, that second RoPE, those
    /// sibling mat-muls, the rest of that heads chain).
    Folded,
}

/// What a mat-mul computes apart from its input: `out = x · wᵀ (+ bias)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MatMulPart {
    pub w: WeightId,
    pub bias: Option<WeightId>,
    pub out: BufId,
}

pub(crate) fn fusion_plan(graph: &Graph, weights: &[GpuWeight], fuse_siblings: bool) -> Vec<Fusion> {
    let rounding_of = |op: &Op| match op {
        Op::MatMul { w, .. } => weights.get(w.0 as usize).map(|w| ActRounding::of(w.desc.ty)),
        _ => None,
    };
    // Whether `buf` is read by none of the ops from `from` on before it is written again.
    let unread_after = |buf: BufId, from: usize| -> bool {
        for later in graph.ops.iter().skip(from) {
            if later.inputs().contains(&buf) {
                return false;
            }
            if later.writes(buf) {
                return true;
            }
        }
        true
    };
    // The one rounding with which mat-muls, and only they, read `out` after op `i` until it is
    // written again, each before any of `inputs` changes (so that it can be recomputed from them).
    let only_rounded_readers = |i: usize, out: BufId, inputs: &[BufId]| -> Option<ActRounding> {
        if graph.is_output(out) {
            return None;
        }
        let (mut rounding, mut inputs_changed) = (None, false);
        for later in &graph.ops[i + 1..] {
            if later.inputs().contains(&out) {
                match rounding_of(later) {
                    Some(r) if r != ActRounding::None && !inputs_changed && rounding.is_none_or(|seen| seen == r) => {
                        rounding = Some(r)
                    }
                    _ => return None,
                }
            }
            if later.writes(out) {
                break;
            }
            if later.outputs().iter().any(|w| inputs.contains(w)) {
                inputs_changed = true;
            }
        }
        rounding
    };
    // Whether every reader of `out` after op `i` comes before any other op that rounds
    // activations into a scratch slot (a mat-mul on another input, another attention): a rounding
    // written in place of `out` cannot be recomputed, so its slot must outlast its readers.
    let rounding_kept_for_readers = |i: usize, out: BufId| -> bool {
        let mut other_rounding = false;
        for later in &graph.ops[i + 1..] {
            if later.inputs().contains(&out) && other_rounding {
                return false;
            }
            match later {
                Op::MatMul { x, .. } if *x != out => other_rounding = true,
                Op::Attention { .. } => other_rounding = true,
                _ => {}
            }
            if later.writes(out) {
                break;
            }
        }
        true
    };
    let initial = |i: usize, op: &Op| -> Fusion {
        match op {
            Op::RmsNorm { group, out, .. } if *group == graph.desc(*out).cols => {
                only_rounded_readers(i, *out, &op.inputs()).map_or(Fusion::Own, |_| Fusion::Prologue)
            }
            Op::Glu { out, .. } => {
                only_rounded_readers(i, *out, &op.inputs()).map_or(Fusion::Own, |_| Fusion::Prologue)
            }
            Op::Attention { out, .. }
                if graph.desc(*out).cols <= MAX_ROUNDED_ATTENTION_ROW
                    && graph.desc(*out).rows <= GRID_SPLIT_TOKENS
                    && rounding_kept_for_readers(i, *out) =>
            {
                match only_rounded_readers(i, *out, &[]) {
                    Some(rounding @ ActRounding::Q8 { .. }) => Fusion::RoundsOutput { rounding },
                    _ => Fusion::Own,
                }
            }
            _ => Fusion::Own,
        }
    };
    let mut plan: Vec<Fusion> = graph.ops.iter().enumerate().map(|(i, op)| initial(i, op)).collect();
    for i in 0..graph.ops.len().saturating_sub(1) {
        let Op::Add { a, b, out } = &graph.ops[i + 1] else { continue };
        let product = match &graph.ops[i] {
            Op::MatMul { out, .. } if matches!(rounding_of(&graph.ops[i]), Some(ActRounding::Q8 { .. })) => out,
            Op::RmsNorm { group, out, .. } if *group == graph.desc(*out).cols => out,
            _ => continue,
        };
        let residual = if b == product && a != product {
            *a
        } else if a == product && b != product {
            *b
        } else {
            continue;
        };
        if !graph.is_output(*product) && plan[i] == Fusion::Own && unread_after(*product, i + 2) {
            plan[i] = Fusion::AddInEpilogue { residual, out: *out };
            plan[i + 1] = Fusion::Folded;
        }
    }
    // Sums left to the next rounding: the norm after the Add is left out for a rounding that the
    // mat-mul right after it makes, so nothing runs between the Add and that dispatch.
    for i in 0..graph.ops.len().saturating_sub(3) {
        let Fusion::AddInEpilogue { residual, out: sum } = plan[i] else { continue };
        let (Op::RmsNorm { .. }, Op::RmsNorm { x, group, out: normed, .. }, Op::MatMul { x: read, .. }) =
            (&graph.ops[i], &graph.ops[i + 2], &graph.ops[i + 3])
        else {
            continue;
        };
        let same_shape = graph.desc(residual).rows == graph.desc(sum).rows && graph.desc(residual).cols == *group;
        if plan[i + 2] == Fusion::Prologue && *x == sum && *normed != sum && read == normed && same_shape {
            plan[i] = Fusion::SumBeforeRounding { residual, out: sum };
        }
    }
    // Sibling mat-muls, after the epilogue fusions (a product with an Add in its epilogue stays
    // on its own).
    let sibling_part = |i: usize, plan: &[Fusion]| -> Option<(BufId, MatMulPart, GgmlType, usize)> {
        let Op::MatMul { w, x, bias, out } = graph.ops.get(i)? else { return None };
        let weight = weights.get(w.0 as usize)?;
        let single_chunk = weight.chunks.len() == 1;
        let eight_bit = matches!(ActRounding::of(weight.desc.ty), ActRounding::Q8 { .. });
        (plan[i] == Fusion::Own && single_chunk && eight_bit && !graph.is_output(*out) && out != x).then_some((
            *x,
            MatMulPart { w: *w, bias: *bias, out: *out },
            weight.desc.ty,
            weight.desc.row_len(),
        ))
    };
    let mut i = 0;
    while fuse_siblings && i < graph.ops.len() {
        let Some((x, first, ty, k)) = sibling_part(i, &plan) else {
            i += 1;
            continue;
        };
        let mut others = Vec::new();
        while others.len() < 2 {
            match sibling_part(i + 1 + others.len(), &plan) {
                Some((x2, part, ty2, k2))
                    if x2 == x
                        && ActRounding::of(ty2) == ActRounding::of(ty)
                        && k2 == k
                        && part.bias.is_some() == first.bias.is_some()
                        && part.out != first.out
                        && others.iter().all(|o: &MatMulPart| o.out != part.out) =>
                {
                    others.push(part)
                }
                _ => break,
            }
        }
        if others.is_empty() {
            i += 1;
            continue;
        }
        plan[i] = Fusion::Siblings { others: [others.first().copied(), others.get(1).copied()] };
        for j in 1..=others.len() {
            plan[i + j] = Fusion::Folded;
        }
        i += 1 + others.len();
    }
    // Heads chains, before pairing RoPEs (which are left for graphs without a chain).
    for store in 0..graph.ops.len() {
        let Op::StoreKv { v: Some(v), .. } = &graph.ops[store] else { continue };
        let first = (0..store)
            .rev()
            .take_while(|&j| match &graph.ops[j] {
                Op::RmsNorm { x, out, .. } => x == out && x != v,
                Op::Rope { x, .. } | Op::Scale { x, .. } => x != v,
                _ => false,
            })
            .last();
        let Some(first) = first else { continue };
        if plan[first..=store].iter().all(|f| *f == Fusion::Own)
            && HeadsChain::of(graph, weights, &graph.ops[first..=store]).is_some()
        {
            plan[first] = Fusion::Heads { store };
            plan[first + 1..=store].fill(Fusion::Folded);
        }
    }
    for i in 0..graph.ops.len().saturating_sub(1) {
        if let (Op::Rope { x: a, params: pa }, Op::Rope { x: b, params: pb }) = (&graph.ops[i], &graph.ops[i + 1]) {
            if a != b && pa == pb && pa.n_rot > 0 && plan[i] == Fusion::Own && plan[i + 1] == Fusion::Own {
                plan[i] = Fusion::RopeWithNext { other: *b };
                plan[i + 1] = Fusion::Folded;
            }
        }
    }
    plan
}

/// The widest attention row whose reduce rounds it (attention.wgsl holds the row in workgroup
/// memory: 8 KiB).
pub(crate) const MAX_ROUNDED_ATTENTION_ROW: usize = 2048;

/// Floats of `prepare_heads`' constants (kv_store.wgsl C: a uniform of 16 KiB).
pub(crate) const HEAD_CONSTANTS: usize = 4096;

/// The ops between the q/k/v projections and attention, run by one dispatch (kv_store.wgsl
/// prepare_heads): for the queries and for the keys, in this order, an optional RMS norm per
/// head (Gemma's q/k norms), one RoPE (the same for both) and an optional scale (the query
/// scale); then the KV store of the keys and values.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HeadsChain {
    pub q: BufId,
    pub k: BufId,
    pub v: BufId,
    pub layer: usize,
    pub k_offset: Option<WeightId>,
    pub v_offset: Option<WeightId>,
    pub q_norm: Option<WeightId>,
    pub k_norm: Option<WeightId>,
    /// The norms' epsilon (both norms have the same).
    pub eps: f32,
    pub rope: RopeParams,
    pub q_scale: f32,
    pub k_scale: f32,
}

/// Where one buffer of a heads chain is: its steps come in the order norm, RoPE, scale.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum HeadStep {
    Start,
    Normed,
    Rotated,
    Scaled,
}

impl HeadsChain {
    /// The chain `ops` (ending with the StoreKv) make, if the kernel runs it: every head whole in
    /// its workgroup (widths multiples of the head, heads of at most 512 values in whole 32-value
    /// blocks, so that a quantized store's blocks stay within a head) and the vectors within the
    /// constants.
    pub fn of(graph: &Graph, weights: &[GpuWeight], ops: &[Op]) -> Option<HeadsChain> {
        let (Op::StoreKv { layer, k, v: Some(v), k_offset, v_offset }, chain) = ops.split_last()? else { return None };
        // The chain writes its keys and values to the cache only: a step that hands them on
        // runs the ops one by one.
        if graph.is_output(*k) || graph.is_output(*v) {
            return None;
        }
        let mut q = None;
        let (mut q_step, mut k_step) = (HeadStep::Start, HeadStep::Start);
        let (mut q_norm, mut k_norm, mut eps) = (None, None, None);
        let (mut q_scale, mut k_scale) = (1.0, 1.0);
        let mut rope: Option<&RopeParams> = None;
        for op in chain {
            let x = match op {
                Op::RmsNorm { x, .. } | Op::Rope { x, .. } | Op::Scale { x, .. } => *x,
                _ => return None,
            };
            if x == *v || x != *k && q.is_some_and(|q| q != x) {
                return None;
            }
            let is_k = x == *k;
            if !is_k {
                q = Some(x);
            }
            let (step, norm, scale) =
                if is_k { (&mut k_step, &mut k_norm, &mut k_scale) } else { (&mut q_step, &mut q_norm, &mut q_scale) };
            match op {
                Op::RmsNorm { x, weight: Some(w), eps: e, group, out } if x == out && *step == HeadStep::Start => {
                    if eps.is_some_and(|seen| seen != *e) {
                        return None;
                    }
                    eps = Some(*e);
                    *norm = Some((*w, *group));
                    *step = HeadStep::Normed;
                }
                Op::Rope { params, .. } if *step < HeadStep::Rotated && rope.is_none_or(|r| r == params) => {
                    rope = Some(params);
                    *step = HeadStep::Rotated;
                }
                Op::Scale { factor, .. } if *step == HeadStep::Rotated => {
                    *scale = *factor;
                    *step = HeadStep::Scaled;
                }
                _ => return None,
            }
        }
        let (q, rope) = (q?, rope?.clone());
        if q_step < HeadStep::Rotated || k_step < HeadStep::Rotated {
            return None;
        }
        let hd = rope.head_dim;
        if hd == 0 || !hd.is_multiple_of(32) || hd > MAX_HEAD_DIM || rope.n_rot > hd || !rope.n_rot.is_multiple_of(2) {
            return None;
        }
        let whole_heads = [q, *k, *v].iter().all(|b| graph.desc(*b).cols.is_multiple_of(hd));
        let norms_per_head = [q_norm, k_norm].iter().flatten().all(|&(_, group)| group == hd);
        let chain = HeadsChain {
            q,
            k: *k,
            v: *v,
            layer: *layer,
            k_offset: *k_offset,
            v_offset: *v_offset,
            q_norm: q_norm.map(|(w, _)| w),
            k_norm: k_norm.map(|(w, _)| w),
            eps: eps.unwrap_or(0.0),
            rope,
            q_scale,
            k_scale,
        };
        let vectors_fit = chain.constants(graph, weights).is_some_and(|c| c.len <= HEAD_CONSTANTS);
        (whole_heads && norms_per_head && vectors_fit).then_some(chain)
    }

    /// The layout of the kernel's constants: the vectors end to end, with zeros past them for an
    /// absent offset.
    pub fn constants(&self, graph: &Graph, weights: &[GpuWeight]) -> Option<HeadConstants> {
        let mut layout = HeadConstants {
            parts: Vec::new(),
            len: 0,
            q_norm: 0,
            k_norm: 0,
            freq_factors: 0,
            k_offset: 0,
            v_offset: 0,
        };
        let mut place = |w: Option<WeightId>| -> Option<u32> {
            let Some(w) = w else { return Some(u32::MAX) };
            let desc = &weights.get(w.0 as usize)?.desc;
            let at = layout.len;
            layout.parts.push(w);
            layout.len += desc.row_len() * desc.n_rows();
            Some(at as u32)
        };
        let q_norm = place(self.q_norm)?;
        let k_norm = place(self.k_norm)?;
        let freq_factors = place(self.rope.freq_factors)?;
        let k_offset = place(self.k_offset)?;
        let v_offset = place(self.v_offset)?;
        let zeros = layout.len as u32;
        let widest = graph.desc(self.k).cols.max(graph.desc(self.v).cols);
        let or_zeros = |at: u32| if at == u32::MAX { zeros } else { at };
        layout.q_norm = q_norm;
        layout.k_norm = k_norm;
        layout.freq_factors = freq_factors;
        layout.k_offset = or_zeros(k_offset);
        layout.v_offset = or_zeros(v_offset);
        if k_offset == u32::MAX || v_offset == u32::MAX {
            layout.len += widest;
        }
        Some(layout)
    }
}

/// Where each vector of a heads chain starts in the kernel's constants (u32::MAX: absent).
pub(crate) struct HeadConstants {
    /// The vectors, in order.
    pub parts: Vec<WeightId>,
    /// Floats used.
    pub len: usize,
    pub q_norm: u32,
    pub k_norm: u32,
    pub freq_factors: u32,
    pub k_offset: u32,
    pub v_offset: u32,
}
