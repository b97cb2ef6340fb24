// Quantized weights times 8-bit activations: out = x · Wᵀ (+ bias) with integer dot products.
//
// The activations come from act_quant.wgsl as the CPU rounds them (Q8_K blocks of 256 for the
// K-quants, Q8_0 blocks of 32 for the others), so each block's integer sum is exactly the CPU's
// and only the f32 sums of the blocks' scaled results are ordered differently.
// Weights are bound as array<u32>, blocks in row order (a tensor too large for one binding is
// split into row ranges, each its own buffer starting at row `row0`), each read as whole aligned
// words: the GGUF blocks of Q4_1, Q5_1 (5, 6 words), Q2_K, Q4_K and Q5_K (21, 36, 44 words)
// unchanged; Q4_0, Q5_0, Q8_0, Q3_K, Q6_K and MXFP4 as weights.rs's `SplitScales` lays them out,
// the block bodies (4, 5, 8, 27, 52, 4 words) followed by every block's scale (an f16, MXFP4's
// exponent byte). Segment s's weight type is the define Ts_TYPE (T0_Q4_K, T1_Q6_K, ...), all
// segments rounding their activations alike: Q4_0, Q5_0, Q8_0, MXFP4 (32-value blocks, Q8_0
// activations; MXFP4's codes become their doubled E2M1 values, mxfp4_fns.wgsl); Q4_1, Q5_1 (32-value blocks,
// Q8_1 activations: Q8_0's with each block's code sum times its scale); or with SUPER_BLOCKS
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-value super-blocks, Q8_K activations).
//
// Shape (the one the fastest WebGPU engines use): a 64-invocation workgroup computes ROWS weight
// rows for TILE_T tokens; THREADS invocations share a weight block (16 for a 256-value
// super-block, 2 for a 32-value block), each reading its 16 values as whole u32 words and
// holding the matching activation words in registers across the rows. A token's result does not
// depend on how many tokens share its workgroup (the same invocation adds the same blocks in the
// same order), so batches, speculative verification and decoding agree exactly.
//
// Variants: DOT4 uses dot4I8Packed (the WGSL packed_4x8_integer_dot_product language feature;
// native, or Naga's polyfill where the device lacks it), otherwise bytes are unpacked by shifts.
// SUBGROUPS sums partial results with subgroupAdd, otherwise through a shared-memory tree. DECODE
// is the single-token tile. RESIDUAL / RESIDUAL_IN_PLACE add the residual stream (from RESID,
// or what OUT holds) to the result, as the Add this epilogue replaces computes it.
// SEGMENTS (SEGMENT3 for a third) computes the products of sibling mat-muls, which read the same
// activations with weights of the same family and row length (q/k/v, gate/up), in one dispatch:
// segment s has its own weights (W0, W1, W2) and output (OUT0, OUT1, OUT2) and owns a contiguous
// range of workgroups, so each workgroup's segment is uniform; their biases lie end to end in
// BIAS_W. The weight-reading code is written once and repeated per segment (`#foreach`), each
// copy reading its own binding as its own type, so a workgroup chooses its segment once, not on
// every load.
// EXPERTS (with DECODE, one segment) multiplies a mixture of experts' chosen experts: the binding
// holds P.n_expert experts' matrices of P.rows rows one after another, and grid z is one (token,
// slot) pair, whose expert id route_experts wrote to IDS: the recorded step never changes with
// the routing. Its activation row is the token's or, with PER_SLOT, the pair's own (x holding
// n_used slices a token); its output is row `pair` of [n_tokens * n_used, n] (IDS and
// expert_pair: matmul_params.wgsl). Experts too large for one binding together lie in up to
// three (W0, W1, W2 with WEIGHTS1, WEIGHTS2), P.experts_per_binding whole experts each.
// EXPERTS_GROUPED (TILE_T pairs a workgroup) multiplies the
// same pairs a step of many tokens makes, grouped by expert (experts.wgsl group_experts): grid z
// is one tile of up to TILE_T pairs of one expert, so each weight block is read once per tile
// rather than once per pair; z past the last tile returns at once. A pair's result is the same
// bits in either variant (the same invocations add the same blocks in the same order).
#ifdef SUBGROUPS_DIRECTIVE
enable subgroups;
#endif

