//! A mixture of experts larger than the device's memory (`--moe-offload`, llama.cpp's
//! `--cpu-moe`): [`ExpertOffload`] is a [`Backend`] made of two, the device (a GPU) holding every
//! weight but the expert stacks, and the host (the CPU backend, which reads weights in place from
//! the file's memory map) holding the expert stacks and computing their products.
//!
//! Each compiled graph is cut into parts, runs of consecutive ops on one side: the expert
//! mat-muls on the host, every op with other weights (attention, routers, dense and shared FFNs,
//! the output head) on the device, and a weightless op (the experts' activation, their weighted
//! sum, a residual add) where fewer of its input values must cross. Each part is a graph of its
//! own, compiled on its side; a step runs them in order. A buffer that a part reads and another
//! part wrote last crosses: the writing part declares it an output ([`Graph::outputs`]), the step
//! reads it back after that part ([`Backend::read_output`]) and writes it into the reading part
//! ([`Backend::write_buffer`]). In a MoE layer the FFN input, the router's ids and weights and the
//! residual stream go down, and the residual with the experts' weighted sum added comes up:
//! 2 · (n_embd + n_used) values a token down and n_embd up.
//!
//! Every part but the last waits for its backend, so this runs natively only (a browser cannot
//! wait for a GPU readback).

use crate::backend::{
    Backend, BackendCounters, Capability, ExpertTallies, GraphId, GraphSlots, KernelTime, KvId, KvLayout, LogitsFuture,
    Readback, TopK, WeightData,
};
use crate::error::{CoreError, Result};
use crate::graph::{BufId, Graph, Op, SeqStep, StepInput, WeightDesc, WeightId};
use crate::kv::BlockCopy;

/// Where an op runs and a weight lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Device,
    Host,
}

impl Side {
    fn index(self) -> usize {
        match self {
            Side::Device => 0,
            Side::Host => 1,
        }
    }
}

/// A weight as the model uploaded it, sent to each side the first time an op there reads it.
struct StoredWeight {
    desc: WeightDesc,
    data: WeightData,
    /// Its id on the device and on the host, once uploaded there.
    uploaded: [Option<WeightId>; 2],
}

/// One part of a split graph: ops of one side, with the buffers that cross over.
#[derive(Debug, PartialEq, Eq)]
struct PartPlan {
    side: Side,
    /// Indices into the whole graph's ops.
    ops: Vec<usize>,
    /// Buffers of the whole graph written into this part before it runs.
    imports: Vec<BufId>,
    /// Buffers of the whole graph read back after it runs.
    exports: Vec<BufId>,
}

/// A compiled part: its graph on its side and its buffers' ids there.
struct Part {
    side: Side,
    graph: GraphId,
    /// (whole graph's buffer, the part graph's) for the imports and the exports.
    imports: Vec<(BufId, BufId)>,
    exports: Vec<(BufId, BufId)>,
}

struct SplitGraph {
    parts: Vec<Part>,
    /// Per buffer of the whole graph: the last value read back for the next part (4-byte words).
    crossing: Vec<Vec<u32>>,
}

/// The device backend with the expert weights kept on the host; see the module's documentation.
pub struct ExpertOffload {
    sides: [Box<dyn Backend>; 2],
    name: String,
    weights: Vec<StoredWeight>,
    /// Per KV pool: the device's pool and the host's, which has no layers (no host op reads the
    /// cache) but lets the host's steps pass the step checks.
    kvs: Vec<(KvId, KvId)>,
    graphs: GraphSlots<SplitGraph>,
    /// The side that runs the last part of the submitted step, whose `ready` and `take` it answers.
    pending: Option<Side>,
    /// The step's sequences as the host sees them (no KV blocks), kept so a step allocates nothing.
    host_seqs: Vec<SeqStep<'static>>,
    /// Where the parts before the last put their (one-word) logits.
    scratch_logits: Vec<f32>,
    scratch_top_k: TopK,
    /// Whole steps run, and the parts they ran.
    steps: u64,
    parts_run: u64,
}

