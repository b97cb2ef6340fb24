// Rotary position embedding, in place, one thread per (token, head, rotated pair).
// NEOX rotates (i, i + n_rot/2); otherwise adjacent pairs (2i, 2i+1). FREQ_FACTORS divides each
// pair's angle by a per-pair factor (llama 3). SECOND rotates a second buffer with the same
// parameters in the same dispatch (k after q): its invocations follow the first buffer's.

// Mirrors kernel_params.rs (a test checks the fields).
struct RopeParams {
    n_tokens: u32,
    n_heads: u32,
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
    // X's row length
    cols: u32,
    // the folded grid's x width
    groups_x: u32,
    // SECOND: X2's heads and row length
    n_heads2: u32,
    cols2: u32,
}

@group(0) @binding(0) var<uniform> P: RopeParams;
// [2 + 3 * n_tokens + 3 * n_seqs] u32: n_tokens, n_seqs, token ids, token sequences,
// token positions, per-sequence info (see attention.wgsl)
@group(0) @binding(1) var<storage, read> STEP: array<u32>;
#ifdef FREQ_FACTORS
// [n_rot / 2] f32 (GGUF F32 bytes)
@group(0) @binding(2) var<storage, read> FF: array<f32>;
#endif
// [n_tokens, n_heads * head_dim] f32
@group(0) @binding(3) var<storage, read_write> X: array<f32>;
#ifdef SECOND
// [n_tokens, n_heads2 * head_dim] f32
@group(0) @binding(4) var<storage, read_write> X2: array<f32>;
#endif

@compute @workgroup_size(64)
fn rope(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let half_rot = P.n_rot / 2u;
    var id = (wg.y * P.groups_x + wg.x) * 64u + lid.x;
    var per_token = P.n_heads * half_rot;
    var cols = P.cols;
    var second = false;
#ifdef SECOND
    if (id >= P.n_tokens * per_token) {
        id -= P.n_tokens * per_token;
        per_token = P.n_heads2 * half_rot;
        cols = P.cols2;
        second = true;
    }
#endif
    if (id >= P.n_tokens * per_token) {
        return;
    }
    let t = id / per_token;
    let h = (id % per_token) / half_rot;
    let i = id % half_rot;
    var ff = 1.0;
#ifdef FREQ_FACTORS
    ff = FF[i];
#endif
    let yarn = vec4<f32>(P.yarn_ext, P.yarn_low, P.yarn_high, P.mscale);
    let cs = rope_cos_sin(f32(STEP[2u + 2u * STEP[0] + t]), i, P.theta_scale, P.freq_scale, ff, yarn);
    let base = t * cols + h * P.head_dim;
#ifdef NEOX
    let i0 = base + i;
    let i1 = base + i + half_rot;
#else
    let i0 = base + 2u * i;
    let i1 = base + 2u * i + 1u;
#endif
    if (second) {
#ifdef SECOND
        let r = rope_rotate(X2[i0], X2[i1], cs);
        X2[i0] = r.x;
        X2[i1] = r.y;
#endif
    } else {
        let r = rope_rotate(X[i0], X[i1], cs);
        X[i0] = r.x;
        X[i1] = r.y;
    }
}
