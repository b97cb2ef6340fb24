// Causal attention over the paged KV cache (layout in kv_cache.wgsl): GQA, sliding window,
// optional soft-cap, through per-sequence block tables, in two dispatches (flash decoding):
//   attention: a query's keys are cut into splits (`split_plan`: their number a function of the
//     context length only, so a query's result never depends on its batch), each split's
//     online softmax written as a partial (running max m, sum l, unnormalised output);
//     a workgroup computes a group of the query heads that share a KV head (GQA), reading each
//     key and value once for them all; one workgroup per (split, head group, token) where the
//     step has at most GRID_SPLIT_TOKENS tokens (decode, speculative verification), so short
//     steps fill the GPU, else one per (head group, token) looping over its splits (MERGED),
//     which merges them as they finish and writes the output itself; the same code computes
//     every split either way, per head in the same order whatever the group;
//   attention_reduce (REDUCE): one workgroup per token merges its splits in order, as MERGED
//     does; with ROUND_Q8_0, ROUND_Q8_1 or ROUND_Q8_K it writes the row rounded for the output projection
//     instead (no rounding dispatch of its own).
// Capability variants: SHADER_F16 reads an f16 cache as WGSL f16 (exact, as unpack2x16float);
// SUBGROUPS takes each key tile's maximum score with subgroupMax instead of a serial scan;
// GPU_SHAPES (a GPU adapter) cuts shorter splits and issues each thread's key and value loads
// several at a time (same arithmetic, same order).
#ifdef SHADER_F16
enable f16;
#endif
// Browsers require `enable subgroups;`; Naga (native) rejects it and needs no directive.
#ifdef SUBGROUPS_DIRECTIVE
enable subgroups;
#endif

// Mirrors kernel_params.rs (a test checks the fields).
struct AttentionParams {
    n_tokens: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    // multiplies q·k before the softmax
    scale: f32,
    // sliding window (0 = none)
    window: u32,
    // tanh soft-cap of the scores (0 = none)
    softcap: f32,
    // the folded grid's x width
    groups_x: u32,
    layer: u32,
    // splits in the grid (MAX_SPLITS, or 1 where MERGED)
    grid_splits: u32,
    // query heads a workgroup computes, of one KV head
    group: u32,
    // ROUND_Q8_0 / ROUND_Q8_1 / ROUND_Q8_K (the reduce): the word of XQ where the scales start
    scales_at: u32,
    // values per value (and output) head: head_dim, or MLA's latent width
    v_head_dim: u32,
    // values of the stored rows V is read from: n_head_kv * v_head_dim, or the key rows' width
    // where the values are their start (V then binds the key rows: MLA's latent)
    v_row_width: u32,
}

@group(0) @binding(0) var<uniform> P: AttentionParams;
// see STEP in kv_cache.wgsl
@group(0) @binding(1) var<storage, read> STEP: array<u32>;
// see TABLES in kv_cache.wgsl (unused by the reduce, which binds nothing there)
@group(0) @binding(2) var<storage, read> TABLES: array<u32>;

// Splits of a query's keys: at most MAX_SPLITS of a multiple of WG keys, at least SPLIT_KEYS
// keys each where there are that many.
// Shorter splits fill a GPU: a decode step has a workgroup per (split, head group) only. A CPU
// adapter launches the grid's empty split workgroups at a cost (compile.rs attention_max_splits).
#ifdef GPU_SHAPES
const MAX_SPLITS: u32 = 32u;
const SPLIT_KEYS: u32 = 128u;
#else
const MAX_SPLITS: u32 = 16u;
const SPLIT_KEYS: u32 = 256u;
#endif
// Floats of one split's partial: the head's unnormalised output, then m and l.
fn partial_len() -> u32 {
    return P.v_head_dim + 2u;
}

