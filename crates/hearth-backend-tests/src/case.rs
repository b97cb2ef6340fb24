//! Single-op graphs run on the CPU backend (the oracle) and on a subject backend, step by step,
//! compared by normalised MSE. Inputs enter the graphs through `Embed` of random F32 tables.

use crate::{Subject, Tolerance};
use hearth_core::backend::{Backend, Capability, GraphId, KvId, KvLayout, Readback, TopK, WeightData};
use hearth_core::gguf::MemorySource;
use hearth_core::graph::{BufId, Graph, Op, SeqStep, StepInput, WeightDesc, WeightId};
use hearth_core::kv::{BlockCopy, KvGroup, KvType};
use hearth_core::quant::GgmlType;
use hearth_core::CoreError;
use hearth_cpu::CpuBackend;
use std::sync::Arc;

/// xorshift64*: reproducible test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn below(&mut self, n: u32) -> u32 {
        (self.next_u64() % n as u64) as u32
    }
}

/// Normalised mean squared error of `got` against `want`.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let err: f64 = got.iter().zip(want).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let norm: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    err / norm.max(1e-30)
}

/// Every type a weight may be stored as.
pub const WEIGHT_TYPES: [GgmlType; GgmlType::WEIGHT_TYPES.len()] = GgmlType::WEIGHT_TYPES;

/// Random GGUF bytes for `rows` rows of `row_len` values of `ty`
/// (`hearth_core::quant::synthetic::random_bytes`).
pub fn random_weight(ty: GgmlType, row_len: usize, rows: usize, rng: &mut Rng) -> Vec<u8> {
    hearth_core::quant::synthetic::random_bytes(ty, row_len * rows, &mut || rng.next_u64())
        .unwrap_or_else(|e| panic!("no generator for {ty:?}: {e}"))
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
        values: hearth_core::kv::ValueRows::Stored,
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

pub fn tokens(n: usize, below: u32, rng: &mut Rng) -> Vec<u32> {
    (0..n).map(|_| rng.below(below)).collect()
}

/// A graph and the weights it uses, run on the oracle and on a subject.
pub struct Case {
    pub graph: Graph,
    pub weights: Vec<(WeightDesc, Vec<u8>)>,
    pub kv: KvLayout,
}

/// What a backend made of a case: ready to step, or refused through `supports` (the reason).
pub enum Loaded {
    Ready(KvId, GraphId),
    Refused(String),
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

    /// Uploads the weights, asks `supports` about the KV layout and every op, then allocates the
    /// pool and compiles the graph. A refusal must be one `compile` agrees with: it then fails
    /// with `CoreError::Unsupported`.
    pub fn try_load(&self, backend: &mut dyn Backend) -> Loaded {
        let mut ids = Vec::new();
        for (desc, bytes) in &self.weights {
            let data = WeightData { source: Arc::new(MemorySource::new(bytes.clone())), offset: 0, len: bytes.len() };
            ids.push(backend.upload_weight(desc.clone(), data).expect("upload"));
        }
        assert_eq!(ids, (0..ids.len() as u32).map(WeightId).collect::<Vec<_>>());
        let refusal = backend.supports(Capability::Kv(&self.kv)).err().or_else(|| {
            self.graph.ops.iter().find_map(|op| backend.supports(Capability::Op { op, graph: &self.graph }).err())
        });
        if let Some(reason) = refusal {
            if let Err(e) = backend.alloc_kv(self.kv.clone()).and_then(|_| backend.compile(&self.graph)) {
                assert!(matches!(e, CoreError::Unsupported { .. }), "refused ({reason}), yet failed otherwise: {e}");
            }
            return Loaded::Refused(reason);
        }
        let kv = backend.alloc_kv(self.kv.clone()).expect("kv");
        let g = backend.compile(&self.graph).expect("compile");
        Loaded::Ready(kv, g)
    }

    /// [`Case::try_load`] on a backend that must run the case.
    pub fn load(&self, backend: &mut dyn Backend) -> (KvId, GraphId) {
        match self.try_load(backend) {
            Loaded::Ready(kv, g) => (kv, g),
            Loaded::Refused(reason) => panic!("the backend refused the case: {reason}"),
        }
    }

    /// Runs the steps on `backend`; returns the logits of each step.
    pub fn run(&self, backend: &mut dyn Backend, steps: &[Step]) -> Vec<Vec<f32>> {
        let (kv, g) = self.load(backend);
        steps.iter().map(|step| run_step(backend, g, kv, step).expect("execute")).collect()
    }

    /// Runs the steps on the CPU oracle and on every variant of `subject`, each compared with the
    /// oracle within `tolerance`. A variant that refuses the case is reported, not compared.
    pub fn check(&self, subject: &dyn Subject, what: &str, tolerance: Tolerance, steps: &[Step]) {
        let mut cpu = CpuBackend::new(Some(1)).expect("cpu");
        let want = self.run(&mut cpu, steps);
        self.check_variants(subject, what, tolerance, steps, &want, &mut cpu);
    }

    /// Every variant of `subject` against `want` (the logits of each step), and its expert
    /// tallies against `cpu`'s after it ran the case.
    pub fn check_variants(
        &self,
        subject: &dyn Subject,
        what: &str,
        tolerance: Tolerance,
        steps: &[Step],
        want: &[Vec<f32>],
        cpu: &mut CpuBackend,
    ) {
        for (variant, mut backend) in subject.variants() {
            let (kv, g) = match self.try_load(backend.as_mut()) {
                Loaded::Ready(kv, g) => (kv, g),
                Loaded::Refused(reason) => {
                    eprintln!("{what} [{variant}]: refused at load ({reason})");
                    continue;
                }
            };
            for (s, (step, w)) in steps.iter().zip(want).enumerate() {
                let got = run_step(backend.as_mut(), g, kv, step).expect("execute");
                tolerance.assert_close(&format!("{what} [{variant}] step {s}"), &got, w);
            }
            // The same experts picked, so the same tokens counted per expert.
            let tallies = backend.expert_tallies().expect("expert tallies");
            assert_eq!(tallies, cpu.expert_tallies().expect("cpu tallies"), "{what} [{variant}]: expert tallies");
        }
    }
}

/// Runs one step (its block copies first) and returns the logits.
pub fn run_step(backend: &mut dyn Backend, g: GraphId, kv: KvId, step: &Step) -> hearth_core::Result<Vec<f32>> {
    backend.copy_kv_blocks(kv, &step.copies)?;
    let seqs: Vec<SeqStep<'_>> =
        step.seqs.iter().map(|s| SeqStep { n_tokens: s.n_tokens, pos0: s.pos0, block_tables: &s.tables }).collect();
    let (mut logits, mut top_k) = (Vec::new(), TopK::default());
    let input = StepInput { tokens: &step.tokens, seqs: &seqs };
    hearth_core::backend::run_step(backend, g, kv, input, Readback::Logits, &mut logits, &mut top_k)?;
    Ok(logits)
}
