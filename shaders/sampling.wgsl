// Per-row top-k of the logits (k ≤ 256; the sampler asks for at most 64) for sampling on the device, so a decode step reads back
// 8·k bytes per row instead of the whole vocabulary. Two passes, no subgroups:
// TOPK_CHUNKS: workgroup (c, r) finds the k best entries of chunk c (chunk_len logits) of row r.
// TOPK_MERGE: workgroup r merges its row's n_chunks·k chunk candidates into the row's k best.
// Order, as the host reference (hearth-core sampling::top_k_rows): larger logit first, equal
// logits by lower token id; NaN counts as -inf and is reported as -inf; -0.0 equals +0.0. The
// comparisons run on integer keys made from the bits, so no float special case depends on the
// driver. A chunk shorter than k pads with empty slots (id 0xffffffff), ranked after everything;
// the caller keeps k ≤ n_vocab, so the merged rows hold real entries only.
// Each of the k rounds: every thread finds its best entry ranked after the previous round's pick,
// then a tree reduction over the 256 threads picks the best of those (k·len/256 loads per thread).
// TOPK_LSE (with either pass) adds each row's log Σ exp(logit), NaN as -inf, for a drafter's
// confidence: TOPK_CHUNKS writes (max, Σ exp(l − max)) per chunk, TOPK_MERGE combines a row's
// chunks and writes max + log(sum) after the candidates. Matches the host reference
// (hearth-core sampling::log_sum_exp_rows) to float rounding, not bit for bit.

// Mirrors kernel_params.rs (a test checks the fields).
struct TopKParams {
    n_rows: u32,
    n_vocab: u32,
    // logits per chunk
    chunk_len: u32,
    n_chunks: u32,
    // candidates kept per chunk and per row
    k: u32,
}

@group(0) @binding(0) var<uniform> P: TopKParams;
#ifdef TOPK_CHUNKS
// [n_rows, n_vocab] f32: the step's logits
@group(0) @binding(1) var<storage, read> LOGITS: array<f32>;
// [n_rows, n_chunks, k, 2] u32: (token id, logit bits) per chunk candidate, best first
@group(0) @binding(2) var<storage, read_write> CAND: array<u32>;
#endif
#ifdef TOPK_MERGE
// [n_rows, n_chunks, k, 2] u32: as written by TOPK_CHUNKS
@group(0) @binding(2) var<storage, read> CAND: array<u32>;
// [n_rows, k, 2] u32: (token id, logit bits) per row, best first; then with TOPK_LSE [n_rows]
// log-sum-exp bits; read back to the host
@group(0) @binding(3) var<storage, read_write> OUT: array<u32>;
#endif
#ifdef TOPK_LSE
#ifdef TOPK_CHUNKS
// [n_rows, n_chunks, 2] f32: (max, Σ exp(l − max)) of each chunk
@group(0) @binding(4) var<storage, read_write> PART: array<f32>;
#endif
#ifdef TOPK_MERGE
// [n_rows, n_chunks, 2] f32: as written by TOPK_CHUNKS
@group(0) @binding(4) var<storage, read> PART: array<f32>;
#endif
#endif

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
const NEG_INF_BITS: u32 = 0xff800000u;

// The reduction: each thread's best (key, id, logit bits).
var<workgroup> red_key: array<u32, 256>;
var<workgroup> red_id: array<u32, 256>;
var<workgroup> red_bits: array<u32, 256>;

// NaN → -inf, -0.0 → +0.0 (the bits reported for NaN are -inf's).
fn canonical(bits: u32) -> u32 {
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return NEG_INF_BITS;
    }
    return bits;
}

// Increasing with the float's value; 0 is below every float (even -inf) and marks empty slots.
fn order_key(bits: u32) -> u32 {
    var b = canonical(bits);
    if (b == 0x80000000u) {
        b = 0u;
    }
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

fn ranks_before(key_a: u32, id_a: u32, key_b: u32, id_b: u32) -> bool {
    return key_a > key_b || (key_a == key_b && id_a < id_b);
}

// Where this workgroup's list starts in the source buffer, and the token id of its entry 0.
var<private> src_base: u32;
var<private> id_base: u32;

// Entry `j` of this workgroup's list: (order key, token id, logit bits).
fn entry(j: u32) -> vec3<u32> {
#ifdef TOPK_CHUNKS
    let bits = bitcast<u32>(LOGITS[src_base + j]);
    return vec3<u32>(order_key(bits), id_base + j, canonical(bits));
#endif
#ifdef TOPK_MERGE
    let id = CAND[2u * (src_base + j)];
    let bits = CAND[2u * (src_base + j) + 1u];
    var key = order_key(bits);
    if (id == NONE) {
        key = 0u;
    }
    return vec3<u32>(key, id, bits);
#endif
}

// The k best of this workgroup's `len` entries, best first, into `dst` ([k, 2] u32 from
// `dst_base` pairs on) of CAND or OUT. `has_list`: whether this workgroup has a list (barriers are
// reached by every thread either way).
fn top_k_rounds(lid: u32, len: u32, k: u32, has_list: bool, dst_base: u32) {
    // The previous round's pick; nothing is ranked after an empty slot.
    var prev_key = 0u;
    var prev_id = NONE;
    for (var round = 0u; round < k; round++) {
        var best_key = 0u;
        var best_id = NONE;
        var best_bits = NEG_INF_BITS;
        if (has_list) {
            for (var j = lid; j < len; j += WG) {
                let e = entry(j);
                let after_prev = round == 0u || ranks_before(prev_key, prev_id, e.x, e.y);
                if (after_prev && ranks_before(e.x, e.y, best_key, best_id)) {
                    best_key = e.x;
                    best_id = e.y;
                    best_bits = e.z;
                }
            }
        }
        red_key[lid] = best_key;
        red_id[lid] = best_id;
        red_bits[lid] = best_bits;
        workgroupBarrier();
        for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
            if (lid < stride && ranks_before(red_key[lid + stride], red_id[lid + stride], red_key[lid], red_id[lid])) {
                red_key[lid] = red_key[lid + stride];
                red_id[lid] = red_id[lid + stride];
                red_bits[lid] = red_bits[lid + stride];
            }
            workgroupBarrier();
        }
        prev_key = red_key[0];
        prev_id = red_id[0];
        if (has_list && lid == 0u) {
            let o = 2u * (dst_base + round);
#ifdef TOPK_CHUNKS
            CAND[o] = prev_id;
            CAND[o + 1u] = red_bits[0];
#endif
#ifdef TOPK_MERGE
            OUT[o] = prev_id;
            OUT[o + 1u] = red_bits[0];
#endif
        }
        // Everyone has read the result before the next round overwrites it.
        workgroupBarrier();
    }
}

