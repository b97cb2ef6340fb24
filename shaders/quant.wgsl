// Weights over raw GGUF bytes: the embedding lookup for every weight type, and the matrix
// product for F32, F16 and BF16 weights (the quantized types multiply 8-bit activations in
// matmul_q8.wgsl; MATMUL here reads f32 activations, rounded to f16 / bf16 for F16 / BF16
// weights).
//
// Weights are bound as array<u32> (a tensor too large for one binding is split into row ranges,
// each its own buffer starting at row `row0`): F32, F16, BF16, Q4_1, Q5_1, Q2_K, Q4_K and Q5_K
// as their GGUF bytes (rows of row_bytes each), Q4_0, Q5_0, Q8_0, Q3_K, Q6_K and MXFP4 as
// weights.rs's `SplitScales` lays them out (block bodies in row order, then every block's scale:
// an f16, MXFP4's exponent byte); values are extracted byte by byte. Exactly one weight-type
// define is set: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// MXFP4. Scales are f16 read with unpack2x16float (no shader-f16 needed).
// Capability variants (device.rs DeviceInfo::defines): with SHADER_F16, F16 weights are bound
// as array<vec2<f16>> and read as WGSL f16 (F16_NATIVE; exact, as unpack2x16float);
// accumulation stays f32. SUBGROUPS sums
// a mat-mul row's partial dots with subgroupAdd instead of a shared-memory tree.
// EXPERTS (with DECODE) multiplies a mixture of experts' chosen experts, grid z one (token, slot)
// pair whose expert id is read on the device, as matmul_q8.wgsl's EXPERTS does.
// (`enable` directives must precede every declaration.)
#ifdef SHADER_F16
enable f16;
#endif
// Browsers require `enable subgroups;`; Naga (native) rejects it and needs no directive.
#ifdef SUBGROUPS_DIRECTIVE
enable subgroups;
#endif

// Mirrors kernel_params.rs (a test checks the fields).
struct EmbedParams {
    // the chunk's first row (a table too large for one binding is split into row ranges)
    row0: u32,
    // rows in the chunk
    rows: u32,
    // values in a row
    row_len: u32,
    // bytes of a row as the file stores it
    row_bytes: u32,
}

#ifdef EMBED
@group(0) @binding(0) var<uniform> P: EmbedParams;
#else
// MatMulParams: matmul_params.wgsl
@group(0) @binding(0) var<uniform> P: MatMulParams;
#endif
#ifdef F16_NATIVE
// [rows_in_chunk * row_len] f16, padded to an even count
@group(0) @binding(1) var<storage, read> W: array<vec2<f16>>;

// Value `i` of the f16 weights (row_len of them a row).
fn f16_value(i: u32) -> f32 {
    return f32(W[i >> 1u][i & 1u]);
}
#else
// [rows_in_chunk * row_bytes] GGUF bytes, padded to 4 bytes
@group(0) @binding(1) var<storage, read> W: array<u32>;

