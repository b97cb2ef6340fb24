//! Op conformance against the CPU backend (in the spirit of ggml's test-backend-ops): single-op
//! graphs with random inputs, many shapes including odd ones, compared by normalised MSE.
//! Inputs enter the graphs through `Embed` of random F32 tables (embed itself is tested first).

mod common;

use common::{nmse, open, Rng};
use hearth_core::backend::{Backend, KvLayout, WeightData};
use hearth_core::gguf::MemorySource;
use hearth_core::graph::{AttentionParams, BufId, Graph, Op, RopeMode, RopeParams, StepInput, WeightDesc, WeightId};
use hearth_core::quant::GgmlType;
use hearth_cpu::CpuBackend;
use hearth_wgpu::WgpuOptions;
use std::sync::Arc;

/// Random GGUF bytes for `rows` rows of `row_len` values of `ty`: random quants, with every f16
/// scale replaced by a small finite value so outputs stay in a sane range.
fn random_weight(ty: GgmlType, row_len: usize, rows: usize, rng: &mut Rng) -> Vec<u8> {
    let n = row_len * rows;
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| rng.f32().to_le_bytes()).collect(),
        GgmlType::F16 => (0..n).flat_map(|_| half::f16::from_f32(rng.f32()).to_le_bytes()).collect(),
        _ => {
            let (block_bytes, scale_offsets): (usize, &[usize]) = match ty {
                GgmlType::Q8_0 => (34, &[0]),
                GgmlType::Q4_0 => (18, &[0]),
                GgmlType::Q5_0 => (22, &[0]),
                GgmlType::Q4_K => (144, &[0, 2]),
                GgmlType::Q6_K => (210, &[208]),
                other => panic!("no generator for {other:?}"),
            };
            let blocks = n / ty.block_len();
            let mut bytes: Vec<u8> = (0..blocks * block_bytes).map(|_| rng.next_u64() as u8).collect();
            for b in 0..blocks {
                for &off in scale_offsets {
                    let d = half::f16::from_f32(0.002 + 0.02 * rng.f32().abs());
                    bytes[b * block_bytes + off..b * block_bytes + off + 2].copy_from_slice(&d.to_le_bytes());
                }
            }
            bytes
        }
    }
}

/// A graph and the weights it uses, run on both backends.
struct Case {
    graph: Graph,
    weights: Vec<(WeightDesc, Vec<u8>)>,
    kv: Option<KvLayout>,
}

impl Case {
    fn new(n_tokens: usize) -> Self {
        Case { graph: Graph::new(n_tokens), weights: Vec::new(), kv: None }
    }

    fn weight(&mut self, ty: GgmlType, dims: &[u64], rng: &mut Rng) -> WeightId {
        let bytes = random_weight(ty, dims[0] as usize, dims.iter().skip(1).product::<u64>() as usize, rng);
        self.weights.push((WeightDesc { name: format!("w{}", self.weights.len()), ty, dims: dims.to_vec() }, bytes));
        WeightId(self.weights.len() as u32 - 1)
    }

    /// A buffer [n_tokens, cols] filled with random values (Embed of a random F32 table).
    fn input(&mut self, name: &str, cols: usize, rng: &mut Rng) -> BufId {
        let table = self.weight(GgmlType::F32, &[cols as u64, 64], rng);
        let out = self.graph.buf(name, self.graph.n_tokens, cols);
        self.graph.push(Op::Embed { table, out });
        out
    }

    /// Runs both backends over the given steps; returns (cpu, wgpu) logits per step.
    fn run(&self, backend: &mut dyn Backend, steps: &[(Vec<u32>, usize)]) -> Vec<Vec<f32>> {
        let mut ids = Vec::new();
        for (desc, bytes) in &self.weights {
            let data = WeightData { source: Arc::new(MemorySource::new(bytes.clone())), offset: 0, len: bytes.len() };
            ids.push(backend.upload_weight(desc.clone(), data).expect("upload"));
        }
        assert_eq!(ids, (0..ids.len() as u32).map(WeightId).collect::<Vec<_>>());
        let layout = self.kv.clone().unwrap_or(KvLayout { n_layers: 1, capacity: 64, k_width: 4, v_width: 4 });
        let kv = backend.alloc_kv(layout).expect("kv");
        let g = backend.compile(&self.graph).expect("compile");
        steps
            .iter()
            .map(|(tokens, pos0)| {
                let mut logits = Vec::new();
                backend.execute(g, kv, StepInput { tokens, pos0: *pos0 }, &mut logits).expect("execute");
                logits
            })
            .collect()
    }

    fn check(&self, what: &str, threshold: f64, steps: &[(Vec<u32>, usize)], options: WgpuOptions) {
        let Some(mut gpu) = open(options) else { return };
        let mut cpu = CpuBackend::new(Some(1)).expect("cpu");
        let want = self.run(&mut cpu, steps);
        let got = self.run(&mut gpu, steps);
        for (s, (g, w)) in got.iter().zip(&want).enumerate() {
            let e = nmse(g, w);
            eprintln!("{what} step {s}: nmse {e:.3e}");
            assert!(e <= threshold, "{what} step {s}: nmse {e:.3e} > {threshold:.0e}\n got {:?}\nwant {:?}", &g[..g.len().min(8)], &w[..w.len().min(8)]);
        }
    }
}