// MatMulParams: matmul_params.wgsl; a uniform, so that the storage bindings of three segments
// fit in WebGPU's 8 per stage
@group(0) @binding(0) var<uniform> P: MatMulParams;
// [rows_in_chunk * k / BLOCK_LEN] blocks (see the top), padded to 4 bytes
@group(0) @binding(1) var<storage, read> W0: array<u32>;
// [n_tokens * k / 4] u32 codes, then from word scales_at [n_tokens * k / block_len] f32 scales,
// for Q8_1 (d, s) pairs (act_quant.wgsl's layout)
@group(0) @binding(2) var<storage, read> XQ: array<u32>;
// [n_tokens, n] f32
@group(0) @binding(3) var<storage, read_write> OUT0: array<f32>;
#ifdef BIAS
// [n] f32 (stored as the GGUF F32 bytes); with SEGMENTS each segment's [n] in turn
@group(0) @binding(4) var<storage, read> BIAS_W: array<f32>;
#endif
#ifdef RESIDUAL
// [n_tokens, n] f32: added to the product (an Add folded into this epilogue)
@group(0) @binding(5) var<storage, read> RESID: array<f32>;
#endif
#ifdef WEIGHTS1
// segment 1: [rows_1 * k / BLOCK_LEN] blocks (with EXPERTS: the second binding of experts)
@group(0) @binding(6) var<storage, read> W1: array<u32>;
#endif
#ifdef SEGMENTS
// segment 1's output [n_tokens, n_1] f32
@group(0) @binding(7) var<storage, read_write> OUT1: array<f32>;
#endif
#ifdef WEIGHTS2
// segment 2: [rows_2 * k / BLOCK_LEN] blocks (with EXPERTS: the third binding of experts)
@group(0) @binding(8) var<storage, read> W2: array<u32>;
#endif
#ifdef SEGMENT3
// segment 2's output [n_tokens, n_2] f32
@group(0) @binding(9) var<storage, read_write> OUT2: array<f32>;
#endif
#ifdef EXPERTS_GROUPED
// [n_tokens * n_used] u32: the pairs sorted by expert
@group(0) @binding(11) var<storage, read> ORDER: array<u32>;
// [1 + 3 * tiles] u32: the tile count, then each tile's (expert, first index in ORDER, pairs)
@group(0) @binding(12) var<storage, read> TILES: array<u32>;
// This workgroup's tile (expert, first index in ORDER, pairs): 0 pairs past the last tile.
var<workgroup> tile: vec3<u32>;
// The tile's pairs: their activation rows and output rows.
var<private> tile_act: array<u32, TILE_T>;
var<private> tile_out: array<u32, TILE_T>;
#endif

// The activation row of tile token t: the step's row t0 + t, or a grouped tile's t-th pair's.
fn act_row(t0: u32, t: u32) -> u32 {
#ifdef EXPERTS_GROUPED
    return tile_act[t];
#else
    return t0 + t;
#endif
}

// The output row of tile token t.
fn out_row(out_t0: u32, t: u32) -> u32 {
#ifdef EXPERTS_GROUPED
    return tile_out[t];
#else
    return out_t0 + t;
#endif
}

fn store_out(segment: u32, at: u32, v: f32) {
#ifdef SEGMENT3
    if (segment == 2u) {
        OUT2[at] = v;
        return;
    }
#endif
#ifdef SEGMENTS
    if (segment == 1u) {
        OUT1[at] = v;
        return;
    }
#endif
    OUT0[at] = v;
}

const WG: u32 = 64u;
const ROWS: u32 = 4u;
#ifdef DECODE
const TILE_T: u32 = 1u;
#else
const TILE_T: u32 = 8u;
#endif
#ifdef SUPER_BLOCKS
const THREADS: u32 = 16u;
const BLOCK_LEN: u32 = 256u;
#else
const THREADS: u32 = 2u;
const BLOCK_LEN: u32 = 32u;
#endif
const BLOCKS_AT_ONCE: u32 = WG / THREADS;
const OUTPUTS: u32 = ROWS * TILE_T;

// Byte `i` (0..3) of `w`, sign-extended.
fn i8_in(w: u32, i: u32) -> i32 {
    return i32(w << (24u - 8u * i)) >> 24u;
}

// Σ of the products of the 4 signed bytes of a and b.
fn dot4(a: u32, b: u32) -> i32 {
#ifdef DOT4
    return dot4I8Packed(a, b);
#else
    let x = vec4<i32>(i32(a << 24u), i32(a << 16u), i32(a << 8u), i32(a)) >> vec4<u32>(24u);
    let y = vec4<i32>(i32(b << 24u), i32(b << 16u), i32(b << 8u), i32(b)) >> vec4<u32>(24u);
    return dot(x, y);
#endif
}

