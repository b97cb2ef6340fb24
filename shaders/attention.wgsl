// Paged KV cache: store (with conversion to the cache's storage type) and causal attention
// (GQA, sliding window, optional soft-cap) through per-sequence block tables.
// Capability variants: SHADER_F16 reads an f16 cache as WGSL f16 (exact, as unpack2x16float);
// SUBGROUPS takes each key tile's maximum score with subgroupMax instead of a serial scan.
#ifdef SHADER_F16
enable f16;
#endif
// Browsers require `enable subgroups;`; Naga (native) rejects it and needs no directive.
#ifdef SUBGROUPS_DIRECTIVE
enable subgroups;
#endif
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

#ifdef STORE_KV
// [n_tokens, width, groups_x, layer, width2 (SECOND)]; a uniform, so that the storage bindings
// of keys and values fit in WebGPU's 8 per stage
@group(0) @binding(0) var<uniform> P: array<vec4<u32>, 2>;
// see STEP above
@group(0) @binding(1) var<storage, read> STEP: array<u32>;
// see TABLES above
@group(0) @binding(2) var<storage, read> TABLES: array<u32>;
// [n_tokens, width] f32
@group(0) @binding(3) var<storage, read> SRC: array<f32>;
#ifdef KV_Q8_0 || KV_Q4_0
// [n_blocks, block_size, row_words] u32 (atomic: neighbouring blocks share a word of scales)
@group(0) @binding(4) var<storage, read_write> CACHE: array<atomic<u32>>;
#else
// [n_blocks, block_size, row_words] u32
@group(0) @binding(4) var<storage, read_write> CACHE: array<u32>;
#endif
#ifdef KV_OFFSET
// [width] f32: subtracted from every row before it is quantized (Op::StoreKv's k_offset or
// v_offset)
@group(0) @binding(5) var<storage, read> OFFSET: array<f32>;
#endif
// SECOND stores a second buffer in the same dispatch (the values after the keys), into its own
// cache, with its own offset; its invocations follow the first buffer's.
#ifdef SECOND
// [n_tokens, width2] f32
@group(0) @binding(6) var<storage, read> SRC2: array<f32>;
#ifdef KV_Q8_0 || KV_Q4_0
@group(0) @binding(7) var<storage, read_write> CACHE2: array<atomic<u32>>;
#else
@group(0) @binding(7) var<storage, read_write> CACHE2: array<u32>;
#endif
#ifdef KV_OFFSET
// [width2] f32
@group(0) @binding(8) var<storage, read> OFFSET2: array<f32>;
#endif
#endif

fn p(i: u32) -> u32 {
    return P[i / 4u][i % 4u];
}

// Whether this invocation stores the second buffer (uniform per workgroup only where the first
// buffer's invocations fill whole workgroups; the accesses below branch per invocation).
var<private> second: bool = false;

fn src_at(i: u32) -> f32 {
#ifdef SECOND
    if (second) {
        return SRC2[i];
    }
#endif
    return SRC[i];
}

#ifdef KV_OFFSET
fn offset_at(i: u32) -> f32 {
#ifdef SECOND
    if (second) {
        return OFFSET2[i];
    }
#endif
    return OFFSET[i];
}
#endif

#ifdef KV_Q8_0 || KV_Q4_0
fn cache_store(i: u32, word: u32) {
#ifdef SECOND
    if (second) {
        atomicStore(&CACHE2[i], word);
        return;
    }
#endif
    atomicStore(&CACHE[i], word);
}

// Sets the 16 bits of word i from `shift` to `bits`, leaving the other half (a neighbour's).
fn cache_set_half(i: u32, shift: u32, bits: u32) {
#ifdef SECOND
    if (second) {
        atomicAnd(&CACHE2[i], ~(0xffffu << shift));
        atomicOr(&CACHE2[i], bits << shift);
        return;
    }
#endif
    atomicAnd(&CACHE[i], ~(0xffffu << shift));
    atomicOr(&CACHE[i], bits << shift);
}
#else
fn cache_store(i: u32, word: u32) {
#ifdef SECOND
    if (second) {
        CACHE2[i] = word;
        return;
    }
#endif
    CACHE[i] = word;
}
#endif

