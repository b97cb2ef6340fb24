//! Single-op graphs run on the CPU backend (the oracle) and on wgpu, step by step, compared by
//! normalised MSE. Inputs enter the graphs through `Embed` of random F32 tables.

use super::{nmse, open_variants, Rng};
use hearth_core::backend::{Backend, KvLayout, WeightData};
use hearth_core::gguf::MemorySource;
use hearth_core::graph::{BufId, Graph, Op, SeqStep, StepInput, WeightDesc, WeightId};
use hearth_core::kv::{BlockCopy, KvGroup, KvType};
use hearth_core::quant::GgmlType;
use hearth_cpu::CpuBackend;
use hearth_wgpu::WgpuOptions;
use std::sync::Arc;

/// Random GGUF bytes for `rows` rows of `row_len` values of `ty`: random quants, with every f16
/// scale replaced by a small finite value so outputs stay in a sane range.
pub fn random_weight(ty: GgmlType, row_len: usize, rows: usize, rng: &mut Rng) -> Vec<u8> {
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

/// One sequence of a step: its token count, first position and block tables (per KV group).
#[derive(Clone, Debug)]
pub struct SeqSpec {
    pub n_tokens: usize,
    pub pos0: usize,
    pub tables: Vec<Vec<u32>>,
}

/// One step: block copies to run first, then the tokens of every sequence.
#[derive(Clone, Debug, Default)]
pub struct Step {
    pub copies: Vec<BlockCopy>,
    pub tokens: Vec<u32>,
    pub seqs: Vec<SeqSpec>,
}

/// The default pool: one group of 8 blocks of 16 positions, f32 rows of 4.
pub fn small_layout() -> KvLayout {
    KvLayout {
        n_layers: 1,
        k_width: 4,
        v_width: 4,
        kv_type: KvType::F32,
        block_size: 16,
        groups: vec![KvGroup { layers: vec![0], window: None, n_blocks: 8 }],
    }
}

/// A one-sequence step at `pos0` whose block table is blocks 0, 1, 2, ... in order.
pub fn single(tokens: Vec<u32>, pos0: usize, layout: &KvLayout) -> Step {
    let blocks = (pos0 + tokens.len()).div_ceil(layout.block_size) as u32;
    let tables = layout.groups.iter().map(|_| (0..blocks).collect()).collect();
    Step { copies: Vec::new(), seqs: vec![SeqSpec { n_tokens: tokens.len(), pos0, tables }], tokens }
}

/// A graph and the weights it uses, run on both backends.
pub struct Case {
    pub graph: Graph,
    pub weights: Vec<(WeightDesc, Vec<u8>)>,
    pub kv: KvLayout,
}

impl Case {
    pub fn new(n_tokens: usize) -> Self {
        Self::batched(n_tokens, 1)
    }

    pub fn batched(n_tokens: usize, n_seqs: usize) -> Self {
        Case { graph: Graph::new(n_tokens, n_seqs), weights: Vec::new(), kv: small_layout() }
    }

    pub fn weight(&mut self, ty: GgmlType, dims: &[u64], rng: &mut Rng) -> WeightId {
        let bytes = random_weight(ty, dims[0] as usize, dims.iter().skip(1).product::<u64>() as usize, rng);
        self.weights.push((WeightDesc { name: format!("w{}", self.weights.len()), ty, dims: dims.to_vec() }, bytes));
        WeightId(self.weights.len() as u32 - 1)
    }

    /// A buffer [n_tokens, cols] filled with random values (Embed of a random F32 table).
    pub fn input(&mut self, name: &str, cols: usize, rng: &mut Rng) -> BufId {
        let table = self.weight(GgmlType::F32, &[cols as u64, 64], rng);
        let out = self.graph.buf(name, self.graph.n_tokens, cols);
        self.graph.push(Op::Embed { table, out });
        out
    }

    /// Uploads the weights, allocates the pool and compiles the graph on `backend`.
    pub fn load(&self, backend: &mut dyn Backend) -> (hearth_core::backend::KvId, hearth_core::backend::GraphId) {
        let mut ids = Vec::new();
        for (desc, bytes) in &self.weights {
            let data = WeightData { source: Arc::new(MemorySource::new(bytes.clone())), offset: 0, len: bytes.len() };
            ids.push(backend.upload_weight(desc.clone(), data).expect("upload"));
        }
        assert_eq!(ids, (0..ids.len() as u32).map(WeightId).collect::<Vec<_>>());
        let kv = backend.alloc_kv(self.kv.clone()).expect("kv");
        let g = backend.compile(&self.graph).expect("compile");
        (kv, g)
    }

    /// Runs the steps on `backend`; returns the logits of each step.
    pub fn run(&self, backend: &mut dyn Backend, steps: &[Step]) -> Vec<Vec<f32>> {
        let (kv, g) = self.load(backend);
        steps.iter().map(|step| run_step(backend, g, kv, step).expect("execute")).collect()
    }

    /// Runs the steps on the CPU and on every kernel variant the adapter offers
    /// (`open_variants`), each compared with the CPU's results.
    pub fn check(&self, what: &str, threshold: f64, steps: &[Step], options: WgpuOptions) {
        let mut cpu = CpuBackend::new(Some(1)).expect("cpu");
        let want = self.run(&mut cpu, steps);
        for mut gpu in open_variants(options) {
            let variant = gpu.info().variant();
            let got = self.run(&mut gpu, steps);
            for (s, (g, w)) in got.iter().zip(&want).enumerate() {
                let e = nmse(g, w);
                eprintln!("{what} [{variant}] step {s}: nmse {e:.3e}");
                assert!(
                    e <= threshold,
                    "{what} [{variant}] step {s}: nmse {e:.3e} > {threshold:.0e}\n got {:?}\nwant {:?}",
                    &g[..g.len().min(8)],
                    &w[..w.len().min(8)]
                );
            }
        }
    }
}

/// Runs one step (its block copies first) and returns the logits.
pub fn run_step(
    backend: &mut dyn Backend,
    g: hearth_core::backend::GraphId,
    kv: hearth_core::backend::KvId,
    step: &Step,
) -> hearth_core::Result<Vec<f32>> {
    backend.copy_kv_blocks(kv, &step.copies)?;
    let seqs: Vec<SeqStep<'_>> =
        step.seqs.iter().map(|s| SeqStep { n_tokens: s.n_tokens, pos0: s.pos0, block_tables: &s.tables }).collect();
    let (mut logits, mut top_k) = (Vec::new(), hearth_core::backend::TopK::default());
    let input = StepInput { tokens: &step.tokens, seqs: &seqs };
    hearth_core::backend::run_step(
        backend,
        g,
        kv,
        input,
        hearth_core::backend::Readback::Logits,
        &mut logits,
        &mut top_k,
    )?;
    Ok(logits)
}

pub fn tokens(n: usize, below: u32, rng: &mut Rng) -> Vec<u32> {
    (0..n).map(|_| rng.below(below)).collect()
}
