// The paged KV cache's layout and conversions, appended to kv_store.wgsl and attention.wgsl,
// which declare STEP and TABLES.
//
// Storage of one layer: [n_blocks, block_size, row_words] u32, a row holding `width` values as
//   KV_F32:  width f32;
//   KV_F16:  width f16, two per u32 (pack of element 2i in the low half, 2i+1 in the high half);
//   KV_Q8_0: width int8 quants, four per u32, then width/32 f16 scales, two per u32 — ggml's
//            q8_0 blocks (d = amax/127 as f16, q = round(x / d)) with scales and quants apart,
//            so that every row stays 4-byte aligned;
//   KV_Q4_0: width/2 bytes of 4-bit quants, eight per u32, then width/32 f16 scales, two per
//            u32 — ggml's q4_0 blocks (quantize_row_q4_0_ref: the value of largest magnitude
//            maps to -8, d = max / -8, q = min(15, trunc(x / d + 8.5)); byte j of a block holds
//            element j in its low and element j + 16 in its high nibble), scales and quants apart.
// Quantized types store every 32-value block of a row rotated by an orthonormal Walsh-Hadamard
// transform (hearth_core::kv::hadamard32, its own inverse), which spreads a block's outlier
// channels over all its values before quantization.
// Values are dequantized (and un-rotated) to f32 on read, so the attention numerics are those of
// the CPU oracle, which gathers dequantized, un-rotated rows the same way.
//
// STEP (written once per step), u32:
//   [0] n_tokens, [1] n_seqs, [2 ..] tokens [n_tokens], token_seq [n_tokens], token_pos [n_tokens],
//   then per sequence [pos0, n_tokens, first_token].
// TABLES (written once per step), u32:
//   [0] block_size, then per layer [table_base, table_cap], then at each table_base, per sequence
//   s at table_base + s * (table_cap + 1): [first_index, blocks [table_cap]] where blocks[i] holds
//   the sequence's positions (first_index + i) * block_size ...

fn step_token_seq(t: u32) -> u32 {
    return STEP[2u + STEP[0] + t];
}

fn step_token_pos(t: u32) -> u32 {
    return STEP[2u + 2u * STEP[0] + t];
}

// Slot (block * block_size + offset) of position `pos` of sequence `s` in `layer`'s group.
fn slot_of(layer: u32, s: u32, pos: u32) -> u32 {
    let bs = TABLES[0];
    let base = TABLES[1u + 2u * layer] + s * (TABLES[2u + 2u * layer] + 1u);
    let first = TABLES[base];
    let block = TABLES[base + 1u + pos / bs - first];
    return block * bs + pos % bs;
}

// u32 words of one stored row of `width` values.
fn row_words(width: u32) -> u32 {
#ifdef KV_F32
    return width;
#endif
#ifdef KV_F16
    return width / 2u;
#endif
#ifdef KV_Q8_0 || KV_Q4_0
    return scales_word(width) + (width / 32u + 1u) / 2u;
#endif
}

#ifdef KV_Q8_0 || KV_Q4_0
// Word of a row where the f16 block scales start (after the quants).
fn scales_word(width: u32) -> u32 {
#ifdef KV_Q8_0
    return width / 4u;
#else
    return width / 8u;
#endif
}

// u32 words of quants of one 32-value block.
fn block_words() -> u32 {
#ifdef KV_Q8_0
    return 8u;
#else
    return 4u;
#endif
}

// In-place orthonormal Walsh-Hadamard transform of one block, exactly as the CPU's
// hearth_core::kv::hadamard32: f32 butterflies of stride 1, 2, 4, 8, 16, then a 1/sqrt(32) scale.
fn hadamard32(x: ptr<function, array<f32, 32>>) {
    for (var h = 1u; h < 32u; h *= 2u) {
        for (var i = 0u; i < 32u; i += 2u * h) {
            for (var j = i; j < i + h; j++) {
                let a = (*x)[j];
                let b = (*x)[j + h];
                (*x)[j] = a + b;
                (*x)[j + h] = a - b;
            }
        }
    }
    for (var j = 0u; j < 32u; j++) {
        (*x)[j] = (*x)[j] * 0.17677669;
    }
}

// The 32 values of a stored block (its quant words and scale): dequantized as ggml does, then
// un-rotated.
fn decode_block(words: array<u32, 8>, d: f32) -> array<f32, 32> {
    var x: array<f32, 32>;
    for (var w = 0u; w < block_words(); w++) {
        for (var b = 0u; b < 4u; b++) {
#ifdef KV_Q8_0
            x[4u * w + b] = f32(extractBits(bitcast<i32>(words[w]), 8u * b, 8u)) * d;
#else
            let byte = (words[w] >> (8u * b)) & 0xffu;
            x[4u * w + b] = f32(i32(byte & 15u) - 8) * d;
            x[4u * w + b + 16u] = f32(i32(byte >> 4u) - 8) * d;
#endif
        }
    }
    hadamard32(&x);
    return x;
}
#endif

// f16 bits of x, rounded to nearest even (exact bit arithmetic in f16's normal range).
fn f16_bits(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    let exponent = (bits >> 23u) & 0xffu;
    if (exponent >= 113u && exponent < 142u) {
        let lsb = (bits >> 13u) & 1u;
        let r = bits + 0x0fffu + lsb;
        return ((r >> 16u) & 0x8000u) | (((r & 0x7fffffffu) >> 13u) - (112u << 10u));
    }
    return pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu;
}
