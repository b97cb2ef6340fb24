//! Op conformance against the CPU oracle: single-op graphs with random inputs, many shapes
//! including odd ones, every weight type (those a backend refuses are checked to be refused
//! cleanly), compared within a [`Tolerance`].

use crate::case::{run_step, single, small_layout, tokens, Case, SeqSpec, WEIGHT_TYPES};
use crate::{Rng, Subject, Tolerance};
use hearth_core::backend::WeightData;
use hearth_core::gguf::MemorySource;
use hearth_core::graph::{GluActivation, Graph, Op, RopeMode, RopeParams, RopeYarn, WeightDesc};
use hearth_core::kv::BlockCopy;
use hearth_core::quant::GgmlType;
use hearth_core::CoreError;
use std::sync::Arc;

fn block(ty: GgmlType) -> usize {
    ty.block_len()
}

pub fn embed_every_type(subject: &dyn Subject) {
    let mut rng = Rng(1);
    for ty in WEIGHT_TYPES {
        for (row_len, n) in [(block(ty) * 3, 5usize), (block(ty), 1)] {
            let mut c = Case::new(n);
            let table = c.weight(ty, &[row_len as u64, 13], &mut rng);
            let out = c.graph.buf("out", n, row_len);
            c.graph.push(Op::Embed { table, out });
            c.graph.logits = out;
            let steps = [single(tokens(n, 13, &mut rng), 0, &small_layout())];
            c.check(subject, &format!("embed {ty:?} {row_len}x{n}"), Tolerance::DEQUANTIZE, &steps);
        }
    }
}

pub fn matmul_every_type_and_shape(subject: &dyn Subject) {
    let mut rng = Rng(3);
    for ty in WEIGHT_TYPES {
        for (k_blocks, n_out, rows, bias) in [(1, 1, 1, false), (2, 17, 3, true), (3, 67, 9, false), (1, 130, 17, true)]
        {
            let k = block(ty).max(if block(ty) == 1 { 67 } else { 0 }) * k_blocks;
            let mut c = Case::new(rows);
            let x = c.input("x", k, &mut rng);
            let w = c.weight(ty, &[k as u64, n_out as u64], &mut rng);
            let b = bias.then(|| c.weight(GgmlType::F32, &[n_out as u64], &mut rng));
            let out = c.graph.buf("out", rows, n_out);
            c.graph.push(Op::MatMul { w, x, bias: b, out });
            c.graph.logits = out;
            let steps = [single(tokens(rows, 64, &mut rng), 0, &small_layout())];
            c.check(
                subject,
                &format!("matmul {ty:?} k{k} n{n_out} rows{rows} bias{bias}"),
                Tolerance::SUM_ORDER,
                &steps,
            );
        }
    }
}

pub fn rms_norm_shapes(subject: &dyn Subject) {
    let mut rng = Rng(4);
    for (rows, cols, group, weighted, in_place) in
        [(3, 96, 32, true, false), (5, 896, 896, true, true), (1, 100, 100, false, false), (2, 640, 64, false, true)]
    {
        let mut c = Case::new(rows);
        let x = c.input("x", cols, &mut rng);
        let weight = weighted.then(|| c.weight(GgmlType::F32, &[group as u64], &mut rng));
        let out = if in_place { x } else { c.graph.buf("out", rows, cols) };
        c.graph.push(Op::RmsNorm { x, weight, eps: 1e-6, group, out });
        c.graph.logits = out;
        let steps = [single(tokens(rows, 64, &mut rng), 0, &small_layout())];
        c.check(subject, &format!("rms_norm {rows}x{cols}/{group}"), Tolerance::ELEMENTWISE, &steps);
    }
    // A norm whose output only the next op, an Add to a residual, reads (Gemma's post-norms; a
    // GPU backend may add in the norm's epilogue): the sum into the residual, into the norm's
    // output, or into a third buffer, the norm in place or not.
    for (sum_into, in_place) in [("residual", true), ("residual", false), ("normed", false), ("third", true)] {
        let (rows, cols) = (3, 640);
        let mut c = Case::new(rows);
        let residual = c.input("residual", cols, &mut rng);
        let x = c.input("x", cols, &mut rng);
        let weight = Some(c.weight(GgmlType::F32, &[cols as u64], &mut rng));
        let normed = if in_place { x } else { c.graph.buf("normed", rows, cols) };
        c.graph.push(Op::RmsNorm { x, weight, eps: 1e-6, group: cols, out: normed });
        let out = match sum_into {
            "residual" => residual,
            "normed" => normed,
            _ => c.graph.buf("sum", rows, cols),
        };
        // An Add's output may alias its first operand only.
        let (a, b) = if out == normed { (normed, residual) } else { (residual, normed) };
        c.graph.push(Op::Add { a, b, out });
        c.graph.logits = out;
        let steps = [single(tokens(rows, 64, &mut rng), 0, &small_layout())];
        let what = format!("rms_norm then add into the {sum_into} (norm in place: {in_place})");
        c.check(subject, &what, Tolerance::ELEMENTWISE, &steps);
    }
}

