// Element-wise ops over f32 activations: add, scale, swiglu, geglu, swiglu_oai, concat, last_rows.
// Every entry point uses a 1-D grid of 256-thread workgroups folded into 2-D (x * y) when wider
// than 65535 workgroups; P.groups_x holds the folded grid's x width.
// INPLACE: the output is also the first operand (`out` may alias `a` / `gate`), so the first
// operand is read from OUT and A is not bound. The activation functions are activation_fns.wgsl's.

// Mirrors kernel_params.rs (a test checks the fields).
struct ElementwiseParams {
    // values written
    len: u32,
    // the folded grid's x width
    groups_x: u32,
    // SCALE: the factor
    factor: f32,
    // LAST_ROWS: the row length
    cols: u32,
    // CONCAT: values of a's and of b's slices
    group_a: u32,
    group_b: u32,
}

@group(0) @binding(0) var<uniform> P: ElementwiseParams;
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
    return (wg.y * P.groups_x + wg.x) * 256u + lid.x;
}

fn first(i: u32) -> f32 {
#ifdef INPLACE
    return OUT[i];
#else
    return A[i];
#endif
}

#ifdef ADD
@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = index(wg, lid);
    if (i < P.len) {
        OUT[i] = first(i) + B[i];
    }
}
#endif

#ifdef SCALE
@compute @workgroup_size(256)
fn scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = index(wg, lid);
    if (i < P.len) {
        OUT[i] = OUT[i] * P.factor;
    }
}
#endif

#ifdef SWIGLU
@compute @workgroup_size(256)
fn swiglu(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = index(wg, lid);
    if (i < P.len) {
        OUT[i] = silu(first(i)) * B[i];
    }
}
#endif

#ifdef GEGLU
// GELU as activation_fns.wgsl's gelu_ggml.
@compute @workgroup_size(256)
fn geglu(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = index(wg, lid);
    if (i < P.len) {
        OUT[i] = gelu_ggml(first(i)) * B[i];
    }
}
#endif

#ifdef SWIGLU_OAI
// gpt-oss's clamped SwiGLU, as activation_fns.wgsl's clamped_swiglu.
@compute @workgroup_size(256)
fn swiglu_oai(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = index(wg, lid);
    if (i < P.len) {
        OUT[i] = clamped_swiglu(first(i), B[i]);
    }
}
#endif

#ifdef CONCAT
// Slices of A (group_a values) and B (group_b) side by side: the rows of A: [n, groups * group_a]
// and B: [n, groups * group_b] are runs of slices, so output slice pair p (over all rows) takes
// A's slice p and B's slice p.
@compute @workgroup_size(256)
fn concat(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = index(wg, lid);
    if (i < P.len) {
        let pair = i / (P.group_a + P.group_b);
        let j = i % (P.group_a + P.group_b);
        if (j < P.group_a) {
            OUT[i] = A[pair * P.group_a + j];
        } else {
            OUT[i] = B[pair * P.group_b + j - P.group_a];
        }
    }
}
#endif

#ifdef LAST_ROWS
// [2 + 3 * n_tokens + 3 * n_seqs] u32: n_tokens, n_seqs, token ids, token sequences, token
// positions, then per sequence [pos0, n_tokens, first_token] (see attention.wgsl)
@group(0) @binding(4) var<storage, read> STEP: array<u32>;

// len = n_seqs * cols; A: [n_tokens, cols] f32, OUT: [n_seqs, cols] f32: row s is
// A's row of the last token of sequence s.
@compute @workgroup_size(256)
fn last_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = index(wg, lid);
    if (i < P.len) {
        let cols = P.cols;
        let s = i / cols;
        let info = 2u + 3u * STEP[0] + 3u * s;
        let row = STEP[info + 2u] + STEP[info + 1u] - 1u;
        OUT[i] = A[row * cols + i % cols];
    }
}
#endif
