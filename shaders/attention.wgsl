// Causal attention over the paged KV cache (layout in kv_cache.wgsl): GQA, sliding window,
// optional soft-cap, through per-sequence block tables, in two dispatches (flash decoding):
//   attention: a query's keys are cut into splits (`split_plan`: their number a function of the
//     context length only, so a query's result never depends on its batch), each split's
//     online softmax written as a partial (running max m, sum l, unnormalised output);
//     one workgroup per (split, query head, token) where the step has at most GRID_SPLIT_TOKENS
//     tokens (decode, speculative verification), so short steps fill the GPU, else one per
//     (query head, token) looping over its splits; the same code computes every split either way;
//   attention_reduce (REDUCE): one workgroup per token merges its splits in order; with ROUND_Q8_0
//     or ROUND_Q8_K it writes the row rounded for the output projection instead (no rounding
//     dispatch of its own).
// Capability variants: SHADER_F16 reads an f16 cache as WGSL f16 (exact, as unpack2x16float);
// SUBGROUPS takes each key tile's maximum score with subgroupMax instead of a serial scan.
#ifdef SHADER_F16
enable f16;
#endif
// Browsers require `enable subgroups;`; Naga (native) rejects it and needs no directive.
#ifdef SUBGROUPS_DIRECTIVE
enable subgroups;
#endif

// [n_tokens, n_head, n_head_kv, head_dim, scale (f32 bits), window (0 = none),
//  softcap (f32 bits, 0 = none), groups_x, layer, grid_splits (MAX_SPLITS or 1)]
@group(0) @binding(0) var<storage, read> P: array<u32>;
// see STEP in kv_cache.wgsl
@group(0) @binding(1) var<storage, read> STEP: array<u32>;
// see TABLES in kv_cache.wgsl (unused by the reduce, which binds nothing there)
@group(0) @binding(2) var<storage, read> TABLES: array<u32>;

// Splits of a query's keys: at most MAX_SPLITS of a multiple of WG keys, at least SPLIT_KEYS
// keys each where there are that many.
const MAX_SPLITS: u32 = 16u;
const SPLIT_KEYS: u32 = 256u;
// Floats of one split's partial: the head's unnormalised output, then m and l.
fn partial_len() -> u32 {
    return P[3] + 2u;
}

// Token t's keys: (first key, keys per split, number of splits), from its position and the
// window only.
fn split_plan(t: u32) -> vec3<u32> {
    let pos = step_token_pos(t);
    var lo = 0u;
    let window = P[5];
    if (window != 0u && pos + 1u > window) {
        lo = pos + 1u - window;
    }
    let n_keys = pos + 1u - lo;
    let n_splits = min((n_keys + SPLIT_KEYS - 1u) / SPLIT_KEYS, MAX_SPLITS);
    let per_split = (n_keys + n_splits - 1u) / n_splits;
    let split_len = (per_split + WG - 1u) / WG * WG;
    return vec3<u32>(lo, split_len, (n_keys + split_len - 1u) / split_len);
}

const WG: u32 = 128u;

#ifdef REDUCE
#ifdef ROUND_Q8_0 || ROUND_Q8_K
// The merged row rounded for the mat-muls that read it, as act_quant.wgsl rounds (and lays out)
// activations: [n_tokens * n_head * head_dim / 4] u32 codes, then from word P[10] the f32 scale
// of each block of ROUND_BLOCK values.
@group(0) @binding(4) var<storage, read_write> XQ: array<u32>;
// One token's merged row.
var<workgroup> row_sh: array<f32, 2048>;
#ifdef ROUND_Q8_K
const ROUND_BLOCK: u32 = 256u;
#else
const ROUND_BLOCK: u32 = 32u;
#endif

// Token t's row (k values in row_sh) rounded: a thread per block, which takes the first value of
// largest magnitude as act_quant.wgsl's tree does, then the same codes and scale.
fn round_row(t: u32, k: u32, tid: u32) {
    for (var b = tid; b < k / ROUND_BLOCK; b += WG) {
        let first = b * ROUND_BLOCK;
        var vmax = row_sh[first];
        for (var j = 1u; j < ROUND_BLOCK; j++) {
            if (abs(row_sh[first + j]) > abs(vmax)) {
                vmax = row_sh[first + j];
            }
        }
        let amax = abs(vmax);
#ifdef ROUND_Q8_0
        var id = 0.0;
        if (amax != 0.0) {
            id = 127.0 / amax;
        }
        let d = round_f16(amax / 127.0);
#else
        var iscale = 0.0;
        var d = 0.0;
        if (amax != 0.0) {
            iscale = -127.0 / vmax;
            d = 1.0 / iscale;
        }
#endif
        for (var w = 0u; w < ROUND_BLOCK / 4u; w++) {
            let at = first + 4u * w;
            let x = vec4<f32>(row_sh[at], row_sh[at + 1u], row_sh[at + 2u], row_sh[at + 3u]);
#ifdef ROUND_Q8_0
            let q = vec4<i32>(round(x * id));
#else
            var q = vec4<i32>(0);
            if (amax != 0.0) {
                q = vec4<i32>(min(round(iscale * x), vec4<f32>(127.0)));
            }
#endif
            XQ[(t * k + at) / 4u] = pack_codes(q);
        }
        XQ[P[10] + (t * k) / ROUND_BLOCK + b] = bitcast<u32>(d);
    }
}
#else
// [n_tokens, n_head * head_dim] f32
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;
#endif
// [n_tokens, n_head, MAX_SPLITS, head_dim + 2] f32: each split's output, m and l
@group(0) @binding(6) var<storage, read> PART: array<f32>;
#ifdef KV_OFFSET
// [n_head_kv * head_dim] f32: what the store subtracted from the values (AttentionParams::v_offset)
@group(0) @binding(7) var<storage, read> V_OFFSET: array<f32>;
#endif