pub fn rope_modes(subject: &dyn Subject) {
    let mut rng = Rng(5);
    // (mode, head_dim, n_rot, heads, frequency factors, YaRN stretching a 32-position context 4 times)
    for (mode, head_dim, n_rot, heads, factors, yarn) in [
        (RopeMode::Neox, 64, 64, 3, false, false),
        (RopeMode::Normal, 32, 32, 2, true, false),
        (RopeMode::Neox, 80, 32, 2, false, false),
        (RopeMode::Normal, 6, 4, 5, false, false),
        (RopeMode::Neox, 64, 64, 2, false, true),
        (RopeMode::Normal, 48, 32, 2, true, true),
    ] {
        let rows = 4;
        let mut c = Case::new(rows);
        let x = c.input("x", head_dim * heads, &mut rng);
        let freq_factors = factors.then(|| c.weight(GgmlType::F32, &[(n_rot / 2) as u64], &mut rng));
        let freq_scale = if yarn { 0.25 } else { 1.0 };
        let yarn = yarn.then(|| RopeYarn::new(n_rot, 32, 10000.0, 4.0, [32.0, 1.0], 1.0, None));
        c.graph.push(Op::Rope {
            x,
            params: RopeParams { mode, head_dim, n_rot, freq_base: 10000.0, freq_scale, freq_factors, yarn },
        });
        c.graph.logits = x;
        let steps = [
            single(tokens(rows, 64, &mut rng), 0, &small_layout()),
            single(tokens(rows, 64, &mut rng), 37, &small_layout()),
        ];
        c.check(subject, &format!("rope {mode:?} hd{head_dim} rot{n_rot} {yarn:?}"), Tolerance::SUM_ORDER, &steps);
    }
    // q then k with the same parameters and different head counts, as attention blocks emit them
    // (a backend may rotate both in one kernel); k is widened by an F32 product to sum with q.
    for mode in [RopeMode::Neox, RopeMode::Normal] {
        let (rows, head_dim) = (3, 32);
        let mut c = Case::new(rows);
        let q = c.input("q", head_dim * 4, &mut rng);
        let k = c.input("k", head_dim * 2, &mut rng);
        let params = RopeParams {
            mode,
            head_dim,
            n_rot: head_dim,
            freq_base: 10000.0,
            freq_scale: 1.0,
            freq_factors: None,
            yarn: None,
        };
        c.graph.push(Op::Rope { x: q, params: params.clone() });
        c.graph.push(Op::Rope { x: k, params });
        let widen = c.weight(GgmlType::F32, &[(head_dim * 2) as u64, (head_dim * 4) as u64], &mut rng);
        let wide = c.graph.buf("wide", rows, head_dim * 4);
        c.graph.push(Op::MatMul { w: widen, x: k, bias: None, out: wide });
        c.graph.push(Op::Add { a: q, b: wide, out: q });
        c.graph.logits = q;
        let steps = [single(tokens(rows, 64, &mut rng), 5, &small_layout())];
        c.check(subject, &format!("rope q and k {mode:?}"), Tolerance::SUM_ORDER, &steps);
    }
}