impl ExpertOffload {
    /// Runs on `device`, with the expert weights on `host` (a CPU backend).
    pub fn new(device: Box<dyn Backend>, host: Box<dyn Backend>) -> Self {
        let name = format!("{}+{} experts", device.name(), host.name());
        ExpertOffload {
            sides: [device, host],
            name,
            weights: Vec::new(),
            kvs: Vec::new(),
            graphs: GraphSlots::default(),
            pending: None,
            host_seqs: Vec::new(),
            scratch_logits: Vec::new(),
            scratch_top_k: TopK::default(),
            steps: 0,
            parts_run: 0,
        }
    }

    /// Bytes of the weights uploaded to each side (device, host).
    pub fn weight_bytes(&self) -> [u64; 2] {
        self.bytes_per_side(|_| None)
    }

    /// Bytes of the weights on each side once every part has compiled: an expert stack not yet
    /// uploaded counts on the host, where the expert mat-muls run.
    pub fn planned_bytes(&self) -> [u64; 2] {
        self.bytes_per_side(|w| (w.desc.n_experts() > 1).then_some(Side::Host))
    }

    /// Bytes per side of the uploaded weights, a weight not uploaded anywhere counted on the side
    /// `pending` names.
    fn bytes_per_side(&self, pending: impl Fn(&StoredWeight) -> Option<Side>) -> [u64; 2] {
        let mut bytes = [0u64; 2];
        for w in &self.weights {
            let pending = if w.uploaded == [None, None] { pending(w) } else { None };
            for side in [Side::Device, Side::Host] {
                if w.uploaded[side.index()].is_some() || pending == Some(side) {
                    bytes[side.index()] += w.data.len as u64;
                }
            }
        }
        bytes
    }

    fn side(&mut self, side: Side) -> &mut dyn Backend {
        self.sides[side.index()].as_mut()
    }

    /// Weight `id` on `side`, uploaded there at the first need.
    fn weight_on(&mut self, side: Side, id: WeightId) -> Result<WeightId> {
        let stored = self
            .weights
            .get(id.0 as usize)
            .ok_or_else(|| CoreError::InvalidArgument(format!("unknown weight id {}", id.0)))?;
        if let Some(there) = stored.uploaded[side.index()] {
            return Ok(there);
        }
        let (desc, data) = (stored.desc.clone(), stored.data.clone());
        let there = self.sides[side.index()].upload_weight(desc, data)?;
        self.weights[id.0 as usize].uploaded[side.index()] = Some(there);
        Ok(there)
    }

    /// Compiles the part `plan` of `whole` on its side: its ops renumbered into a graph of their
    /// own buffers and that side's weights, its crossings as (whole, part) buffer ids.
    fn compile_part(&mut self, whole: &Graph, plan: &PartPlan) -> Result<Part> {
        let mut part = Graph::new(whole.n_tokens, whole.n_seqs);
        let mut local: Vec<Option<BufId>> = vec![None; whole.bufs.len()];
        let mut map = |b: BufId, part: &mut Graph| -> BufId {
            *local[b.0 as usize].get_or_insert_with(|| {
                let d = whole.desc(b);
                part.typed_buf(d.name.clone(), d.dtype, d.rows, d.cols)
            })
        };
        let imports: Vec<(BufId, BufId)> = plan.imports.iter().map(|&b| (b, map(b, &mut part))).collect();
        for &i in &plan.ops {
            let mut op = whole.ops[i].clone();
            let mut weight_ids = Vec::new();
            op.visit_ids(&mut |b| *b = map(*b, &mut part), &mut |w| weight_ids.push(*w));
            let there: Vec<WeightId> =
                weight_ids.iter().map(|&w| self.weight_on(plan.side, w)).collect::<Result<_>>()?;
            let mut next = there.into_iter();
            op.visit_ids(&mut |_| {}, &mut |w| *w = next.next().unwrap_or(*w));
            part.push(op);
        }
        let exports: Vec<(BufId, BufId)> = plan.exports.iter().map(|&b| (b, map(b, &mut part))).collect();
        part.outputs = exports.iter().map(|&(_, local)| local).collect();
        // The logits where this part computes them; else a word of its own, which `take` reads.
        part.logits = match local[whole.logits.0 as usize] {
            Some(logits) if plan.ops.iter().any(|&i| whole.ops[i].writes(whole.logits)) => logits,
            _ => part.buf("no logits", 1, 1),
        };
        let graph = self.side(plan.side).compile(&part)?;
        Ok(Part { side: plan.side, graph, imports, exports })
    }
}

