// KV-cache write and causal attention (GQA, sliding window, optional soft-cap).
// The cache of a layer is two f32 buffers [capacity, n_head_kv * head_dim]; values are stored
// rounded to f16 precision, the precision of llama.cpp's default cache (and of the CPU oracle).

#ifdef STORE_KV
// [n_tokens, width, groups_x]
@group(0) @binding(0) var<storage, read> P: array<u32>;
// [2 + n_tokens] u32: pos0, n_tokens, token ids
@group(0) @binding(1) var<storage, read> STEP: array<u32>;
// [n_tokens, width] f32
@group(0) @binding(2) var<storage, read> SRC: array<f32>;
// [capacity, width] f32
@group(0) @binding(3) var<storage, read_write> CACHE: array<f32>;

@compute @workgroup_size(256)
fn store_kv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = (wg.y * P[2] + wg.x) * 256u + lid.x;
    if (i >= P[0] * P[1]) {
        return;
    }
    let v = SRC[i];
    CACHE[STEP[0] * P[1] + i] = unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x;
}
#endif

#ifdef ATTENTION
// [n_tokens, n_head, n_head_kv, head_dim, scale (f32 bits), window (0 = none),
//  softcap (f32 bits, 0 = none), groups_x]
@group(0) @binding(0) var<storage, read> P: array<u32>;
// [2 + n_tokens] u32: pos0, n_tokens, token ids
@group(0) @binding(1) var<storage, read> STEP: array<u32>;
// [n_tokens, n_head * head_dim] f32
@group(0) @binding(2) var<storage, read> Q: array<f32>;
// [capacity, n_head_kv * head_dim] f32
@group(0) @binding(3) var<storage, read> K: array<f32>;
// [capacity, n_head_kv * head_dim] f32
@group(0) @binding(4) var<storage, read> V: array<f32>;
// [n_tokens, n_head * head_dim] f32
@group(0) @binding(5) var<storage, read_write> OUT: array<f32>;

const WG: u32 = 128u;
// head_dim <= WG * DIMS_PER_THREAD
const DIMS_PER_THREAD: u32 = 4u;
var<workgroup> q_sh: array<f32, 512>;
var<workgroup> scores: array<f32, WG>;

fn softcapped(s: f32) -> f32 {
    let c = bitcast<f32>(P[6]);
    if (c == 0.0) {
        return s;
    }
    let x = s / c;
    let t = exp(-2.0 * abs(x));
    return c * sign(x) * (1.0 - t) / (1.0 + t);
}

// One workgroup per (token, query head). Keys are processed in tiles of WG: each thread scores
// one key of the tile, then every thread folds the tile into its own output dimensions with an
// online softmax (running max m, running sum l).
@compute @workgroup_size(128)
fn attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let id = wg.y * P[7] + wg.x;
    let n_head = P[1];
    let valid = id < P[0] * n_head;
    let t = id / n_head;
    let h = id % n_head;
    let hd = P[3];
    let kvh = h / (n_head / P[2]);
    let q_width = n_head * hd;
    let kv_width = P[2] * hd;
    let pos = STEP[0] + t;
    var lo = 0u;
    let window = P[5];
    if (window != 0u && pos + 1u > window) {
        lo = pos + 1u - window;
    }
    let scale = bitcast<f32>(P[4]);
    let tid = lid.x;
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
            var dot = 0.0;
            let kb = j * kv_width + kvh * hd;
            for (var d = 0u; d < hd; d++) {
                dot += q_sh[d] * K[kb + d];
            }
            s = softcapped(dot * scale);
        }
        scores[tid] = s;
        workgroupBarrier();
        let count = min(WG, end - tile);
        var tile_max = m;
        for (var r = 0u; r < count; r++) {
            tile_max = max(tile_max, scores[r]);
        }
        let correction = exp(m - tile_max);
        l = l * correction;
        for (var u = 0u; u < DIMS_PER_THREAD; u++) {
            acc[u] = acc[u] * correction;
        }
        for (var r = 0u; r < count; r++) {
            let w = exp(scores[r] - tile_max);
            l += w;
            let vb = (tile + r) * kv_width + kvh * hd;
            for (var u = 0u; u < DIMS_PER_THREAD; u++) {
                let d = tid + u * WG;
                if (d < hd) {
                    acc[u] += w * V[vb + d];
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
            OUT[t * q_width + h * hd + d] = acc[u] / l;
        }
    }
}
#endif