// Token t's keys: (first key, keys per split, number of splits), from its position and the
// window only.
fn split_plan(t: u32) -> vec3<u32> {
    let pos = step_token_pos(t);
    var lo = 0u;
    let window = P.window;
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

// One step of merging a query's split partials in split order, which the reduce and MERGED both
// take (the same arithmetic, so a query's result is the same bits whichever kernel merges it):
// from the merged (m, l) so far and the next split's (m, l), the new (m, l) and the factors of
// the merged output and of the split's.
fn merge_weights(merged: vec2<f32>, split: vec2<f32>) -> vec4<f32> {
    let m = max(merged.x, split.x);
    let c_merged = exp(merged.x - m);
    let c_split = exp(split.x - m);
    return vec4<f32>(m, merged.y * c_merged + split.y * c_split, c_merged, c_split);
}

// A sink joins a head's softmax as one more split would: one key of score `sink` (m = sink,
// l = 1) whose value is zero. Returns (the new m and l, the factor of the output so far).
fn merge_sink(merged: vec2<f32>, sink: f32) -> vec3<f32> {
    let w = merge_weights(merged, vec2<f32>(sink, 1.0));
    return vec3<f32>(w.xy, w.z);
}

#ifdef REDUCE
#ifdef ROUND_Q8_0 || ROUND_Q8_1 || ROUND_Q8_K
// The merged row rounded for the mat-muls that read it, as act_quant.wgsl rounds (and lays out)
// activations: [n_tokens * n_head * v_head_dim / 4] u32 codes, then from word P.scales_at the f32 scale
// of each block of ROUND_BLOCK values (ROUND_Q8_1: each block's (d, s) pair).
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
#ifdef ROUND_Q8_0 || ROUND_Q8_1
        var id = 0.0;
        if (amax != 0.0) {
            id = div_rn(127.0, amax);
        }
        let d = round_f16(div_rn(amax, 127.0));
#else
        var iscale = 0.0;
        var d = 0.0;
        if (amax != 0.0) {
            iscale = div_rn(-127.0, vmax);
            d = div_rn(1.0, iscale);
        }
#endif
        var code_sum = 0;
        for (var w = 0u; w < ROUND_BLOCK / 4u; w++) {
            let at = first + 4u * w;
            let x = vec4<f32>(row_sh[at], row_sh[at + 1u], row_sh[at + 2u], row_sh[at + 3u]);
#ifdef ROUND_Q8_0 || ROUND_Q8_1
            let q = vec4<i32>(round(x * id));
#else
            var q = vec4<i32>(0);
            if (amax != 0.0) {
                q = vec4<i32>(min(round(iscale * x), vec4<f32>(127.0)));
            }
#endif
            XQ[(t * k + at) / 4u] = pack_codes(q);
            code_sum += q.x + q.y + q.z + q.w;
        }
#ifdef ROUND_Q8_1
        let pair = P.scales_at + 2u * ((t * k) / ROUND_BLOCK + b);
        XQ[pair] = bitcast<u32>(d);
        XQ[pair + 1u] = bitcast<u32>(round_f16(f32(code_sum) * div_rn(amax, 127.0)));
#else
        XQ[P.scales_at + (t * k) / ROUND_BLOCK + b] = bitcast<u32>(d);
#endif
    }
}
#else
// [n_tokens, n_head * v_head_dim] f32
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;
#endif
// [n_tokens, n_head, MAX_SPLITS, v_head_dim + 2] f32: each split's output, m and l
@group(0) @binding(6) var<storage, read> PART: array<f32>;
#ifdef KV_OFFSET
// [n_head_kv * v_head_dim] f32: what the store subtracted from the values (AttentionParams::v_offset)
@group(0) @binding(7) var<storage, read> V_OFFSET: array<f32>;
#endif
#ifdef SINKS
// [n_head] f32: each query head's sink logit (AttentionParams::sinks)
@group(0) @binding(8) var<storage, read> SINKS: array<f32>;
#endif