/// Cuts `graph` into parts and finds the buffers that cross between them. The expert mat-muls run
/// on the host and every op with other weights on the device; a weightless op (an activation, a
/// sum) runs where fewer of its input values must cross, ties on the device. Each part is a
/// graph of its own, so a buffer crosses whenever another part wrote it, on either side.
fn plan(graph: &Graph) -> Vec<PartPlan> {
    let mut parts: Vec<PartPlan> = Vec::new();
    // Per buffer: the parts holding its latest value, the one that wrote it first.
    let mut holders: Vec<Vec<usize>> = vec![Vec::new(); graph.bufs.len()];
    for (i, op) in graph.ops.iter().enumerate() {
        // The part an op on `side` joins: the last one if it is on that side, else a new one.
        let joined = |side: Side| parts.last().filter(|p| p.side == side).map(|_| parts.len() - 1);
        let crossing = |side: Side| -> usize {
            let part = joined(side);
            op.inputs()
                .iter()
                .filter(|b| {
                    let held = &holders[b.0 as usize];
                    !held.is_empty() && part.is_none_or(|p| !held.contains(&p))
                })
                .map(|b| graph.desc(*b).len())
                .sum()
        };
        let side = match op {
            Op::MatMulExperts { .. } => Side::Host,
            _ if op.weights().is_empty() && crossing(Side::Host) < crossing(Side::Device) => Side::Host,
            _ => Side::Device,
        };
        let here = match joined(side) {
            Some(p) => p,
            None => {
                parts.push(PartPlan { side, ops: Vec::new(), imports: Vec::new(), exports: Vec::new() });
                parts.len() - 1
            }
        };
        for b in op.inputs() {
            let held = &mut holders[b.0 as usize];
            let Some(&writer) = held.first() else { continue }; // never written: no value to carry
            if held.contains(&here) {
                continue;
            }
            held.push(here);
            if !parts[writer].exports.contains(&b) {
                parts[writer].exports.push(b);
            }
            if !parts[here].imports.contains(&b) {
                parts[here].imports.push(b);
            }
        }
        for b in op.outputs() {
            holders[b.0 as usize] = vec![here];
        }
        parts[here].ops.push(i);
    }
    // The whole graph's own outputs are read from the part that wrote them last.
    for &b in &graph.outputs {
        if let Some(&p) = holders.get(b.0 as usize).and_then(|held| held.first()) {
            if !parts[p].exports.contains(&b) {
                parts[p].exports.push(b);
            }
        }
    }
    parts
}

fn add_counters(a: BackendCounters, b: BackendCounters) -> BackendCounters {
    BackendCounters {
        graphs_compiled: a.graphs_compiled + b.graphs_compiled,
        graphs_released: a.graphs_released + b.graphs_released,
        steps_executed: a.steps_executed + b.steps_executed,
        ops_executed: a.ops_executed + b.ops_executed,
        pipelines_created: a.pipelines_created + b.pipelines_created,
        bind_groups_created: a.bind_groups_created + b.bind_groups_created,
        submits: a.submits + b.submits,
        dispatches: a.dispatches + b.dispatches,
        bytes_read_back: a.bytes_read_back + b.bytes_read_back,
        split_parts: a.split_parts + b.split_parts,
    }
}

