//! Device time per kernel family (`WgpuOptions::profile`): a timestamp before and after every
//! dispatch of a step, read back once the step is done and summed by family. Natively only, on
//! adapters with `TIMESTAMP_QUERY_INSIDE_PASSES` (browsers offer timestamps per pass at most).
#![cfg_attr(target_arch = "wasm32", allow(unused_imports, dead_code))]

use crate::device::Gpu;
use crate::shader::PipelineKey;
use crate::WgpuError;
use hearth_core::backend::KernelTime;
use std::collections::BTreeMap;

/// wgpu's limit on queries per set: two per dispatch.
const MAX_QUERIES: u32 = 4096;

/// The kernel family of a dispatch, as profiles report it: the entry point, with the weight type
/// for products and lookups and the rounding and prologue for activation rounding
/// ("matmul_q8 Q4_K", "act_quant Q8_K+NORM").
pub(crate) fn family(key: &PipelineKey) -> String {
    let named =
        |names: &[&str]| -> Vec<&str> { key.defines.iter().copied().filter(|d| names.contains(d)).collect::<Vec<_>>() };
    let types: Vec<&str> = hearth_core::quant::GgmlType::WEIGHT_TYPES.iter().map(|t| t.name()).collect();
    let detail = match key.entry {
        // The segments' types (T0_Q5_0, T1_Q8_0, ...), each named once.
        "matmul_q8" => key
            .defines
            .iter()
            .filter_map(|d| d.get(3..).filter(|ty| d.starts_with('T') && types.contains(ty)))
            .fold(Vec::new(), |mut seen, ty| {
                if !seen.contains(&ty) {
                    seen.push(ty);
                }
                seen
            }),
        "matmul" | "embed" => named(&types),
        "act_quant" => named(&["Q8_0", "Q8_K", "F16", "NORM", "SWIGLU", "GEGLU"]),
        _ => Vec::new(),
    };
    if detail.is_empty() {
        key.entry.to_string()
    } else {
        format!("{} {}", key.entry, detail.join("+"))
    }
}

/// The timestamps of one compiled graph's steps.
pub(crate) struct StepTimestamps {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Dispatches timed per step (the first ones, up to the query limit).
    capacity: u32,
}

impl StepTimestamps {
    pub fn new(gpu: &Gpu, dispatches: usize) -> Self {
        let capacity = (dispatches as u32).min(MAX_QUERIES / 2);
        let queries = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("step timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 2 * capacity.max(1),
        });
        let bytes = 16 * capacity.max(1) as u64;
        let buffer = |label, usage| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        let resolved = buffer("timestamps resolved", wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC);
        let readback = buffer("timestamps readback", wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
        StepTimestamps { queries, resolved, readback, capacity }
    }

    /// Writes the timestamp before (`end` false) or after dispatch `index`, if it is timed.
    pub fn write(&self, pass: &mut wgpu::ComputePass<'_>, index: u32, end: bool) {
        if index < self.capacity {
            pass.write_timestamp(&self.queries, 2 * index + end as u32);
        }
    }

    /// Records the copy of the step's timestamps to the host-readable buffer.
    pub fn resolve(&self, encoder: &mut wgpu::CommandEncoder, timed: u32) {
        let n = 2 * timed.min(self.capacity);
        if n > 0 {
            encoder.resolve_query_set(&self.queries, 0..n, &self.resolved, 0);
            encoder.copy_buffer_to_buffer(&self.resolved, 0, &self.readback, 0, 8 * n as u64);
        }
    }

    /// After the step finished: adds each timed dispatch's duration to its family.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn accumulate<'a>(
        &self,
        gpu: &Gpu,
        dispatches: impl ExactSizeIterator<Item = (&'a str, u64)>,
        into: &mut BTreeMap<String, KernelTime>,
    ) -> Result<(), WgpuError> {
        let timed = (dispatches.len() as u32).min(self.capacity) as usize;
        if timed == 0 {
            return Ok(());
        }
        let bytes = 16 * timed as u64;
        let signal = crate::replay::start_map(&self.readback, bytes);
        crate::replay::wait_idle(gpu)?;
        crate::replay::map_outcome(&signal).unwrap_or(Err(WgpuError::ReadBack("timestamps not mapped".into())))?;
        let period_ns = gpu.queue.get_timestamp_period() as f64;
        {
            let view =
                self.readback.slice(0..bytes).get_mapped_range().map_err(|e| WgpuError::ReadBack(e.to_string()))?;
            let ticks: &[u64] = bytemuck::cast_slice(&view[..]);
            for ((family, weight_bytes), pair) in dispatches.zip(ticks.chunks_exact(2)) {
                if !into.contains_key(family) {
                    into.insert(family.to_string(), KernelTime { family: family.to_string(), ..Default::default() });
                }
                let Some(entry) = into.get_mut(family) else { continue };
                entry.dispatches += 1;
                entry.nanos += (pair[1].saturating_sub(pair[0]) as f64 * period_ns) as u64;
                entry.weight_bytes += weight_bytes;
            }
        }
        self.readback.unmap();
        Ok(())
    }
}
