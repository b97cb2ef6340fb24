//! Decoding stored KV rows (f32, f16, q8_0, q4_0) into f32, exactly as `hearth_core::quant::
//! dequantize_row` does (every value is the same bits), but inlinable into the attention loops'
//! AVX2 context and, for f16, with F16C when the CPU has it.

use super::PagedKv;
use hearth_core::kv::KvType;

/// Values per block of q8_0 and q4_0 (and per rotation block).
const QK: usize = 32;

/// Values `c0..c1` of one stored row (`bytes`: the whole row) into out: [c1 - c0]. For the
/// quantized types c0 and c1 are multiples of 32 (whole blocks).
#[inline(always)]
pub(super) fn decode(ty: KvType, bytes: &[u8], c0: usize, c1: usize, out: &mut [f32]) {
    match ty {
        KvType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes[c0 * 4..c1 * 4].chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        KvType::F16 => f16_to_f32(&bytes[c0 * 2..c1 * 2], out),
        KvType::Q8_0 => {
            #[cfg(target_arch = "x86_64")]
            if crate::kernels::detected_isa() != crate::kernels::Isa::Scalar {
                // SAFETY: AVX2 and F16C are present (`detected_isa` checks them).
                unsafe { q8_0_to_f32_avx2(&bytes[c0 / QK * (2 + QK)..c1 / QK * (2 + QK)], out) };
                return;
            }
            const BYTES: usize = 2 + QK;
            let blocks = bytes[c0 / QK * BYTES..c1 / QK * BYTES].chunks_exact(BYTES);
            for (block, out) in blocks.zip(out.chunks_exact_mut(QK)) {
                let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
                for (o, &q) in out.iter_mut().zip(&block[2..]) {
                    *o = q as i8 as f32 * d;
                }
            }
        }
        KvType::Q4_0 => {
            #[cfg(target_arch = "x86_64")]
            if crate::kernels::detected_isa() != crate::kernels::Isa::Scalar {
                // SAFETY: AVX2 and F16C are present (`detected_isa` checks them).
                unsafe { q4_0_to_f32_avx2(&bytes[c0 / QK * (2 + QK / 2)..c1 / QK * (2 + QK / 2)], out) };
                return;
            }
            const BYTES: usize = 2 + QK / 2;
            let blocks = bytes[c0 / QK * BYTES..c1 / QK * BYTES].chunks_exact(BYTES);
            for (block, out) in blocks.zip(out.chunks_exact_mut(QK)) {
                let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
                let (lo, hi) = out.split_at_mut(QK / 2);
                for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&block[2..]) {
                    *l = ((q & 0x0F) as i32 - 8) as f32 * d;
                    *h = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
    }
}

/// f16 little-endian values to f32 (exact either way).
#[inline(always)]
fn f16_to_f32(bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::detected_isa() != crate::kernels::Isa::Scalar {
        // SAFETY: F16C and AVX are present (`detected_isa` checks them).
        unsafe { f16_to_f32_f16c(bytes, out) };
        return;
    }
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_to_f32_f16c(bytes: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = out.len().min(bytes.len() / 2);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, so 16 bytes from 2i and 8 floats from i are in bounds.
        let h = _mm_loadu_si128(bytes.as_ptr().add(2 * i) as *const __m128i);
        _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    for j in i..n {
        out[j] = half::f16::from_le_bytes([bytes[2 * j], bytes[2 * j + 1]]).to_f32();
    }
}

/// The f16 block scale at the start of a q8_0 / q4_0 block, as a broadcast f32 (exact).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block_scale(block: &[u8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let bits = u16::from_le_bytes([block[0], block[1]]);
    _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))))
}

/// Whole q8_0 blocks to f32, out: [32 * blocks]: q * d, the scalar path's values bit for bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn q8_0_to_f32_avx2(blocks: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::*;
    for (block, out) in blocks.chunks_exact(2 + QK).zip(out.chunks_exact_mut(QK)) {
        let d = block_scale(block);
        for g in 0..QK / 8 {
            // SAFETY: the block holds 32 quants after its scale and out 32 floats; 8 of each per g.
            let q = _mm_loadl_epi64(block.as_ptr().add(2 + 8 * g) as *const __m128i);
            let v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * g), v);
        }
    }
}

