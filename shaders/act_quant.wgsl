// Activation rounding before a mat-mul, reproducing the 8-bit (or f16) activations the CPU
// backend and llama.cpp multiply quantized weights with, so the mat-mul's integer dot products
// (matmul_q8.wgsl) are the CPU's integer sums.
// Q8_0: blocks of 32, d = amax / 127 stored as f16, q = round_even(x * 127 / amax).
// Q8_1: Q8_0's codes and scale, plus s = Σq · amax / 127 stored as f16 (the weight's min times s
//       is the block's offset term for Q4_1 / Q5_1).
// Q8_K: blocks of 256, iscale = -127 / (value of largest magnitude, the first one on a tie),
//       q = min(round_even(x * iscale), 127), d = 1 / iscale (f32).
// F16 / BF16: each value rounded to f16 / bf16, written as f32 (quant.wgsl's F16 and BF16
//       mat-muls read f32).
// Fully parallel: one invocation per 4 values, a 64-invocation workgroup per 256 values of a row
// (one Q8_K block or eight Q8_0 blocks), the block maximum found by a shared-memory tree.
//
// The op producing the input runs here as a prologue when only mat-muls read its output
// (compile.rs), so it costs no dispatch of its own and its f32 output is never written:
// NORM: RMS normalisation of each row (WEIGHT: times a weight), as norm.wgsl computes it;
// SWIGLU / GEGLU / SWIGLU_OAI: silu(gate) * up / gelu(gate) * up / gpt-oss's clamped SwiGLU, as
// elementwise.wgsl computes them.
// SUM (with NORM): before that norm, the ops that produce its input, a residual add of another
// RMS norm (Gemma's post-norms): S = residual + norm(X) (SUM_WEIGHT: times a weight), written
// here because later ops read it, then normalised and rounded. One workgroup per row then rounds
// all of the row's blocks, so every value of S is written by the invocation that read its
// residual (S may be the residual itself) and the row's sum is complete before it is normalised.

// Mirrors kernel_params.rs (a test checks the fields).
struct ActQuantParams {
    // row length, a multiple of 32 for Q8_0 / Q8_K
    k: u32,
    // the word of OUT where the scales start (rows * k / 4)
    scales_at: u32,
    // NORM's epsilon
    eps: f32,
    // 256-value chunks of a row each workgroup rounds
    chunks: u32,
    // SUM: the first norm's epsilon
    first_eps: f32,
}

@group(0) @binding(0) var<uniform> P: ActQuantParams;
// [rows, k] f32: the input (SWIGLU / GEGLU / SWIGLU_OAI: the gate; SUM: the first norm's input)
@group(0) @binding(1) var<storage, read> X: array<f32>;
// Q8_0 / Q8_K: [rows * k / 4] u32, 4 codes each (value 4i + j in byte j), then
// [rows * k / block_len] f32 scales (as bits), block b's at scales_at + b.
// Q8_1: the codes, then [rows * k / 32] (d, s) pairs of f32, block b's at scales_at + 2b.
// F16 / BF16: [rows, k] f32 (as bits).
@group(0) @binding(2) var<storage, read_write> OUT: array<u32>;
#ifdef SWIGLU || GEGLU || SWIGLU_OAI
// [rows, k] f32
@group(0) @binding(3) var<storage, read> UP: array<f32>;
#endif
#ifdef WEIGHT
// [k] f32 (GGUF F32 bytes)
@group(0) @binding(4) var<storage, read> NW: array<f32>;
#endif
#ifdef SUM
// [rows, k] f32: the sum, the input of NORM (without SUM_RESIDUAL: also the residual added)
@group(0) @binding(5) var<storage, read_write> S: array<f32>;
#ifdef SUM_RESIDUAL
// [rows, k] f32
@group(0) @binding(6) var<storage, read> R: array<f32>;
#endif
#ifdef SUM_WEIGHT
// [k] f32: the first norm's weight
@group(0) @binding(7) var<storage, read> SW: array<f32>;
#endif
#endif

const WG: u32 = 64u;
#ifdef Q8_K
// Invocations per block (256 values).
const GROUP: u32 = 64u;
#else
// Q8_0 / Q8_1: 32 values.
const GROUP: u32 = 8u;
#endif
#ifdef Q8_1
// Per invocation: the sum of its 4 codes, then (a tree per block) the block's sum.
var<workgroup> code_sums: array<i32, WG>;
#endif

// Per invocation: its candidate for the block's value of largest magnitude and that value's
// index (a tie keeps the first, as the CPU's scan does).
var<workgroup> best_value: array<f32, WG>;
var<workgroup> best_index: array<u32, WG>;
#ifdef NORM
var<workgroup> squares: array<f32, WG>;

// The sum of every invocation's `s`, added in the same order by every workgroup (a tree).
fn workgroup_sum(tid: u32, s: f32) -> f32 {
    squares[tid] = s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride) {
            squares[tid] += squares[tid + stride];
        }
        workgroupBarrier();
    }
    let total = squares[0];
    // `squares` is written again by the next sum.
    workgroupBarrier();
    return total;
}

