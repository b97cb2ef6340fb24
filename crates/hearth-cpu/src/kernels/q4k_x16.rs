//! Q4_K weights repacked once (by the CPU backend, at a weight's first mat-mul) in tiles of 16
//! rows ("x16"), for the AVX-512 VNNI kernel in x86/interleaved512/q4_k_x16.rs that serves every
//! row count, decode included.
//!
//! The interleaved prefill kernel (x86/interleaved512/q4_k.rs) rearranges 16 rows on every call:
//! from 5 tokens up that pays, below it does not, and a verification pass of 5 rows cost about as
//! much as one of 8. Stored interleaved from the start, the rows cost nothing to rearrange, so
//! every call (1 to 64 tokens) multiplies 64 codes of 16 rows per `vpdpbusd`. The codes stay
//! packed two to a byte and the scales one to a byte, so a tile of 16 rows takes 2,368 bytes per
//! super-block against 2,304 as rows (+2.8%): decode reads about that much more.
//!
//! One super-block of a tile (`nb` of them per tile, one after the other), byte offsets:
//! - [`CODES`]: [32 chunks][16 rows][4] bytes; chunk p's low nibbles are elements 8p..8p + 4 of
//!   each row, its high nibbles elements 8p + 4..8p + 8 (a row's 4 consecutive codes per i32 lane);
//! - [`SCALES`]: [8 sub-blocks][16 rows] u8, the 6-bit scales;
//! - [`MINS`]: [4 sub-block pairs][16 rows][2] u8 (sub-block 2q, then 2q + 1), the 6-bit mins;
//! - [`D`], [`DMIN`]: [16 rows] f16 each, the rows' bytes as stored.
//!
//! Nothing is rounded: [`unpack_row`] gives back the original row byte for byte (the 12-byte
//! scale encoding is a bijection on the 6-bit values); the fallback of
//! `kernels::vec_dot_q4k_x16` on CPUs without the kernel reads rows that way, and the tests check
//! it. (The CPU backend keeps the rows too, in the model file's mapping, for embedding lookups and
//! the llama.cpp-numerics path.)

use hearth_core::quant::GgmlType;

/// Weight rows per tile.
pub const TILE_ROWS: usize = 16;
/// Bytes of a Q4_K super-block as stored in a row.
const ROW_BLOCK: usize = 144;
pub(crate) const CODES: usize = 0;
pub(crate) const SCALES: usize = CODES + 32 * 64;
pub(crate) const MINS: usize = SCALES + 8 * TILE_ROWS;
pub(crate) const D: usize = MINS + 8 * TILE_ROWS;
pub(crate) const DMIN: usize = D + 2 * TILE_ROWS;
/// Bytes of one super-block of a tile.
pub const BLOCK: usize = DMIN + 2 * TILE_ROWS;

/// Bytes of a tile of 16 rows of `n` elements (`n` a multiple of 256).
pub fn tile_bytes(n: usize) -> usize {
    n / GgmlType::Q4_K.block_len() * BLOCK
}

/// Sub-block j's 6-bit (scale, min) from a row block's 12 scale bytes (ggml's `get_scale_min_k4`).
fn scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// The 12 scale bytes that [`scale_min`] reads back as `scales` and `mins` (6 bits each).
fn encode_scales(scales: &[u8; 8], mins: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = (scales[j] & 63) | ((scales[j + 4] >> 4) << 6);
        s[j + 4] = (mins[j] & 63) | ((mins[j + 4] >> 4) << 6);
        s[j + 8] = (scales[j + 4] & 0xF) | ((mins[j + 4] & 0xF) << 4);
    }
    s
}

/// Code of element `e` (0..256) of a row block: packed bytes 32k.. hold elements 64k.. in their
/// low nibbles and 64k + 32.. in their high nibbles.
fn code(block: &[u8], e: usize) -> u8 {
    let byte = block[16 + 32 * (e / 64) + e % 32];
    if e % 64 < 32 {
        byte & 0xF
    } else {
        byte >> 4
    }
}