/// Whole q4_0 blocks to f32, out: [32 * blocks]: (nibble - 8) * d, low nibbles first, the
/// scalar path's values bit for bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn q4_0_to_f32_avx2(blocks: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::*;
    for (block, out) in blocks.chunks_exact(2 + QK / 2).zip(out.chunks_exact_mut(QK)) {
        let d = block_scale(block);
        // SAFETY: the block holds 16 bytes of nibbles after its scale.
        let packed = _mm_loadu_si128(block.as_ptr().add(2) as *const __m128i);
        let mask = _mm_set1_epi8(0x0F);
        let eight = _mm_set1_epi8(8);
        // Values 0..16 (low nibbles) and 16..32 (high nibbles), as i8 in -8..=7.
        let lo = _mm_sub_epi8(_mm_and_si128(packed, mask), eight);
        let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), mask), eight);
        for (g, q) in [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)].into_iter().enumerate() {
            let v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
            // SAFETY: out holds 32 floats; 8 per g.
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * g), v);
        }
    }
}

/// Which part of a stored row one KV head's slice needs decoding: the stored columns
/// `c0..c1` (whole 32-value blocks for the quantized types, whose rotation works per block) and
/// where the head's `head_dim` values start inside them.
#[derive(Clone, Copy)]
pub(super) struct HeadCols {
    pub c0: usize,
    pub c1: usize,
    pub skip: usize,
}

impl HeadCols {
    pub fn new(ty: KvType, col: usize, head_dim: usize) -> Self {
        let (c0, c1) = match ty {
            KvType::F32 | KvType::F16 => (col, col + head_dim),
            KvType::Q8_0 | KvType::Q4_0 => (col / QK * QK, (col + head_dim).div_ceil(QK) * QK),
        };
        HeadCols { c0, c1, skip: col - c0 }
    }

    pub fn width(&self) -> usize {
        self.c1 - self.c0
    }
}

/// Decodes positions `first..=last` (all in one block) of K (`values` = false) or V into
/// tile: [last - first + 1, cols.width()], as stored: the quantized types stay rotated and
/// without their value offset (attention works in the rotated domain, see mod.rs).
#[inline(always)]
pub(super) fn decode_tile(
    kv: &PagedKv<'_>,
    values: bool,
    cols: HeadCols,
    first: usize,
    last: usize,
    tile: &mut Vec<f32>,
) {
    let bs = kv.block_size;
    let (data, row) = if values { (kv.v, kv.v_row) } else { (kv.k, kv.k_row) };
    let width = cols.width();
    tile.resize((last + 1 - first) * width, 0.0);
    let block = kv.block_table[first / bs] as usize;
    for (pos, out) in (first..=last).zip(tile.chunks_exact_mut(width)) {
        let slot = block * bs + pos % bs;
        decode(kv.kv_type, &data[slot * row..(slot + 1) * row], cols.c0, cols.c1, out);
    }
    if let Some(&next) = kv.block_table.get(first / bs + 1) {
        prefetch_block(data, row, bs, next as usize, byte_range(kv.kv_type, cols.c0, cols.c1));
    }
}

/// Bytes `c0..c1` of a stored row span (whole blocks for the quantized types, as in `decode`).
fn byte_range(ty: KvType, c0: usize, c1: usize) -> (usize, usize) {
    match ty {
        KvType::F32 => (c0 * 4, c1 * 4),
        KvType::F16 => (c0 * 2, c1 * 2),
        KvType::Q8_0 => (c0 / QK * (2 + QK), c1 / QK * (2 + QK)),
        KvType::Q4_0 => (c0 / QK * (2 + QK / 2), c1 / QK * (2 + QK / 2)),
    }
}

/// Asks for the head's bytes of every row of pool block `block` (the sequence's next block,
/// which the caller decodes next), so that they arrive while this one is used: a sequence's
/// blocks lie anywhere in the pool, and each is 16 short slices of rows. Measured with
/// `examples/attention_step` (1 thread, 1k context, loaded machine): 3-10% off the step, most on
/// f16. A block outside the pool (a stale table entry past the span) is skipped.
#[inline(always)]
fn prefetch_block(data: &[u8], row: usize, bs: usize, block: usize, (b0, b1): (usize, usize)) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        if b1 <= b0 || block.saturating_add(1).saturating_mul(bs * row) > data.len() {
            return;
        }
        for slot in block * bs..(block + 1) * bs {
            let start = slot * row + b0;
            // Every 64-byte line of start..start + (b1 - b0), whatever its alignment.
            for offset in (start..slot * row + b1).step_by(64).chain([slot * row + b1 - 1]) {
                // SAFETY: SSE is in the x86_64 baseline, and a prefetch reads nothing (the
                // address is inside `data` anyway, checked above).
                unsafe { _mm_prefetch::<_MM_HINT_T0>(data.as_ptr().wrapping_add(offset) as *const i8) };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, row, bs, block, b0, b1);
}