// The RMS factor of row `row` of the norm's input (SUM: after writing that input, the sum).
fn row_scale(row: u32, k: u32, tid: u32) -> f32 {
    var s = 0.0;
#ifdef SUM
    for (var c = tid; c < k; c += WG) {
        let v = X[row * k + c];
        s += v * v;
    }
    let first = div_rn(1.0, sqrt(div_rn(workgroup_sum(tid, s), f32(k)) + P.first_eps));
    s = 0.0;
    for (var c = tid; c < k; c += WG) {
        let i = row * k + c;
        var v = X[i] * first;
#ifdef SUM_WEIGHT
        v = v * SW[c];
#endif
#ifdef SUM_RESIDUAL
        v = R[i] + v;
#else
        v = S[i] + v;
#endif
        S[i] = v;
        s += v * v;
    }
    // The rounding reads values of S other invocations wrote.
    storageBarrier();
#else
    for (var c = tid; c < k; c += WG) {
        let v = X[row * k + c];
        s += v * v;
    }
#endif
    return div_rn(1.0, sqrt(div_rn(workgroup_sum(tid, s), f32(k)) + P.eps));
}
#endif

// Value `i` (column `col`) of the input, through the prologue; `scale` is the row's RMS factor.
fn value(i: u32, col: u32, scale: f32) -> f32 {
#ifdef NORM
#ifdef SUM
    var v = S[i] * scale;
#else
    var v = X[i] * scale;
#endif
#ifdef WEIGHT
    v = v * NW[col];
#endif
    return v;
#endif
#ifdef SWIGLU
    return silu(X[i]) * UP[i];
#endif
#ifdef GEGLU
    return gelu_ggml(X[i]) * UP[i];
#endif
#ifdef SWIGLU_OAI
    return clamped_swiglu(X[i], UP[i]);
#endif
#ifdef NORM || SWIGLU || GEGLU || SWIGLU_OAI
#else
    return X[i];
#endif
}

// grid: (ceil(k / 256 / chunks), rows)
@compute @workgroup_size(64)
fn act_quant(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let tid = lid.x;
    let k = P.k;
    let row = wg.y;
    var scale = 1.0;
#ifdef NORM
    // The row's sum of squares, in the same order by every workgroup of the row.
    scale = row_scale(row, k, tid);
#endif
    let chunks = P.chunks;
    let end = min(chunks * (wg.x + 1u), (k + 255u) / 256u);
    for (var chunk = chunks * wg.x; chunk < end; chunk++) {
        round_chunk(row, k, 256u * chunk, tid, scale);
    }
}

// Rounds the 256 values of row `row` from column `chunk_col`, 4 per invocation.
fn round_chunk(row: u32, k: u32, chunk_col: u32, tid: u32, scale: f32) {
    let col = chunk_col + 4u * tid;
    let i = row * k + col;
#ifdef F16
    for (var j = 0u; j < 4u && col + j < k; j++) {
        OUT[i + j] = bitcast<u32>(round_f16(value(i + j, col + j, scale)));
    }
#endif
#ifdef BF16
    for (var j = 0u; j < 4u && col + j < k; j++) {
        OUT[i + j] = bitcast<u32>(round_bf16(value(i + j, col + j, scale)));
    }
#endif
#ifdef Q8_0 || Q8_1 || Q8_K
    let valid = col < k;
    var x = vec4<f32>(0.0);
    if (valid) {
        x = vec4<f32>(value(i, col, scale), value(i + 1u, col + 1u, scale), value(i + 2u, col + 2u, scale),
            value(i + 3u, col + 3u, scale));
    }
    // This invocation's candidate: the first of its 4 values of largest magnitude.
    var v = x.x;
    var at = 4u * tid;
    for (var j = 1u; j < 4u; j++) {
        if (abs(x[j]) > abs(v)) {
            v = x[j];
            at = 4u * tid + j;
        }
    }
    best_value[tid] = v;
    best_index[tid] = at;
    workgroupBarrier();
    for (var stride = GROUP / 2u; stride > 0u; stride /= 2u) {
        if (tid % GROUP < stride) {
            let other = best_value[tid + stride];
            let other_at = best_index[tid + stride];
            let mine = best_value[tid];
            if (abs(other) > abs(mine) || (abs(other) == abs(mine) && other_at < best_index[tid])) {
                best_value[tid] = other;
                best_index[tid] = other_at;
            }
        }
        workgroupBarrier();
    }
    let vmax = best_value[tid - tid % GROUP];
    let amax = abs(vmax);
#ifdef Q8_0 || Q8_1
    var id = 0.0;
    if (amax != 0.0) {
        id = div_rn(127.0, amax);
    }
    let q = vec4<i32>(round(x * id));
    let d = round_f16(div_rn(amax, 127.0));
    let block_len = 32u;
#endif
#ifdef Q8_1
    // The block's code sum, in integers (so in any order), times the unrounded scale.
    code_sums[tid] = q.x + q.y + q.z + q.w;
    workgroupBarrier();
    for (var stride = GROUP / 2u; stride > 0u; stride /= 2u) {
        if (tid % GROUP < stride) {
            code_sums[tid] += code_sums[tid + stride];
        }
        workgroupBarrier();
    }
    let s = round_f16(f32(code_sums[tid - tid % GROUP]) * div_rn(amax, 127.0));
#endif
#ifdef Q8_K
    var q = vec4<i32>(0);
    var d = 0.0;
    if (amax != 0.0) {
        let iscale = div_rn(-127.0, vmax);
        q = vec4<i32>(min(round(iscale * x), vec4<f32>(127.0)));
        d = div_rn(1.0, iscale);
    }
    let block_len = 256u;
#endif
    if (valid) {
        OUT[i / 4u] = pack_codes(q);
        if (tid % GROUP == 0u) {
#ifdef Q8_1
            OUT[P.scales_at + 2u * (i / block_len)] = bitcast<u32>(d);
            OUT[P.scales_at + 2u * (i / block_len) + 1u] = bitcast<u32>(s);
#else
            OUT[P.scales_at + i / block_len] = bitcast<u32>(d);
#endif
        }
    }
#endif
    // The next chunk writes `best_value` and `best_index` again.
    workgroupBarrier();
}