/// MLA's per-head projections (Op::MatMulHeads: head h's slice of each row times matrix h) for
/// weight types of 32- and 256-value blocks, and the per-head concatenation that puts a head's
/// latent query beside its rotated part (Op::Concat), over a decode row and a prompt chunk.
pub fn per_head_matmuls_and_concat(subject: &dyn Subject) {
    let mut rng = Rng(9);
    const HEADS: usize = 4;
    for rows in [1, 19] {
        for ty in [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::F16] {
            let (k, n) = (ty.block_len().max(32) * 2, 48);
            let mut c = Case::new(rows);
            let x = c.input("q_nope", HEADS * k, &mut rng);
            let w = c.weight(ty, &[k as u64, n as u64, HEADS as u64], &mut rng);
            let latent = c.graph.buf("q_latent", rows, HEADS * n);
            c.graph.push(Op::MatMulHeads { w, x, out: latent });
            let rope = c.input("q_rope", HEADS * 8, &mut rng);
            let out = c.graph.buf("q", rows, HEADS * (n + 8));
            c.graph.push(Op::Concat { a: latent, b: rope, groups: HEADS, out });
            // The one-group concatenation of the keys: [latent, rotated key].
            let key = c.graph.buf("k", rows, HEADS * (n + 8) + 16);
            let k_rope = c.input("k_rope", 16, &mut rng);
            c.graph.push(Op::Concat { a: out, b: k_rope, groups: 1, out: key });
            c.graph.logits = key;
            let steps = [single(tokens(rows, 64, &mut rng), 0, &small_layout())];
            c.check(
                subject,
                &format!("per-head mat-muls {ty:?} and concat, {rows} rows"),
                Tolerance::SUM_ORDER,
                &steps,
            );
        }
    }
}

pub fn elementwise_ops(subject: &dyn Subject) {
    let mut rng = Rng(7);
    for (rows, cols) in [(1, 7), (3, 300), (2, 4864)] {
        let steps = |rng: &mut Rng| vec![single(tokens(rows, 64, rng), 0, &small_layout())];
        for kind in ["add", "add_in_place", "swiglu", "swiglu_in_place", "geglu", "swiglu_oai", "scale", "last_row"] {
            let mut c = Case::new(rows);
            let a = c.input("a", cols, &mut rng);
            let b = c.input("b", cols, &mut rng);
            let fresh = c.graph.buf("out", rows, cols);
            let out = match kind {
                "add" => {
                    c.graph.push(Op::Add { a, b, out: fresh });
                    fresh
                }
                "add_in_place" => {
                    c.graph.push(Op::Add { a, b, out: a });
                    a
                }
                "swiglu" => {
                    c.graph.push(Op::Glu { activation: GluActivation::Silu, gate: a, up: b, out: fresh });
                    fresh
                }
                "swiglu_in_place" => {
                    c.graph.push(Op::Glu { activation: GluActivation::Silu, gate: a, up: b, out: a });
                    a
                }
                "geglu" => {
                    c.graph.push(Op::Scale { x: a, factor: 6.0 });
                    c.graph.push(Op::Glu { activation: GluActivation::GeluTanh, gate: a, up: b, out: a });
                    a
                }
                "swiglu_oai" => {
                    // Gate and up values to ±10, so that both clamps at ±7 bite.
                    c.graph.push(Op::Scale { x: a, factor: 10.0 });
                    c.graph.push(Op::Scale { x: b, factor: 10.0 });
                    c.graph.push(Op::Glu { activation: GluActivation::GPT_OSS, gate: a, up: b, out: fresh });
                    fresh
                }
                "scale" => {
                    c.graph.push(Op::Scale { x: a, factor: -2.5 });
                    a
                }
                _ => {
                    let last = c.graph.buf("last", 1, cols);
                    c.graph.push(Op::LastRows { x: a, out: last });
                    last
                }
            };
            c.graph.logits = out;
            let tolerance = match kind {
                "geglu" | "swiglu_oai" => Tolerance::TRANSCENDENTAL,
                "last_row" => Tolerance::EXACT,
                _ => Tolerance::ELEMENTWISE,
            };
            c.check(subject, &format!("{kind} {rows}x{cols}"), tolerance, &steps(&mut rng));
        }
    }
}

