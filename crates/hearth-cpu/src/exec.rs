//! Runs a validated graph op by op.

use crate::kv_store::KvStore;
use crate::weights::CpuWeight;
use crate::{attention, experts, matmul, ops, CompiledGraph, CpuError};
use hearth_core::graph::{BufId, BufType, GluActivation, Graph, Op, StepInput, WeightId};
use hearth_core::kv::ValueRows;
use hearth_core::Result;

pub(crate) struct ExecContext<'a> {
    pub weights: &'a [CpuWeight],
    pub input: StepInput<'a>,
    pub debug: &'a DebugOptions,
    pub numerics: crate::Numerics,
}

/// Debug aids, set when the backend is created (not per step); [`DebugOptions::from_env`] reads
/// `HEARTH_DUMP_TAPS` (print every op's output; a directory path also writes them as raw f32) and
/// `HEARTH_OP_TIMES` (wall time per op kind, per step).
#[derive(Clone, Debug, Default)]
pub struct DebugOptions {
    pub dump_taps: Option<std::ffi::OsString>,
    pub op_times: bool,
}

impl DebugOptions {
    pub fn from_env() -> Self {
        DebugOptions {
            dump_taps: std::env::var_os("HEARTH_DUMP_TAPS"),
            op_times: std::env::var_os("HEARTH_OP_TIMES").is_some(),
        }
    }
}

/// KV ops must fit the pool: the layer exists and K/V rows have the pool's widths.
fn check_kv_ops(graph: &Graph, kv: &KvStore) -> std::result::Result<(), CpuError> {
    let l = &kv.layout;
    for op in &graph.ops {
        // The rows an op writes or reads: (keys, values, where the values are).
        let (layer, rows) = match op {
            Op::StoreKv { layer, k, v, .. } => {
                let values = if v.is_some() { ValueRows::Stored } else { ValueRows::KeyPrefix };
                (*layer, (graph.desc(*k).cols, v.map_or(l.v_width, |v| graph.desc(v).cols), values))
            }
            Op::Attention { params: p, .. } => (p.layer, (p.n_head_kv * p.head_dim, p.n_head_kv * p.v_dim(), p.values)),
            _ => continue,
        };
        if kv.group_of(layer).is_none() || rows != (l.k_width, l.v_width, l.values) {
            return Err(CpuError::BadKv(format!(
                "op {} on layer {layer} does not fit the KV pool ({} layers, widths {}/{}, values {:?})",
                op.name(),
                l.n_layers,
                l.k_width,
                l.v_width,
                l.values
            )));
        }
    }
    Ok(())
}

/// Copies `src` into `dst` unless they are the same buffer, then returns `dst` for in-place work.
fn prepare_out(bufs: &mut [Vec<f32>], src: BufId, dst: BufId) -> Vec<f32> {
    let mut out = std::mem::take(&mut bufs[dst.0 as usize]);
    if src != dst {
        out.copy_from_slice(&bufs[src.0 as usize]);
    }
    out
}