const ONES: u32 = 0x01010101u;
const LOW4: u32 = 0x0f0f0f0fu;

// One token's activation words for this invocation's values of a block, their sums (for the
// weight types whose codes carry an offset or a min), the block's scale and, for Q8_1, the
// block's code sum times its scale.
struct Act {
    q: vec4<u32>,
    sums: vec4<i32>,
    d: f32,
    s: f32,
}

// Q4_K sub-block j's 6-bit (scale, min) from the 12 scale bytes in s.
fn scale_min_k4(j: u32, s: vec3<u32>) -> vec2<i32> {
    let byte = vec4<u32>(j, j + 4u, j + 8u, j - 4u);
    var sc: u32;
    var m: u32;
    if (j < 4u) {
        sc = (s[j / 4u] >> (8u * (j % 4u))) & 63u;
        m = (s[(j + 4u) / 4u] >> (8u * (j % 4u))) & 63u;
    } else {
        let hi = (s[2u] >> (8u * (j % 4u))) & 0xffu; // byte j + 4
        let lo_sc = (s[0u] >> (8u * (j % 4u))) & 0xffu; // byte j - 4
        let lo_m = (s[1u] >> (8u * (j % 4u))) & 0xffu; // byte j
        sc = (hi & 0xfu) | ((lo_sc >> 6u) << 4u);
        m = (hi >> 4u) | ((lo_m >> 6u) << 4u);
    }
    return vec2<i32>(i32(sc), i32(m));
}

// A weight block's codes for this invocation, decoded once and applied to every token.
struct Weights {
    q: vec4<u32>,
    // Q4_K, Q5_K: (scale, min) of the low and high sub-blocks; Q2_K, Q3_K, Q6_K: the 4 sub-block
    // scales.
    sc: vec4<i32>,
    // Q2_K: the 4 sub-block mins.
    mins: vec4<i32>,
    d: f32,
    // Q4_1, Q5_1: the block's min, for one slot only (the other's 0: the term is the block's);
    // the K-quants with mins: the super-block's scale of the mins.
    dmin: f32,
}

// Byte `i` (0..3) of `w`, unsigned.
fn u8_in(w: u32, i: u32) -> i32 {
    return i32((w >> (8u * i)) & 0xffu);
}

// Bit i of x (i < 4) to bit 0 of byte i.
fn spread_bits(x: u32) -> u32 {
    return (x & 1u) | ((x & 2u) << 7u) | ((x & 4u) << 14u) | ((x & 8u) << 21u);
}

#foreach $S in 0, 1 if WEIGHTS1, 2 if WEIGHTS2
// Words of a block (its body, for the types whose scales follow the bodies).
#ifdef T$S_Q4_K
const BLOCK_WORDS_$S: u32 = 36u;
#endif
#ifdef T$S_Q6_K
const BLOCK_WORDS_$S: u32 = 52u;
#endif
#ifdef T$S_Q8_0
const BLOCK_WORDS_$S: u32 = 8u;
#endif
#ifdef T$S_Q5_0
const BLOCK_WORDS_$S: u32 = 5u;
#endif
#ifdef T$S_Q4_0 || T$S_MXFP4
const BLOCK_WORDS_$S: u32 = 4u;
#endif
#ifdef T$S_Q4_1
const BLOCK_WORDS_$S: u32 = 5u;
#endif
#ifdef T$S_Q5_1
const BLOCK_WORDS_$S: u32 = 6u;
#endif
#ifdef T$S_Q2_K
const BLOCK_WORDS_$S: u32 = 21u;
#endif
#ifdef T$S_Q3_K
const BLOCK_WORDS_$S: u32 = 27u;
#endif
#ifdef T$S_Q5_K
const BLOCK_WORDS_$S: u32 = 44u;
#endif