/// The ops whose output only mat-muls read (the norm before q/k/v, the activation before
/// ffn_down), with several readers sharing one input and rows that end mid-workgroup, and a
/// product added to another: a backend may fold such a producer into the rounding of the
/// mat-muls' activations and the add into the product (the wgpu backend does both), which must
/// still give the CPU's results.
pub fn producers_feeding_matmuls(subject: &dyn Subject) {
    let mut rng = Rng(8);
    for rows in [1, 3] {
        let steps = |rng: &mut Rng| vec![single(tokens(rows, 64, rng), 0, &small_layout())];
        for (producer, ty_a, ty_b, k) in [
            ("norm", GgmlType::Q4_K, GgmlType::Q6_K, 512),
            ("norm_in_place", GgmlType::Q5_0, GgmlType::Q8_0, 96),
            ("swiglu", GgmlType::Q4_0, GgmlType::Q8_0, 96),
            ("geglu", GgmlType::Q4_K, GgmlType::Q4_K, 256),
            ("norm", GgmlType::Q5_K, GgmlType::Q2_K, 512),
            ("swiglu", GgmlType::Q4_1, GgmlType::Q5_1, 96),
            ("geglu", GgmlType::Q3_K, GgmlType::Q6_K, 256),
            ("swiglu_oai", GgmlType::MXFP4, GgmlType::Q8_0, 96),
        ] {
            let mut c = Case::new(rows);
            let x = c.input("x", k, &mut rng);
            let h = match producer {
                "norm" => {
                    let weight = Some(c.weight(GgmlType::F32, &[k as u64], &mut rng));
                    let h = c.graph.buf("h", rows, k);
                    c.graph.push(Op::RmsNorm { x, weight, eps: 1e-6, group: k, out: h });
                    h
                }
                "norm_in_place" => {
                    c.graph.push(Op::RmsNorm { x, weight: None, eps: 1e-6, group: k, out: x });
                    x
                }
                gated => {
                    let up = c.input("up", k, &mut rng);
                    let h = c.graph.buf("h", rows, k);
                    let activation = match gated {
                        "swiglu" => GluActivation::Silu,
                        "geglu" => GluActivation::GeluTanh,
                        _ => GluActivation::GPT_OSS,
                    };
                    c.graph.push(Op::Glu { activation, gate: x, up, out: h });
                    h
                }
            };
            let n_out = 40;
            let (a, b) = (c.graph.buf("a", rows, n_out), c.graph.buf("b", rows, n_out));
            let wa = c.weight(ty_a, &[k as u64, n_out as u64], &mut rng);
            let wb = c.weight(ty_b, &[k as u64, n_out as u64], &mut rng);
            c.graph.push(Op::MatMul { w: wa, x: h, bias: None, out: a });
            c.graph.push(Op::MatMul { w: wb, x: h, bias: None, out: b });
            // The second product's sum with the first, in place or into a buffer of its own: a
            // backend may write it in the product's epilogue.
            let sum = if producer == "geglu" { c.graph.buf("sum", rows, n_out) } else { a };
            c.graph.push(Op::Add { a, b, out: sum });
            c.graph.logits = sum;
            let tolerance = if producer == "geglu" { Tolerance::TRANSCENDENTAL } else { Tolerance::SUM_ORDER };
            let what = format!("{producer} → matmul {ty_a:?} + {ty_b:?} k{k} rows{rows}");
            c.check(subject, &what, tolerance, &steps(&mut rng));
        }
    }
}

