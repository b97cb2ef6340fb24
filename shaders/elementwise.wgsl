// Element-wise ops over f32 activations: add, scale, swiglu, geglu, last_rows.
// Every entry point uses a 1-D grid of 256-thread workgroups folded into 2-D (x * y) when wider
// than 65535 workgroups; P[1] holds the folded grid's x width.
// INPLACE: the output is also the first operand (`out` may alias `a` / `gate`), so the first
// operand is read from OUT and A is not bound.

// [len, groups_x, ...] u32 (f32 params bitcast)
@group(0) @binding(0) var<storage, read> P: array<u32>;
#ifdef INPLACE
#else
// [len] f32: first operand (a, gate, x)
@group(0) @binding(1) var<storage, read> A: array<f32>;
#endif
#ifdef BINARY
// [len] f32: second operand (b, up)
@group(0) @binding(2) var<storage, read> B: array<f32>;
#endif
// [len] f32: output
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;

fn index(wg: vec3<u32>, lid: vec3<u32>) -> u32 {
    return (wg.y * P[1] + wg.x) * 256u + lid.x;
}

fn first(i: u32) -> f32 {
#ifdef INPLACE
    return OUT[i];
#else
    return A[i];
#endif
}

// tanh without overflow for large |x| (exp(2x) overflows f32 past ~44).
fn safe_tanh(x: f32) -> f32 {
    let t = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - t) / (1.0 + t);
}

fn round_f16(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

#ifdef ADD
// P: [len, groups_x]
@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = index(wg, lid);
    if (i < P[0]) {
        OUT[i] = first(i) + B[i];
    }
}
#endif

#ifdef SCALE
// P: [len, groups_x, factor]
@compute @workgroup_size(256)
fn scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = index(wg, lid);
    if (i < P[0]) {
        OUT[i] = OUT[i] * bitcast<f32>(P[2]);
    }
}
#endif

#ifdef SWIGLU
// P: [len, groups_x]
@compute @workgroup_size(256)
fn swiglu(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = index(wg, lid);
    if (i < P[0]) {
        let g = first(i);
        OUT[i] = g / (1.0 + exp(-g)) * B[i];
    }
}
#endif

#ifdef GEGLU
// P: [len, groups_x]. GELU (tanh form) of the f16-rounded input, rounded to f16, as ggml's CPU
// table does.
@compute @workgroup_size(256)
fn geglu(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = index(wg, lid);
    if (i < P[0]) {
        let x = first(i);
        var y: f32;
        if (x <= -10.0) {
            y = 0.0;
        } else if (x >= 10.0) {
            y = x;
        } else {
            let h = round_f16(x);
            y = round_f16(0.5 * h * (1.0 + safe_tanh(0.7978846 * h * (1.0 + 0.044715 * h * h))));
        }
        OUT[i] = y * B[i];
    }
}
#endif

#ifdef LAST_ROWS
// [2 + 3 * n_tokens + 3 * n_seqs] u32: n_tokens, n_seqs, token ids, token sequences, token
// positions, then per sequence [pos0, n_tokens, first_token] (see attention.wgsl)
@group(0) @binding(4) var<storage, read> STEP: array<u32>;

// P: [n_seqs * cols, groups_x, cols]; A: [n_tokens, cols] f32, OUT: [n_seqs, cols] f32: row s is
// A's row of the last token of sequence s.
@compute @workgroup_size(256)
fn last_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = index(wg, lid);
    if (i < P[0]) {
        let cols = P[2];
        let s = i / cols;
        let info = 2u + 3u * STEP[0] + 3u * s;
        let row = STEP[info + 2u] + STEP[info + 1u] - 1u;
        OUT[i] = A[row * cols + i % cols];
    }
}
#endif
