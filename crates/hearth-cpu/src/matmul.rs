//! out[r, j] = dot(W row j, x row r) (+ bias[j]). The activation rows are converted once to the
//! weight's dot type (8-bit blocks for quantized weights), then weight rows are split across
//! threads; each thread streams its weight rows once and reuses them for every activation row.

use crate::compat;
use crate::kernels;
use crate::kernels::q4k_x16;
use crate::weights::{CpuWeight, X16Tiles};
use crate::Numerics;
use hearth_core::quant::GgmlType;

#[cfg(not(target_arch = "wasm32"))]
use rayon::prelude::*;

/// Disjoint writes into `out` from several threads: each output column j is owned by one task.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    // A method (not field access) so closures capture the whole Send+Sync wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// The activation rows of a mat-mul converted to its weight's dot type, kept so that mat-muls
/// reading the same input (q/k/v, gate/up) convert it once.
#[derive(Default)]
pub(crate) struct QuantizedActivations {
    bytes: Vec<u8>,
    /// The input and dot type `bytes` hold, `None` when stale.
    key: Option<(hearth_core::graph::BufId, GgmlType)>,
}

impl QuantizedActivations {
    /// Forgets the held rows (their input buffer may be written next).
    pub fn invalidate(&mut self) {
        self.key = None;
    }

    /// The rows of `x` ([rows, k], buffer `id`) in `ty`, converted unless already held.
    fn get(&mut self, id: hearth_core::graph::BufId, ty: GgmlType, x: &[f32], k: usize) -> &[u8] {
        if self.key != Some((id, ty)) {
            // Shapes were validated at compile time, so the row sizes below are whole blocks.
            let act_row = ty.row_bytes(k).unwrap_or(0);
            let rows = x.len() / k;
            self.bytes.resize(act_row * rows, 0);
            let convert = |(xr, ar): (&[f32], &mut [u8])| kernels::quantize_activation(ty, xr, ar);
            // One row per task: rows are independent, so the result is the same on any thread.
            #[cfg(not(target_arch = "wasm32"))]
            if rows > 1 && act_row > 0 {
                x.par_chunks_exact(k).zip(self.bytes.par_chunks_exact_mut(act_row)).for_each(convert);
            } else {
                x.chunks_exact(k).zip(self.bytes.chunks_exact_mut(act_row.max(1))).for_each(convert);
            }
            #[cfg(target_arch = "wasm32")]
            x.chunks_exact(k).zip(self.bytes.chunks_exact_mut(act_row.max(1))).for_each(convert);
            self.key = Some((id, ty));
        }
        &self.bytes
    }
}

/// x: [rows, k] (buffer `x_id`), out: [rows, n] for W: [n, k]; `cache` holds x converted to the
/// weight's dot type when the previous mat-mul already read the same input.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    w: &CpuWeight,
    x: &[f32],
    x_id: hearth_core::graph::BufId,
    k: usize,
    bias: Option<&[f32]>,
    cache: &mut QuantizedActivations,
    numerics: Numerics,
    out: &mut [f32],
) {
    let rows = x.len() / k;
    let llama_cpp_rows = if numerics == Numerics::LlamaCpp { compat::llama_cpp_rows(w.desc.ty, rows) } else { 0 };
    // Ours for every row unless llama.cpp's rounding covers them all (its first `llama_cpp_rows`
    // rows are overwritten below).
    if llama_cpp_rows < rows {
        matmul_rows(w, x, x_id, k, bias, cache, out);
    }
    if llama_cpp_rows > 0 {
        let act = cache.get(x_id, GgmlType::Q8_K, x, k);
        compat::matmul_rows(w, act, k, llama_cpp_rows, bias, out);
    }
}