// Where this invocation's values sit in a block, in activation words from the block's start.
fn act_words_$S(slot: u32) -> vec4<u32> {
#ifdef T$S_Q4_K || T$S_Q5_K
    // chunk c = slot / 4 of 64 values: low nibbles are values 64c + 8p.., high ones 64c + 32 + 8p..
    let c = slot / 4u;
    let p = slot % 4u;
    let lo = (64u * c + 8u * p) / 4u;
    return vec4<u32>(lo, lo + 1u, lo + 8u, lo + 9u);
#endif
#ifdef T$S_Q2_K || T$S_Q3_K || T$S_Q6_K
    // half n = slot / 8, l0 = 4 (slot % 8): values 128n + 32g + l0.. for g = 0..3
    let at = (128u * (slot / 8u) + 4u * (slot % 8u)) / 4u;
    return vec4<u32>(at, at + 8u, at + 16u, at + 24u);
#endif
#ifdef T$S_Q8_0
    // values 16p..16p+15
    return vec4<u32>(4u * slot, 4u * slot + 1u, 4u * slot + 2u, 4u * slot + 3u);
#endif
#ifdef T$S_Q4_0 || T$S_Q5_0 || T$S_Q4_1 || T$S_Q5_1 || T$S_MXFP4
    // values 8p.. (low nibbles) and 16 + 8p.. (high nibbles)
    return vec4<u32>(2u * slot, 2u * slot + 1u, 2u * slot + 4u, 2u * slot + 5u);
#endif
}

fn load_act_$S(token: u32, block: u32, slot: u32) -> Act {
    let k = P.row_len;
    let first = (token * k + block * BLOCK_LEN) / 4u;
    let at = act_words_$S(slot);
    var a: Act;
    a.q = vec4<u32>(XQ[first + at.x], XQ[first + at.y], XQ[first + at.z], XQ[first + at.w]);
    a.sums = vec4<i32>(dot4(a.q.x, ONES), dot4(a.q.y, ONES), dot4(a.q.z, ONES), dot4(a.q.w, ONES));
#ifdef T$S_Q4_1 || T$S_Q5_1
    let pair = P.scales_at + 2u * ((token * k) / BLOCK_LEN + block);
    a.d = bitcast<f32>(XQ[pair]);
    a.s = bitcast<f32>(XQ[pair + 1u]);
#else
    a.d = bitcast<f32>(XQ[P.scales_at + (token * k) / BLOCK_LEN + block]);
#endif
    return a;
}

// One weight block times one token's activations, scaled.
fn block_dot_$S(w: Weights, a: Act) -> f32 {
#ifdef T$S_Q4_K || T$S_Q5_K
    let s = w.sc.x * (dot4(w.q.x, a.q.x) + dot4(w.q.y, a.q.y)) + w.sc.z * (dot4(w.q.z, a.q.z) + dot4(w.q.w, a.q.w));
    let m = w.sc.y * (a.sums.x + a.sums.y) + w.sc.w * (a.sums.z + a.sums.w);
    return a.d * (w.d * f32(s) - w.dmin * f32(m));
#endif
#ifdef T$S_Q6_K
    let dots = vec4<i32>(dot4(w.q.x, a.q.x), dot4(w.q.y, a.q.y), dot4(w.q.z, a.q.z), dot4(w.q.w, a.q.w));
    let s = dot(w.sc, dots - 32 * a.sums);
    return a.d * w.d * f32(s);
#endif
#ifdef T$S_Q2_K || T$S_Q3_K
    let dots = vec4<i32>(dot4(w.q.x, a.q.x), dot4(w.q.y, a.q.y), dot4(w.q.z, a.q.z), dot4(w.q.w, a.q.w));
#endif
#ifdef T$S_Q2_K
    return a.d * (w.d * f32(dot(w.sc, dots)) - w.dmin * f32(dot(w.mins, a.sums)));
#endif
#ifdef T$S_Q3_K
    return a.d * w.d * f32(dot(w.sc, dots - 4 * a.sums));
#endif
#ifdef T$S_Q4_1 || T$S_Q5_1
    let s = dot4(w.q.x, a.q.x) + dot4(w.q.y, a.q.y) + dot4(w.q.z, a.q.z) + dot4(w.q.w, a.q.w);
    return a.d * w.d * f32(s) + w.dmin * a.s;
#endif
#ifdef T$S_Q4_0 || T$S_Q5_0 || T$S_Q8_0 || T$S_MXFP4
    let s = dot4(w.q.x, a.q.x) + dot4(w.q.y, a.q.y) + dot4(w.q.z, a.q.z) + dot4(w.q.w, a.q.w);
#endif
#ifdef T$S_Q8_0 || T$S_MXFP4
    return a.d * w.d * f32(s);
#endif
#ifdef T$S_Q4_0
    return a.d * w.d * f32(s - 8 * (a.sums.x + a.sums.y + a.sums.z + a.sums.w));
#endif
#ifdef T$S_Q5_0
    return a.d * w.d * f32(s - 16 * (a.sums.x + a.sums.y + a.sums.z + a.sums.w));
#endif
}