/// Gemma's layer seams: a post-norm, its add to the residual stream and the next pre-norm, whose
/// output mat-muls read (a backend may compute the sum in the rounding of the mat-muls'
/// activations). Two such seams feed each other, as layers do, so a sum written wrongly shows in
/// the next one; the sum goes into the residual or into a buffer of its own, one or two mat-muls
/// read the pre-norm, and rows are longer than one 256-value block and end within one.
pub fn post_norm_chains_feeding_matmuls(subject: &dyn Subject) {
    let mut rng = Rng(10);
    for rows in [1, 3] {
        let steps = |rng: &mut Rng| vec![single(tokens(rows, 64, rng), 0, &small_layout())];
        for (ty, k, sum_in_place, readers) in [
            (GgmlType::Q5_0, 640, true, 2),
            (GgmlType::Q8_0, 96, false, 1),
            (GgmlType::Q6_K, 1280, true, 1),
            (GgmlType::Q4_1, 640, false, 2),
        ] {
            let mut c = Case::new(rows);
            let residual = c.input("residual", k, &mut rng);
            let proj = c.input("proj", k, &mut rng);
            let normed = c.graph.buf("normed", rows, k);
            let sum = if sum_in_place { residual } else { c.graph.buf("sum", rows, k) };
            let mut stream = residual;
            for seam in 0..2 {
                let post = Some(c.weight(GgmlType::F32, &[k as u64], &mut rng));
                let pre = Some(c.weight(GgmlType::F32, &[k as u64], &mut rng));
                c.graph.push(Op::RmsNorm { x: proj, weight: post, eps: 1e-6, group: k, out: proj });
                let out = if seam == 0 { sum } else { stream };
                c.graph.push(Op::Add { a: stream, b: proj, out });
                stream = out;
                c.graph.push(Op::RmsNorm { x: stream, weight: pre, eps: 1e-5, group: k, out: normed });
                let w = c.weight(ty, &[k as u64, k as u64], &mut rng);
                c.graph.push(Op::MatMul { w, x: normed, bias: None, out: proj });
                if readers == 2 {
                    let other = c.graph.buf(format!("other{seam}"), rows, k);
                    let w = c.weight(ty, &[k as u64, k as u64], &mut rng);
                    c.graph.push(Op::MatMul { w, x: normed, bias: None, out: other });
                    // Not added right away, so that the two products may run as siblings.
                    c.graph.push(Op::Scale { x: other, factor: 0.5 });
                    c.graph.push(Op::Add { a: proj, b: other, out: proj });
                }
            }
            // The last seam's sum stays in the residual stream, where the check reads it.
            let last = Some(c.weight(GgmlType::F32, &[k as u64], &mut rng));
            c.graph.push(Op::RmsNorm { x: proj, weight: last, eps: 1e-6, group: k, out: proj });
            c.graph.push(Op::Add { a: stream, b: proj, out: stream });
            c.graph.logits = stream;
            let what = format!(
                "post-norm + add + pre-norm → {readers} matmul {ty:?} k{k} sum in place {sum_in_place} rows{rows}"
            );
            c.check(subject, &what, Tolerance::SUM_ORDER, &steps(&mut rng));
        }
    }
}

/// Consecutive mat-muls reading one input, as q/k/v and gate/up do (a backend may compute them in
/// one dispatch): outputs of different widths, with and without biases, weights of one type or
/// of two, one token and tiles of several. Each product is mixed into the checked result through
/// an F32 mat-mul of its own, so a wrong row in any of them shows.
pub fn sibling_matmuls_sharing_an_input(subject: &dyn Subject) {
    let mut rng = Rng(9);
    for rows in [1, 3, 9] {
        let steps = |rng: &mut Rng| vec![single(tokens(rows, 64, rng), 0, &small_layout())];
        for (types, k, biased) in [
            ([GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K], 512, true),
            ([GgmlType::Q5_0, GgmlType::Q5_0, GgmlType::Q8_0], 96, true),
            ([GgmlType::Q6_K, GgmlType::Q6_K, GgmlType::Q6_K], 256, false),
            ([GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K], 512, true),
            ([GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::Q6_K], 256, false),
            ([GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q8_0], 64, false),
            ([GgmlType::Q4_1, GgmlType::Q5_1, GgmlType::Q4_1], 96, true),
            ([GgmlType::Q3_K, GgmlType::Q5_K, GgmlType::Q2_K], 256, false),
        ] {
            let mut c = Case::new(rows);
            let x = c.input("x", k, &mut rng);
            let h = c.graph.buf("h", rows, k);
            let norm = Some(c.weight(GgmlType::F32, &[k as u64], &mut rng));
            c.graph.push(Op::RmsNorm { x, weight: norm, eps: 1e-6, group: k, out: h });
            let mix = 24;
            let mut mixed = Vec::new();
            for (i, (ty, width)) in types.into_iter().zip([48usize, 20, 22]).enumerate() {
                let out = c.graph.buf(format!("out{i}"), rows, width);
                let w = c.weight(ty, &[k as u64, width as u64], &mut rng);
                let bias = biased.then(|| c.weight(GgmlType::F32, &[width as u64], &mut rng));
                c.graph.push(Op::MatMul { w, x: h, bias, out });
                mixed.push((out, width));
            }
            let mut sum = None;
            for (i, (product, width)) in mixed.into_iter().enumerate() {
                let projected = c.graph.buf(format!("mixed{i}"), rows, mix);
                let w = c.weight(GgmlType::F32, &[width as u64, mix as u64], &mut rng);
                c.graph.push(Op::MatMul { w, x: product, bias: None, out: projected });
                sum = Some(match sum {
                    None => projected,
                    Some(acc) => {
                        c.graph.push(Op::Add { a: acc, b: projected, out: acc });
                        acc
                    }
                });
            }
            c.graph.logits = sum.expect("three products");
            let what = format!("norm → sibling matmuls {types:?} k{k} bias{biased} rows{rows}");
            c.check(subject, &what, Tolerance::SUM_ORDER, &steps(&mut rng));
        }
    }
}