impl Backend for ExpertOffload {
    fn name(&self) -> &str {
        &self.name
    }

    /// The device's variant and where the weights are, so that a load message says how much of
    /// the model the device holds.
    fn variant(&self) -> Option<String> {
        let [device, host] = self.planned_bytes().map(|b| b as f64 / 1e6);
        let placement = format!("weights: {device:.1} MB on the device, {host:.1} MB of experts in host memory");
        Some(match self.sides[0].variant() {
            Some(v) => format!("{v}; {placement}"),
            None => placement,
        })
    }

    fn supports(&self, what: Capability<'_>) -> std::result::Result<(), String> {
        match what {
            Capability::Kv(_) => self.sides[0].supports(what),
            // Each side is asked when the part holding the op compiles; the host (the CPU) runs
            // every op and the device is asked about everything else here.
            Capability::Op { op: Op::MatMulExperts { .. }, .. } => Ok(()),
            Capability::Op { op, graph } => {
                // The device judges the op by its own ids: only ops whose weights it holds, or
                // none, can be asked before the part compiles.
                let mut on_device = Vec::new();
                for w in op.weights() {
                    match self.weights.get(w.0 as usize).and_then(|s| s.uploaded[0]) {
                        Some(there) => on_device.push(there),
                        None => return Ok(()),
                    }
                }
                let mut renamed = op.clone();
                let mut next = on_device.into_iter();
                renamed.visit_ids(&mut |_| {}, &mut |w| *w = next.next().unwrap_or(*w));
                self.sides[0].supports(Capability::Op { op: &renamed, graph })
            }
        }
    }

    fn upload_weight(&mut self, desc: WeightDesc, data: WeightData) -> Result<WeightId> {
        // Weights that are not expert stacks go to the device now, so that it answers `supports`
        // about the ops reading them and a model too large for it fails at load; the rest wait
        // for the first part that reads them.
        let id = WeightId(self.weights.len() as u32);
        let expert_stack = desc.n_experts() > 1;
        self.weights.push(StoredWeight { desc, data, uploaded: [None, None] });
        if !expert_stack {
            self.weight_on(Side::Device, id)?;
        }
        Ok(id)
    }

    fn alloc_kv(&mut self, layout: KvLayout) -> Result<KvId> {
        let host_layout = KvLayout { n_layers: 0, groups: Vec::new(), ..layout.clone() };
        let device = self.side(Side::Device).alloc_kv(layout)?;
        let host = self.side(Side::Host).alloc_kv(host_layout)?;
        self.kvs.push((device, host));
        Ok(KvId(self.kvs.len() as u32 - 1))
    }

    fn copy_kv_blocks(&mut self, kv: KvId, copies: &[BlockCopy]) -> Result<()> {
        let (device, _) = self.kv(kv)?;
        self.side(Side::Device).copy_kv_blocks(device, copies)
    }

    fn compile(&mut self, graph: &Graph) -> Result<GraphId> {
        graph.validate(|id| self.weights.get(id.0 as usize).map(|w| &w.desc))?;
        let plans = plan(graph);
        // `take` reads the last part's logits: the output head must run last, as a decoder's does.
        if !plans.last().is_some_and(|last| last.ops.iter().any(|&i| graph.ops[i].writes(graph.logits))) {
            return Err(CoreError::Unsupported {
                backend: self.name.clone(),
                what: "a graph whose logits are not written by its last ops".into(),
            });
        }
        let mut parts = Vec::new();
        for plan in plans {
            match self.compile_part(graph, &plan) {
                Ok(part) => parts.push(part),
                Err(e) => {
                    for part in parts {
                        self.side(part.side).release_graph(part.graph);
                    }
                    return Err(e);
                }
            }
        }
        Ok(self.graphs.insert(SplitGraph { parts, crossing: vec![Vec::new(); graph.bufs.len()] }))
    }

    fn release_graph(&mut self, graph: GraphId) {
        if let Some(split) = self.graphs.remove(graph) {
            for part in split.parts {
                self.side(part.side).release_graph(part.graph);
            }
        }
    }