// Block `bi`'s f16 scale, in the words from `scales_at` that follow the bodies.
fn split_scale_$S(scales_at: u32, bi: u32) -> f32 {
    return unpack2x16float(W$S[scales_at + bi / 2u])[bi & 1u];
}

#ifdef T$S_MXFP4
// Block `bi`'s exponent byte, in the words from `scales_at` that follow the bodies.
fn split_exponent_$S(scales_at: u32, bi: u32) -> u32 {
    return (W$S[scales_at + bi / 4u] >> (8u * (bi & 3u))) & 0xffu;
}
#endif

// Block `bi` (counted from the chunk's first row) for this invocation's slot; `scales_at` is the
// first word of the scales for the split layouts.
fn load_weights_$S(bi: u32, scales_at: u32, slot: u32) -> Weights {
    var w: Weights;
    let b = bi * BLOCK_WORDS_$S;
#ifdef T$S_Q4_K || T$S_Q5_K
    // super-block: d f16, dmin f16, scales[12], (Q5_K: qh[32],) qs[128]
    let c = slot / 4u;
    let p = slot % 4u;
    let dd = unpack2x16float(W$S[b]);
    w.d = dd.x;
    w.dmin = dd.y;
    let s = vec3<u32>(W$S[b + 1u], W$S[b + 2u], W$S[b + 3u]);
    let lo = scale_min_k4(2u * c, s);
    let hi = scale_min_k4(2u * c + 1u, s);
    w.sc = vec4<i32>(lo, hi);
#endif
#ifdef T$S_Q4_K
    let q0 = W$S[b + 4u + 8u * c + 2u * p];
    let q1 = W$S[b + 5u + 8u * c + 2u * p];
    w.q = vec4<u32>(q0 & LOW4, q1 & LOW4, (q0 >> 4u) & LOW4, (q1 >> 4u) & LOW4);
#endif
#ifdef T$S_Q5_K
    // value 64c + l's 5th bit is bit 2c of qh[l], value 64c + 32 + l's bit 2c + 1
    let q0 = W$S[b + 12u + 8u * c + 2u * p];
    let q1 = W$S[b + 13u + 8u * c + 2u * p];
    let h0 = W$S[b + 4u + 2u * p] >> (2u * c);
    let h1 = W$S[b + 5u + 2u * p] >> (2u * c);
    w.q = vec4<u32>(
        (q0 & LOW4) | ((h0 & ONES) << 4u),
        (q1 & LOW4) | ((h1 & ONES) << 4u),
        ((q0 >> 4u) & LOW4) | (((h0 >> 1u) & ONES) << 4u),
        ((q1 >> 4u) & LOW4) | (((h1 >> 1u) & ONES) << 4u),
    );
#endif
#ifdef T$S_Q2_K || T$S_Q3_K
    // value 128n + 32j + l: 2 bits at 2j of qs[32n + l], sub-block scale 8n + 2j + l / 16
    let n = slot / 8u;
    let l0 = slot % 8u;
    let h = l0 / 4u;
#endif
#ifdef T$S_Q2_K
    // super-block: scales[16] (scale in the low nibble, min in the high), qs[64], d f16, dmin f16
    let qs = W$S[b + 4u + 8u * n + l0];
    w.q = vec4<u32>(qs & 0x03030303u, (qs >> 2u) & 0x03030303u, (qs >> 4u) & 0x03030303u, (qs >> 6u) & 0x03030303u);
    let s0 = W$S[b + 2u * n];
    let s1 = W$S[b + 2u * n + 1u];
    let sc = vec4<i32>(u8_in(s0, h), u8_in(s0, h + 2u), u8_in(s1, h), u8_in(s1, h + 2u));
    w.sc = sc & vec4<i32>(0xf);
    w.mins = sc >> vec4<u32>(4u);
    let dd = unpack2x16float(W$S[b + 20u]);
    w.d = dd.x;
    w.dmin = dd.y;
#endif
#ifdef T$S_Q3_K
    // body: hmask[32] (bit 4n + j of hmask[l]: the high bit, set for codes 0..3, clear for -4..-1),
    // qs[64], scales[12] (16 6-bit scales, 32 off)
    let qs = W$S[b + 8u + 8u * n + l0];
    let hm = W$S[b + l0] >> (4u * n);
    w.q = vec4<u32>(
        (qs & 0x03030303u) | ((hm & ONES) << 2u),
        ((qs >> 2u) & 0x03030303u) | (((hm >> 1u) & ONES) << 2u),
        ((qs >> 4u) & 0x03030303u) | (((hm >> 2u) & ONES) << 2u),
        ((qs >> 6u) & 0x03030303u) | (((hm >> 3u) & ONES) << 2u),
    );
    // Scale bytes 8n .. 8n + 7: low nibbles from bytes 0..7 (shifted by 4n), high 2 bits from
    // bytes 8..11.
    let a0 = W$S[b + 24u];
    let a1 = W$S[b + 25u];
    let hi = W$S[b + 26u];
    let x0 = ((a0 >> (4u * n)) & LOW4) | (((hi >> (4u * n)) & 0x03030303u) << 4u);
    let x1 = ((a1 >> (4u * n)) & LOW4) | (((hi >> (4u * n + 2u)) & 0x03030303u) << 4u);
    w.sc = vec4<i32>(u8_in(x0, h), u8_in(x0, h + 2u), u8_in(x1, h), u8_in(x1, h + 2u)) - vec4<i32>(32);
    w.d = split_scale_$S(scales_at, bi);
#endif
#ifdef T$S_Q6_K
    // body: ql[128], qh[64], scales[16] i8
    let n = slot / 8u;
    let l0 = slot % 8u;
    let ql0 = W$S[b + 16u * n + l0];
    let ql1 = W$S[b + 16u * n + 8u + l0];
    let qh = W$S[b + 32u + 8u * n + l0];
    w.q = vec4<u32>(
        (ql0 & LOW4) | ((qh & 0x03030303u) << 4u),
        (ql1 & LOW4) | (((qh >> 2u) & 0x03030303u) << 4u),
        ((ql0 >> 4u) & LOW4) | (((qh >> 4u) & 0x03030303u) << 4u),
        ((ql1 >> 4u) & LOW4) | (((qh >> 6u) & 0x03030303u) << 4u),
    );
    // scales 8n + l0 / 4 + 2g (l0 here in words)
    let s0 = W$S[b + 48u + 2u * n];
    let s1 = W$S[b + 49u + 2u * n];
    let h = l0 / 4u;
    w.sc = vec4<i32>(i8_in(s0, h), i8_in(s0, h + 2u), i8_in(s1, h), i8_in(s1, h + 2u));
    w.d = split_scale_$S(scales_at, bi);
#endif
#ifdef T$S_Q8_0
    // body: qs[32] i8
    w.d = split_scale_$S(scales_at, bi);
    let q = b + 4u * slot;
    w.q = vec4<u32>(W$S[q], W$S[q + 1u], W$S[q + 2u], W$S[q + 3u]);
#endif
#ifdef T$S_Q4_0
    // body: qs[16] (value j < 16: low nibble of qs[j], else high nibble of qs[j - 16])
    w.d = split_scale_$S(scales_at, bi);
    let q0 = W$S[b + 2u * slot];
    let q1 = W$S[b + 2u * slot + 1u];
    w.q = vec4<u32>(q0 & LOW4, q1 & LOW4, (q0 >> 4u) & LOW4, (q1 >> 4u) & LOW4);
#endif
#ifdef T$S_MXFP4
    // body: qs[16] as Q4_0's, each 4-bit E2M1 code taken as its doubled value (an int8)
    w.d = e8m0_half(split_exponent_$S(scales_at, bi));
    let q0 = W$S[b + 2u * slot];
    let q1 = W$S[b + 2u * slot + 1u];
    w.q = vec4<u32>(
        mxfp4_bytes(q0 & LOW4),
        mxfp4_bytes(q1 & LOW4),
        mxfp4_bytes((q0 >> 4u) & LOW4),
        mxfp4_bytes((q1 >> 4u) & LOW4),
    );
#endif
#ifdef T$S_Q4_1
    // block: d f16, m f16, qs[16] as Q4_0
    let dm = unpack2x16float(W$S[b]);
    w.d = dm.x;
    w.dmin = select(0.0, dm.y, slot == 0u);
    let q0 = W$S[b + 1u + 2u * slot];
    let q1 = W$S[b + 2u + 2u * slot];
    w.q = vec4<u32>(q0 & LOW4, q1 & LOW4, (q0 >> 4u) & LOW4, (q1 >> 4u) & LOW4);
#endif
#ifdef T$S_Q5_1
    // block: d f16, m f16, qh u32, qs[16] as Q5_0
    let dm = unpack2x16float(W$S[b]);
    w.d = dm.x;
    w.dmin = select(0.0, dm.y, slot == 0u);
    let qh = W$S[b + 1u] >> (8u * slot);
    let q0 = W$S[b + 2u + 2u * slot];
    let q1 = W$S[b + 3u + 2u * slot];
    w.q = vec4<u32>(
        (q0 & LOW4) | (spread_bits(qh & 0xfu) << 4u),
        (q1 & LOW4) | (spread_bits((qh >> 4u) & 0xfu) << 4u),
        ((q0 >> 4u) & LOW4) | (spread_bits((qh >> 16u) & 0xfu) << 4u),
        ((q1 >> 4u) & LOW4) | (spread_bits((qh >> 20u) & 0xfu) << 4u),
    );
#endif
#ifdef T$S_Q5_0
    // body: qh u32 (bit j: the 5th bit of value j), qs[16] as Q4_0
    w.d = split_scale_$S(scales_at, bi);
    let qh = W$S[b] >> (8u * slot);
    let q0 = W$S[b + 1u + 2u * slot];
    let q1 = W$S[b + 2u + 2u * slot];
    w.q = vec4<u32>(
        (q0 & LOW4) | (spread_bits(qh & 0xfu) << 4u),
        (q1 & LOW4) | (spread_bits((qh >> 4u) & 0xfu) << 4u),
        ((q0 >> 4u) & LOW4) | (spread_bits((qh >> 16u) & 0xfu) << 4u),
        ((q1 >> 4u) & LOW4) | (spread_bits((qh >> 20u) & 0xfu) << 4u),
    );
#endif
    return w;
}