#ifdef TOPK_LSE
var<workgroup> red_max: array<f32, 256>;
var<workgroup> red_sum: array<f32, 256>;

// -inf and NaN logits enter the sums as this finite stand-in (exp(LOW − m) is 0 for any logit m
// above it), so no float operation here sees an infinity unless a logit is +inf.
const LOW: f32 = -3.0e38;
const POS_INF_BITS: u32 = 0x7f800000u;

// (max, Σ exp(x − max)) of two partial sums; an empty part is (LOW, 0).
fn combine(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let m = max(a.x, b.x);
    return vec2<f32>(m, a.y * exp(a.x - m) + b.y * exp(b.x - m));
}

// Tree reduction of every thread's partial (max, sum); the result is in red_max[0], red_sum[0].
fn reduce_log_sum(lid: u32, part: vec2<f32>) {
    red_max[lid] = part.x;
    red_sum[lid] = part.y;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lid < stride) {
            let c = combine(vec2<f32>(red_max[lid], red_sum[lid]), vec2<f32>(red_max[lid + stride], red_sum[lid + stride]));
            red_max[lid] = c.x;
            red_sum[lid] = c.y;
        }
        workgroupBarrier();
    }
}
#endif

#ifdef TOPK_CHUNKS
@compute @workgroup_size(256)
fn top_k_chunks(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n_rows = P.n_rows;
    let n_vocab = P.n_vocab;
    let chunk_len = P.chunk_len;
    let n_chunks = P.n_chunks;
    let k = P.k;
    let chunk = wg.x;
    let row = wg.y;
    let has_list = row < n_rows && chunk < n_chunks;
    let first = chunk * chunk_len;
    src_base = row * n_vocab + first;
    id_base = first;
    let len = min(chunk_len, n_vocab - min(first, n_vocab));
    top_k_rounds(lid.x, len, k, has_list, (row * n_chunks + chunk) * k);
#ifdef TOPK_LSE
    // Each thread's running (max, sum) over its strided entries, rescaled when the max grows.
    var part = vec2<f32>(LOW, 0.0);
    if (has_list) {
        for (var j = lid.x; j < len; j += WG) {
            let bits = canonical(bitcast<u32>(LOGITS[src_base + j]));
            var x = bitcast<f32>(bits);
            if (bits == NEG_INF_BITS) {
                x = LOW;
            }
            part = combine(part, vec2<f32>(max(x, LOW), 1.0));
        }
    }
    reduce_log_sum(lid.x, part);
    if (has_list && lid.x == 0u) {
        let o = 2u * (row * n_chunks + chunk);
        PART[o] = red_max[0];
        PART[o + 1u] = red_sum[0];
    }
#endif
}
#endif

#ifdef TOPK_MERGE
@compute @workgroup_size(256)
fn top_k_merge(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n_rows = P.n_rows;
    let n_chunks = P.n_chunks;
    let k = P.k;
    let row = wg.x;
    src_base = row * n_chunks * k;
    id_base = 0u;
    top_k_rounds(lid.x, n_chunks * k, k, row < n_rows, row * k);
#ifdef TOPK_LSE
    var part = vec2<f32>(LOW, 0.0);
    if (row < n_rows) {
        for (var c = lid.x; c < n_chunks; c += WG) {
            let o = 2u * (row * n_chunks + c);
            part = combine(part, vec2<f32>(PART[o], PART[o + 1u]));
        }
    }
    reduce_log_sum(lid.x, part);
    if (row < n_rows && lid.x == 0u) {
        // No logit above -inf: -inf; a +inf logit: +inf; else max + log(sum), the sum ≥ 1 (the
        // max's own term).
        var lse_bits = NEG_INF_BITS;
        if (bitcast<u32>(red_max[0]) == POS_INF_BITS) {
            lse_bits = POS_INF_BITS;
        } else if (red_max[0] > LOW) {
            lse_bits = bitcast<u32>(red_max[0] + log(red_sum[0]));
        }
        OUT[2u * n_rows * k + row] = lse_bits;
    }
#endif
}
#endif
