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
    // Activation rows are taken in tiles so one pass over a weight row serves several tokens
    // (`vec_dot_rows` unpacks each weight block once per `MULTI_ROWS` tokens).
    const TILE: usize = 64;
    let compute = |j: usize| {
        let wrow = w.row(j);
        let b = bias.map_or(0.0, |b| b[j]);
        let mut dots = [0f32; TILE];
        for r0 in (0..rows).step_by(TILE) {
            let tile = TILE.min(rows - r0);
            kernels::vec_dot_rows(ty, k, wrow, &act[r0 * act_row..(r0 + tile) * act_row], &mut dots[..tile]);
            for (r, &d) in (r0..r0 + tile).zip(&dots[..tile]) {
                // SAFETY: r < rows and j < n, and column j is written only by this task.
                unsafe { *out_ptr.get().add(r * n + j) = d + b };
            }
        }
    };
    #[cfg(not(target_arch = "wasm32"))]
    {
        let threads = rayon::current_num_threads().max(1);
        let chunk = (n / (threads * 8)).max(16);
        (0..n).into_par_iter().with_min_len(chunk).for_each(|j| compute(j));
    }
    #[cfg(target_arch = "wasm32")]
    (0..n).for_each(compute);
}