/// Repacks 16 whole Q4_K rows of `n` elements (`rows`, one after the other) into the tile `dst`
/// ([`tile_bytes`]`(n)` bytes); a caller's size mismatch leaves `dst` untouched.
pub fn repack_tile(n: usize, rows: &[u8], dst: &mut [u8]) {
    let nb = n / GgmlType::Q4_K.block_len();
    if rows.len() != TILE_ROWS * nb * ROW_BLOCK || dst.len() != nb * BLOCK {
        debug_assert!(false, "repack_tile: {} row bytes, {} tile bytes for rows of {n}", rows.len(), dst.len());
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::q4k_x16_available() {
        // SAFETY: AVX-512 VNNI was detected; 16 whole rows and a whole tile (checked above).
        return unsafe { super::x86::q4_k_x16_repack_tile(nb, rows.as_ptr(), nb * ROW_BLOCK, dst.as_mut_ptr()) };
    }
    repack_tile_reference(n, rows, dst)
}

/// [`repack_tile`] in plain code, element by element: the reference its SIMD form is tested
/// against, and the form every other CPU runs.
pub fn repack_tile_reference(n: usize, rows: &[u8], dst: &mut [u8]) {
    let nb = n / GgmlType::Q4_K.block_len();
    let row_bytes = nb * ROW_BLOCK;
    debug_assert!(rows.len() == TILE_ROWS * row_bytes && dst.len() == nb * BLOCK);
    for (i, blk) in dst.chunks_exact_mut(BLOCK).enumerate().take(nb) {
        for l in 0..TILE_ROWS {
            let src = &rows[l * row_bytes + i * ROW_BLOCK..][..ROW_BLOCK];
            for p in 0..32 {
                for j in 0..4 {
                    blk[CODES + p * 64 + 4 * l + j] = code(src, 8 * p + j) | (code(src, 8 * p + 4 + j) << 4);
                }
            }
            for s in 0..8 {
                let (scale, min) = scale_min(s, &src[4..16]);
                blk[SCALES + s * TILE_ROWS + l] = scale;
                blk[MINS + (s / 2) * 2 * TILE_ROWS + 2 * l + s % 2] = min;
            }
            blk[D + 2 * l..D + 2 * l + 2].copy_from_slice(&src[0..2]);
            blk[DMIN + 2 * l..DMIN + 2 * l + 2].copy_from_slice(&src[2..4]);
        }
    }
}

/// Row `l` (0..16) of the tile `tile` of rows of `n` elements, byte for byte as it was stored
/// before [`repack_tile`], into `dst` (one Q4_K row).
pub fn unpack_row(n: usize, tile: &[u8], l: usize, dst: &mut [u8]) {
    let nb = n / GgmlType::Q4_K.block_len();
    debug_assert!(tile.len() == nb * BLOCK && dst.len() == nb * ROW_BLOCK && l < TILE_ROWS);
    for (blk, out) in tile.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(ROW_BLOCK)) {
        out[0..2].copy_from_slice(&blk[D + 2 * l..D + 2 * l + 2]);
        out[2..4].copy_from_slice(&blk[DMIN + 2 * l..DMIN + 2 * l + 2]);
        let scales: [u8; 8] = std::array::from_fn(|s| blk[SCALES + s * TILE_ROWS + l]);
        let mins: [u8; 8] = std::array::from_fn(|s| blk[MINS + (s / 2) * 2 * TILE_ROWS + 2 * l + s % 2]);
        out[4..16].copy_from_slice(&encode_scales(&scales, &mins));
        let code_at = |e: usize| {
            let byte = blk[CODES + (e / 8) * 64 + 4 * l + e % 4];
            if e % 8 < 4 {
                byte & 0xF
            } else {
                byte >> 4
            }
        };
        for k in 0..4 {
            for t in 0..32 {
                out[16 + 32 * k + t] = code_at(64 * k + t) | (code_at(64 * k + 32 + t) << 4);
            }
        }
    }
}
