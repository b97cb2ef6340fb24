// Element-wise ops over f32 activations: add, scale, swiglu, geglu, last_rows.
// Every entry point uses a 1-D grid of 256-thread workgroups folded into 2-D (x * y) when wider
// than 65535 workgroups; P[1] holds the folded grid's x width.
// INPLACE: the output is also the first operand (`out` may alias `a` / `gate`), so the first
// operand is read from OUT and A is not bound. The activation functions are activation_fns.wgsl's.

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
        OUT[i] = silu(first(i)) * B[i];
    }
}
#endif

#ifdef GEGLU
// P: [len, groups_x]. GELU as activation_fns.wgsl's gelu_ggml.
@compute @workgroup_size(256)
fn geglu(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = index(wg, lid);
    if (i < P[0]) {
        OUT[i] = gelu_ggml(first(i)) * B[i];
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
