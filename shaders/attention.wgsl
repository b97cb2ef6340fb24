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
//  softcap (f32 bits, 0 = none), groups_x, f16_path (1: the small-batch numerics below)]
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

// Round to nearest-even f16, exactly (bit arithmetic in f16's normal range).
fn round_f16(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    let exponent = (bits >> 23u) & 0xffu;
    if (exponent >= 113u && exponent < 142u) {
        let lsb = (bits >> 13u) & 1u;
        return bitcast<f32>((bits + 0x0fffu + lsb) & ~0x1fffu);
    }
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

// q · k in the order of ggml's AVX-512 `ggml_vec_dot_f16` (the CPU oracle's small-batch path):
// per 64 values, 4 accumulators of 16 lanes by FMA; accumulators added (0+2)+(1+3); lanes halved
// 8, 4, then (0+2)+(1+3); the tail past the last 64 added afterwards.
fn dot_ggml_f16(kb: u32, hd: u32) -> f32 {
    var acc: array<f32, 64>;
    for (var i = 0u; i < 64u; i++) {
        acc[i] = 0.0;
    }
    let blocks = hd / 64u * 64u;
    for (var i = 0u; i < blocks; i += 64u) {
        for (var j = 0u; j < 64u; j++) {
            acc[j] = fma(q_sh[i + j], K[kb + i + j], acc[j]);
        }
    }
    var x: array<f32, 16>;
    for (var l = 0u; l < 16u; l++) {
        x[l] = (acc[l] + acc[32u + l]) + (acc[16u + l] + acc[48u + l]);
    }
    for (var l = 0u; l < 8u; l++) {
        x[l] = x[l] + x[l + 8u];
    }
    for (var l = 0u; l < 4u; l++) {
        x[l] = x[l] + x[l + 4u];
    }
    var sum = (x[0] + x[2]) + (x[1] + x[3]);
    for (var i = blocks; i < hd; i++) {
        sum += q_sh[i] * K[kb + i];
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
    let f16_path = P[8] == 1u;
    if (valid) {
        for (var d = tid; d < hd; d += WG) {
            let qv = Q[t * q_width + h * hd + d];
            if (f16_path) {
                q_sh[d] = round_f16(qv);
            } else {
                q_sh[d] = qv;
            }
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
            if (f16_path) {
                dot = dot_ggml_f16(kb, hd);
            } else {
                for (var d = 0u; d < hd; d++) {
                    dot += q_sh[d] * K[kb + d];
                }
            }
            s = softcapped(dot * scale);
        }
        scores[tid] = s;
        workgroupBarrier();
        let count = min(WG, end - tile);
        if (f16_path) {
            // Key by key as the CPU's small-batch path: one-pass online softmax with the output
            // accumulator kept at f16 precision.
            for (var r = 0u; r < count; r++) {
                let s = scores[r];
                var ms = 1.0;
                var vs = 1.0;
                if (s > m) {
                    ms = exp(m - s);
                    m = s;
                    for (var u = 0u; u < DIMS_PER_THREAD; u++) {
                        acc[u] = round_f16(acc[u] * ms);
                    }
                } else {
                    vs = exp(s - m);
                }
                let vb = (tile + r) * kv_width + kvh * hd;
                for (var u = 0u; u < DIMS_PER_THREAD; u++) {
                    let d = tid + u * WG;
                    if (d < hd) {
                        acc[u] = round_f16(fma(V[vb + d], vs, acc[u]));
                    }
                }
                l = fma(l, ms, vs);
            }
            workgroupBarrier();
            continue;
        }
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
            OUT[t * q_width + h * hd + d] = acc[u] * (1.0 / l);
        }
    }
}
#endif