// One workgroup per token: each value of its row merges the splits of its head in order.
@compute @workgroup_size(128)
fn attention_reduce(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wg.y * P.groups_x + wg.x;
    if (t >= P.n_tokens) {
        return;
    }
    let n_head = P.n_head;
    // The output's head size: the values'.
    let hd = P.v_head_dim;
    let q_width = n_head * hd;
    let n_splits = split_plan(t).z;
    for (var i = lid.x; i < q_width; i += WG) {
        let h = i / hd;
        let d = i % hd;
        let first = (t * n_head + h) * MAX_SPLITS * partial_len();
        var merged = vec2<f32>(-3.0e38, 0.0);
        var acc = 0.0;
        for (var s = 0u; s < n_splits; s++) {
            let at = first + s * partial_len();
            let w = merge_weights(merged, vec2<f32>(PART[at + hd], PART[at + hd + 1u]));
            acc = acc * w.z + PART[at + d] * w.w;
            merged = w.xy;
        }
#ifdef SINKS
        let sunk = merge_sink(merged, SINKS[h]);
        merged = sunk.xy;
        acc = acc * sunk.z;
#endif
        var v = acc * (1.0 / merged.y);
#ifdef KV_OFFSET
        // The weights sum to 1: the values' offset comes back whole.
        let kvh = h / (n_head / P.n_head_kv);
        v = acc * (1.0 / merged.y) + V_OFFSET[kvh * hd + d];
#endif
#ifdef ROUND_Q8_0 || ROUND_Q8_1 || ROUND_Q8_K
        row_sh[i] = v;
#else
        OUT[t * q_width + i] = v;
#endif
    }
#ifdef ROUND_Q8_0 || ROUND_Q8_1 || ROUND_Q8_K
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
// [n_blocks, block_size, row_words(v_row_width)] u32 (the K rows where values are their start)
@group(0) @binding(5) var<storage, read> V: array<u32>;
#endif
#else
// [n_blocks, block_size, row_words(n_head_kv * head_dim)] u32
@group(0) @binding(4) var<storage, read> K: array<u32>;
// [n_blocks, block_size, row_words(v_row_width)] u32 (the K rows where values are their start)
@group(0) @binding(5) var<storage, read> V: array<u32>;
#endif
#ifdef MERGED
// [n_tokens, n_head * v_head_dim] f32
@group(0) @binding(6) var<storage, read_write> OUT: array<f32>;
#ifdef KV_OFFSET
// [n_head_kv * v_head_dim] f32: what the store subtracted from the values (AttentionParams::v_offset)
@group(0) @binding(7) var<storage, read> V_OFFSET: array<f32>;
#endif
#ifdef SINKS
// [n_head] f32: each query head's sink logit (AttentionParams::sinks)
@group(0) @binding(8) var<storage, read> SINKS: array<f32>;
#endif
#else
// [n_tokens, n_head, MAX_SPLITS, v_head_dim + 2] f32: each split's unnormalised output, m and l
@group(0) @binding(6) var<storage, read_write> PART: array<f32>;
#endif

// A workgroup computes `group` (P.group) query heads of one KV head, at most MAX_GROUP of them
// (group * head_dim <= 1024), so every key and value it reads serves them all; a thread owns
// value dimensions tid + u * WG (v_head_dim <= WG * DIMS_PER_THREAD) of every head of the group.
const MAX_GROUP: u32 = 8u;
const DIMS_PER_THREAD: u32 = 4u;
// Keys whose values a thread loads before folding them in, and key values loaded at a time for
// the scores: on a GPU each load would otherwise wait out the memory latency alone; a CPU adapter
// pays for the registers instead.
#ifdef GPU_SHAPES
const V_BATCH: u32 = 8u;
const K_CHUNK: u32 = 16u;
#else
const V_BATCH: u32 = 1u;
const K_CHUNK: u32 = 8u;
#endif
// [group, head_dim] the group's queries
var<workgroup> q_sh: array<f32, 1024>;
// [MAX_GROUP, WG] a key tile's scores per head, then their softmax weights exp(score - max)
var<workgroup> scores: array<f32, 1024>;
// First word of each key's V row in the tile.
var<workgroup> rows: array<u32, WG>;
#ifdef SUBGROUPS
// [MAX_GROUP, 32] each subgroup's maximum score of the tile (subgroups of at least 4 invocations).
var<workgroup> sg_max: array<f32, 256>;
#endif
#ifdef KV_Q8_0 || KV_Q4_0
// V rows are un-rotated a whole block at a time, but read a dimension per thread: V_KEYS keys'
// blocks covering the head's columns are decoded into v_sh together (V_SPAN values a key: a
// head of up to 512 columns not aligned to blocks touches at most 18 blocks).
const V_KEYS: u32 = 2u;
const V_SPAN: u32 = 576u;
var<workgroup> v_sh: array<f32, 1152>;
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

// q · k of each of the group's heads with the key whose row starts at word `row`, in f32 in the
// CPU oracle's order: per head 8 accumulators over its dimensions (lane i % 8), combined
// ((0+4)+(1+5))+((2+6)+(3+7)), then the tail past the last multiple of 8. `col` is the KV head's
// first column in the row. Each key value is read once for all the heads.
fn group_dots(row: u32, col: u32, hd: u32, width: u32, group: u32) -> array<f32, MAX_GROUP> {
    var acc: array<array<f32, 8>, MAX_GROUP>;
    for (var g = 0u; g < MAX_GROUP; g++) {
        for (var lane = 0u; lane < 8u; lane++) {
            acc[g][lane] = 0.0;
        }
    }
#ifdef KV_Q8_0 || KV_Q4_0
    var kb: array<f32, 32>;
    var kb_at = 0xffffffffu;
#endif
    let full = hd / 8u * 8u;
    // K_CHUNK values loaded at a time, folded in 8 at a time.
    for (var i0 = 0u; i0 < full; i0 += K_CHUNK) {
        var k: array<f32, K_CHUNK>;
        for (var lane = 0u; lane < K_CHUNK; lane++) {
            k[lane] = 0.0;
            if (i0 + lane < full) {
#ifdef KV_Q8_0 || KV_Q4_0
                k[lane] = k_cached(row, col + i0 + lane, width, &kb, &kb_at);
#else
                k[lane] = k_at(row, col + i0 + lane, width);
#endif
            }
        }
        for (var g = 0u; g < MAX_GROUP; g++) {
            if (g < group) {
                for (var lane = 0u; lane < 8u; lane++) {
                    acc[g][lane] += q_sh[g * hd + i0 + lane] * k[lane];
                }
#ifdef GPU_SHAPES
                if (i0 + 8u < full) {
                    for (var lane = 0u; lane < 8u; lane++) {
                        acc[g][lane] += q_sh[g * hd + i0 + 8u + lane] * k[8u + lane];
                    }
                }
#endif
            }
        }
    }
    var sums: array<f32, MAX_GROUP>;
    for (var g = 0u; g < MAX_GROUP; g++) {
        let a = acc[g];
        sums[g] = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    }
    for (var i = full; i < hd; i++) {
#ifdef KV_Q8_0 || KV_Q4_0
        let k = k_cached(row, col + i, width, &kb, &kb_at);
#else
        let k = k_at(row, col + i, width);
#endif
        for (var g = 0u; g < MAX_GROUP; g++) {
            if (g < group) {
                sums[g] += q_sh[g * hd + i] * k;
            }
        }
    }
    return sums;
}

fn softcapped(s: f32) -> f32 {
    let c = P.softcap;
    if (c == 0.0) {
        return s;
    }
    let x = s / c;
    let t = exp(-2.0 * abs(x));
    return c * sign(x) * (1.0 - t) / (1.0 + t);
}

// One workgroup per (split, query-head group, token), or per (query-head group, token) for all
// its splits in turn (see the top). A split's keys are processed in tiles of WG: each thread
// looks up one key's slot through the block table and scores it against every head of the
// group, the tile's softmax weights are computed once per (head, key), then every thread folds
// the tile into its own dimensions of every head (one value read for them all) with an online
// softmax per head (running max m, running sum l).
@compute @workgroup_size(128)
fn attention(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
#ifdef SUBGROUPS
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
#endif
) {
    let id = wg.y * P.groups_x + wg.x;
    let n_head = P.n_head;
    let group = P.group;
    let n_groups = n_head / group;
    let grid_splits = P.grid_splits;
    let valid = id < P.n_tokens * n_groups * grid_splits;
    // The group's first query head; all its heads read KV head kvh.
    let h0 = id % n_groups * group;
    let t = min(id / n_groups / grid_splits, P.n_tokens - 1u);
    let hd = P.head_dim;
    let vd = P.v_head_dim;
    let kvh = h0 / (n_head / P.n_head_kv);
    let q_width = n_head * hd;
    let kv_width = P.n_head_kv * hd;
    let words = row_words(kv_width);
    // V rows: n_head_kv heads of vd values, or the key rows (MLA: values, the latent, are
    // their start).
    let v_width = P.v_row_width;
    let v_words = row_words(v_width);
    let vcol = kvh * vd;
    let layer = P.layer;
    let seq = step_token_seq(t);
    let plan = split_plan(t);
    // The splits this workgroup computes: its own (or none past the token's), or all of them.
    var first_split = 0u;
    var end_split = plan.z;
    if (grid_splits > 1u) {
        first_split = id / n_groups % grid_splits;
        end_split = min(first_split + 1u, plan.z);
    }
    if (!valid) {
        end_split = first_split;
    }
    // The grid is sized for the most splits; a workgroup past its token's splits has nothing to
    // do (the whole workgroup leaves together).
    if (end_split <= first_split) {
        return;
    }
    let last_key = step_token_pos(t) + 1u;
    let scale = P.scale;
    let tid = lid.x;
    // One f32 numerics path for every query, as on the CPU oracle: a query's result never
    // depends on how many others share the step or its workgroup (batch invariance).
    let col = kvh * hd;
    let group_width = group * hd;
    if (valid) {
        for (var i = tid; i < group_width; i += WG) {
            q_sh[i] = Q[t * q_width + h0 * hd + i];
        }
    }
    workgroupBarrier();
#ifdef MERGED
    // The splits merged so far: (m, l) per head and this thread's outputs.
    var merged: array<vec2<f32>, MAX_GROUP>;
    for (var g = 0u; g < MAX_GROUP; g++) {
        merged[g] = vec2<f32>(-3.0e38, 0.0);
    }
    var merged_acc: array<array<f32, MAX_GROUP>, DIMS_PER_THREAD>;
    for (var u = 0u; u < DIMS_PER_THREAD; u++) {
        for (var g = 0u; g < MAX_GROUP; g++) {
            merged_acc[u][g] = 0.0;
        }
    }
#endif
    // Uniform loop bounds across the workgroup (barriers inside).
    for (var split = first_split; split < end_split; split++) {
        let lo = plan.x + split * plan.y;
        let end = min(lo + plan.y, last_key);
        var m: array<f32, MAX_GROUP>;
        var l: array<f32, MAX_GROUP>;
        for (var g = 0u; g < MAX_GROUP; g++) {
            m[g] = -3.0e38;
            l[g] = 0.0;
        }
        // [dimension tid + u * WG][head]
        var acc: array<array<f32, MAX_GROUP>, DIMS_PER_THREAD>;
        for (var u = 0u; u < DIMS_PER_THREAD; u++) {
            for (var g = 0u; g < MAX_GROUP; g++) {
                acc[u][g] = 0.0;
            }
        }
        for (var tile = lo; tile < end; tile += WG) {
            let j = tile + tid;
            var s: array<f32, MAX_GROUP>;
            for (var g = 0u; g < MAX_GROUP; g++) {
                s[g] = -3.0e38;
            }
            if (j < end) {
                let slot = slot_of(layer, seq, j);
                let row = slot * words;
                rows[tid] = slot * v_words;
                let dots = group_dots(row, col, hd, kv_width, group);
                for (var g = 0u; g < MAX_GROUP; g++) {
                    if (g < group) {
                        s[g] = softcapped(dots[g] * scale);
                    }
                }
            }
            for (var g = 0u; g < MAX_GROUP; g++) {
                if (g < group) {
                    scores[g * WG + tid] = s[g];
#ifdef SUBGROUPS
                    // Subgroups are consecutive invocations (see quant.wgsl).
                    let s_max = subgroupMax(s[g]);
                    if (sg_lane == 0u) {
                        sg_max[g * 32u + tid / sg_size] = s_max;
                    }
#endif
                }
            }
            workgroupBarrier();
            let count = min(WG, end - tile);
            // Online softmax in f32, per head: rescale what the earlier tiles summed to this
            // tile's maximum.
            var tile_max: array<f32, MAX_GROUP>;
            var correction: array<f32, MAX_GROUP>;
            for (var g = 0u; g < MAX_GROUP; g++) {
                tile_max[g] = m[g];
                if (g < group) {
#ifdef SUBGROUPS
                    // Keys past `count` score -3e38, so the whole tile's maximum is that of its
                    // first count.
                    for (var i = 0u; i < (WG + sg_size - 1u) / sg_size; i++) {
                        tile_max[g] = max(tile_max[g], sg_max[g * 32u + i]);
                    }
#else
                    for (var r = 0u; r < count; r++) {
                        tile_max[g] = max(tile_max[g], scores[g * WG + r]);
                    }
#endif
                }
                correction[g] = exp(m[g] - tile_max[g]);
                l[g] = l[g] * correction[g];
            }
            for (var u = 0u; u < DIMS_PER_THREAD; u++) {
                for (var g = 0u; g < MAX_GROUP; g++) {
                    acc[u][g] = acc[u][g] * correction[g];
                }
            }
            // Each key's weight per head, computed once, over its score (read by the scans
            // above without subgroups).
#ifdef SUBGROUPS
#else
            workgroupBarrier();
#endif
            for (var g = 0u; g < MAX_GROUP; g++) {
                if (g < group) {
                    scores[g * WG + tid] = exp(s[g] - tile_max[g]);
                }
            }
            workgroupBarrier();
#ifdef KV_Q8_0 || KV_Q4_0
            // Blocks first_block .. first_block + n_vblocks hold the head's value columns.
            let first_block = vcol / 32u;
            let n_vblocks = (vcol + vd + 31u) / 32u - first_block;
#endif
            // V_BATCH keys at a time: their values' loads issued together (GPU_SHAPES), then the
            // keys folded in one at a time, in order.
            for (var r0 = 0u; r0 < count; r0 += V_BATCH) {
#ifdef KV_Q8_0 || KV_Q4_0
#else
#ifdef GPU_SHAPES
                var vb: array<array<f32, V_BATCH>, DIMS_PER_THREAD>;
                for (var u = 0u; u < DIMS_PER_THREAD; u++) {
                    let d = tid + u * WG;
                    if (d < vd) {
                        // Keys past the tile's read its last one again, unused.
                        for (var b = 0u; b < V_BATCH; b++) {
                            vb[u][b] = v_at(rows[min(r0 + b, count - 1u)], vcol + d, v_width);
                        }
                    }
                }
#endif
#endif
                for (var b = 0u; b < V_BATCH; b++) {
                    let r = r0 + b;
                    if (r < count) {
#ifdef KV_Q8_0 || KV_Q4_0
                        if (r % V_KEYS == 0u) {
                            // Keys r .. r + V_KEYS: each thread decodes some (key, block) pairs.
                            workgroupBarrier();
                            for (var p = tid; p < V_KEYS * n_vblocks; p += WG) {
                                let key = p / n_vblocks;
                                let block = p % n_vblocks;
                                if (r + key < count) {
                                    let x = v_block(rows[r + key], first_block + block, v_width);
                                    for (var i = 0u; i < 32u; i++) {
                                        v_sh[key * V_SPAN + block * 32u + i] = x[i];
                                    }
                                }
                            }
                            workgroupBarrier();
                        }
#endif
                        // Key r's weight for each head, read once for the sum and every dimension.
                        var w: array<f32, MAX_GROUP>;
                        for (var g = 0u; g < MAX_GROUP; g++) {
                            if (g < group) {
                                w[g] = scores[g * WG + r];
                                l[g] += w[g];
                            }
                        }
                        for (var u = 0u; u < DIMS_PER_THREAD; u++) {
                            let d = tid + u * WG;
                            if (d < vd) {
#ifdef KV_Q8_0 || KV_Q4_0
                                let v = v_sh[(r % V_KEYS) * V_SPAN + vcol + d - first_block * 32u];
#else
#ifdef GPU_SHAPES
                                let v = vb[u][b];
#else
                                let v = v_at(rows[r], vcol + d, v_width);
#endif
#endif
                                for (var g = 0u; g < MAX_GROUP; g++) {
                                    if (g < group) {
                                        acc[u][g] += w[g] * v;
                                    }
                                }
                            }
                        }
                    }
                }
            }
            for (var g = 0u; g < MAX_GROUP; g++) {
                m[g] = tile_max[g];
            }
            workgroupBarrier();
        }
#ifdef MERGED
        var factors: array<vec2<f32>, MAX_GROUP>;
        for (var g = 0u; g < MAX_GROUP; g++) {
            let w = merge_weights(merged[g], vec2<f32>(m[g], l[g]));
            factors[g] = w.zw;
            merged[g] = w.xy;
        }
        for (var u = 0u; u < DIMS_PER_THREAD; u++) {
            for (var g = 0u; g < MAX_GROUP; g++) {
                merged_acc[u][g] = merged_acc[u][g] * factors[g].x + acc[u][g] * factors[g].y;
            }
        }
#else
        // This split's partial per head: the unnormalised output, then m and l.
        for (var g = 0u; g < MAX_GROUP; g++) {
            if (g < group) {
                let at = ((t * n_head + h0 + g) * MAX_SPLITS + split) * partial_len();
                for (var u = 0u; u < DIMS_PER_THREAD; u++) {
                    let d = tid + u * WG;
                    if (d < vd) {
                        PART[at + d] = acc[u][g];
                    }
                }
            }
        }
        for (var g = 0u; g < MAX_GROUP; g++) {
            if (g < group && tid == g) {
                let at = ((t * n_head + h0 + g) * MAX_SPLITS + split) * partial_len();
                PART[at + vd] = m[g];
                PART[at + vd + 1u] = l[g];
            }
        }
#endif
    }
#ifdef MERGED
#ifdef SINKS
    for (var g = 0u; g < MAX_GROUP; g++) {
        if (g < group) {
            let sunk = merge_sink(merged[g], SINKS[h0 + g]);
            merged[g] = sunk.xy;
            for (var u = 0u; u < DIMS_PER_THREAD; u++) {
                merged_acc[u][g] = merged_acc[u][g] * sunk.z;
            }
        }
    }
#endif
    if (valid) {
        for (var g = 0u; g < MAX_GROUP; g++) {
            for (var u = 0u; u < DIMS_PER_THREAD; u++) {
                let d = tid + u * WG;
                if (g < group && d < vd) {
                    var v = merged_acc[u][g] * (1.0 / merged[g].y);
#ifdef KV_OFFSET
                    // The weights sum to 1: the values' offset comes back whole.
                    v = merged_acc[u][g] * (1.0 / merged[g].y) + V_OFFSET[vcol + d];
#endif
                    OUT[t * n_head * vd + (h0 + g) * vd + d] = v;
                }
            }
        }
    }
#endif
}
#endif