    fn submit(&mut self, graph: GraphId, kv: KvId, input: StepInput<'_>, readback: Readback) -> Result<()> {
        self.pending = None;
        let (device_kv, host_kv) = self.kv(kv)?;
        self.host_seqs.clear();
        self.host_seqs.extend(input.seqs.iter().map(|s| SeqStep {
            n_tokens: s.n_tokens,
            pos0: s.pos0,
            block_tables: &[],
        }));
        let host_input = StepInput { tokens: input.tokens, seqs: &self.host_seqs };
        let split =
            self.graphs.get_mut(graph).ok_or(CoreError::InvalidArgument(format!("unknown graph {}", graph.0)))?;
        let n_parts = split.parts.len();
        for (i, part) in split.parts.iter().enumerate() {
            let backend = self.sides[part.side.index()].as_mut();
            for &(whole, local) in &part.imports {
                backend.write_buffer(part.graph, local, &split.crossing[whole.0 as usize])?;
            }
            let (kv, input) = match part.side {
                Side::Device => (device_kv, input),
                Side::Host => (host_kv, host_input),
            };
            if i + 1 == n_parts {
                backend.submit(part.graph, kv, input, readback)?;
                self.pending = Some(part.side);
                self.steps += 1;
                self.parts_run += n_parts as u64;
                break;
            }
            backend.submit(part.graph, kv, input, Readback::Logits)?;
            let waited = match backend.ready() {
                Some(ready) => crate::block_on::block_on(ready),
                None => Ok(()),
            };
            let taken = backend.take(&mut self.scratch_logits, &mut self.scratch_top_k);
            waited.and(taken)?;
            for &(whole, local) in &part.exports {
                backend.read_output(part.graph, local, &mut split.crossing[whole.0 as usize])?;
            }
        }
        Ok(())
    }

    fn ready(&mut self) -> Option<LogitsFuture> {
        let side = self.pending?;
        self.side(side).ready()
    }

    fn take(&mut self, logits: &mut Vec<f32>, top_k: &mut TopK) -> Result<()> {
        let side = self.pending.take().ok_or(CoreError::InvalidArgument("take without a submitted step".into()))?;
        self.side(side).take(logits, top_k)
    }

    fn read_buffer(&self, graph: GraphId, name: &str) -> Option<Vec<f32>> {
        // The last part that writes a buffer of that name holds its value after the step.
        let split = self.graphs.get(graph)?;
        split.parts.iter().rev().find_map(|part| self.sides[part.side.index()].read_buffer(part.graph, name))
    }

    fn write_buffer(&mut self, graph: GraphId, buf: BufId, words: &[u32]) -> Result<()> {
        let split =
            self.graphs.get_mut(graph).ok_or(CoreError::InvalidArgument(format!("unknown graph {}", graph.0)))?;
        let slot = split
            .crossing
            .get_mut(buf.0 as usize)
            .ok_or(CoreError::InvalidArgument(format!("unknown buffer {}", buf.0)))?;
        slot.clear();
        slot.extend_from_slice(words);
        for part in &split.parts {
            if let Some(&(_, local)) = part.imports.iter().find(|(whole, _)| *whole == buf) {
                self.sides[part.side.index()].write_buffer(part.graph, local, words)?;
            }
        }
        Ok(())
    }

    fn read_output(&mut self, graph: GraphId, buf: BufId, words: &mut Vec<u32>) -> Result<()> {
        let split = self.graphs.get(graph).ok_or(CoreError::InvalidArgument(format!("unknown graph {}", graph.0)))?;
        let found = split.parts.iter().rev().find_map(|part| {
            part.exports.iter().find(|(whole, _)| *whole == buf).map(|&(_, local)| (part.side, part.graph, local))
        });
        match found {
            Some((side, part, local)) => self.side(side).read_output(part, local, words),
            None => Err(CoreError::InvalidArgument(format!("buffer {} is not an output of the graph", buf.0))),
        }
    }