// Values one invocation converts: 1 (f32), 2 (f16: one u32), 32 (q8_0, q4_0: one block).
fn unit_len() -> u32 {
#ifdef KV_F32
    return 1u;
#endif
#ifdef KV_F16
    return 2u;
#endif
#ifdef KV_Q8_0 || KV_Q4_0
    return 32u;
#endif
}

// Round half away from zero, as C's roundf (ggml's quantize_row_q8_0_ref).
fn round_away(x: f32) -> f32 {
    let t = trunc(x);
    if (abs(x - t) >= 0.5) {
        return t + sign(x);
    }
    return t;
}

// One invocation per (token, unit).
@compute @workgroup_size(256)
fn store_kv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    var i = (wg.y * p(2u) + wg.x) * 256u + lid.x;
    var width = p(1u);
    var units = width / unit_len();
#ifdef SECOND
    if (i >= p(0u) * units) {
        i -= p(0u) * units;
        width = p(4u);
        units = width / unit_len();
        second = true;
    }
#endif
    if (i >= p(0u) * units) {
        return;
    }
    let t = i / units;
    let u = i % units;
    let src = t * width + u * unit_len();
    let row = slot_of(p(3u), step_token_seq(t), step_token_pos(t)) * row_words(width);
#ifdef KV_F32
    cache_store(row + u, bitcast<u32>(src_at(src)));
#endif
#ifdef KV_F16
    cache_store(row + u, f16_bits(src_at(src)) | (f16_bits(src_at(src + 1u)) << 16u));
#endif
#ifdef KV_Q8_0 || KV_Q4_0
    var x: array<f32, 32>;
    for (var j = 0u; j < 32u; j++) {
        x[j] = src_at(src + j);
#ifdef KV_OFFSET
        x[j] -= offset_at(u * 32u + j);
#endif
    }
    hadamard32(&x);
#endif
#ifdef KV_Q8_0
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(x[j]));
    }
    let d = amax / 127.0;
    var id = 0.0;
    if (d != 0.0) {
        id = 1.0 / d;
    }
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var b = 0u; b < 4u; b++) {
            let q = i32(clamp(round_away(x[w * 4u + b] * id), -128.0, 127.0));
            word = word | ((bitcast<u32>(q) & 0xffu) << (8u * b));
        }
        cache_store(row + u * 8u + w, word);
    }
#endif
#ifdef KV_Q4_0
    // The first value of largest magnitude, with its sign.
    var vmax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        if (abs(x[j]) > abs(vmax)) {
            vmax = x[j];
        }
    }
    let d = vmax / -8.0;
    var id = 0.0;
    if (d != 0.0) {
        id = 1.0 / d;
    }
    for (var w = 0u; w < 4u; w++) {
        var word = 0u;
        for (var b = 0u; b < 4u; b++) {
            let j = w * 4u + b;
            // x * id + 8.5 is at least 0.5, so truncation is a floor.
            let lo = min(15u, u32(x[j] * id + 8.5));
            let hi = min(15u, u32(x[j + 16u] * id + 8.5));
            word = word | ((lo | (hi << 4u)) << (8u * b));
        }
        cache_store(row + u * 4u + w, word);
    }
#endif
#ifdef KV_Q8_0 || KV_Q4_0
    // Each half of a scale word belongs to one block: clear ours, then set it.
    let scale_word = row + scales_word(width) + u / 2u;
    let shift = 16u * (u & 1u);
    cache_set_half(scale_word, shift, f16_bits(d));
#endif
}
#endif