// This invocation's partial sums of ROWS rows from first_row for TILE_T tokens from t0; the
// rows are counted from row_base of the binding's binding_rows (an expert's, for EXPERTS).
fn accumulate_$S(first_row: u32, rows: u32, k: u32, n_tokens: u32, t0: u32, tid: u32, row_base: u32, binding_rows: u32) -> array<f32, OUTPUTS> {
    let slot = tid % THREADS;
    let n_blocks = k / BLOCK_LEN;
    let scales_at = binding_rows * n_blocks * BLOCK_WORDS_$S;
    var acc: array<f32, OUTPUTS>;
    for (var o = 0u; o < OUTPUTS; o++) {
        acc[o] = 0.0;
    }
    for (var block = tid / THREADS; block < n_blocks; block += BLOCKS_AT_ONCE) {
        var act: array<Act, TILE_T>;
        for (var t = 0u; t < TILE_T; t++) {
            if (t0 + t < n_tokens) {
                act[t] = load_act_$S(act_row(t0, t), block, slot);
            }
        }
        for (var r = 0u; r < ROWS; r++) {
            if (first_row + r < rows) {
                let w = load_weights_$S((row_base + first_row + r) * n_blocks + block, scales_at, slot);
                for (var t = 0u; t < TILE_T; t++) {
                    if (t0 + t < n_tokens) {
                        acc[r * TILE_T + t] += block_dot_$S(w, act[t]);
                    }
                }
            }
        }
    }
    return acc;
}
#endforeach

