// The KV store: each token's keys and values converted to the cache's storage type (layout in
// kv_cache.wgsl) and written at their slots through the block tables.
//   store_kv: one invocation per (token, stored unit) of one buffer, or of the keys then the
//     values (SECOND).
//   prepare_heads (HEADS, with SECOND): one workgroup per (token, head) of the queries, keys and
//     values. A query or key head is RMS-normalised with its weight (Q_NORM, K_NORM), rotated
//     (RoPE: NEOX, FREQ_FACTORS as in rope.wgsl) and scaled, in place, as Op::RmsNorm, Op::Rope
//     and Op::Scale compute it; then key and value heads are stored: everything between the
//     q/k/v projections and attention in one dispatch.

// Mirror kernel_params.rs (a test checks the fields). Uniforms, so that the storage bindings
// fit in WebGPU's 8 per stage.
struct StoreKvParams {
    n_tokens: u32,
    // SRC's row length
    width: u32,
    // the folded grid's x width
    groups_x: u32,
    layer: u32,
    // SECOND: SRC2's row length
    width2: u32,
}

struct HeadsParams {
    n_tokens: u32,
    n_q_heads: u32,
    n_k_heads: u32,
    n_v_heads: u32,
    head_dim: u32,
    // leading values of each head that are rotated
    n_rot: u32,
    // freq_base^(-2 / n_rot)
    theta_scale: f32,
    freq_scale: f32,
    // YaRN (rope_fns.wgsl): ext_factor (0: none), correction range, cos/sin scale
    yarn_ext: f32,
    yarn_low: f32,
    yarn_high: f32,
    mscale: f32,
    layer: u32,
    // the folded grid's x width
    groups_x: u32,
    // the q/k norms' epsilon
    eps: f32,
    q_scale: f32,
    k_scale: f32,
    // where each vector starts in C
    q_norm_at: u32,
    k_norm_at: u32,
    freq_factors_at: u32,
    k_offset_at: u32,
    v_offset_at: u32,
}

#ifdef HEADS
@group(0) @binding(0) var<uniform> P: HeadsParams;
#else
@group(0) @binding(0) var<uniform> P: StoreKvParams;
#endif
// see STEP in kv_cache.wgsl
@group(0) @binding(1) var<storage, read> STEP: array<u32>;
// see TABLES in kv_cache.wgsl
@group(0) @binding(2) var<storage, read> TABLES: array<u32>;
#ifdef HEADS
// [n_tokens, width] f32: the keys, normalised and rotated in place before they are stored
@group(0) @binding(3) var<storage, read_write> SRC: array<f32>;
#else
// [n_tokens, width] f32
@group(0) @binding(3) var<storage, read> SRC: array<f32>;
#endif
#ifdef KV_Q8_0 || KV_Q4_0
// [n_blocks, block_size, row_words] u32 (atomic: neighbouring blocks share a word of scales)
@group(0) @binding(4) var<storage, read_write> CACHE: array<atomic<u32>>;
#else
// [n_blocks, block_size, row_words] u32
@group(0) @binding(4) var<storage, read_write> CACHE: array<u32>;
#endif
#ifdef KV_OFFSET
#ifdef HEADS
#else
// [width] f32: subtracted from every row before it is quantized (Op::StoreKv's k_offset or
// v_offset)
@group(0) @binding(5) var<storage, read> OFFSET: array<f32>;
#endif
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
#ifdef HEADS
#else
// [width2] f32
@group(0) @binding(8) var<storage, read> OFFSET2: array<f32>;
#endif
#endif
#endif
#ifdef HEADS
// [n_tokens, n_q_heads * head_dim] f32: the queries, normalised, rotated and scaled in place
@group(0) @binding(9) var<storage, read_write> Q: array<f32>;
// [4096] f32, the vectors prepare_heads reads, end to end: q/k norm weights [head_dim],
// RoPE frequency factors [n_rot / 2], key and value offsets [width], [width2]
@group(0) @binding(10) var<uniform> C: array<vec4<f32>, 1024>;
#endif

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
#ifdef HEADS
    let at = select(P.k_offset_at, P.v_offset_at, second) + i;
    return C[at / 4u][at % 4u];
#else
#ifdef SECOND
    if (second) {
        return OFFSET2[i];
    }
#endif
    return OFFSET[i];
#endif
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

fn kv_layer() -> u32 {
    return P.layer;
}

