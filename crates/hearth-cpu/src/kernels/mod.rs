//! CPU compute kernels: the quantized dot products and activation quantizers of the mat-mul hot path.
//!
//! [`vec_dot`] dispatches once-detected x86_64 kernels — AVX2+FMA+F16C (llama.cpp's AVX2 kernel
//! structure and roundings; for Q4_K those of its repacked kernels) or, for the hottest types,
//! the same kernels with AVX-512 BW/VNNI instructions (bit-identical) — and falls back to the
//! scalar reference in `hearth_core::quant` for every other type or CPU. The browser build
//! (wasm32 with simd128) dispatches its own simd128 kernels (`Isa::Simd128`, `wasm/`),
//! bit-identical to the scalar reference. [`vec_dot_rows`] and
//! [`vec_dot_tile`] compute several dot products per pass over a weight row, each equal to
//! [`vec_dot`] bit for bit. Row sizes are validated by the caller at load time; a mismatch here is
//! a bug, caught by `debug_assert!` in debug builds and answered with NaN (never UB, never a panic)
//! in release builds.

#[cfg(target_arch = "x86_64")]
mod kquant_tile;
pub mod q4k_x16;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm;
#[cfg(target_arch = "x86_64")]
mod x86;

use hearth_core::quant::{self, GgmlType};
use std::sync::OnceLock;

/// Instruction sets a kernel can be run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// The portable reference (`hearth_core::quant`).
    Scalar,
    /// x86_64 with AVX2, FMA and F16C.
    Avx2,
    /// [`Isa::Avx2`] plus AVX-512 F/BW/VL and VNNI: the AVX2 kernels with VNNI dot instructions
    /// (bit-identical results) for the hottest weight types.
    Avx512Vnni,
    /// wasm32 with simd128 (enabled at compile time for the browser build).
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    Simd128,
}

/// The best instruction set of this CPU, detected once.
pub fn detected_isa() -> Isa {
    // simd128 is a compile-time feature of the wasm build: nothing to detect. (`if true` keeps
    // the lines below reachable, without an unreachable-code warning.)
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if true {
        return Isa::Simd128;
    }
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
                let vnni = is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni");
                return if vnni { Isa::Avx512Vnni } else { Isa::Avx2 };
            }
        }
        Isa::Scalar
    })
}

/// Whether [`vec_dot_with`] has a SIMD kernel for weights of type `ty` under `isa`.
pub fn has_simd_vec_dot(isa: Isa, ty: GgmlType) -> bool {
    match isa {
        Isa::Scalar => false,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => x86::supports(ty),
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512Vnni => {
            let _ = ty;
            false
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Isa::Simd128 => wasm::supports(ty),
    }
}

/// Whether this CPU can run kernels of `isa` (asked by the x86_64 kernels' dispatch).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn isa_available(isa: Isa) -> bool {
    match isa {
        Isa::Scalar => true,
        Isa::Avx2 => detected_isa() != Isa::Scalar,
        Isa::Avx512Vnni => detected_isa() == Isa::Avx512Vnni,
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Isa::Simd128 => true,
    }
}

fn sizes_ok(ty: GgmlType, n: usize, weights: &[u8], activation: &[u8]) -> bool {
    matches!(ty.row_bytes(n), Ok(b) if b == weights.len())
        && matches!(ty.vec_dot_type().row_bytes(n), Ok(b) if b == activation.len())
}

/// Dot product of a weight row of type `ty` with an activation row already converted by
/// [`quantize_activation`] to `ty.vec_dot_type()`; both hold `n` elements.
#[inline]
pub fn vec_dot(ty: GgmlType, n: usize, weights: &[u8], activation: &[u8]) -> f32 {
    vec_dot_with(detected_isa(), ty, n, weights, activation)
}

