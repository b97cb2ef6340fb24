//! The device's expert counters: route_experts (with TALLY) adds one to a u32 per (router,
//! expert) for every pick, so counting costs no readback per step; `expert_tallies` reads them
//! back and folds them into 64-bit totals (a u32 that wrapped since the last read still gives its
//! increment, as long as fewer than 2^32 picks of one expert come between two reads).

use crate::device::Gpu;
use crate::WgpuError;
use hearth_core::backend::ExpertTallies;
use hearth_core::graph::{Graph, Op};

/// Counters the buffer holds: routers × experts (64 layers of 1024 experts, 512 of 128).
pub(crate) const TALLY_SLOTS: usize = 1 << 16;

pub(crate) struct TallyCounters {
    /// [TALLY_SLOTS] u32: router r's expert e at r * n_expert + e.
    pub buffer: wgpu::Buffer,
    /// The routers' width: every tallied router of every graph on this backend has it.
    n_expert: usize,
    /// The counters as last read, and their totals (read natively only: a browser cannot wait).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    last: Vec<u32>,
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    totals: ExpertTallies,
}

/// (router, n_expert) of each tallied router of `graph`.
fn tallied_routers(graph: &Graph) -> impl Iterator<Item = (usize, usize)> + '_ {
    graph.ops.iter().filter_map(|op| match op {
        Op::RouteExperts { logits, tally: Some(router), .. } => Some((*router, graph.desc(*logits).cols)),
        _ => None,
    })
}

impl TallyCounters {
    /// Makes `counters` ready for `graph`'s tallied routers (creating them at the first such
    /// graph); an error when a router does not fit them.
    pub fn prepare(counters: &mut Option<TallyCounters>, gpu: &Gpu, graph: &Graph) -> Result<(), WgpuError> {
        for (router, n_expert) in tallied_routers(graph) {
            let c = counters.get_or_insert_with(|| TallyCounters::new(gpu, n_expert));
            if n_expert != c.n_expert || (router + 1) * n_expert > TALLY_SLOTS {
                return Err(WgpuError::Unsupported(format!(
                    "expert counters for router {router} of {n_expert} experts (this backend counts routers of {} experts, {TALLY_SLOTS} counters in all)",
                    c.n_expert
                )));
            }
        }
        Ok(())
    }

    fn new(gpu: &Gpu, n_expert: usize) -> Self {
        // Storage buffers are created zeroed.
        let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("expert tallies"),
            size: (TALLY_SLOTS * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        TallyCounters { buffer, n_expert, last: vec![0; TALLY_SLOTS], totals: ExpertTallies::default() }
    }

    /// The first counter of `router`.
    pub fn base(&self, router: usize) -> u32 {
        (router * self.n_expert) as u32
    }

    /// Reads the counters (waiting for the device) and returns the totals.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read(&mut self, gpu: &Gpu) -> Result<ExpertTallies, WgpuError> {
        let words = crate::replay::read_back(gpu, &self.buffer, TALLY_SLOTS)?;
        for (slot, (word, last)) in words.iter().zip(&mut self.last).enumerate() {
            let now = word.to_bits();
            let added = now.wrapping_sub(*last);
            if added > 0 {
                self.totals.add(slot / self.n_expert, self.n_expert, slot % self.n_expert, added as u64);
            }
            *last = now;
        }
        Ok(self.totals.clone())
    }
}