pub(crate) fn run(compiled: &mut CompiledGraph, kv: &mut KvStore, ctx: &ExecContext<'_>) -> Result<()> {
    let graph = &compiled.graph;
    let bufs = &mut compiled.bufs;
    let n = graph.n_tokens;
    check_kv_ops(graph, kv)?;
    let seqs = ctx.input.seqs;
    // [n_tokens] position of each token in its sequence.
    let positions: Vec<usize> = ctx.input.token_positions().map(|(_, p)| p).collect();
    let w = |id: WeightId| &ctx.weights[id.0 as usize];
    let cols = |b: BufId| graph.bufs[b.0 as usize].cols;
    // A weight read as a vector (norms, biases, offsets, sinks), decoded once.
    let vector = |id: WeightId| w(id).values();
    let taps = ctx.debug.dump_taps.as_ref();
    let mut timer = OpTimer::new(ctx.debug.op_times);
    // Mat-muls never write their input, so converted activations stay valid across consecutive
    // mat-muls; any other op may write any buffer.
    compiled.activations.invalidate();
    for (index, op) in graph.ops.iter().enumerate() {
        timer.start();
        if !matches!(op, Op::MatMul { .. }) {
            compiled.activations.invalidate();
        }
        match op {
            Op::Embed { table, out } => {
                ops::embed(w(*table), ctx.input.tokens, &mut bufs[out.0 as usize])?;
            }
            Op::RmsNorm { x, weight, eps, group, out } => {
                let mut o = prepare_out(bufs, *x, *out);
                ops::rms_norm(&mut o, *group, *eps, weight.map(vector).transpose()?);
                bufs[out.0 as usize] = o;
            }
            Op::MatMul { w: wid, x, bias, out } => {
                let mut o = std::mem::take(&mut bufs[out.0 as usize]);
                let bias = bias.map(vector).transpose()?;
                matmul::matmul(
                    w(*wid),
                    &bufs[x.0 as usize],
                    *x,
                    cols(*x),
                    bias,
                    &mut compiled.activations,
                    ctx.numerics,
                    &mut o,
                );
                bufs[out.0 as usize] = o;
            }
            Op::Rope { x, params } => {
                let factors = params.freq_factors.map(vector).transpose()?;
                ops::rope(&mut bufs[x.0 as usize], cols(*x), params, factors, &positions);
            }
            Op::StoreKv { layer, k, v, k_offset, v_offset } => {
                let offset = |o: &Option<WeightId>| o.map(vector).transpose();
                let v = v.map(|v| &bufs[v.0 as usize][..]);
                kv.store(*layer, seqs, &bufs[k.0 as usize], v, offset(k_offset)?, offset(v_offset)?)?;
            }
            Op::Attention { q, params, out } => {
                let mut o = std::mem::take(&mut bufs[out.0 as usize]);
                let (q_width, out_width) = (cols(*q), cols(*out));
                let v_offset = params.v_offset.map(vector).transpose()?;
                let sinks = params.sinks.map(vector).transpose()?;
                let mut t0 = 0;
                for seq in seqs {
                    // The positions this sequence's queries see, read in place from its blocks.
                    let hi = seq.pos0 + seq.n_tokens - 1;
                    let lo = params.window.map_or(0, |w| (seq.pos0 + 1).saturating_sub(w));
                    let paged = kv.paged(params.layer, seq, lo, hi, v_offset)?;
                    let rows = t0 * q_width..(t0 + seq.n_tokens) * q_width;
                    let out_rows = t0 * out_width..(t0 + seq.n_tokens) * out_width;
                    attention::attention(
                        &bufs[q.0 as usize][rows],
                        paged,
                        params,
                        sinks,
                        seq.pos0,
                        seq.n_tokens,
                        ctx.numerics,
                        &mut o[out_rows],
                    )?;
                    t0 += seq.n_tokens;
                }
                bufs[out.0 as usize] = o;
            }
            Op::Add { a, b, out } => {
                let mut o = prepare_out(bufs, *a, *out);
                ops::add_assign(&mut o, &bufs[b.0 as usize]);
                bufs[out.0 as usize] = o;
            }
            Op::Scale { x, factor } => {
                bufs[x.0 as usize].iter_mut().for_each(|v| *v *= factor);
            }
            Op::Glu { activation, gate, up, out } => {
                let mut o = prepare_out(bufs, *gate, *out);
                let (up, cols) = (&bufs[up.0 as usize], cols(*gate));
                match *activation {
                    GluActivation::Silu => ops::swiglu(&mut o, up, cols),
                    GluActivation::GeluTanh => ops::geglu(&mut o, up, cols),
                    GluActivation::ClampedSilu { alpha, limit } => ops::clamped_swiglu(&mut o, up, cols, alpha, limit),
                }
                bufs[out.0 as usize] = o;
            }
            Op::LastRows { x, out } => {
                let c = cols(*x);
                let mut o = std::mem::take(&mut bufs[out.0 as usize]);
                let mut end = 0;
                for (s, seq) in seqs.iter().enumerate() {
                    end += seq.n_tokens;
                    o[s * c..(s + 1) * c].copy_from_slice(&bufs[x.0 as usize][(end - 1) * c..end * c]);
                }
                bufs[out.0 as usize] = o;
            }
            Op::RouteExperts { logits, routing, ids, weights, .. } => {
                let (mut i, mut wts) =
                    (std::mem::take(&mut bufs[ids.0 as usize]), std::mem::take(&mut bufs[weights.0 as usize]));
                let scratch = &mut compiled.experts;
                let bias = routing.selection_bias.map(vector).transpose()?;
                experts::route(&bufs[logits.0 as usize], cols(*logits), routing, bias, scratch, &mut i, &mut wts);
                bufs[ids.0 as usize] = i;
                bufs[weights.0 as usize] = wts;
            }
            Op::MatMulExperts { w: wid, x, ids, bias, out } => {
                let mut o = std::mem::take(&mut bufs[out.0 as usize]);
                let (x, ids, n_used) = (&bufs[x.0 as usize], &bufs[ids.0 as usize], cols(*ids));
                let bias = bias.map(vector).transpose()?;
                experts::matmul(w(*wid), x, ids, n_used, bias, &mut compiled.experts, &mut o)?;
                bufs[out.0 as usize] = o;
            }
            Op::MatMulHeads { w: wid, x, out } => {
                let mut o = std::mem::take(&mut bufs[out.0 as usize]);
                experts::matmul_heads(w(*wid), &bufs[x.0 as usize], n, &mut compiled.experts, &mut o)?;
                bufs[out.0 as usize] = o;
            }
            Op::Concat { a, b, groups, out } => {
                let mut o = std::mem::take(&mut bufs[out.0 as usize]);
                ops::concat(&bufs[a.0 as usize], &bufs[b.0 as usize], (cols(*a), cols(*b)), *groups, &mut o);
                bufs[out.0 as usize] = o;
            }
            Op::CombineExperts { x, weights, out } => {
                let mut o = std::mem::take(&mut bufs[out.0 as usize]);
                experts::combine(&bufs[x.0 as usize], &bufs[weights.0 as usize], cols(*weights), &mut o);
                bufs[out.0 as usize] = o;
            }
        }
        timer.stop(op, |id| &ctx.weights[id.0 as usize]);
        if let Some(dir) = &taps {
            dump_tap(graph, bufs, index, op, std::path::Path::new(dir));
        }
    }
    timer.report(n);
    Ok(())
}