// Stores unit `u` of token `t`'s row of `width` values (of the first buffer, or of the second
// where `second` is set).
fn store_unit(t: u32, u: u32, width: u32) {
    let src = t * width + u * unit_len();
    let row = slot_of(kv_layer(), step_token_seq(t), step_token_pos(t)) * row_words(width);
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
    let d = div_rn(amax, 127.0);
    var id = 0.0;
    if (d != 0.0) {
        id = div_rn(1.0, d);
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
    let d = div_rn(vmax, -8.0);
    var id = 0.0;
    if (d != 0.0) {
        id = div_rn(1.0, d);
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

#ifdef HEADS
#else
// One invocation per (token, unit).
@compute @workgroup_size(256)
fn store_kv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    var i = (wg.y * P.groups_x + wg.x) * 256u + lid.x;
    var width = P.width;
    var units = width / unit_len();
#ifdef SECOND
    if (i >= P.n_tokens * units) {
        i -= P.n_tokens * units;
        width = P.width2;
        units = width / unit_len();
        second = true;
    }
#endif
    if (i >= P.n_tokens * units) {
        return;
    }
    store_unit(i / units, i % units, width);
}
#endif

#ifdef HEADS
const HEAD_THREADS: u32 = 64u;
// One head, head_dim <= 512 (compile.rs checks).
var<workgroup> head: array<f32, 512>;
var<workgroup> partial: array<f32, HEAD_THREADS>;

fn constant(i: u32) -> f32 {
    return C[i / 4u][i % 4u];
}

fn head_load(is_q: bool, i: u32) -> f32 {
    if (is_q) {
        return Q[i];
    }
    return SRC[i];
}

fn head_write(is_q: bool, i: u32, x: f32) {
    if (is_q) {
        Q[i] = x;
    } else {
        SRC[i] = x;
    }
}

// One workgroup per (token, head): query heads, then key heads, then value heads.
@compute @workgroup_size(64)
fn prepare_heads(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n_heads = P.n_q_heads + P.n_k_heads + P.n_v_heads;
    let g = wg.y * P.groups_x + wg.x;
    if (g >= P.n_tokens * n_heads) {
        return;
    }
    let t = g / n_heads;
    let hd = P.head_dim;
    let units = hd / unit_len();
    var h = g % n_heads;
    if (h >= P.n_q_heads + P.n_k_heads) {
        // A value head: stored as it is.
        second = true;
        h -= P.n_q_heads + P.n_k_heads;
        for (var u = lid.x; u < units; u += HEAD_THREADS) {
            store_unit(t, h * units + u, P.n_v_heads * hd);
        }
        return;
    }
    let is_q = h < P.n_q_heads;
    if (!is_q) {
        h -= P.n_q_heads;
    }
    let width = select(P.n_k_heads, P.n_q_heads, is_q) * hd;
    let base = t * width + h * hd;
    for (var i = lid.x; i < hd; i += HEAD_THREADS) {
        head[i] = head_load(is_q, base + i);
    }
    // The norm weight's place in C, or none.
    var norm_at = 0xffffffffu;
#ifdef Q_NORM
    if (is_q) {
        norm_at = P.q_norm_at;
    }
#endif
#ifdef K_NORM
    if (!is_q) {
        norm_at = P.k_norm_at;
    }
#endif
    if (norm_at != 0xffffffffu) {
        // Each thread sums the squares of its own values.
        var s = 0.0;
        for (var i = lid.x; i < hd; i += HEAD_THREADS) {
            s += head[i] * head[i];
        }
        partial[lid.x] = s;
        workgroupBarrier();
        for (var stride = HEAD_THREADS / 2u; stride > 0u; stride /= 2u) {
            if (lid.x < stride) {
                partial[lid.x] += partial[lid.x + stride];
            }
            workgroupBarrier();
        }
        let scale = div_rn(1.0, sqrt(div_rn(partial[0], f32(hd)) + P.eps));
        for (var i = lid.x; i < hd; i += HEAD_THREADS) {
            head[i] = head[i] * scale * constant(norm_at + i);
        }
    }
    workgroupBarrier();
    // RoPE: each thread rotates its own pairs (the pairs partition the rotated values).
    let half_rot = P.n_rot / 2u;
    let theta_scale = P.theta_scale;
    let pos = f32(step_token_pos(t));
    for (var i = lid.x; i < half_rot; i += HEAD_THREADS) {
        var ff = 1.0;
#ifdef FREQ_FACTORS
        ff = constant(P.freq_factors_at + i);
#endif
        let cs = rope_cos_sin(pos, i, theta_scale, P.freq_scale, ff, vec4<f32>(P.yarn_ext, P.yarn_low, P.yarn_high, P.mscale));
#ifdef NEOX
        let i0 = i;
        let i1 = i + half_rot;
#else
        let i0 = 2u * i;
        let i1 = 2u * i + 1u;
#endif
        let r = rope_rotate(head[i0], head[i1], cs);
        head[i0] = r.x;
        head[i1] = r.y;
    }
    workgroupBarrier();
    let factor = select(P.k_scale, P.q_scale, is_q);
    for (var i = lid.x; i < hd; i += HEAD_THREADS) {
        head_write(is_q, base + i, head[i] * factor);
    }
    if (is_q) {
        return;
    }
    // The key head, written by this workgroup, is stored from the key buffer.
    storageBarrier();
    for (var u = lid.x; u < units; u += HEAD_THREADS) {
        store_unit(t, h * units + u, width);
    }
}
#endif
