// Mixture-of-experts routing and combination, as llama.cpp's build_moe_ffn and the CPU backend
// (hearth-cpu experts.rs) compute them; the chosen experts' products are the mat-muls' EXPERTS
// variant (matmul_q8.wgsl, quant.wgsl), which read the ids written here on the device.
// route_experts (ROUTE): per token, the router's probabilities (SOFTMAX: a softmax of the row;
//   otherwise a sigmoid of each logit), its n_used most probable experts, ties to the lower id,
//   and their probabilities as weights, renormalised to sum 1 (NORMALIZE), times P.scale.
// combine_experts (COMBINE): out[t, c] = Σ_j weights[t, j] · x[t, j * cols + c], slot after slot.

// Mirrors kernel_params.rs (a test checks the fields).
struct ExpertParams {
    // tokens (rows of every buffer)
    n_tokens: u32,
    // ROUTE: experts (columns of the logits)
    n_expert: u32,
    // experts chosen per token
    n_used: u32,
    // ROUTE: the factor applied to the weights
    scale: f32,
    // COMBINE: values of a token's output row
    cols: u32,
    // COMBINE: the folded grid's x width
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: ExpertParams;

#ifdef ROUTE
// [n_tokens, n_expert] f32: the router's logits
@group(0) @binding(1) var<storage, read> LOGITS: array<f32>;
// [n_tokens, n_used] u32: the chosen experts, most probable first
@group(0) @binding(2) var<storage, read_write> IDS: array<u32>;
// [n_tokens, n_used] f32: their weights
@group(0) @binding(3) var<storage, read_write> WEIGHTS: array<f32>;

// ggml's floor for the chosen probabilities' sum before dividing by it.
const MIN_WEIGHT_SUM: f32 = 6.1035156e-5;

// Expert e's probability for token t (`shift` and `inv_sum`: the softmax's maximum and 1 / Σ).
fn probability(t: u32, e: u32, shift: f32, inv_sum: f32) -> f32 {
    let l = LOGITS[t * P.n_expert + e];
#ifdef SOFTMAX
    return exp(l - shift) * inv_sum;
#else
    return 1.0 / (1.0 + exp(-l));
#endif
}

// grid: ceil(n_tokens / 64) workgroups, an invocation per token (a router row is a few hundred
// values at most; the n_used picks rescan it rather than sort it)
@compute @workgroup_size(64)
fn route_experts(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    if (t >= P.n_tokens) {
        return;
    }
    let n_expert = P.n_expert;
    var shift = 0.0;
    var inv_sum = 1.0;
#ifdef SOFTMAX
    shift = LOGITS[t * n_expert];
    for (var e = 1u; e < n_expert; e++) {
        shift = max(shift, LOGITS[t * n_expert + e]);
    }
    var sum = 0.0;
    for (var e = 0u; e < n_expert; e++) {
        sum += exp(LOGITS[t * n_expert + e] - shift);
    }
    inv_sum = 1.0 / sum;
#endif
    // Pick j is the most probable expert after pick j - 1 in the order (probability descending,
    // id ascending): a strictly larger probability, scanning ids upwards, keeps the lower id.
    var last_p = 0.0;
    var last_id = 0u;
    var total = 0.0;
    let first = t * P.n_used;
    for (var j = 0u; j < P.n_used; j++) {
        var best_p = -1.0;
        var best = 0u;
        for (var e = 0u; e < n_expert; e++) {
            let p = probability(t, e, shift, inv_sum);
            let after_last = j == 0u || p < last_p || (p == last_p && e > last_id);
            if (after_last && p > best_p) {
                best_p = p;
                best = e;
            }
        }
        IDS[first + j] = best;
        WEIGHTS[first + j] = best_p;
        total += best_p;
        last_p = best_p;
        last_id = best;
    }
#ifdef NORMALIZE
    let norm = max(total, MIN_WEIGHT_SUM);
    for (var j = 0u; j < P.n_used; j++) {
        WEIGHTS[first + j] = WEIGHTS[first + j] / norm;
    }
#endif
    for (var j = 0u; j < P.n_used; j++) {
        WEIGHTS[first + j] = WEIGHTS[first + j] * P.scale;
    }
}
#endif

#ifdef COMBINE
// [n_tokens, n_used * cols] f32: each chosen expert's output, slot after slot
@group(0) @binding(4) var<storage, read> X: array<f32>;
// [n_tokens, n_used] f32: route_experts' weights
@group(0) @binding(5) var<storage, read> SLOT_WEIGHTS: array<f32>;
// [n_tokens, cols] f32
@group(0) @binding(6) var<storage, read_write> OUT: array<f32>;

// grid: ceil(n_tokens * cols / 256) workgroups folded into x*y, an invocation per output value
@compute @workgroup_size(256)
fn combine_experts(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = (wg.y * P.groups_x + wg.x) * 256u + lid.x;
    let cols = P.cols;
    if (i >= P.n_tokens * cols) {
        return;
    }
    let t = i / cols;
    let c = i % cols;
    let n_used = P.n_used;
    let row = t * n_used * cols + c;
    var acc = X[row] * SLOT_WEIGHTS[t * n_used];
    for (var j = 1u; j < n_used; j++) {
        acc += X[row + j * cols] * SLOT_WEIGHTS[t * n_used + j];
    }
    OUT[i] = acc;
}
#endif
