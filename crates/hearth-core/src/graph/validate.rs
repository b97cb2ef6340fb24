//! The one shape check of a [`Graph`], run by every backend's `compile`: after it, a backend may
//! index buffers and weights without bounds checks of its own. The aliasing rules are the
//! strictest any backend needs (a WebGPU dispatch cannot bind one buffer both as read-write
//! output and as a second input), so a graph valid on one backend is valid on all. Ops read and
//! write f32 buffers and single-matrix weights, except the mixture-of-experts ops, which exchange
//! u32 expert ids and read expert weights; a u32 buffer or an expert weight given to any other op
//! is refused here, so no backend reads ids as values or an expert stack as one tall matrix.

use super::{BufId, BufType, ExpertGating, GluActivation, Graph, Op, WeightDesc, WeightId};
use crate::error::CoreError;
use crate::kv::ValueRows;

impl Graph {
    /// Checks every op against the buffer shapes and types and the shapes of the weights `weight`
    /// finds (by the backend's ids); the first inconsistency is an error naming the op
    /// ([`CoreError::BadGraph`], [`CoreError::BufTypeMismatch`], [`CoreError::ExpertWeight`]).
    pub fn validate<'w>(&self, weight: impl Fn(WeightId) -> Option<&'w WeightDesc>) -> Result<(), CoreError> {
        let graph_error = |reason: String| CoreError::BadGraph { index: 0, op: "graph", reason };
        if self.n_seqs == 0 || self.n_seqs > self.n_tokens {
            return Err(graph_error(format!("{} sequences for {} tokens", self.n_seqs, self.n_tokens)));
        }
        match self.bufs.get(self.logits.0 as usize) {
            None => return Err(graph_error(format!("the logits buffer {} does not exist", self.logits.0))),
            Some(d) if d.dtype != BufType::F32 => {
                return Err(CoreError::BufTypeMismatch {
                    index: 0,
                    op: "graph",
                    buffer: d.name.clone(),
                    expected: BufType::F32,
                    found: d.dtype,
                })
            }
            Some(_) => {}
        }
        for (index, op) in self.ops.iter().enumerate() {
            OpCheck { graph: self, op, index, weight: &weight }.run()?;
        }
        Ok(())
    }
}

struct OpCheck<'a, F> {
    graph: &'a Graph,
    op: &'a Op,
    index: usize,
    weight: &'a F,
}