fn byte_at(i: u32) -> u32 {
    return (W[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

fn u16_at(i: u32) -> u32 {
    return byte_at(i) | (byte_at(i + 1u) << 8u);
}

// The f16 at byte `i`, which is even: every f16 of a GGUF row (F16 values, block scales) sits
// at an even offset, as row and block sizes are even.
fn f16_at(i: u32) -> f32 {
    return unpack2x16float(W[i >> 2u])[(i >> 1u) & 1u];
}

// Sign-extends a byte.
fn i8_of(b: u32) -> i32 {
    return (i32(b << 24u)) >> 24u;
}
#endif

#ifdef Q4_0 || Q5_0 || Q8_0 || Q3_K || Q6_K
// Block `bi`'s f16 scale, after the chunk's P.rows rows of P.row_len / block_len bodies.
fn split_scale(bi: u32, body_words: u32, block_len: u32) -> f32 {
    let scales_at = P.rows * (P.row_len / block_len) * body_words;
    return unpack2x16float(W[scales_at + bi / 2u])[bi & 1u];
}
#endif
#ifdef MXFP4
// Block `bi`'s exponent byte, after the chunk's P.rows rows of P.row_len / 32 bodies of 4 words.
fn split_exponent(bi: u32) -> u32 {
    let scales_at = P.rows * (P.row_len / 32u) * 4u;
    return (W[scales_at + bi / 4u] >> (8u * (bi & 3u))) & 0xffu;
}
#endif

// Value `i` of the chunk's row `row` (P.row_len values of P.row_bytes bytes a row).
fn dequant(row: u32, i: u32) -> f32 {
    let base = row * P.row_bytes;
#ifdef F32
    return bitcast<f32>(byte_at(base + 4u * i) | (byte_at(base + 4u * i + 1u) << 8u)
        | (byte_at(base + 4u * i + 2u) << 16u) | (byte_at(base + 4u * i + 3u) << 24u));
#endif
#ifdef F16
#ifdef F16_NATIVE
    return f16_value(base / 2u + i);
#else
    return f16_at(base + 2u * i);
#endif
#endif
#ifdef BF16
    return bitcast<f32>(u16_at(base + 2u * i) << 16u);
#endif
#ifdef Q4_0 || Q5_0 || Q8_0 || MXFP4
    let bi = row * (P.row_len / 32u) + i / 32u;
    let j = i % 32u;
#endif
#ifdef Q4_1 || Q5_1
    let j = i % 32u;
#endif
#ifdef Q4_1
    // block: d f16, m f16, qs[16] as Q4_0 (unsigned codes)
    let b = base + (i / 32u) * 20u;
    let q = (byte_at(b + 4u + j % 16u) >> (4u * (j / 16u))) & 0xfu;
    return f16_at(b) * f32(q) + f16_at(b + 2u);
#endif
#ifdef Q5_1
    // block: d f16, m f16, qh u32, qs[16] as Q5_0 (unsigned codes)
    let b = base + (i / 32u) * 24u;
    let hi = ((byte_at(b + 4u + j / 8u) >> (j % 8u)) & 1u) << 4u;
    let q = ((byte_at(b + 8u + j % 16u) >> (4u * (j / 16u))) & 0xfu) | hi;
    return f16_at(b) * f32(q) + f16_at(b + 2u);
#endif
#ifdef Q2_K || Q3_K
    // value 128n + 32g + l of a super-block: 2 bits at 2g of qs[32n + l], sub-block 8n + 2g + l / 16
    let j = i % 256u;
    let n = j / 128u;
    let g = (j % 128u) / 32u;
    let l = j % 32u;
    let sub = 8u * n + 2u * g + l / 16u;
#endif
#ifdef Q2_K
    // super-block of 256: scales[16] (scale low nibble, min high nibble), qs[64], d f16, dmin f16
    let b = base + (i / 256u) * 84u;
    let q = (byte_at(b + 16u + 32u * n + l) >> (2u * g)) & 3u;
    let sc = byte_at(b + sub);
    return f16_at(b + 80u) * f32(sc & 0xfu) * f32(q) - f16_at(b + 82u) * f32(sc >> 4u);
#endif
#ifdef Q3_K
    // body of a super-block of 256: hmask[32], qs[64], scales[12] (16 6-bit scales, 32 off: low
    // nibbles in bytes 0..7, high 2 bits in bytes 8..11); a clear hmask bit subtracts 4
    let bi = row * (P.row_len / 256u) + i / 256u;
    let b = bi * 108u;
    let q2 = (byte_at(b + 32u + 32u * n + l) >> (2u * g)) & 3u;
    let high = (byte_at(b + l) >> (4u * n + g)) & 1u;
    let q = i32(q2 | (high << 2u)) - 4;
    let sc_lo = (byte_at(b + 96u + sub % 8u) >> (4u * (sub / 8u))) & 0xfu;
    let sc_hi = (byte_at(b + 104u + sub % 4u) >> (2u * (sub / 4u))) & 3u;
    let sc = i32(sc_lo | (sc_hi << 4u)) - 32;
    return split_scale(bi, 27u, 256u) * f32(sc) * f32(q);
#endif
#ifdef Q8_0
    // body: qs[32] i8
    return split_scale(bi, 8u, 32u) * f32(i8_of(byte_at(bi * 32u + j)));
#endif
#ifdef Q4_0
    // body: qs[16]: value j<16 is the low nibble of qs[j], j>=16 the high nibble of qs[j-16]
    let q = (byte_at(bi * 16u + j % 16u) >> (4u * (j / 16u))) & 0xfu;
    return split_scale(bi, 4u, 32u) * f32(i32(q) - 8);
#endif
#ifdef MXFP4
    // body: qs[16] as Q4_0's, 4-bit E2M1 codes
    let q = (byte_at(bi * 16u + j % 16u) >> (4u * (j / 16u))) & 0xfu;
    return f32(mxfp4_value(q)) * e8m0_half(split_exponent(bi));
#endif
#ifdef Q5_0
    // body: qh u32 (bit j = 5th bit of value j), qs[16] nibbles as Q4_0
    let b = bi * 20u;
    let qh = byte_at(b + j / 8u);
    let hi = ((qh >> (j % 8u)) & 1u) << 4u;
    let q = ((byte_at(b + 4u + j % 16u) >> (4u * (j / 16u))) & 0xfu) | hi;
    return split_scale(bi, 5u, 32u) * f32(i32(q) - 16);
#endif
#ifdef Q4_K || Q5_K
    // super-block of 256: d f16, dmin f16, scales[12] (8 pairs of 6-bit scale/min),
    // (Q5_K: qh[32],) qs[128]
#ifdef Q4_K
    let b = base + (i / 256u) * 144u;
#else
    let b = base + (i / 256u) * 176u;
#endif
    let j = i % 256u;
    let chunk = j / 64u;
    let half = (j % 64u) / 32u;
    let l = j % 32u;
    let sub = 2u * chunk + half;
    var sc: u32;
    var m: u32;
    let s = b + 4u;
    if (sub < 4u) {
        sc = byte_at(s + sub) & 63u;
        m = byte_at(s + sub + 4u) & 63u;
    } else {
        sc = (byte_at(s + sub + 4u) & 0xfu) | ((byte_at(s + sub - 4u) >> 6u) << 4u);
        m = (byte_at(s + sub + 4u) >> 4u) | ((byte_at(s + sub) >> 6u) << 4u);
    }
#ifdef Q4_K
    let q = (byte_at(b + 16u + 32u * chunk + l) >> (4u * half)) & 0xfu;
#else
    // the 5th bit: bit 2 chunk + half of qh[l]
    let q = ((byte_at(b + 48u + 32u * chunk + l) >> (4u * half)) & 0xfu)
        | (((byte_at(b + 16u + l) >> (2u * chunk + half)) & 1u) << 4u);
#endif
    return f16_at(b) * f32(sc) * f32(q) - f16_at(b + 2u) * f32(m);
#endif
#ifdef Q6_K
    // body of a super-block of 256: ql[128] low nibbles, qh[64] 2-bit highs, scales[16] i8
    let bi = row * (P.row_len / 256u) + i / 256u;
    let b = bi * 208u;
    let j = i % 256u;
    let n = j / 128u;
    let g = (j % 128u) / 32u;
    let l = j % 32u;
    let ql = (byte_at(b + 64u * n + l + (g & 1u) * 32u) >> (4u * (g / 2u))) & 0xfu;
    let qh = (byte_at(b + 128u + 32u * n + l) >> (2u * g)) & 3u;
    let q = i32(ql | (qh << 4u)) - 32;
    let sc = i8_of(byte_at(b + 192u + 8u * n + l / 16u + 2u * g));
    return split_scale(bi, 52u, 256u) * f32(sc) * f32(q);
#endif
}

#ifdef EMBED
// P: [row0, rows_in_chunk, row_len, row_bytes]
// [2 + 3 * n_tokens + 3 * n_seqs] u32: n_tokens, n_seqs, token ids, ... (see attention.wgsl)
@group(0) @binding(2) var<storage, read> STEP: array<u32>;
// [n_tokens, row_len] f32
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;

// grid: (ceil(row_len / 64), n_tokens)
@compute @workgroup_size(64)
fn embed(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let c = gid.x;
    let row_len = P.row_len;
    if (c >= row_len) {
        return;
    }
    let tok = STEP[2u + t];
    if (tok < P.row0 || tok >= P.row0 + P.rows) {
        return;
    }
    OUT[t * row_len + c] = dequant(tok - P.row0, c);
}
#endif

#ifdef MATMUL
// [n_tokens, k] f32
@group(0) @binding(2) var<storage, read> X: array<f32>;
// [n_tokens, n] f32
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;
#ifdef BIAS
// [n] f32 (stored as the GGUF F32 bytes); EXPERTS: [n_expert, n], each expert's bias
@group(0) @binding(4) var<storage, read> BIAS_W: array<f32>;
#endif
const WG: u32 = 64u;
// Activation rows handled by one workgroup: each weight value is dequantized once for all of them.
// DECODE (one activation row) avoids the empty tile slots.
#ifdef DECODE
const TILE_T: u32 = 1u;
#else
const TILE_T: u32 = 8u;
#endif
var<workgroup> partial: array<array<f32, TILE_T>, WG>;

// grid: (rows folded into x*y with groups_x columns, ceil(n_tokens / TILE_T)); one weight row
// per workgroup, threads stride along k, then a shared-memory tree reduction or, with
// SUBGROUPS, subgroupAdd within each subgroup and thread 0 adding the subgroups' sums (subgroups
// taken to be consecutive invocations, as every implementation forms them for 1-D workgroups).
@compute @workgroup_size(64)
fn matmul(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
#ifdef SUBGROUPS
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
#endif
) {
    let local_row = wg.y * P.groups_x + wg.x;
    let rows = P.rows;
    let k = P.row_len;
    let n = P.n;
    var n_tokens = P.n_tokens;
    var t0 = wg.z * TILE_T;
    // The first output row (token) of this workgroup, and the weight row in the binding.
    var out_t0 = t0;
    var weight_row = local_row;
    // Where the bias of this workgroup's weights starts in BIAS_W.
    var bias_at = 0u;
#ifdef EXPERTS
    let pair = expert_pair(wg.z);
    weight_row = pair.expert * rows + local_row;
    bias_at = pair.expert * rows;
    t0 = pair.act_row;
    n_tokens = t0 + 1u;
    out_t0 = wg.z;
#endif
    let tid = lid.x;
    let valid = local_row < rows;
    var acc: array<f32, TILE_T>;
    for (var u = 0u; u < TILE_T; u++) {
        acc[u] = 0.0;
    }
    if (valid) {
        for (var i = tid; i < k; i += WG) {
            let w = dequant(weight_row, i);
            for (var u = 0u; u < TILE_T; u++) {
                if (t0 + u < n_tokens) {
                    acc[u] += w * X[(t0 + u) * k + i];
                }
            }
        }
    }
#ifdef SUBGROUPS
    for (var u = 0u; u < TILE_T; u++) {
        acc[u] = subgroupAdd(acc[u]);
    }
    if (sg_lane == 0u) {
        partial[tid / sg_size] = acc;
    }
    workgroupBarrier();
    if (tid == 0u) {
        for (var s = 1u; s < (WG + sg_size - 1u) / sg_size; s++) {
            for (var u = 0u; u < TILE_T; u++) {
                partial[0][u] += partial[s][u];
            }
        }
    }
#else
    partial[tid] = acc;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride) {
            for (var u = 0u; u < TILE_T; u++) {
                partial[tid][u] += partial[tid + stride][u];
            }
        }
        workgroupBarrier();
    }
#endif
    if (tid == 0u && valid) {
        let row = P.row0 + local_row;
        var b = 0.0;
#ifdef BIAS
        b = BIAS_W[bias_at + row];
#endif
        for (var u = 0u; u < TILE_T; u++) {
            if (t0 + u < n_tokens) {
                OUT[(out_t0 + u) * n + row] = partial[0][u] + b;
            }
        }
    }
}
#endif