    fn counters(&self) -> BackendCounters {
        let sides = add_counters(self.sides[0].counters(), self.sides[1].counters());
        BackendCounters { steps_executed: self.steps, split_parts: self.parts_run, ..sides }
    }

    fn expert_tallies(&mut self) -> Result<ExpertTallies> {
        let mut tallies = self.side(Side::Device).expert_tallies()?;
        for (router, row) in self.side(Side::Host).expert_tallies()?.counts.iter().enumerate() {
            for (expert, &n) in row.iter().enumerate() {
                tallies.add(router, row.len(), expert, n);
            }
        }
        Ok(tallies)
    }

    fn kernel_profile(&mut self) -> Option<Vec<KernelTime>> {
        self.side(Side::Device).kernel_profile()
    }

    fn memory_bytes(&self) -> u64 {
        self.sides[0].memory_bytes() + self.sides[1].memory_bytes()
    }
}

impl ExpertOffload {
    fn kv(&self, kv: KvId) -> Result<(KvId, KvId)> {
        self.kvs.get(kv.0 as usize).copied().ok_or(CoreError::InvalidArgument(format!("unknown KV pool {}", kv.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{BufType, ExpertGating, ExpertRouting, GluActivation};

    /// A MoE layer's FFN: the norm and router on the device; gate, up, activation, down, the
    /// weighted sum and the residual add on the host; the output head on the device again.
    #[test]
    fn a_moe_layer_crosses_to_the_host_and_back() {
        let (n, d, ff, n_expert, k) = (3, 8, 16, 4, 2);
        let mut g = Graph::new(n, 1);
        let [table, norm_w, router_w, gate_w, up_w, down_w, head_w] = [0, 1, 2, 3, 4, 5, 6].map(WeightId);
        let x = g.buf("x", n, d);
        let normed = g.buf("normed", n, d);
        let router = g.buf("router", n, n_expert);
        let ids = g.typed_buf("ids", BufType::U32, n, k);
        let weights = g.buf("weights", n, k);
        let [gate, up] = ["gate", "up"].map(|name| g.buf(name, n, k * ff));
        let down = g.buf("down", n, k * d);
        let moe = g.buf("moe", n, d);
        let logits = g.buf("logits", n, 10);
        let routing = ExpertRouting::top(k, ExpertGating::Softmax);
        g.push(Op::Embed { table, out: x });
        g.push(Op::RmsNorm { x, weight: Some(norm_w), eps: 1e-6, group: d, out: normed });
        g.push(Op::MatMul { w: router_w, x: normed, bias: None, out: router });
        g.push(Op::RouteExperts { logits: router, routing, ids, weights, tally: Some(0) });
        g.push(Op::MatMulExperts { w: gate_w, x: normed, ids, bias: None, out: gate });
        g.push(Op::MatMulExperts { w: up_w, x: normed, ids, bias: None, out: up });
        g.push(Op::Glu { activation: GluActivation::Silu, gate, up, out: gate });
        g.push(Op::MatMulExperts { w: down_w, x: gate, ids, bias: None, out: down });
        g.push(Op::CombineExperts { x: down, weights, out: moe });
        g.push(Op::Add { a: x, b: moe, out: x });
        g.push(Op::MatMul { w: head_w, x, bias: None, out: logits });
        g.logits = logits;

        let part = |side, ops: Vec<usize>, imports, exports| PartPlan { side, ops, imports, exports };
        assert_eq!(
            plan(&g),
            vec![
                // Every value the host needs goes down once: the FFN input, the picks, the residual.
                part(Side::Device, vec![0, 1, 2, 3], vec![], vec![normed, ids, weights, x]),
                // The sum of the experts goes up added to the residual: one row a token.
                part(Side::Host, vec![4, 5, 6, 7, 8, 9], vec![normed, ids, weights, x], vec![x]),
                part(Side::Device, vec![10], vec![x], vec![]),
            ]
        );
    }
}