// One workgroup per token: each value of its row merges the splits of its head in order.
@compute @workgroup_size(128)
fn attention_reduce(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wg.y * P[7] + wg.x;
    if (t >= P[0]) {
        return;
    }
    let n_head = P[1];
    let hd = P[3];
    let q_width = n_head * hd;
    let n_splits = split_plan(t).z;
    for (var i = lid.x; i < q_width; i += WG) {
        let h = i / hd;
        let d = i % hd;
        let first = (t * n_head + h) * MAX_SPLITS * partial_len();
        var m = -3.0e38;
        for (var s = 0u; s < n_splits; s++) {
            m = max(m, PART[first + s * partial_len() + hd]);
        }
        var l = 0.0;
        var acc = 0.0;
        for (var s = 0u; s < n_splits; s++) {
            let at = first + s * partial_len();
            let c = exp(PART[at + hd] - m);
            l += PART[at + hd + 1u] * c;
            acc += PART[at + d] * c;
        }
        var v = acc * (1.0 / l);
#ifdef KV_OFFSET
        // The weights sum to 1: the values' offset comes back whole.
        let kvh = h / (n_head / P[2]);
        v = acc * (1.0 / l) + V_OFFSET[kvh * hd + d];
#endif
#ifdef ROUND_Q8_0 || ROUND_Q8_K
        row_sh[i] = v;
#else
        OUT[t * q_width + i] = v;
#endif
    }
#ifdef ROUND_Q8_0 || ROUND_Q8_K
    workgroupBarrier();
    round_row(t, q_width, lid.x);
#endif
}
#else
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
// [n_tokens, n_head, MAX_SPLITS, head_dim + 2] f32: each split's unnormalised output, m and l
@group(0) @binding(6) var<storage, read_write> PART: array<f32>;

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

// One workgroup per (split, query head, token), or per (query head, token) for all its splits
// in turn (see the top). A split's keys are processed in tiles of WG: each thread looks up one
// key's slot through the block table and scores it, then every thread folds the tile into its
// own output dimensions with an online softmax (running max m, running sum l).
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
    let grid_splits = P[9];
    let valid = id < P[0] * n_head * grid_splits;
    let h = id % n_head;
    let t = min(id / n_head / grid_splits, P[0] - 1u);
    let hd = P[3];
    let kvh = h / (n_head / P[2]);
    let q_width = n_head * hd;
    let kv_width = P[2] * hd;
    let words = row_words(kv_width);
    let layer = P[8];
    let seq = step_token_seq(t);
    let plan = split_plan(t);
    // The splits this workgroup computes: its own (or none past the token's), or all of them.
    var first_split = 0u;
    var end_split = plan.z;
    if (grid_splits > 1u) {
        first_split = id / n_head % grid_splits;
        end_split = min(first_split + 1u, plan.z);
    }
    if (!valid) {
        end_split = first_split;
    }
    let last_key = step_token_pos(t) + 1u;
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
    // Uniform loop bounds across the workgroup (barriers inside).
    for (var split = first_split; split < end_split; split++) {
        let lo = plan.x + split * plan.y;
        let end = min(lo + plan.y, last_key);
        var m = -3.0e38;
        var l = 0.0;
        var acc: array<f32, DIMS_PER_THREAD>;
        for (var u = 0u; u < DIMS_PER_THREAD; u++) {
            acc[u] = 0.0;
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
        // This split's partial: the unnormalised output, then m and l.
        let at = ((t * n_head + h) * MAX_SPLITS + split) * partial_len();
        for (var u = 0u; u < DIMS_PER_THREAD; u++) {
            let d = tid + u * WG;
            if (d < hd) {
                PART[at + d] = acc[u];
            }
        }
        if (tid == 0u) {
            PART[at + hd] = m;
            PART[at + hd + 1u] = l;
        }
    }
}
#endif