impl<'w, F: Fn(WeightId) -> Option<&'w WeightDesc>> OpCheck<'_, F> {
    fn bad(&self, reason: String) -> CoreError {
        CoreError::BadGraph { index: self.index, op: self.op.name(), reason }
    }

    /// `[rows, cols]` of an f32 buffer: what every op reads and writes, but expert ids.
    fn shape(&self, b: BufId) -> Result<(usize, usize), CoreError> {
        self.typed_shape(b, BufType::F32)
    }

    /// `[rows, cols]` of a buffer, which must hold `dtype`.
    fn typed_shape(&self, b: BufId, dtype: BufType) -> Result<(usize, usize), CoreError> {
        let d = self.graph.bufs.get(b.0 as usize).ok_or_else(|| self.bad(format!("unknown buffer {}", b.0)))?;
        if d.dtype != dtype {
            return Err(CoreError::BufTypeMismatch {
                index: self.index,
                op: self.op.name(),
                buffer: d.name.clone(),
                expected: dtype,
                found: d.dtype,
            });
        }
        Ok((d.rows, d.cols))
    }

    fn same(&self, a: BufId, b: BufId) -> Result<(usize, usize), CoreError> {
        let (sa, sb) = (self.shape(a)?, self.shape(b)?);
        if sa != sb {
            return Err(self.bad(format!("shapes {sa:?} and {sb:?} differ")));
        }
        Ok(sa)
    }

    /// A buffer with one row per token of the step.
    fn per_token(&self, b: BufId) -> Result<usize, CoreError> {
        let (rows, cols) = self.shape(b)?;
        if rows != self.graph.n_tokens {
            return Err(self.bad(format!("{rows} rows for {} tokens", self.graph.n_tokens)));
        }
        Ok(cols)
    }

    /// A weight read as a stack of matrices, one per expert (a dense weight is a stack of one).
    fn experts(&self, id: WeightId) -> Result<&'w WeightDesc, CoreError> {
        (self.weight)(id).ok_or_else(|| self.bad(format!("unknown weight {}", id.0)))
    }

    /// A weight read as one matrix or vector: every op but the expert mat-mul reads one.
    fn weight(&self, id: WeightId) -> Result<&'w WeightDesc, CoreError> {
        let d = self.experts(id)?;
        if d.n_experts() != 1 {
            return Err(CoreError::ExpertWeight {
                index: self.index,
                op: self.op.name(),
                weight: d.name.clone(),
                n_experts: d.n_experts(),
            });
        }
        Ok(d)
    }

    /// A weight read as a plain vector of `len` values (norm weights, biases, offsets).
    fn vector(&self, id: WeightId, len: usize) -> Result<(), CoreError> {
        let d = self.weight(id)?;
        if d.dims.iter().product::<u64>() != len as u64 {
            return Err(self.bad(format!("weight '{}' {:?} should hold {len} values", d.name, d.dims)));
        }
        Ok(())
    }

    fn run(&self) -> Result<(), CoreError> {
        let n = self.graph.n_tokens;
        match self.op {
            Op::Embed { table, out } => {
                let d = self.weight(*table)?;
                if self.shape(*out)? != (n, d.row_len()) {
                    return Err(self.bad(format!(
                        "output {:?} vs {n} tokens of table rows of {}",
                        self.shape(*out)?,
                        d.row_len()
                    )));
                }
            }
            Op::RmsNorm { x, weight, group, out, .. } => {
                let (_, cols) = self.same(*x, *out)?;
                if *group == 0 || cols % group != 0 {
                    return Err(self.bad(format!("group {group} does not divide {cols}")));
                }
                if let Some(w) = weight {
                    self.vector(*w, *group)?;
                }
            }
            Op::MatMul { w, x, bias, out } => {
                let d = self.weight(*w)?;
                let (rows, k) = self.shape(*x)?;
                if k != d.row_len() || self.shape(*out)? != (rows, d.n_rows()) || x == out {
                    return Err(self.bad(format!(
                        "x {:?}, out {:?}, weight '{}' {:?}",
                        (rows, k),
                        self.shape(*out)?,
                        d.name,
                        d.dims
                    )));
                }
                if let Some(b) = bias {
                    self.vector(*b, d.n_rows())?;
                }
            }
            Op::Rope { x, params: p } => {
                let cols = self.per_token(*x)?;
                if p.head_dim == 0 || cols % p.head_dim != 0 || p.n_rot > p.head_dim || p.n_rot % 2 != 0 {
                    return Err(self.bad(format!("{cols} columns with head_dim {} n_rot {}", p.head_dim, p.n_rot)));
                }
                if let Some(f) = p.freq_factors {
                    self.vector(f, p.n_rot / 2)?;
                }
            }
            Op::StoreKv { k, v, k_offset, v_offset, .. } => {
                let k_cols = self.per_token(*k)?;
                if let Some(o) = k_offset {
                    self.vector(*o, k_cols)?;
                }
                match (v, v_offset) {
                    (Some(v), offset) => {
                        let v_cols = self.per_token(*v)?;
                        if let Some(o) = offset {
                            self.vector(*o, v_cols)?;
                        }
                    }
                    (None, Some(_)) => return Err(self.bad("a value offset without values to store".into())),
                    (None, None) => {}
                }
            }
            Op::Attention { q, params: p, out } => {
                let cols = self.per_token(*q)?;
                let out_cols = self.per_token(*out)?;
                if p.n_head_kv == 0
                    || p.n_head % p.n_head_kv != 0
                    || cols != p.n_head * p.head_dim
                    || out_cols != p.n_head * p.v_dim()
                    || p.v_dim() == 0
                    || q == out
                {
                    return Err(self.bad(format!(
                        "{cols} columns in and {out_cols} out for {} heads of {} (values {}; {} KV heads)",
                        p.n_head,
                        p.head_dim,
                        p.v_dim(),
                        p.n_head_kv
                    )));
                }
                if p.values == ValueRows::KeyPrefix
                    && (p.n_head_kv != 1 || !ValueRows::key_prefix_fits(p.v_dim(), p.head_dim) || p.v_offset.is_some())
                {
                    return Err(self.bad(format!(
                        "values read from the start of the key rows need one KV head, values of at most the \
                         head's {} in whole 32-value blocks (not {}) and no value offset",
                        p.head_dim,
                        p.v_dim()
                    )));
                }
                if let Some(o) = p.v_offset {
                    self.vector(o, p.n_head_kv * p.v_dim())?;
                }
                if let Some(sinks) = p.sinks {
                    self.vector(sinks, p.n_head)?;
                }
            }
            Op::Glu { activation: GluActivation::ClampedSilu { alpha, limit }, .. }
                if !(alpha.is_finite() && limit.is_finite()) =>
            {
                return Err(self.bad(format!("clamped SwiGLU with alpha {alpha} and limit {limit}")));
            }
            Op::Add { a, b, out } | Op::Glu { gate: a, up: b, out, .. } => {
                self.same(*a, *b)?;
                self.same(*a, *out)?;
                // `out` may be the first operand (updated in place), never the second.
                if b == out {
                    return Err(self.bad("out may alias the first operand, not the second".into()));
                }
            }
            Op::Scale { x, .. } => {
                self.shape(*x)?;
            }
            Op::LastRows { x, out } => {
                let cols = self.per_token(*x)?;
                if self.shape(*out)? != (self.graph.n_seqs, cols) || x == out {
                    return Err(self.bad("output must have one row per sequence, of the input's width".into()));
                }
            }
            Op::RouteExperts { logits, routing, ids, weights, .. } => {
                let n_expert = self.per_token(*logits)?;
                let k = routing.n_used;
                if k == 0 || k > n_expert {
                    return Err(self.bad(format!("{k} experts used of {n_expert}")));
                }
                if self.typed_shape(*ids, BufType::U32)? != (n, k) || self.shape(*weights)? != (n, k) {
                    return Err(self.bad(format!("ids and weights must be [{n}, {k}]")));
                }
                if !routing.scale.is_finite() {
                    return Err(self.bad(format!("expert weight scale {}", routing.scale)));
                }
                if let Some(bias) = routing.selection_bias {
                    // A softmax over the chosen logits shifts by the first chosen, the largest
                    // only when nothing but the logits chooses.
                    if routing.gating == ExpertGating::SoftmaxOfChosen {
                        return Err(self.bad("a selection bias with a softmax over the chosen logits".into()));
                    }
                    self.vector(bias, n_expert)?;
                }
                if let Some(g) = routing.groups {
                    // A group's score sums its two best experts'.
                    let per_group = n_expert.checked_div(g.n_group).unwrap_or(0);
                    if per_group < 2
                        || n_expert % g.n_group != 0
                        || g.n_used == 0
                        || g.n_used > g.n_group
                        || k > g.n_used * per_group
                    {
                        return Err(self.bad(format!(
                            "{k} experts used of {} groups of {n_expert} experts, {} groups used",
                            g.n_group, g.n_used
                        )));
                    }
                }
            }
            Op::MatMulExperts { w, x, ids, bias, out } => {
                let d = self.experts(*w)?;
                if let Some(b) = bias {
                    self.vector(*b, d.n_experts() * d.n_rows())?;
                }
                let (_, k) = self.typed_shape(*ids, BufType::U32)?;
                let x_cols = self.per_token(*x)?;
                let broadcast = x_cols == d.row_len();
                if k == 0 || !(broadcast || x_cols == k * d.row_len()) || k > d.n_experts() {
                    return Err(
                        self.bad(format!("x of {x_cols} columns for {k} slots of weight '{}' {:?}", d.name, d.dims))
                    );
                }
                if self.typed_shape(*ids, BufType::U32)?.0 != n || self.per_token(*out)? != k * d.n_rows() || x == out {
                    return Err(self.bad(format!(
                        "ids [{n}, {k}] and out [{n}, {}] for weight '{}' {:?}",
                        k * d.n_rows(),
                        d.name,
                        d.dims
                    )));
                }
            }
            Op::MatMulHeads { w, x, out } => {
                let d = self.experts(*w)?;
                let heads = d.n_experts();
                if self.per_token(*x)? != heads * d.row_len() || self.per_token(*out)? != heads * d.n_rows() || x == out
                {
                    return Err(self.bad(format!(
                        "x of {} and out of {} columns for the {heads} heads of weight '{}' {:?}",
                        self.per_token(*x)?,
                        self.per_token(*out)?,
                        d.name,
                        d.dims
                    )));
                }
            }
            Op::Concat { a, b, groups, out } => {
                let (ca, cb, co) = (self.per_token(*a)?, self.per_token(*b)?, self.per_token(*out)?);
                if *groups == 0
                    || ca * cb == 0
                    || ca % groups != 0
                    || cb % groups != 0
                    || co != ca + cb
                    || out == a
                    || out == b
                {
                    return Err(self.bad(format!("{groups} groups of {ca} and {cb} columns into {co}")));
                }
            }
            Op::CombineExperts { x, weights, out } => {
                let k = self.per_token(*weights)?;
                let x_cols = self.per_token(*x)?;
                let cols = self.per_token(*out)?;
                if k == 0 || x_cols != k * cols || x == out || weights == out {
                    return Err(self.bad(format!("x of {x_cols} columns for {k} slots of {cols}")));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{ExpertGating, ExpertRouting};
    use crate::quant::GgmlType;

    fn matrix(rows: u64, k: u64) -> WeightDesc {
        WeightDesc { name: "w".into(), ty: GgmlType::F32, dims: vec![k, rows] }
    }

    fn graph_with(op: impl FnOnce(&mut Graph) -> Op) -> Graph {
        let mut g = Graph::new(2, 1);
        let op = op(&mut g);
        g.push(op);
        g.logits = BufId(0);
        g
    }

    #[test]
    fn a_consistent_mat_mul_passes() {
        let w = matrix(3, 4);
        let g = graph_with(|g| {
            let x = g.buf("x", 2, 4);
            let out = g.buf("out", 2, 3);
            Op::MatMul { w: WeightId(0), x, bias: None, out }
        });
        g.validate(|_| Some(&w)).expect("valid");
    }

    #[test]
    fn a_mat_mul_of_the_wrong_width_names_the_op_and_weight() {
        let w = matrix(3, 5);
        let g = graph_with(|g| {
            let x = g.buf("x", 2, 4);
            let out = g.buf("out", 2, 3);
            Op::MatMul { w: WeightId(0), x, bias: None, out }
        });
        let err = g.validate(|_| Some(&w)).expect_err("k differs").to_string();
        assert!(err.contains("mat_mul") && err.contains("'w'"), "{err}");
    }

    #[test]
    fn an_unknown_weight_or_buffer_is_an_error_not_a_panic() {
        let g = graph_with(|g| {
            let x = g.buf("x", 2, 4);
            Op::MatMul { w: WeightId(7), x, bias: None, out: BufId(9) }
        });
        assert!(matches!(g.validate(|_| None), Err(CoreError::BadGraph { op: "mat_mul", .. })));
        let w = matrix(3, 4);
        assert!(matches!(g.validate(|_| Some(&w)), Err(CoreError::BadGraph { op: "mat_mul", .. })));
    }

    #[test]
    fn out_may_alias_the_first_operand_only() {
        let in_place = graph_with(|g| {
            let a = g.buf("a", 2, 4);
            let b = g.buf("b", 2, 4);
            Op::Add { a, b, out: a }
        });
        in_place.validate(|_| None).expect("out = a");
        let second = graph_with(|g| {
            let a = g.buf("a", 2, 4);
            let b = g.buf("b", 2, 4);
            Op::Glu { activation: GluActivation::Silu, gate: a, up: b, out: b }
        });
        assert!(second.validate(|_| None).is_err());
    }

    #[test]
    fn per_token_ops_need_one_row_per_token() {
        let g = graph_with(|g| {
            let q = g.buf("q", 3, 8);
            let out = g.buf("out", 3, 8);
            let params = crate::graph::AttentionParams {
                layer: 0,
                n_head: 2,
                n_head_kv: 1,
                head_dim: 4,
                scale: 1.0,
                window: None,
                softcap: None,
                v_offset: None,
                sinks: None,
                v_head_dim: None,
                values: ValueRows::Stored,
            };
            Op::Attention { q, params, out }
        });
        let err = g.validate(|_| None).expect_err("3 rows for 2 tokens").to_string();
        assert!(err.contains("3 rows for 2 tokens"), "{err}");
    }

    #[test]
    fn more_sequences_than_tokens_is_refused() {
        let mut g = Graph::new(1, 2);
        g.logits = g.buf("logits", 2, 4);
        assert!(g.validate(|_| None).is_err());
    }

    #[test]
    fn a_u32_buffer_in_an_f32_op_is_refused_naming_op_and_buffer() {
        let g = graph_with(|g| {
            let a = g.buf("a", 2, 4);
            let ids = g.typed_buf("expert_ids", BufType::U32, 2, 4);
            Op::Add { a, b: ids, out: a }
        });
        let err = g.validate(|_| None).expect_err("u32 operand");
        assert!(
            matches!(
                &err,
                CoreError::BufTypeMismatch { index: 0, op: "add", buffer, expected: BufType::F32, found: BufType::U32 }
                    if buffer == "expert_ids"
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("'expert_ids' holds u32"), "{err}");

        // Written as well as read: a mat-mul's output.
        let w = matrix(3, 4);
        let g = graph_with(|g| {
            let x = g.buf("x", 2, 4);
            let out = g.typed_buf("out", BufType::U32, 2, 3);
            Op::MatMul { w: WeightId(0), x, bias: None, out }
        });
        assert!(matches!(g.validate(|_| Some(&w)), Err(CoreError::BufTypeMismatch { op: "mat_mul", .. })));
    }

    #[test]
    fn the_logits_are_f32() {
        let mut g = Graph::new(1, 1);
        g.logits = g.typed_buf("logits", BufType::U32, 1, 4);
        assert!(matches!(g.validate(|_| None), Err(CoreError::BufTypeMismatch { op: "graph", .. })));
        g.bufs[0].dtype = BufType::F32;
        g.validate(|_| None).expect("f32 logits");
    }

    #[test]
    fn an_expert_weight_is_refused_by_every_op_reading_a_matrix_or_vector() {
        // [k = 4, n = 3, 8 experts]: each expert's matrix alone would fit the mat-mul.
        let experts = WeightDesc { name: "blk.0.ffn_gate_exps.weight".into(), ty: GgmlType::F32, dims: vec![4, 3, 8] };
        let mat_mul = graph_with(|g| {
            let x = g.buf("x", 2, 4);
            let out = g.buf("out", 2, 3);
            Op::MatMul { w: WeightId(0), x, bias: None, out }
        });
        let err = mat_mul.validate(|_| Some(&experts)).expect_err("expert weight");
        assert!(
            matches!(&err, CoreError::ExpertWeight { op: "mat_mul", weight, n_experts: 8, .. }
                if weight == "blk.0.ffn_gate_exps.weight"),
            "{err:?}"
        );
        let embed = graph_with(|g| {
            let out = g.buf("out", 2, 4);
            Op::Embed { table: WeightId(0), out }
        });
        assert!(matches!(embed.validate(|_| Some(&experts)), Err(CoreError::ExpertWeight { op: "embed", .. })));
        // A vector of the right length, stacked: [2, 1, 2] holds the 4 values of the group.
        let stacked = WeightDesc { name: "norm".into(), ty: GgmlType::F32, dims: vec![2, 1, 2] };
        let norm = graph_with(|g| {
            let x = g.buf("x", 2, 4);
            Op::RmsNorm { x, weight: Some(WeightId(0)), eps: 1e-6, group: 4, out: x }
        });
        assert!(matches!(norm.validate(|_| Some(&stacked)), Err(CoreError::ExpertWeight { op: "rms_norm", .. })));
        let flat = WeightDesc { dims: vec![4], ..stacked };
        norm.validate(|_| Some(&flat)).expect("one vector");
    }

    #[test]
    fn ops_name_what_they_read_and_write() {
        let (a, b, c) = (BufId(0), BufId(1), BufId(2));
        assert_eq!((Op::Add { a, b, out: c }.inputs(), Op::Add { a, b, out: c }.outputs()), (vec![a, b], vec![c]));
        assert_eq!(
            (Op::Scale { x: a, factor: 2.0 }.inputs(), Op::Scale { x: a, factor: 2.0 }.outputs()),
            (vec![a], vec![a])
        );
        let store = Op::StoreKv { layer: 0, k: a, v: Some(b), k_offset: None, v_offset: None };
        assert_eq!((store.inputs(), store.outputs()), (vec![a, b], vec![]));
        let embed = Op::Embed { table: WeightId(0), out: c };
        assert_eq!((embed.inputs(), embed.outputs()), (vec![], vec![c]));
        let route = Op::RouteExperts { logits: a, routing: routing(2), ids: b, weights: c, tally: None };
        assert_eq!((route.inputs(), route.outputs()), (vec![a], vec![b, c]));
        assert!(route.writes(b) && route.writes(c) && !route.writes(a));
    }

    fn routing(n_used: usize) -> ExpertRouting {
        ExpertRouting {
            n_used,
            gating: ExpertGating::Softmax,
            normalize: true,
            scale: 1.0,
            selection_bias: None,
            groups: None,
        }
    }

    /// A router over 8 experts choosing 2, the gate mat-mul of experts [k = 4, n = 3, 8 experts]
    /// on each token's row, and the combination of the 2 slots.
    fn moe_graph(x_cols: usize, ids_type: BufType) -> Graph {
        let mut g = Graph::new(2, 1);
        let logits = g.buf("router_logits", 2, 8);
        let ids = g.typed_buf("expert_ids", ids_type, 2, 2);
        let weights = g.buf("expert_weights", 2, 2);
        let x = g.buf("x", 2, x_cols);
        let out = g.buf("out", 2, 6);
        let combined = g.buf("combined", 2, 3);
        g.push(Op::RouteExperts { logits, routing: routing(2), ids, weights, tally: Some(0) });
        g.push(Op::MatMulExperts { w: WeightId(0), x, ids, bias: None, out });
        g.push(Op::CombineExperts { x: out, weights, out: combined });
        g.logits = combined;
        g
    }

    #[test]
    fn expert_ops_read_u32_ids_and_expert_weights() {
        let experts = WeightDesc { name: "blk.0.ffn_gate_exps.weight".into(), ty: GgmlType::F32, dims: vec![4, 3, 8] };
        // x read whole by every slot, or a slice per slot.
        moe_graph(4, BufType::U32).validate(|_| Some(&experts)).expect("broadcast x");
        moe_graph(8, BufType::U32).validate(|_| Some(&experts)).expect("x per slot");
        let err = moe_graph(6, BufType::U32).validate(|_| Some(&experts)).expect_err("6 columns");
        assert!(matches!(err, CoreError::BadGraph { index: 1, op: "mat_mul_experts", .. }), "{err:?}");
        // Ids must be u32, for the router and the mat-mul alike.
        let err = moe_graph(4, BufType::F32).validate(|_| Some(&experts)).expect_err("f32 ids");
        assert!(
            matches!(&err, CoreError::BufTypeMismatch { index: 0, op: "route_experts", buffer, .. } if buffer == "expert_ids"),
            "{err:?}"
        );
        // More experts used than the router scores.
        let mut g = moe_graph(4, BufType::U32);
        g.ops[0] =
            Op::RouteExperts { logits: BufId(0), routing: routing(9), ids: BufId(1), weights: BufId(2), tally: None };
        assert!(matches!(g.validate(|_| Some(&experts)), Err(CoreError::BadGraph { index: 0, .. })));
    }
}