/// [`vec_dot`] with an explicit instruction set (for tests and benchmarks). Asking for an ISA
/// the CPU lacks runs the scalar reference instead.
pub fn vec_dot_with(isa: Isa, ty: GgmlType, n: usize, weights: &[u8], activation: &[u8]) -> f32 {
    if !sizes_ok(ty, n, weights, activation) {
        debug_assert!(
            false,
            "vec_dot: {ty} row of {n} with {} weight / {} activation bytes",
            weights.len(),
            activation.len()
        );
        return f32::NAN;
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && isa_available(isa) && x86::supports(ty) {
        // SAFETY: the ISA's features are present (detected) and the row sizes were checked.
        return unsafe { x86::vec_dot(isa == Isa::Avx512Vnni, ty, n, weights.as_ptr(), activation.as_ptr()) };
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if isa == Isa::Simd128 && wasm::supports(ty) {
        let mut out = [0f32];
        // SAFETY: the row sizes were checked.
        unsafe { wasm::vec_dot_tile(ty, n, weights, weights.len(), activation, activation.len(), &mut out) };
        return out[0];
    }
    let _ = isa;
    quant::vec_dot(ty, n, weights, activation).unwrap_or(f32::NAN)
}

/// Whether Q4_K matrices are worth repacking into x16 tiles ([`q4k_x16`]) on this CPU: it has
/// AVX-512 VNNI, which their kernel needs.
pub fn q4k_x16_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    if detected_isa() == Isa::Avx512Vnni {
        return true;
    }
    false
}

/// `out[w * rows + r]` = weight row w of the x16 tiles `tiles` (Q4_K rows of `n` elements, 16 a
/// tile; see [`q4k_x16`]) · Q8_K activation row r of `activations`, each equal to [`vec_dot`]
/// of the row as stored before repacking, bit for bit.
pub fn vec_dot_q4k_x16(n: usize, tiles: &[u8], activations: &[u8], out: &mut [f32]) {
    let tile_bytes = q4k_x16::tile_bytes(n);
    let act_row = GgmlType::Q8_K.row_bytes(n).unwrap_or(0);
    let (n_tiles, rows) = (tiles.len() / tile_bytes.max(1), activations.len() / act_row.max(1));
    if tile_bytes == 0
        || act_row == 0
        || n_tiles * tile_bytes != tiles.len()
        || rows * act_row != activations.len()
        || out.len() != n_tiles * q4k_x16::TILE_ROWS * rows
    {
        debug_assert!(
            false,
            "vec_dot_q4k_x16: rows of {n}, {} tile / {} activation bytes, {} outputs",
            tiles.len(),
            activations.len(),
            out.len()
        );
        out.fill(f32::NAN);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if q4k_x16_available() {
        // SAFETY: AVX-512 VNNI was detected; whole tiles and activation rows, one output per
        // pair (sizes checked above).
        return unsafe { x86::q4_k_x16_pass(n / GgmlType::Q4_K.block_len(), tiles, activations, act_row, out) };
    }
    // Without the kernel (a CPU that would not have repacked): each row rebuilt, then the row
    // kernels.
    let mut row = vec![0u8; GgmlType::Q4_K.row_bytes(n).unwrap_or(0)];
    for (t, tile) in tiles.chunks_exact(tile_bytes).enumerate() {
        for l in 0..q4k_x16::TILE_ROWS {
            q4k_x16::unpack_row(n, tile, l, &mut row);
            let w = t * q4k_x16::TILE_ROWS + l;
            vec_dot_rows(GgmlType::Q4_K, n, &row, activations, &mut out[w * rows..(w + 1) * rows]);
        }
    }
}

/// The most activation rows that [`vec_dot_tile`]'s Q4_K/Q6_K tiles take in one sweep over
/// their weight rows: more go in groups, each sweeping all the weight rows of the call again.
pub const GROUP_ROWS: usize = 8;

/// Activation rows that [`vec_dot_rows`] dots with one weight row in a single pass.
pub const MULTI_ROWS: usize = 4;

/// From how many activation rows Q4_K weights go through the interleaved kernel
/// (x86/interleaved512/, AVX-512 VNNI) rather than the packed tiles: interleaving a tile of 16
/// weight rows costs about as much as a few tokens' dot products with it. Sweeping 192 MiB of
/// Qwen2.5-1.5B-shaped rows from memory on 2 threads (benches/verify_tiles.rs, ms, packed →
/// interleaved): rows of 1536 at 4 tokens 12.8 → 14.2, 6: 18.2 → 16.8, 8: 22.3 → 19.1,
/// 12: 37.7 → 23.5; rows of 8960 at 4 tokens 16.3 → 13.1, 12: 35.6 → 21.5. (Q6_K stays in the
/// packed tiles: see interleaved512/mod.rs for the rounding it must keep.) Weights the CPU
/// backend repacked ([`q4k_x16`]) skip this rearranging at every row count.
pub const INTERLEAVED_MIN_ROWS: usize = 5;

/// `out[r] = vec_dot(ty, n, weights, activation row r)` for the `out.len()` rows packed in
/// `activations` (each `ty.vec_dot_type().row_bytes(n)` bytes), bit for bit; weight types with
/// multi-row kernels unpack each weight block once per [`MULTI_ROWS`] activation rows.
#[inline]
pub fn vec_dot_rows(ty: GgmlType, n: usize, weights: &[u8], activations: &[u8], out: &mut [f32]) {
    vec_dot_rows_with(detected_isa(), ty, n, weights, activations, out)
}

/// [`vec_dot_rows`] with an explicit instruction set (for tests and benchmarks).
pub fn vec_dot_rows_with(isa: Isa, ty: GgmlType, n: usize, weights: &[u8], activations: &[u8], out: &mut [f32]) {
    let act_row = ty.vec_dot_type().row_bytes(n).unwrap_or(0);
    let whole = act_row > 0 && activations.len() == act_row * out.len();
    if !whole || !sizes_ok(ty, n, weights, &activations[..act_row.min(activations.len())]) {
        debug_assert!(
            false,
            "vec_dot_rows: {ty} row of {n}, {} weight / {} activation bytes for {} rows",
            weights.len(),
            activations.len(),
            out.len()
        );
        out.fill(f32::NAN);
        return;
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if isa == Isa::Simd128 && wasm::supports(ty) {
        // SAFETY: one whole weight row and `out.len()` whole activation rows (checked above).
        return unsafe { wasm::vec_dot_tile(ty, n, weights, weights.len(), activations, act_row, out) };
    }
    // Advanced by the x86_64 kernels only.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && isa_available(isa) && x86::supports_multi(ty) {
        let vnni = isa == Isa::Avx512Vnni;
        let base = activations.as_ptr();
        while done + MULTI_ROWS <= out.len() {
            let rows: [*const u8; MULTI_ROWS] = std::array::from_fn(|i| base.wrapping_add((done + i) * act_row));
            // SAFETY: the ISA's features are present, the weight row and each activation row
            // (within `activations`, whose length was checked) are whole rows of `n` elements.
            let dots = unsafe { x86::vec_dot_multi(vnni, ty, n, weights.as_ptr(), rows) };
            out[done..done + MULTI_ROWS].copy_from_slice(&dots);
            done += MULTI_ROWS;
        }
        // The last 1-3 rows in one pass too, not row by row.
        let row = |i: usize| base.wrapping_add((done + i) * act_row);
        let w = weights.as_ptr();
        // SAFETY: as above, for the remaining whole rows.
        match out.len() - done {
            3 => out[done..]
                .copy_from_slice(&unsafe { x86::vec_dot_multi::<3>(vnni, ty, n, w, [row(0), row(1), row(2)]) }),
            2 => out[done..].copy_from_slice(&unsafe { x86::vec_dot_multi::<2>(vnni, ty, n, w, [row(0), row(1)]) }),
            1 => out[done] = unsafe { x86::vec_dot_multi::<1>(vnni, ty, n, w, [row(0)]) }[0],
            _ => {}
        }
        return;
    }
    for (o, a) in out[done..].iter_mut().zip(activations[done * act_row..].chunks_exact(act_row)) {
        *o = vec_dot_with(isa, ty, n, weights, a);
    }
}

/// Converts an f32 activation row to `ty` (Q8_0, Q8_1, Q8_K, F16, BF16 or F32), bit-identical to
/// `hearth_core::quant::quantize_row` (ggml's `quantize_row_*_ref`; Q8_0/Q8_1 with llama.cpp's SIMD
/// rounding, see below). Q8_0/Q8_1/Q8_K run the same code compiled for AVX2 where available
/// (and Q8_0/Q8_K simd128 forms of the same rules on wasm32); the other types the scalar reference. `dst` must be `ty.row_bytes(src.len())` bytes;
/// otherwise (a caller bug) it is left untouched.
pub fn quantize_activation(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    match ty {
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        GgmlType::Q8_0 if ty.row_bytes(src.len()).is_ok_and(|b| b == dst.len()) => wasm::quantize_q8_0(src, dst),
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        GgmlType::Q8_K if ty.row_bytes(src.len()).is_ok_and(|b| b == dst.len()) => wasm::quantize_q8_k(src, dst),
        GgmlType::Q8_0 | GgmlType::Q8_1 => quantize_q8_legacy_simd_rounding(ty, src, dst),
        #[cfg(target_arch = "x86_64")]
        GgmlType::Q8_K if detected_isa() != Isa::Scalar && ty.row_bytes(src.len()).is_ok_and(|b| b == dst.len()) => {
            // SAFETY: AVX2/FMA/F16C were detected; the sizes match.
            unsafe { quantize_q8_k_avx2(src, dst) }
        }
        _ => {
            let result = quant::quantize_row(ty, src, dst);
            debug_assert!(result.is_ok(), "quantize_activation: {result:?}");
        }
    }
}

/// Q8_0/Q8_1 exactly as llama.cpp's SIMD quantizers compute them (x86 AVX2 and ARM NEON alike):
/// multiply by `127 / amax` and round half to even. ggml's scalar reference divides and rounds
/// half away from zero instead; the two differ on rare ties, and since llama.cpp runs the SIMD
/// form, so do we — on every platform, so the CPU backend gives the same numbers everywhere.
fn quantize_q8_legacy_simd_rounding(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if detected_isa() != Isa::Scalar {
        // SAFETY: AVX2/FMA/F16C were detected.
        return unsafe { quantize_q8_legacy_avx2(ty, src, dst) };
    }
    quantize_q8_legacy_body(ty, src, dst)
}

/// The same code compiled for AVX2: rounding half to even becomes one `vroundps` instead of a
/// libm `rintf` call per element (which took 9% of Qwen2.5-0.5B's prefill), and the loops vectorise.
/// IEEE operations give the same bits whatever instructions carry them out.
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_legacy_avx2(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    quantize_q8_legacy_body(ty, src, dst)
}

#[inline(always)]
fn quantize_q8_legacy_body(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    const QK: usize = 32;
    let bytes = ty.block_bytes();
    debug_assert_eq!(src.len() / QK * bytes, dst.len());
    for (x, block) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(bytes)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        block[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        let mut sum = 0i32;
        for (q, &v) in block[bytes - QK..].iter_mut().zip(x) {
            let r = (v * id).round_ties_even() as i8;
            sum += r as i32;
            *q = r as u8;
        }
        if ty == GgmlType::Q8_1 {
            block[2..4].copy_from_slice(&half::f16::from_f32(sum as f32 * d).to_le_bytes());
        }
    }
}

/// ggml's `quantize_row_q8_K_ref`: `hearth_core::quant`'s reference body, inlined here and
/// compiled for AVX2, so that rounding half to even is an instruction, not a libm `rintf` call
/// per element. `dst` must be `Q8_K.row_bytes(src.len())` bytes.
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_k_avx2(src: &[f32], dst: &mut [u8]) {
    hearth_core::quant::quantize_q8_k_blocks(src, dst)
}

/// Weight rows that [`vec_dot_tile`] handles per pass for types with tile kernels.
pub const TILE_WEIGHT_ROWS: usize = 2;

/// `out[w * rows + r] = vec_dot(ty, n, weight row w, activation row r)` bit for bit, for the
/// weight rows packed in `weights` and the `rows` activation rows packed in `activations`.
/// Q5_0 and Q8_0 with [`MULTI_ROWS`] or more activation rows (prefill) unpack each tile of weight
/// rows (16 with AVX-512 VNNI, 8 with AVX2) once for all the activation rows; with fewer (decode)
/// they load each activation block once per 2 × [`TILE_WEIGHT_ROWS`] weight rows and unpack each
/// weight block once per [`MULTI_ROWS`] activation rows, and so does Q4_K for one activation
/// row (decode) of up to 2048 elements; Q4_K with [`INTERLEAVED_MIN_ROWS`] or more activation
/// rows and AVX-512 VNNI goes in tiles of 16 weight rows interleaved once for all of them; with
/// fewer, Q4_K with 2+ and Q6_K with 2+ or one of up to 2048 elements go in tiles of 2 weight
/// rows × up to 8 activation rows (`kquant_tile`); other types row by row.
pub fn vec_dot_tile(ty: GgmlType, n: usize, weights: &[u8], activations: &[u8], out: &mut [f32]) {
    vec_dot_tile_with(detected_isa(), ty, n, weights, activations, out)
}

/// [`vec_dot_tile`] with an explicit instruction set (for tests and benchmarks).
pub fn vec_dot_tile_with(isa: Isa, ty: GgmlType, n: usize, weights: &[u8], activations: &[u8], out: &mut [f32]) {
    let w_row = ty.row_bytes(n).unwrap_or(0);
    let act_row = ty.vec_dot_type().row_bytes(n).unwrap_or(0);
    let (n_w, rows) = (weights.len() / w_row.max(1), activations.len() / act_row.max(1));
    if w_row == 0
        || act_row == 0
        || n_w * w_row != weights.len()
        || rows * act_row != activations.len()
        || out.len() != n_w * rows
    {
        debug_assert!(
            false,
            "vec_dot_tile: {ty} row of {n}, {} weight / {} activation bytes, {} outputs",
            weights.len(),
            activations.len(),
            out.len()
        );
        out.fill(f32::NAN);
        return;
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if isa == Isa::Simd128 && wasm::supports(ty) {
        // SAFETY: whole weight and activation rows, one output per pair (sizes checked above).
        return unsafe { wasm::vec_dot_tile(ty, n, weights, w_row, activations, act_row, out) };
    }
    // Advanced by the x86_64 kernels only.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut w_done = 0;
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && isa_available(isa) && x86::supports_tile(ty, rows, n) {
        let vnni = isa == Isa::Avx512Vnni;
        // (`supports_tile` keeps one-row Q4_K and Q6_K to rows of up to 2048 elements.)
        w_done = if rows == 1 && matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
            // Decode: Q4_K in tiles of 4 weight rows, Q6_K in prefetching tiles of 2 (the
            // sizes `kquant_tile` and `tile_pass` measured best); any last rows one by one below.
            // SAFETY: the ISA's features are present; whole rows (sizes checked above); `out`
            // holds one output per weight row.
            let (x0, y, o) = (weights.as_ptr(), activations.as_ptr(), out.as_mut_ptr());
            unsafe {
                if ty == GgmlType::Q4_K {
                    x86::decode_tiles::<{ 2 * TILE_WEIGHT_ROWS }>(vnni, ty, n, x0, w_row, n_w, y, o)
                } else {
                    x86::decode_tiles::<TILE_WEIGHT_ROWS>(vnni, ty, n, x0, w_row, n_w, y, o)
                }
            }
        } else if vnni && ty == GgmlType::Q4_K && rows >= INTERLEAVED_MIN_ROWS {
            // Prefill and verification: tiles of 16 weight rows interleaved once for all the tokens.
            // SAFETY: the ISA's features are present and the buffers hold whole rows (sizes
            // checked above).
            let done = unsafe { x86::q4_k_prefill_pass(n / ty.block_len(), weights, w_row, activations, act_row, out) };
            // The last weight rows short of an interleaved tile in packed tiles.
            let (rest_w, rest_out) = (&weights[done * w_row..], &mut out[done * rows..]);
            done + kquant_tile::kquant_pass(vnni, ty, n, rest_w, w_row, activations, act_row, rest_out)
        } else if ty == GgmlType::Q6_K || (ty == GgmlType::Q4_K && rows >= 2) {
            kquant_tile::kquant_pass(vnni, ty, n, weights, w_row, activations, act_row, out)
        } else if vnni && rows >= MULTI_ROWS {
            // Prefill: each tile of weight rows unpacked once for all the tokens.
            // SAFETY: the ISA's features are present, `supports_tile` admitted only Q5_0/Q8_0
            // here, and the buffers hold whole rows (sizes checked above).
            let done =
                unsafe { x86::legacy_prefill_pass(ty, n / ty.block_len(), weights, w_row, activations, act_row, out) };
            // The last weight rows short of an unpacked tile (a mat-mul whose row count is not a
            // multiple of 16) in packed tiles.
            let (rest_w, rest_out) = (&weights[done * w_row..], &mut out[done * rows..]);
            done + tile_pass::<{ 2 * TILE_WEIGHT_ROWS }>(vnni, ty, n, rest_w, w_row, activations, act_row, rest_out)
        } else if rows >= MULTI_ROWS {
            // SAFETY: as above, with AVX2/FMA/F16C present.
            let done = unsafe {
                x86::legacy_prefill_pass_avx2(ty, n / ty.block_len(), weights, w_row, activations, act_row, out)
            };
            let (rest_w, rest_out) = (&weights[done * w_row..], &mut out[done * rows..]);
            done + tile_pass::<TILE_WEIGHT_ROWS>(vnni, ty, n, rest_w, w_row, activations, act_row, rest_out)
        } else {
            // Decode (fewer rows than a token tile): each activation block shared by 4 weight rows.
            tile_pass::<{ 2 * TILE_WEIGHT_ROWS }>(vnni, ty, n, weights, w_row, activations, act_row, out)
        };
    }
    #[cfg(target_arch = "x86_64")]
    if rows == 1 && isa != Isa::Scalar && isa_available(isa) && x86::supports_multi(ty) {
        // Decode, row by row, straight into the kernel: the sizes were checked once above, and
        // re-checking them per row (`vec_dot_rows_with` -> `vec_dot_with`) took ~17% of
        // Qwen2.5-1.5B's decode, whose Q4_K/Q6_K rows are short (1536 elements).
        let vnni = isa == Isa::Avx512Vnni;
        for (w, o) in out.iter_mut().enumerate().skip(w_done) {
            // SAFETY: the ISA's features are present; row w is a whole weight row inside
            // `weights` and `activations` one whole activation row (sizes checked above).
            *o = unsafe {
                x86::vec_dot_multi::<1>(vnni, ty, n, weights.as_ptr().add(w * w_row), [activations.as_ptr()])
            }[0];
        }
        return;
    }
    for w in w_done..n_w {
        vec_dot_rows_with(
            isa,
            ty,
            n,
            &weights[w * w_row..(w + 1) * w_row],
            activations,
            &mut out[w * rows..(w + 1) * rows],
        );
    }
}

/// The whole groups of W weight rows of [`vec_dot_tile_with`]; returns how many weight rows it did.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn tile_pass<const W: usize>(
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
    let (wbase, abase) = (weights.as_ptr(), activations.as_ptr());
    let mut w_done = 0;
    while w_done + W <= n_w {
        let wp: [*const u8; W] = std::array::from_fn(|i| wbase.wrapping_add((w_done + i) * w_row));
        let mut r = 0;
        while r < rows {
            // SAFETY: the caller checked the ISA and the buffer sizes; every pointer is a whole
            // row inside `weights` or `activations`.
            if r + MULTI_ROWS <= rows {
                let ap: [*const u8; MULTI_ROWS] = std::array::from_fn(|i| abase.wrapping_add((r + i) * act_row));
                let dots = unsafe { x86::vec_dot_tile::<W, MULTI_ROWS, false>(vnni, ty, n, wp, ap) };
                for (i, d) in dots.iter().enumerate() {
                    out[(w_done + i) * rows + r..][..MULTI_ROWS].copy_from_slice(d);
                }
                r += MULTI_ROWS;
            } else {
                let dots =
                    unsafe { x86::vec_dot_tile::<W, 1, false>(vnni, ty, n, wp, [abase.wrapping_add(r * act_row)]) };
                for (i, d) in dots.iter().enumerate() {
                    out[(w_done + i) * rows + r] = d[0];
                }
                r += 1;
            }
        }
        w_done += W;
    }
    w_done
}
