//! out[r, j] = dot(W row j, x row r) (+ bias[j]). The activation rows are converted once to the
//! weight's dot type (8-bit blocks for quantized weights), then weight rows are split across
//! threads; each thread streams its weight rows once and reuses them for every activation row.

use crate::kernels;
use crate::weights::CpuWeight;

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

/// x: [rows, k], out: [rows, n] for W: [n, k].
pub fn matmul(w: &CpuWeight, x: &[f32], k: usize, bias: Option<&[f32]>, out: &mut [f32]) {
    let rows = x.len() / k;
    let n = w.desc.n_rows();
    let dot_ty = w.desc.ty.vec_dot_type();
    // Shapes were validated at compile time, so the row sizes below are whole blocks.
    let act_row = dot_ty.row_bytes(k).unwrap_or(0);
    let mut act = vec![0u8; act_row * rows];
    for (xr, ar) in x.chunks_exact(k).zip(act.chunks_exact_mut(act_row)) {
        kernels::quantize_activation(dot_ty, xr, ar);
    }
    let ty = w.desc.ty;
    let out_ptr = OutPtr(out.as_mut_ptr());
    // A task takes CHUNK weight rows; activation rows go in tiles of TILE, so one pass over a
    // weight block serves several tokens and one activation block several weight rows
    // (`vec_dot_tile`; results equal the per-row dot product bit for bit).
    const CHUNK: usize = 16;
    const TILE: usize = 64;
    let compute = |chunk: usize| {
        let j0 = chunk * CHUNK;
        let j1 = (j0 + CHUNK).min(n);
        let weights = w.rows(j0, j1);
        let mut dots = [0f32; CHUNK * TILE];
        for r0 in (0..rows).step_by(TILE) {
            let tile = TILE.min(rows - r0);
            let dots = &mut dots[..(j1 - j0) * tile];
            kernels::vec_dot_tile(ty, k, weights, &act[r0 * act_row..(r0 + tile) * act_row], dots);
            for (j, col) in (j0..j1).zip(dots.chunks_exact(tile)) {
                let b = bias.map_or(0.0, |b| b[j]);
                for (r, &d) in (r0..r0 + tile).zip(col) {
                    // SAFETY: r < rows and j < n, and column j is written only by this task.
                    unsafe { *out_ptr.get().add(r * n + j) = d + b };
                }
            }
        }
    };
    let chunks = n.div_ceil(CHUNK);
    #[cfg(not(target_arch = "wasm32"))]
    {
        let threads = rayon::current_num_threads().max(1);
        let min_len = (chunks / (threads * 8)).max(1);
        (0..chunks).into_par_iter().with_min_len(min_len).for_each(compute);
    }
    #[cfg(target_arch = "wasm32")]
    (0..chunks).for_each(compute);
}
