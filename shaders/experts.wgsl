// Mixture-of-experts routing and combination, as llama.cpp's build_moe_ffn and the CPU backend
// (hearth-cpu experts.rs) compute them; the chosen experts' products are the mat-muls' EXPERTS
// variant (matmul_q8.wgsl, quant.wgsl), which read the ids written here on the device.
// route_experts (ROUTE): per token, the router's probabilities (SOFTMAX: a softmax of the row;
//   SOFTMAX_OF_CHOSEN: the logits themselves; otherwise a sigmoid of each logit), its n_used most
//   probable experts, ties to the lower id, and their probabilities as weights (SOFTMAX_OF_CHOSEN:
//   a softmax of the chosen logits), renormalised to sum 1 (NORMALIZE), times P.scale.
//   SELECTION_BIAS: experts are chosen by their probability plus a bias, weighed by the
//   probability alone. GROUPS: only from the P.n_group_used best of P.n_group equal groups of
//   experts, a group's score the sum of its two best selection scores (DeepSeek-V3).
// combine_experts (COMBINE): out[t, c] = Σ_j weights[t, j] · x[t, j * cols + c], slot after slot.
// group_experts (GROUP): a step's (token, slot) pairs sorted by expert and cut into tiles of at
//   most P.cols pairs of one expert, for the mat-muls' EXPERTS_GROUPED variant (matmul_q8.wgsl).

// Mirrors kernel_params.rs (a test checks the fields).
struct ExpertParams {
    // tokens (rows of every buffer)
    n_tokens: u32,
    // ROUTE: experts (columns of the logits), at most MAX_EXPERTS
    n_expert: u32,
    // experts chosen per token
    n_used: u32,
    // ROUTE: the factor applied to the weights
    scale: f32,
    // COMBINE: values of a token's output row; GROUP: pairs a tile
    cols: u32,
    // the folded grid's x width
    groups_x: u32,
    // TALLY: the router's first counter
    tally_base: u32,
    // GROUPS: expert groups (at most ROUTE_WG), and how many of them are chosen from
    n_group: u32,
    n_group_used: u32,
}

@group(0) @binding(0) var<uniform> P: ExpertParams;

#ifdef ROUTE
// [n_tokens, n_expert] f32: the router's logits
@group(0) @binding(1) var<storage, read> LOGITS: array<f32>;
// [n_tokens, n_used] u32: the chosen experts, most probable first
@group(0) @binding(2) var<storage, read_write> IDS: array<u32>;
// [n_tokens, n_used] f32: their weights
@group(0) @binding(3) var<storage, read_write> WEIGHTS: array<f32>;
#ifdef TALLY
// [65536] u32: tokens routed per (router, expert) since the backend started (tally.rs); this
// router's experts from P.tally_base
@group(0) @binding(4) var<storage, read_write> TALLY: array<atomic<u32>>;
#endif
#ifdef SELECTION_BIAS
// [n_expert] f32: added to the probabilities to choose experts
@group(0) @binding(5) var<storage, read> BIAS: array<f32>;
#endif

// ggml's floor for the chosen probabilities' sum before dividing by it.
const MIN_WEIGHT_SUM: f32 = 6.1035156e-5;
// The widest router a workgroup holds (compile.rs MAX_ROUTED_EXPERTS refuses wider ones; the
// widest in use has 512 experts).
const MAX_EXPERTS: u32 = 1024u;
const ROUTE_WG: u32 = 64u;
// Below every finite logit a router makes (attention.wgsl's floor; -3.4028235e38 itself rounds
// past f32 as an abstract float, which Tint refuses).
const LOWEST: f32 = -3.0e38;

// [n_expert] the token's probabilities
var<workgroup> probs: array<f32, MAX_EXPERTS>;
// [n_expert] the scores that choose: the probabilities (plus the bias; LOWEST outside the chosen
// groups), a chosen expert's set to LOWEST once picked
var<workgroup> selection: array<f32, MAX_EXPERTS>;
#ifdef GROUPS
// [n_group] whether the group is chosen from
var<workgroup> group_chosen: array<u32, ROUTE_WG>;
#endif
// per thread: its best candidate (or its partial max / sum), then the tree reduction's
var<workgroup> best_p: array<f32, ROUTE_WG>;
var<workgroup> best_id: array<u32, ROUTE_WG>;