#ifdef ATTENTION
// [n_tokens, n_head, n_head_kv, head_dim, scale (f32 bits), window (0 = none),
//  softcap (f32 bits, 0 = none), groups_x, layer]
@group(0) @binding(0) var<storage, read> P: array<u32>;
// see STEP above
@group(0) @binding(1) var<storage, read> STEP: array<u32>;
// see TABLES above
@group(0) @binding(2) var<storage, read> TABLES: array<u32>;
// [n_tokens, n_head * head_dim] f32
@group(0) @binding(3) var<storage, read> Q: array<f32>;
#ifdef KV_F16
#ifdef SHADER_F16
// The f16 cache as WGSL f16: [n_blocks, block_size, width / 2] pairs, one a u32 word, so word
// indices (`row`) address pairs unchanged.
@group(0) @binding(4) var<storage, read> K: array<vec2<f16>>;
@group(0) @binding(5) var<storage, read> V: array<vec2<f16>>;
#else
// [n_blocks, block_size, row_words(n_head_kv * head_dim)] u32
@group(0) @binding(4) var<storage, read> K: array<u32>;
// [n_blocks, block_size, row_words(n_head_kv * head_dim)] u32
@group(0) @binding(5) var<storage, read> V: array<u32>;
#endif
#else
// [n_blocks, block_size, row_words(n_head_kv * head_dim)] u32
@group(0) @binding(4) var<storage, read> K: array<u32>;
// [n_blocks, block_size, row_words(n_head_kv * head_dim)] u32
@group(0) @binding(5) var<storage, read> V: array<u32>;
#endif
// [n_tokens, n_head * head_dim] f32
@group(0) @binding(6) var<storage, read_write> OUT: array<f32>;
#ifdef KV_OFFSET
// [n_head_kv * head_dim] f32: what the store subtracted from the values (AttentionParams::v_offset)
@group(0) @binding(7) var<storage, read> V_OFFSET: array<f32>;
#endif

const WG: u32 = 128u;
// head_dim <= WG * DIMS_PER_THREAD
const DIMS_PER_THREAD: u32 = 4u;
var<workgroup> q_sh: array<f32, 512>;
var<workgroup> scores: array<f32, WG>;
// First word of each key's row in the tile.
var<workgroup> rows: array<u32, WG>;
#ifdef SUBGROUPS
// Each subgroup's maximum score of the tile (subgroups of at least 4 invocations).
var<workgroup> sg_max: array<f32, 32>;
#endif
#ifdef KV_Q8_0 || KV_Q4_0
// V rows are un-rotated a whole block at a time, but read a dimension per thread: V_KEYS keys'
// blocks covering the head's columns are decoded into v_sh together (V_SPAN values a key: a
// head of up to 512 columns not aligned to blocks touches at most 18 blocks).
const V_KEYS: u32 = 4u;
const V_SPAN: u32 = 576u;
var<workgroup> v_sh: array<f32, 2304>;

// Block `b` (values 32b ..) of the K row starting at word `row`, dequantized and un-rotated.
fn k_block(row: u32, b: u32, width: u32) -> array<f32, 32> {
    var words: array<u32, 8>;
    for (var w = 0u; w < block_words(); w++) {
        words[w] = K[row + b * block_words() + w];
    }
    let d = unpack2x16float(K[row + scales_word(width) + b / 2u])[b & 1u];
    return decode_block(words, d);
}

fn v_block(row: u32, b: u32, width: u32) -> array<f32, 32> {
    var words: array<u32, 8>;
    for (var w = 0u; w < block_words(); w++) {
        words[w] = V[row + b * block_words() + w];
    }
    let d = unpack2x16float(V[row + scales_word(width) + b / 2u])[b & 1u];
    return decode_block(words, d);
}