/// Debug aid (env `HEARTH_OP_TIMES`): wall time per op kind (mat-muls per weight type) of each
/// step, printed to stderr, to see where a step's time goes.
/// The clock is only read when enabled: `Instant::now` panics on wasm32-unknown-unknown.
struct OpTimer {
    totals: Option<std::collections::BTreeMap<String, (u32, std::time::Duration)>>,
    started: Option<std::time::Instant>,
}

impl OpTimer {
    fn new(on: bool) -> Self {
        OpTimer { totals: on.then(Default::default), started: None }
    }

    fn start(&mut self) {
        if self.totals.is_some() {
            self.started = Some(std::time::Instant::now());
        }
    }

    fn stop<'w>(&mut self, op: &Op, weight: impl Fn(WeightId) -> &'w CpuWeight) {
        let Some(totals) = &mut self.totals else { return };
        let key = match op {
            Op::MatMul { w, .. } => {
                let d = &weight(*w).desc;
                format!("mat_mul {} {}x{}", d.ty, d.n_rows(), d.row_len())
            }
            _ => op.name().to_string(),
        };
        let entry = totals.entry(key).or_default();
        entry.0 += 1;
        entry.1 += self.started.map_or(std::time::Duration::ZERO, |t| t.elapsed());
    }

    fn report(&self, n_tokens: usize) {
        let Some(totals) = &self.totals else { return };
        let all: std::time::Duration = totals.values().map(|v| v.1).sum();
        eprintln!("op times for {n_tokens} tokens: {:.3} ms", all.as_secs_f64() * 1e3);
        for (name, (count, time)) in totals {
            eprintln!("  {:>8.3} ms {count:>4}x {name}", time.as_secs_f64() * 1e3);
        }
    }
}

/// Debug aid (env `HEARTH_DUMP_TAPS`): prints each op's output to stderr as llama.cpp's
/// `llama-eval-callback` does — per row the first and last 3 values, then the sum — so the two
/// runtimes can be compared op by op. When the variable names a directory, the whole output is
/// also written there as raw little-endian f32 (`<op index>_<buffer name>.f32`).
fn dump_tap(graph: &Graph, bufs: &[Vec<f32>], index: usize, op: &Op, dir: &std::path::Path) {
    for b in op.outputs() {
        dump_buffer(graph, bufs, index, op, b, dir);
    }
}

fn dump_buffer(graph: &Graph, bufs: &[Vec<f32>], index: usize, op: &Op, b: BufId, dir: &std::path::Path) {
    let desc = &graph.bufs[b.0 as usize];
    let data = &bufs[b.0 as usize];
    // Expert ids are bit patterns in the f32 buffers.
    let show = |v: &f32| match desc.dtype {
        BufType::U32 => format!("{:10}", v.to_bits()),
        BufType::F32 => format!("{v:10.4}"),
    };
    eprintln!("tap {index} {} -> {} [{}, {}]", op.name(), desc.name, desc.rows, desc.cols);
    for row in data.chunks(desc.cols.max(1)) {
        let c = row.len();
        let head: Vec<String> = row.iter().take(3).map(show).collect();
        let tail: Vec<String> = row[c.saturating_sub(3)..].iter().map(show).collect();
        eprintln!("    [{}, ..., {}]", head.join(", "), tail.join(", "));
    }
    eprintln!("    sum = {:.6}", data.iter().map(|&v| v as f64).sum::<f64>());
    if dir.is_dir() {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        let path = dir.join(format!("{index}_{}.f32", desc.name));
        if let Err(e) = std::fs::write(&path, bytes) {
            eprintln!("    (cannot write {}: {e})", path.display());
        }
    }
}