/// [`matmul`] in our own arithmetic.
fn matmul_rows(
    w: &CpuWeight,
    x: &[f32],
    x_id: hearth_core::graph::BufId,
    k: usize,
    bias: Option<&[f32]>,
    cache: &mut QuantizedActivations,
    out: &mut [f32],
) {
    let rows = x.len() / k;
    let n = w.desc.n_rows();
    let dot_ty = w.desc.ty.vec_dot_type();
    let act_row = dot_ty.row_bytes(k).unwrap_or(0);
    let act = cache.get(x_id, dot_ty, x, k);
    // Repacked here, before the parallel loops, the first time (see weights.rs).
    let x16 = w.x16();
    let out_ptr = OutPtr(out.as_mut_ptr());
    // A task takes CHUNK weight rows; activation rows go in tiles of TILE, so one pass over a
    // weight block serves several tokens and one activation block several weight rows
    // (`vec_dot_tile`; results equal the per-row dot product bit for bit).
    // (16: the rows of an x16 tile, which `dot_weight_rows` needs chunks to start on.)
    const CHUNK: usize = q4k_x16::TILE_ROWS;
    const TILE: usize = 64;
    let compute_into = |chunk: usize, dots: &mut [f32]| {
        let j0 = chunk * CHUNK;
        let j1 = (j0 + CHUNK).min(n);
        for r0 in (0..rows).step_by(TILE) {
            let tile = TILE.min(rows - r0);
            let dots = &mut dots[..(j1 - j0) * tile];
            dot_weight_rows(w, x16, k, j0, j1, &act[r0 * act_row..(r0 + tile) * act_row], dots);
            for (j, col) in (j0..j1).zip(dots.chunks_exact(tile)) {
                let b = bias.map_or(0.0, |b| b[j]);
                for (r, &d) in (r0..r0 + tile).zip(col) {
                    // SAFETY: r < rows and j < n, and column j is written only by this task.
                    unsafe { *out_ptr.get().add(r * n + j) = d + b };
                }
            }
        }
    };
    // Decode and verification (few activation rows): one task takes a run of chunks in a single
    // kernel call, so the per-call work (size checks, dispatch, the tile loop's setup) is paid
    // per task instead of per 16 weight rows; per 16 rows it took ~9% of Qwen2.5-1.5B's decode
    // (~50k calls a token, 9,496 of them for the output head). Each output equals the per-row
    // dot product bit for bit whatever the split. Up to 16 activation rows (verification of up
    // to 15 drafts, a batch of decodes) take this path too: the other's call and zeroed scratch
    // per 16 weight rows made a 5-row pass of Qwen2.5-1.5B ~6 ms slower. Past one group of
    // activation rows (kernels::GROUP_ROWS), a run still goes 16 weight rows a call: the tiles
    // sweep all of a call's weight rows once per group, which a run's rows would make a sweep
    // from memory per group.
    const FEW_ROWS: usize = 16;
    let chunks = n.div_ceil(CHUNK);
    if rows <= FEW_ROWS {
        let compute_run = |(first, last): (usize, usize)| {
            let (j0, j1) = (first * CHUNK, (last * CHUNK).min(n));
            if rows == 1 {
                // Decode: this run's outputs are one contiguous slice of the single output row.
                // SAFETY: j0 < j1 <= n = out.len(), and columns j0..j1 belong to this task only.
                let dots = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(j0), j1 - j0) };
                dot_weight_rows(w, x16, k, j0, j1, act, dots);
                match bias {
                    Some(b) => dots.iter_mut().zip(&b[j0..j1]).for_each(|(d, b)| *d += b),
                    // + 0.0 as every other path adds a zero bias: a -0.0 dot becomes +0.0.
                    None => dots.iter_mut().for_each(|d| *d += 0.0),
                }
                return;
            }
            let mut dots = vec![0f32; (j1 - j0) * rows];
            let step = if rows > kernels::GROUP_ROWS { CHUNK } else { j1 - j0 };
            for c0 in (j0..j1).step_by(step) {
                let c1 = (c0 + step).min(j1);
                dot_weight_rows(w, x16, k, c0, c1, act, &mut dots[(c0 - j0) * rows..(c1 - j0) * rows]);
            }
            for (j, col) in (j0..j1).zip(dots.chunks_exact(rows)) {
                let b = bias.map_or(0.0, |b| b[j]);
                for (r, &d) in col.iter().enumerate() {
                    // SAFETY: r < rows and j < n, and column j is written only by this task.
                    unsafe { *out_ptr.get().add(r * n + j) = d + b };
                }
            }
        };
        #[cfg(not(target_arch = "wasm32"))]
        {
            // A few runs per thread, so that work stealing evens out a slow core.
            let runs = (rayon::current_num_threads().max(1) * 4).min(chunks);
            (0..runs).into_par_iter().map(|i| (i * chunks / runs, (i + 1) * chunks / runs)).for_each(compute_run);
        }
        #[cfg(target_arch = "wasm32")]
        compute_run((0, chunks));
        return;
    }
    let compute = |chunk: usize| compute_into(chunk, &mut [0f32; CHUNK * TILE]);
    #[cfg(not(target_arch = "wasm32"))]
    {
        let threads = rayon::current_num_threads().max(1);
        let min_len = (chunks / (threads * 8)).max(1);
        (0..chunks).into_par_iter().with_min_len(min_len).for_each(compute);
    }
    #[cfg(target_arch = "wasm32")]
    (0..chunks).for_each(compute);
}