/// Bad steps and bad weights are errors, never panics, and leave the backend usable.
pub fn bad_input_is_an_error_not_a_panic(subject: &dyn Subject) {
    for (variant, mut backend) in subject.variants() {
        let backend = backend.as_mut();
        let mut rng = Rng(8);
        let mut c = Case::new(2);
        let x = c.input("x", 32, &mut rng);
        c.graph.logits = x;
        let (kv, g) = c.load(backend);
        let layout = small_layout();
        let ok = single(vec![1, 2], 0, &layout);
        assert!(run_step(backend, g, kv, &ok).is_ok(), "[{variant}] a valid step");
        let mut step = ok.clone();
        step.tokens = vec![1, 64];
        assert!(run_step(backend, g, kv, &step).is_err(), "[{variant}] token out of range");
        assert!(run_step(backend, g, kv, &single(vec![1], 0, &layout)).is_err(), "[{variant}] token count");
        let mut step = ok.clone();
        step.seqs[0].pos0 = 15;
        assert!(run_step(backend, g, kv, &step).is_err(), "[{variant}] block table too short");
        let mut step = ok.clone();
        step.seqs[0].tables[0][0] = 8;
        assert!(run_step(backend, g, kv, &step).is_err(), "[{variant}] block outside the pool");
        let mut step = ok.clone();
        step.seqs = vec![SeqSpec { n_tokens: 1, ..ok.seqs[0].clone() }, SeqSpec { n_tokens: 1, ..ok.seqs[0].clone() }];
        assert!(run_step(backend, g, kv, &step).is_err(), "[{variant}] sequence count");
        let mut step = ok.clone();
        step.copies = vec![BlockCopy { group: 0, src: 0, dst: 8, n_positions: 1 }];
        assert!(run_step(backend, g, kv, &step).is_err(), "[{variant}] copy outside the pool");
        let bad = WeightDesc { name: "short".into(), ty: GgmlType::Q4_K, dims: vec![256, 2] };
        let data = WeightData { source: Arc::new(MemorySource::new(vec![0u8; 100])), offset: 0, len: 100 };
        assert!(backend.upload_weight(bad, data).is_err(), "[{variant}] wrong byte count");
        // A graph that does not add up is refused by the one shape check.
        let mut bad_graph = Graph::new(2, 1);
        let y = bad_graph.buf("y", 3, 8);
        bad_graph.push(Op::Scale { x: y, factor: 2.0 });
        bad_graph.logits = y;
        let mut lopsided = bad_graph.clone();
        lopsided.push(Op::Add { a: y, b: x, out: y });
        assert!(
            matches!(backend.compile(&lopsided), Err(CoreError::BadGraph { .. })),
            "[{variant}] inconsistent graph"
        );
        assert!(run_step(backend, g, kv, &ok).is_ok(), "[{variant}] still usable after the errors");
    }
}