fn tokens(n: usize, below: u32, rng: &mut Rng) -> Vec<u32> {
    (0..n).map(|_| rng.below(below)).collect()
}

const WEIGHT_TYPES: [GgmlType; 7] = [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K];

fn block(ty: GgmlType) -> usize {
    ty.block_len()
}

#[test]
fn embed_every_type() {
    let mut rng = Rng(1);
    for ty in WEIGHT_TYPES {
        for (row_len, n) in [(block(ty) * 3, 5usize), (block(ty), 1)] {
            let mut c = Case::new(n);
            let table = c.weight(ty, &[row_len as u64, 13], &mut rng);
            let out = c.graph.buf("out", n, row_len);
            c.graph.push(Op::Embed { table, out });
            c.graph.logits = out;
            // Dequantization is exact arithmetic on both sides.
            c.check(&format!("embed {ty:?} {row_len}x{n}"), 1e-12, &[(tokens(n, 13, &mut rng), 0)], WgpuOptions::default());
        }
    }
}

#[test]
fn embed_and_matmul_split_into_row_ranges() {
    // A binding cap of 1 KiB forces many chunks (rows split across buffers).
    let mut rng = Rng(2);
    for ty in [GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F32] {
        let k = 256;
        let n = 4;
        let mut c = Case::new(n);
        let table = c.weight(ty, &[k as u64, 50], &mut rng);
        let x = c.graph.buf("x", n, k);
        c.graph.push(Op::Embed { table, out: x });
        let out = c.graph.buf("out", n, 50);
        c.graph.push(Op::MatMul { w: table, x, bias: None, out });
        c.graph.logits = out;
        let opts = WgpuOptions { max_binding_bytes: Some(1024), ..WgpuOptions::default() };
        c.check(&format!("split {ty:?}"), 1e-9, &[(tokens(n, 50, &mut rng), 0)], opts);
    }
}

#[test]
fn matmul_every_type_and_shape() {
    let mut rng = Rng(3);
    for ty in WEIGHT_TYPES {
        // Activations are rounded to the weight's dot type exactly as the CPU does (8-bit
        // blocks, f16), so only the order of f32 additions differs.
        let threshold = 1e-9;
        for (k_blocks, n_out, rows, bias) in [(1, 1, 1, false), (2, 17, 3, true), (3, 67, 9, false), (1, 130, 17, true)] {
            let k = block(ty).max(if block(ty) == 1 { 67 } else { 0 }) * k_blocks;
            let mut c = Case::new(rows);
            let x = c.input("x", k, &mut rng);
            let w = c.weight(ty, &[k as u64, n_out as u64], &mut rng);
            let b = bias.then(|| c.weight(GgmlType::F32, &[n_out as u64], &mut rng));
            let out = c.graph.buf("out", rows, n_out);
            c.graph.push(Op::MatMul { w, x, bias: b, out });
            c.graph.logits = out;
            c.check(&format!("matmul {ty:?} k{k} n{n_out} rows{rows} bias{bias}"), threshold, &[(tokens(rows, 64, &mut rng), 0)], WgpuOptions::default());
        }
    }
}

#[test]
fn rms_norm_shapes() {
    let mut rng = Rng(4);
    for (rows, cols, group, weighted, in_place) in [(3, 96, 32, true, false), (5, 896, 896, true, true), (1, 100, 100, false, false), (2, 640, 64, false, true)] {
        let mut c = Case::new(rows);
        let x = c.input("x", cols, &mut rng);
        let weight = weighted.then(|| c.weight(GgmlType::F32, &[group as u64], &mut rng));
        let out = if in_place { x } else { c.graph.buf("out", rows, cols) };
        c.graph.push(Op::RmsNorm { x, weight, eps: 1e-6, group, out });
        c.graph.logits = out;
        c.check(&format!("rms_norm {rows}x{cols}/{group}"), 1e-10, &[(tokens(rows, 64, &mut rng), 0)], WgpuOptions::default());
    }
}

#[test]
fn rope_modes() {
    let mut rng = Rng(5);
    for (mode, head_dim, n_rot, heads, factors) in [(RopeMode::Neox, 64, 64, 3, false), (RopeMode::Normal, 32, 32, 2, true), (RopeMode::Neox, 80, 32, 2, false), (RopeMode::Normal, 6, 4, 5, false)] {
        let rows = 4;
        let mut c = Case::new(rows);
        let x = c.input("x", head_dim * heads, &mut rng);
        let freq_factors = factors.then(|| c.weight(GgmlType::F32, &[(n_rot / 2) as u64], &mut rng));
        c.graph.push(Op::Rope { x, params: RopeParams { mode, head_dim, n_rot, freq_base: 10000.0, freq_scale: 1.0, freq_factors } });
        c.graph.logits = x;
        let steps = [(tokens(rows, 64, &mut rng), 0), (tokens(rows, 64, &mut rng), 37)];
        c.check(&format!("rope {mode:?} hd{head_dim} rot{n_rot}"), 1e-9, &steps, WgpuOptions::default());
    }
}