// Value `d` of the K row at `row`, through the thread's decoded block `kb` (block index `kb_at`).
fn k_cached(row: u32, d: u32, width: u32, kb: ptr<function, array<f32, 32>>, kb_at: ptr<function, u32>) -> f32 {
    if (d / 32u != *kb_at) {
        *kb = k_block(row, d / 32u, width);
        *kb_at = d / 32u;
    }
    return (*kb)[d & 31u];
}
#else

// Value `d` (column of the whole row) of the row starting at word `row`; `width` values a row.
fn k_at(row: u32, d: u32, width: u32) -> f32 {
#ifdef KV_F32
    return bitcast<f32>(K[row + d]);
#endif
#ifdef KV_F16
#ifdef SHADER_F16
    return f32(K[row + d / 2u][d & 1u]);
#else
    return unpack2x16float(K[row + d / 2u])[d & 1u];
#endif
#endif
}

fn v_at(row: u32, d: u32, width: u32) -> f32 {
#ifdef KV_F32
    return bitcast<f32>(V[row + d]);
#endif
#ifdef KV_F16
#ifdef SHADER_F16
    return f32(V[row + d / 2u][d & 1u]);
#else
    return unpack2x16float(V[row + d / 2u])[d & 1u];
#endif
#endif
}
#endif

// q · k in f32 in the CPU oracle's order: 8 accumulators over the head (lane i % 8), combined
// ((0+4)+(1+5))+((2+6)+(3+7)), then the tail past the last multiple of 8. `col` is the head's
// first column in the row.
fn dot_f32(row: u32, col: u32, hd: u32, width: u32) -> f32 {
    var acc: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        acc[i] = 0.0;
    }
#ifdef KV_Q8_0 || KV_Q4_0
    var kb: array<f32, 32>;
    var kb_at = 0xffffffffu;
#endif
    let full = hd / 8u * 8u;
    for (var i = 0u; i < full; i++) {
#ifdef KV_Q8_0 || KV_Q4_0
        let k = k_cached(row, col + i, width, &kb, &kb_at);
#else
        let k = k_at(row, col + i, width);
#endif
        acc[i % 8u] += q_sh[i] * k;
    }
    var sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (var i = full; i < hd; i++) {
#ifdef KV_Q8_0 || KV_Q4_0
        let k = k_cached(row, col + i, width, &kb, &kb_at);
#else
        let k = k_at(row, col + i, width);
#endif
        sum += q_sh[i] * k;
    }
    return sum;
}

fn softcapped(s: f32) -> f32 {
    let c = bitcast<f32>(P[6]);
    if (c == 0.0) {
        return s;
    }
    let x = s / c;
    let t = exp(-2.0 * abs(x));
    return c * sign(x) * (1.0 - t) / (1.0 + t);
}

