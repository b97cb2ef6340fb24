//! [`super::vec_dot_tile_with`] for Q4_K weights and two or more activation rows, and for Q6_K
//! weights and two or more rows or one short row: the few-row mat-muls of speculative
//! verification and batched decode (1 + k or C rows), prefill's token tiles, and Q6_K's decode
//! of rows up to 2048 elements (the output head). Weight rows go in tiles of W, activation rows
//! in near-equal groups of at most [`MAX_GROUP_ROWS`] (a lone row only in a one-row pass), each
//! (W, R) pair one pass of a W × R kernel (x86/ktile.rs, x86/ktile512.rs) that loads each
//! activation block once per W weight rows and unpacks each weight block once per R rows.

use super::x86;
use hearth_core::quant::GgmlType;

/// The most activation rows one kernel pass takes (the kernels are instantiated for 1..=8).
const MAX_GROUP_ROWS: usize = super::GROUP_ROWS;

/// Weight rows per tile. Measured (benches/verify_tiles.rs, Zen 4, 2 threads, from memory, all
/// prefetching) for groups of 2-4 rows: 2 against 1 within ±7% on Q4_K, up to 13% faster on
/// Q6_K; 4 up to 1.4x slower on Q6_K. Without the sweep prefetch, interleaved rows ran up to
/// 4.8x slower.
const WEIGHT_ROWS: usize = 2;

/// The sizes of the activation row groups of a pass over `rows` rows: as equal as possible, at
/// most [`MAX_GROUP_ROWS`] each (a lone row only when `rows` is 1), e.g. 9 -> 5 + 4, 16 -> 8 + 8.
fn row_groups(rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let groups = rows.div_ceil(MAX_GROUP_ROWS).max(1);
    (0..groups).map(move |g| {
        let (start, end) = (g * rows / groups, (g + 1) * rows / groups);
        (start, end - start)
    })
}

/// Every weight row of `weights` ([n_w, w_row] bytes) × every activation row of `activations`
/// ([rows, act_row] bytes) into `out` ([n_w, rows]); returns the weight rows done (all of them).
#[allow(clippy::too_many_arguments)]
pub(super) fn kquant_pass(
    vnni: bool,
    ty: GgmlType,
    n: usize,
    weights: &[u8],
    w_row: usize,
    activations: &[u8],
    act_row: usize,
    out: &mut [f32],
) -> usize {
    let (n_w, rows) = (weights.len() / w_row, activations.len() / act_row);
    let mut w_done = 0;
    for (r0, len) in row_groups(rows) {
        let pass = Pass { vnni, ty, n, weights, w_row, activations, act_row, rows, r0 };
        // The weights of a group stay in cache for the next group (a task's 16 weight rows).
        w_done = pass.weight_tiles::<WEIGHT_ROWS>(len, 0, out);
        w_done = pass.weight_tiles::<1>(len, w_done, out);
    }
    debug_assert!(rows == 0 || w_done == n_w);
    w_done
}

/// One group of activation rows (from `r0`) of a [`kquant_pass`].
struct Pass<'a> {
    vnni: bool,
    ty: GgmlType,
    n: usize,
    weights: &'a [u8],
    w_row: usize,
    activations: &'a [u8],
    act_row: usize,
    rows: usize,
    r0: usize,
}

impl Pass<'_> {
    /// Weight rows from `w_start` in whole tiles of W against the group's `len` rows; returns
    /// the weight rows done.
    fn weight_tiles<const W: usize>(&self, len: usize, w_start: usize, out: &mut [f32]) -> usize {
        match len {
            1 => self.weight_tiles_r::<W, 1>(w_start, out),
            2 => self.weight_tiles_r::<W, 2>(w_start, out),
            3 => self.weight_tiles_r::<W, 3>(w_start, out),
            4 => self.weight_tiles_r::<W, 4>(w_start, out),
            5 => self.weight_tiles_r::<W, 5>(w_start, out),
            6 => self.weight_tiles_r::<W, 6>(w_start, out),
            7 => self.weight_tiles_r::<W, 7>(w_start, out),
            _ => self.weight_tiles_r::<W, 8>(w_start, out),
        }
    }

    fn weight_tiles_r<const W: usize, const R: usize>(&self, w_start: usize, out: &mut [f32]) -> usize {
        let n_w = self.weights.len() / self.w_row;
        let (wbase, abase) = (self.weights.as_ptr(), self.activations.as_ptr());
        let ap: [*const u8; R] = std::array::from_fn(|i| abase.wrapping_add((self.r0 + i) * self.act_row));
        let mut w0 = w_start;
        while w0 + W <= n_w && self.r0 + R <= self.rows {
            let wp: [*const u8; W] = std::array::from_fn(|i| wbase.wrapping_add((w0 + i) * self.w_row));
            // SAFETY: the caller (`vec_dot_tile_with`) checked the ISA's features and that
            // `weights` and `activations` hold whole rows of `n` elements; rows w0..w0+W and
            // r0..r0+R are inside them (checked by the loop condition); the type is Q4_K or Q6_K.
            let dots = unsafe { x86::vec_dot_tile::<W, R, true>(self.vnni, self.ty, self.n, wp, ap) };
            for (i, d) in dots.iter().enumerate() {
                out[(w0 + i) * self.rows + self.r0..][..R].copy_from_slice(d);
            }
            w0 += W;
        }
        w0
    }
}