#[test]
fn attention_gqa_window_softcap() {
    let mut rng = Rng(6);
    // 70 rows take the CPU's f32 path (64+ queries), the others its f16 small-batch path.
    for (n_head, n_head_kv, head_dim, window, softcap, rows) in
        [(4, 2, 64, None, None, 5), (2, 2, 256, Some(3), None, 4), (6, 1, 32, None, Some(5.0), 3), (3, 3, 48, Some(200), None, 7), (2, 1, 64, Some(40), None, 70)]
    {
        let mut c = Case::new(rows);
        let q = c.input("q", n_head * head_dim, &mut rng);
        let k = c.input("k", n_head_kv * head_dim, &mut rng);
        let v = c.input("v", n_head_kv * head_dim, &mut rng);
        c.graph.push(Op::StoreKv { layer: 1, k, v });
        let out = c.graph.buf("out", rows, n_head * head_dim);
        let params = AttentionParams { layer: 1, n_head, n_head_kv, head_dim, scale: 1.0 / (head_dim as f32).sqrt(), window, softcap };
        c.graph.push(Op::Attention { q, params, out });
        c.graph.logits = out;
        let width = n_head_kv * head_dim;
        c.kv = Some(KvLayout { n_layers: 2, capacity: 300, k_width: width, v_width: width });
        // Several steps so later queries see keys written by earlier steps (and 130+ keys span
        // more than one key tile).
        let mut steps = vec![(tokens(rows, 64, &mut rng), 0), (tokens(rows, 64, &mut rng), rows)];
        steps.push((tokens(rows, 64, &mut rng), 150));
        // The small-batch path reproduces the CPU's f16 rounding (exp may differ by an ulp);
        // the f32 path sums in another order.
        let threshold = if rows < 64 { 1e-8 } else { 1e-9 };
        c.check(&format!("attention h{n_head}/{n_head_kv} hd{head_dim} w{window:?} cap{softcap:?} rows{rows}"), threshold, &steps, WgpuOptions::default());
    }
}

#[test]
fn elementwise_ops() {
    let mut rng = Rng(7);
    for (rows, cols) in [(1, 7), (3, 300), (2, 4864)] {
        let steps = |rng: &mut Rng| vec![(tokens(rows, 64, rng), 0)];
        for kind in ["add", "add_in_place", "swiglu", "swiglu_in_place", "geglu", "scale", "last_row"] {
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
                    c.graph.push(Op::SwiGlu { gate: a, up: b, out: fresh });
                    fresh
                }
                "swiglu_in_place" => {
                    c.graph.push(Op::SwiGlu { gate: a, up: b, out: a });
                    a
                }
                "geglu" => {
                    c.graph.push(Op::Scale { x: a, factor: 6.0 });
                    c.graph.push(Op::GeGlu { gate: a, up: b, out: a });
                    a
                }
                "scale" => {
                    c.graph.push(Op::Scale { x: a, factor: -2.5 });
                    a
                }
                _ => {
                    let last = c.graph.buf("last", 1, cols);
                    c.graph.push(Op::LastRow { x: a, out: last });
                    last
                }
            };
            c.graph.logits = out;
            let threshold = if kind == "geglu" { 1e-6 } else { 1e-10 };
            c.check(&format!("{kind} {rows}x{cols}"), threshold, &steps(&mut rng), WgpuOptions::default());
        }
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let Some(mut gpu) = open(WgpuOptions::default()) else { return };
    let mut rng = Rng(8);
    let mut c = Case::new(2);
    let x = c.input("x", 32, &mut rng);
    c.graph.logits = x;
    let bytes = &c.weights[0].1;
    let data = WeightData { source: Arc::new(MemorySource::new(bytes.clone())), offset: 0, len: bytes.len() };
    gpu.upload_weight(c.weights[0].0.clone(), data).expect("upload");
    let kv = gpu.alloc_kv(KvLayout { n_layers: 1, capacity: 4, k_width: 4, v_width: 4 }).expect("kv");
    let g = gpu.compile(&c.graph).expect("compile");
    let mut logits = Vec::new();
    assert!(gpu.execute(g, kv, StepInput { tokens: &[1, 64], pos0: 0 }, &mut logits).is_err(), "token out of range");
    assert!(gpu.execute(g, kv, StepInput { tokens: &[1], pos0: 0 }, &mut logits).is_err(), "token count");
    assert!(gpu.execute(g, kv, StepInput { tokens: &[1, 2], pos0: 3 }, &mut logits).is_err(), "KV overflow");
    let bad = WeightDesc { name: "short".into(), ty: GgmlType::Q4_K, dims: vec![256, 2] };
    let data = WeightData { source: Arc::new(MemorySource::new(vec![0u8; 100])), offset: 0, len: 100 };
    assert!(gpu.upload_weight(bad, data).is_err(), "wrong byte count");
}