// One workgroup per (token, query head). Keys of the token's own sequence are processed in tiles
// of WG: each thread looks up one key's slot through the block table and scores it, then every
// thread folds the tile into its own output dimensions with an online softmax (running max m,
// running sum l).
@compute @workgroup_size(128)
fn attention(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
#ifdef SUBGROUPS
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
#endif
) {
    let id = wg.y * P[7] + wg.x;
    let n_head = P[1];
    let valid = id < P[0] * n_head;
    let t = min(id / n_head, P[0] - 1u);
    let h = id % n_head;
    let hd = P[3];
    let kvh = h / (n_head / P[2]);
    let q_width = n_head * hd;
    let kv_width = P[2] * hd;
    let words = row_words(kv_width);
    let layer = P[8];
    let seq = step_token_seq(t);
    let pos = step_token_pos(t);
    var lo = 0u;
    let window = P[5];
    if (window != 0u && pos + 1u > window) {
        lo = pos + 1u - window;
    }
    let scale = bitcast<f32>(P[4]);
    let tid = lid.x;
    // One f32 numerics path for every query, as on the CPU oracle: a query's result never
    // depends on how many others share the step (batch invariance).
    let col = kvh * hd;
    if (valid) {
        for (var d = tid; d < hd; d += WG) {
            q_sh[d] = Q[t * q_width + h * hd + d];
        }
    }
    workgroupBarrier();
    var m = -3.0e38;
    var l = 0.0;
    var acc: array<f32, DIMS_PER_THREAD>;
    for (var u = 0u; u < DIMS_PER_THREAD; u++) {
        acc[u] = 0.0;
    }
    // Uniform loop bound across the workgroup (barriers inside).
    var end = lo;
    if (valid) {
        end = pos + 1u;
    }
    for (var tile = lo; tile < end; tile += WG) {
        let j = tile + tid;
        var s = -3.0e38;
        if (j < end) {
            let row = slot_of(layer, seq, j) * words;
            rows[tid] = row;
            s = softcapped(dot_f32(row, col, hd, kv_width) * scale);
        }
        scores[tid] = s;
#ifdef SUBGROUPS
        // Subgroups are consecutive invocations (see quant.wgsl).
        let s_max = subgroupMax(s);
        if (sg_lane == 0u) {
            sg_max[tid / sg_size] = s_max;
        }
#endif
        workgroupBarrier();
        let count = min(WG, end - tile);
#ifdef KV_Q8_0 || KV_Q4_0
        // Blocks first_block .. first_block + n_vblocks hold the head's columns.
        let first_block = col / 32u;
        let n_vblocks = (col + hd + 31u) / 32u - first_block;
#endif
        // Online softmax in f32: rescale what the earlier tiles summed to this tile's maximum.
        var tile_max = m;
#ifdef SUBGROUPS
        // Keys past `count` score -3e38, so the whole tile's maximum is that of its first count.
        for (var i = 0u; i < (WG + sg_size - 1u) / sg_size; i++) {
            tile_max = max(tile_max, sg_max[i]);
        }
#else
        for (var r = 0u; r < count; r++) {
            tile_max = max(tile_max, scores[r]);
        }
#endif
        let correction = exp(m - tile_max);
        l = l * correction;
        for (var u = 0u; u < DIMS_PER_THREAD; u++) {
            acc[u] = acc[u] * correction;
        }
        for (var r = 0u; r < count; r++) {
#ifdef KV_Q8_0 || KV_Q4_0
            if (r % V_KEYS == 0u) {
                // Keys r .. r + V_KEYS: each thread decodes some (key, block) pairs.
                workgroupBarrier();
                for (var p = tid; p < V_KEYS * n_vblocks; p += WG) {
                    let key = p / n_vblocks;
                    let b = p % n_vblocks;
                    if (r + key < count) {
                        let x = v_block(rows[r + key], first_block + b, kv_width);
                        for (var i = 0u; i < 32u; i++) {
                            v_sh[key * V_SPAN + b * 32u + i] = x[i];
                        }
                    }
                }
                workgroupBarrier();
            }
#endif
            let w = exp(scores[r] - tile_max);
            l += w;
            let vrow = rows[r];
            for (var u = 0u; u < DIMS_PER_THREAD; u++) {
                let d = tid + u * WG;
                if (d < hd) {
#ifdef KV_Q8_0 || KV_Q4_0
                    let v = v_sh[(r % V_KEYS) * V_SPAN + col + d - first_block * 32u];
#else
                    let v = v_at(vrow, col + d, kv_width);
#endif
                    acc[u] += w * v;
                }
            }
        }
        m = tile_max;
        workgroupBarrier();
    }
    if (!valid) {
        return;
    }
    for (var u = 0u; u < DIMS_PER_THREAD; u++) {
        let d = tid + u * WG;
        if (d < hd) {
#ifdef KV_OFFSET
            // The weights sum to 1: the values' offset comes back whole.
            OUT[t * q_width + h * hd + d] = acc[u] * (1.0 / l) + V_OFFSET[col + d];
#else
            OUT[t * q_width + h * hd + d] = acc[u] * (1.0 / l);
#endif
        }
    }
}
#endif