// Reduces best_p to its maximum (MAX) or sum in best_p[0].
fn reduce_values(tid: u32, take_max: bool) {
    workgroupBarrier();
    for (var stride = ROUTE_WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride) {
            let other = best_p[tid + stride];
            best_p[tid] = select(best_p[tid] + other, max(best_p[tid], other), take_max);
        }
        workgroupBarrier();
    }
}

// grid: n_tokens workgroups folded into x*y, a workgroup per token: its threads stride the experts
// to compute each probability once (into workgroup memory), then each of the n_used picks is a
// workgroup arg-max over the probabilities not yet picked, in the order (probability descending,
// id ascending), so ties go to the lower id.
@compute @workgroup_size(64)
fn route_experts(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wg.y * P.groups_x + wg.x;
    if (t >= P.n_tokens) {
        return;
    }
    let tid = lid.x;
    let n_expert = P.n_expert;
    let row = t * n_expert;
#ifdef SOFTMAX
    var partial = LOWEST;
    for (var e = tid; e < n_expert; e += ROUTE_WG) {
        partial = max(partial, LOGITS[row + e]);
    }
    best_p[tid] = partial;
    reduce_values(tid, true);
    let shift = best_p[0];
    workgroupBarrier();
    partial = 0.0;
    for (var e = tid; e < n_expert; e += ROUTE_WG) {
        let v = exp(LOGITS[row + e] - shift);
        probs[e] = v;
        partial += v;
    }
    best_p[tid] = partial;
    reduce_values(tid, false);
    let inv_sum = 1.0 / best_p[0];
    for (var e = tid; e < n_expert; e += ROUTE_WG) {
        probs[e] = probs[e] * inv_sum;
    }
#endif
#ifdef SOFTMAX_OF_CHOSEN
    for (var e = tid; e < n_expert; e += ROUTE_WG) {
        probs[e] = LOGITS[row + e];
    }
#endif
#ifdef SOFTMAX || SOFTMAX_OF_CHOSEN
#else
    for (var e = tid; e < n_expert; e += ROUTE_WG) {
        probs[e] = 1.0 / (1.0 + exp(-LOGITS[row + e]));
    }
#endif
    for (var e = tid; e < n_expert; e += ROUTE_WG) {
#ifdef SELECTION_BIAS
        selection[e] = probs[e] + BIAS[e];
#else
        selection[e] = probs[e];
#endif
    }
#ifdef GROUPS
    // Each group's score (a thread per group): its two best selection scores summed, as the
    // CPU's mask_groups; then thread 0 keeps the best P.n_group_used, ties to the lower group.
    workgroupBarrier();
    let per_group = n_expert / P.n_group;
    if (tid < P.n_group) {
        var first_best = LOWEST;
        var second_best = LOWEST;
        for (var e = tid * per_group; e < (tid + 1u) * per_group; e++) {
            let s = selection[e];
            if (s > first_best) {
                second_best = first_best;
                first_best = s;
            } else if (s > second_best) {
                second_best = s;
            }
        }
        best_p[tid] = first_best + second_best;
        group_chosen[tid] = 0u;
    }
    workgroupBarrier();
    if (tid == 0u) {
        for (var j = 0u; j < P.n_group_used; j++) {
            var best = 0u;
            var best_score = 0.0;
            var found = false;
            for (var g = 0u; g < P.n_group; g++) {
                if (group_chosen[g] == 0u && (!found || best_p[g] > best_score)) {
                    best = g;
                    best_score = best_p[g];
                    found = true;
                }
            }
            group_chosen[best] = 1u;
        }
    }
    workgroupBarrier();
    for (var e = tid; e < n_expert; e += ROUTE_WG) {
        if (group_chosen[e / per_group] == 0u) {
            selection[e] = LOWEST;
        }
    }
#endif
    workgroupBarrier();
    let first = t * P.n_used;
    var total = 0.0;
    for (var j = 0u; j < P.n_used; j++) {
        // Each thread's candidate among its experts: a strictly larger probability, scanning ids
        // upwards, keeps the lower id.
        var candidate_p = LOWEST;
        var candidate = 0u;
        for (var e = tid; e < n_expert; e += ROUTE_WG) {
            let p = selection[e];
            if (p > candidate_p) {
                candidate_p = p;
                candidate = e;
            }
        }
        best_p[tid] = candidate_p;
        best_id[tid] = candidate;
        workgroupBarrier();
        for (var stride = ROUTE_WG / 2u; stride > 0u; stride /= 2u) {
            if (tid < stride) {
                let p = best_p[tid + stride];
                let id = best_id[tid + stride];
                if (p > best_p[tid] || (p == best_p[tid] && id < best_id[tid])) {
                    best_p[tid] = p;
                    best_id[tid] = id;
                }
            }
            workgroupBarrier();
        }
        if (tid == 0u) {
            let chosen = best_id[0];
            IDS[first + j] = chosen;
            WEIGHTS[first + j] = probs[chosen];
            total += probs[chosen];
            selection[chosen] = LOWEST;
#ifdef TALLY
            atomicAdd(&TALLY[P.tally_base + chosen], 1u);
#endif
        }
        workgroupBarrier();
    }
    if (tid == 0u) {
#ifdef SOFTMAX_OF_CHOSEN
        // The chosen logits' softmax: shifted by the largest (the first chosen: validate refuses
        // a selection bias here), the exponentials times the reciprocal of their sum (in f32,
        // where the CPU sums in f64).
        let top = WEIGHTS[first];
        var sum = 0.0;
        for (var j = 0u; j < P.n_used; j++) {
            let e = exp(WEIGHTS[first + j] - top);
            WEIGHTS[first + j] = e;
            sum += e;
        }
        let inv = 1.0 / sum;
        total = 0.0;
        for (var j = 0u; j < P.n_used; j++) {
            WEIGHTS[first + j] = WEIGHTS[first + j] * inv;
            total += WEIGHTS[first + j];
        }
#endif
#ifdef NORMALIZE
        let norm = max(total, MIN_WEIGHT_SUM);
#else
        let norm = 1.0;
#endif
        for (var j = 0u; j < P.n_used; j++) {
            WEIGHTS[first + j] = WEIGHTS[first + j] / norm * P.scale;
        }
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

#ifdef GROUP
// [n_tokens * n_used] u32: each (token, slot) pair's expert (route_experts' ids)
@group(0) @binding(1) var<storage, read> PAIR_IDS: array<u32>;
// [n_tokens * n_used] u32: the pairs sorted by expert
@group(0) @binding(2) var<storage, read_write> ORDER: array<u32>;
// [1 + 3 * tiles] u32: the tile count, then each tile's (expert, first index in ORDER, pairs)
@group(0) @binding(3) var<storage, read_write> TILES: array<u32>;

const GROUP_WG: u32 = 256u;
const MAX_GROUP_EXPERTS: u32 = 1024u;
// Each expert's pairs, then its next free place in ORDER.
var<workgroup> expert_count: array<atomic<u32>, MAX_GROUP_EXPERTS>;
// Where each expert's pairs start in ORDER.
var<workgroup> expert_start: array<u32, MAX_GROUP_EXPERTS>;

// grid: one workgroup. Counts each expert's pairs, lays them out expert after expert in ORDER
// (within an expert in no particular order: a pair's product does not depend on its tile's other
// pairs) and cuts each expert's run into tiles of at most P.cols pairs.
@compute @workgroup_size(256)
fn group_experts(@builtin(local_invocation_id) lid: vec3<u32>) {
    let tid = lid.x;
    let n_pairs = P.n_tokens * P.n_used;
    for (var e = tid; e < P.n_expert; e += GROUP_WG) {
        atomicStore(&expert_count[e], 0u);
    }
    workgroupBarrier();
    for (var p = tid; p < n_pairs; p += GROUP_WG) {
        atomicAdd(&expert_count[PAIR_IDS[p]], 1u);
    }
    workgroupBarrier();
    if (tid == 0u) {
        var at = 0u;
        var tiles = 0u;
        for (var e = 0u; e < P.n_expert; e++) {
            let count = atomicLoad(&expert_count[e]);
            expert_start[e] = at;
            for (var first = 0u; first < count; first += P.cols) {
                TILES[1u + 3u * tiles] = e;
                TILES[2u + 3u * tiles] = at + first;
                TILES[3u + 3u * tiles] = min(P.cols, count - first);
                tiles++;
            }
            at += count;
            atomicStore(&expert_count[e], 0u);
        }
        TILES[0] = tiles;
    }
    workgroupBarrier();
    for (var p = tid; p < n_pairs; p += GROUP_WG) {
        let e = PAIR_IDS[p];
        ORDER[expert_start[e] + atomicAdd(&expert_count[e], 1u)] = p;
    }
}
#endif