#ifdef SUBGROUPS
// [subgroups][output] partial sums (at most WG / 4 subgroups: WebGPU's smallest subgroup is 4).
var<workgroup> partial: array<array<f32, OUTPUTS>, 16>;
#else
var<workgroup> partial: array<array<f32, OUTPUTS>, WG>;
#endif

// grid: (ceil(rows_in_chunk / ROWS) folded into x*y with groups_x columns, ceil(n_tokens / TILE_T))
@compute @workgroup_size(64)
fn matmul_q8(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
#ifdef SUBGROUPS
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
#endif
) {
    let grid_group = wg.y * P.groups_x + wg.x;
    // The segment of this workgroup, its first row in it and the segment's shape.
    var segment = 0u;
    var group = grid_group;
    var rows = P.rows;
    var n = P.n;
    // Where this segment's bias starts in BIAS_W: after the earlier segments' outputs.
    var bias_at = 0u;
#ifdef SEGMENTS
    if (grid_group >= P.seg1_first_group) {
        segment = 1u;
        group = grid_group - P.seg1_first_group;
        bias_at = n;
        rows = P.seg1_rows;
        n = P.seg1_n;
    }
#endif
#ifdef SEGMENT3
    if (grid_group >= P.seg2_first_group) {
        segment = 2u;
        group = grid_group - P.seg2_first_group;
        bias_at += n;
        rows = P.seg2_rows;
        n = P.seg2_n;
    }
#endif
    let first_row = group * ROWS;
    let k = P.row_len;
    var n_tokens = P.n_tokens;
    var t0 = wg.z * TILE_T;
    // The first output row (token) of this workgroup.
    var out_t0 = t0;
    var row_base = 0u;
    var binding_rows = rows;
#ifdef EXPERTS || EXPERTS_GROUPED
    var expert = 0u;
#endif
#ifdef EXPERTS
    let pair = expert_pair(wg.z);
    expert = pair.expert;
    t0 = pair.act_row;
    n_tokens = t0 + 1u;
    out_t0 = wg.z;
#endif
#ifdef EXPERTS_GROUPED
    if (lid.x == 0u) {
        let z = wg.z;
        tile = vec3<u32>(0u);
        if (z < TILES[0]) {
            tile = vec3<u32>(TILES[1u + 3u * z], TILES[2u + 3u * z], TILES[3u + 3u * z]);
        }
    }
    let this_tile = workgroupUniformLoad(&tile);
    if (this_tile.z == 0u) {
        return;
    }
    for (var t = 0u; t < TILE_T; t++) {
        let pair = ORDER[this_tile.y + min(t, this_tile.z - 1u)];
        tile_act[t] = pair_act_row(pair);
        tile_out[t] = pair;
    }
    expert = this_tile.x;
    t0 = 0u;
    n_tokens = this_tile.z;
#endif
#ifdef EXPERTS || EXPERTS_GROUPED
    // The binding holding the expert (W0, W1 or W2: P.experts_per_binding whole experts each),
    // and the expert's first row in it.
    segment = expert / P.experts_per_binding;
    bias_at = expert * rows;
    let binding_first = segment * P.experts_per_binding;
    row_base = (expert - binding_first) * rows;
    binding_rows = rows * min(P.experts_per_binding, P.n_expert - binding_first);
#endif
    let tid = lid.x;
    var acc: array<f32, OUTPUTS>;
    // An if chain rather than a switch: llvmpipe skips the branches no invocation takes.
    if (segment == 0u) {
        acc = accumulate_0(first_row, rows, k, n_tokens, t0, tid, row_base, binding_rows);
    }
#ifdef WEIGHTS1
    if (segment == 1u) {
        acc = accumulate_1(first_row, rows, k, n_tokens, t0, tid, row_base, binding_rows);
    }
#endif
#ifdef WEIGHTS2
    if (segment == 2u) {
        acc = accumulate_2(first_row, rows, k, n_tokens, t0, tid, row_base, binding_rows);
    }
#endif
#ifdef SUBGROUPS
    for (var o = 0u; o < OUTPUTS; o++) {
        acc[o] = subgroupAdd(acc[o]);
    }
    let n_subgroups = (WG + sg_size - 1u) / sg_size;
    if (sg_lane == 0u) {
        partial[tid / sg_size] = acc;
    }
    workgroupBarrier();
    if (tid < OUTPUTS) {
        var sum = 0.0;
        for (var s = 0u; s < n_subgroups; s++) {
            sum += partial[s][tid];
        }
        acc[0] = sum;
    }
#else
    partial[tid] = acc;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride) {
            for (var o = 0u; o < OUTPUTS; o++) {
                partial[tid][o] += partial[tid + stride][o];
            }
        }
        workgroupBarrier();
    }
    if (tid < OUTPUTS) {
        acc[0] = partial[0][tid];
    }
#endif
#ifdef EXPERTS || EXPERTS_GROUPED
    // Every binding's experts write the one output.
    segment = 0u;
#endif
    // Invocation o < OUTPUTS writes output o = r * TILE_T + t.
    let r = tid / TILE_T;
    let t = tid % TILE_T;
    if (tid < OUTPUTS && first_row + r < rows && t0 + t < n_tokens) {
        let row = P.row0 + first_row + r;
        var b = 0.0;
#ifdef BIAS
        b = BIAS_W[bias_at + row];
#endif
        let at = out_row(out_t0, t) * n + row;
        var v = acc[0] + b;
#ifdef RESIDUAL
        v = RESID[at] + v;
#endif
#ifdef RESIDUAL_IN_PLACE
        v = OUT0[at] + v;
#endif
        store_out(segment, at, v);
    }
}