/// `out[(j - j0) * rows + r]` = weight row j · activation row r for j in j0..j1 (j0 a multiple of
/// 16), each equal to the one-row kernel bit for bit: from the x16 tiles where `w` has them.
fn dot_weight_rows(w: &CpuWeight, x16: Option<&X16Tiles>, k: usize, j0: usize, j1: usize, act: &[u8], out: &mut [f32]) {
    debug_assert!(j0.is_multiple_of(q4k_x16::TILE_ROWS), "weight rows from {j0}: not a tile's start");
    let tiled_end = x16.map_or(j0, |x| j1.min(x.tiled_rows).max(j0));
    let rows = out.len() / (j1 - j0).max(1);
    let (tiled_out, rest_out) = out.split_at_mut((tiled_end - j0) * rows);
    if let Some(x) = x16.filter(|_| tiled_end > j0) {
        let tile_bytes = q4k_x16::tile_bytes(k);
        let tiles = &x.tiles[j0 / q4k_x16::TILE_ROWS * tile_bytes..tiled_end / q4k_x16::TILE_ROWS * tile_bytes];
        kernels::vec_dot_q4k_x16(k, tiles, act, tiled_out);
    }
    if j1 > tiled_end {
        kernels::vec_dot_tile(w.desc.ty, k, w.rows(tiled_end, j1), act, rest_out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_core::backend::WeightData;
    use hearth_core::gguf::MemorySource;
    use hearth_core::graph::{BufId, WeightDesc};
    use std::sync::Arc;

    /// A Q4_K matrix of 53 rows (3 whole x16 tiles and 5 rows that stay rows) gives the same
    /// outputs, bit for bit, repacked or not, at 1 token (runs), 6 and 12 (runs past a group of
    /// activation rows) and 70 (the 16-row tasks and 64-token tiles); runs that end inside the
    /// rows after the tiles included. (Where the CPU lacks the x16 kernel nothing is repacked.)
    #[test]
    fn repacked_matrix_with_rows_past_the_tiles_matches_its_rows() {
        let (n_rows, k) = (53usize, 512usize);
        let row_bytes = GgmlType::Q4_K.row_bytes(k).expect("row bytes");
        let mut state = 0x2545F4914F6CDD1Du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut bytes: Vec<u8> = (0..n_rows * row_bytes).map(|_| next() as u8).collect();
        for block in bytes.chunks_exact_mut(144) {
            // Finite scales: d and dmin of ~0.01.
            block[0..4].copy_from_slice(&[0x1f, 0x21, 0x1f, 0x21]);
        }
        let source: Arc<dyn hearth_core::gguf::ByteSource> = Arc::new(MemorySource::new(bytes));
        let weight = |repack: bool| {
            let desc = WeightDesc { name: "w".into(), ty: GgmlType::Q4_K, dims: vec![k as u64, n_rows as u64] };
            CpuWeight::new(desc, WeightData { source: source.clone(), offset: 0, len: n_rows * row_bytes }, repack)
                .expect("weight")
        };
        let (repacked, rows_only) = (weight(true), weight(false));
        eprintln!("repacked: {}", repacked.x16().is_some());
        for tokens in [1usize, 6, 12, 70] {
            let x: Vec<f32> = (0..tokens * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
            let run = |w: &CpuWeight| {
                let mut out = vec![f32::NAN; tokens * n_rows];
                let mut cache = QuantizedActivations::default();
                matmul(w, &x, BufId(0), k, None, &mut cache, Numerics::Hearth, &mut out);
                out
            };
            let (a, b) = (run(&repacked), run(&rows_only));
            let differing = a.iter().zip(&b).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
            assert_eq!(differing, 0, "{tokens} tokens: {differing} outputs differ");
            assert!(a.iter().all(|v| v.is_finite()), "{tokens} tokens: outputs not all written");
        }
    }
}
