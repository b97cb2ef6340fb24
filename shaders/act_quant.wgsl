// Activation rounding before a mat-mul, reproducing the 8-bit (or f16) activations the CPU
// backend and llama.cpp multiply quantized weights with, so the mat-mul's integer dot products
// (matmul_q8.wgsl) are the CPU's integer sums.
// Q8_0: blocks of 32, d = amax / 127 stored as f16, q = round_even(x * 127 / amax).
// Q8_K: blocks of 256, iscale = -127 / (value of largest magnitude, the first one on a tie),
//       q = min(round_even(x * iscale), 127), d = 1 / iscale (f32).
// F16: each value rounded to f16, written as f32 (quant.wgsl's F16 mat-mul reads f32).
// Fully parallel: one invocation per 4 values, a 64-invocation workgroup per 256 values of a row
// (one Q8_K block or eight Q8_0 blocks), the block maximum found by a shared-memory tree.
//
// The op producing the input runs here as a prologue when only mat-muls read its output
// (compile.rs), so it costs no dispatch of its own and its f32 output is never written:
// NORM: RMS normalisation of each row (WEIGHT: times a weight), as norm.wgsl computes it;
// SWIGLU / GEGLU: silu(gate) * up / gelu(gate) * up, as elementwise.wgsl computes them.

// [k, scales_at, eps (f32 bits, NORM)]: k (row length) a multiple of 32 for Q8_0 / Q8_K;
// scales_at = the word where the scales start (rows * k / 4)
@group(0) @binding(0) var<storage, read> P: array<u32>;
// [rows, k] f32: the input (SWIGLU / GEGLU: the gate)
@group(0) @binding(1) var<storage, read> X: array<f32>;
// Q8_0 / Q8_K: [rows * k / 4] u32, 4 codes each (value 4i + j in byte j), then
// [rows * k / block_len] f32 scales (as bits), block b's at scales_at + b.
// F16: [rows, k] f32 (as bits).
@group(0) @binding(2) var<storage, read_write> OUT: array<u32>;
#ifdef SWIGLU || GEGLU
// [rows, k] f32
@group(0) @binding(3) var<storage, read> UP: array<f32>;
#endif
#ifdef WEIGHT
// [k] f32 (GGUF F32 bytes)
@group(0) @binding(4) var<storage, read> NW: array<f32>;
#endif

const WG: u32 = 64u;
#ifdef Q8_K
// Invocations per block (256 values).
const GROUP: u32 = 64u;
#else
// Q8_0: 32 values.
const GROUP: u32 = 8u;
#endif

// Per invocation: its candidate for the block's value of largest magnitude and that value's
// index (a tie keeps the first, as the CPU's scan does).
var<workgroup> best_value: array<f32, WG>;
var<workgroup> best_index: array<u32, WG>;
#ifdef NORM
var<workgroup> squares: array<f32, WG>;
#endif

// Value `i` (column `col`) of the input, through the prologue; `scale` is the row's RMS factor.
fn value(i: u32, col: u32, scale: f32) -> f32 {
#ifdef NORM
    var v = X[i] * scale;
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
#ifdef NORM || SWIGLU || GEGLU
#else
    return X[i];
#endif
}

// grid: (ceil(k / 256), rows)
@compute @workgroup_size(64)
fn act_quant(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let tid = lid.x;
    let k = P[0];
    let row = wg.y;
    let col = 256u * wg.x + 4u * tid;
    let i = row * k + col;
    var scale = 1.0;
#ifdef NORM
    // The row's sum of squares, in the same order by every workgroup of the row.
    var s = 0.0;
    for (var c = tid; c < k; c += WG) {
        let v = X[row * k + c];
        s += v * v;
    }
    squares[tid] = s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride) {
            squares[tid] += squares[tid + stride];
        }
        workgroupBarrier();
    }
    scale = 1.0 / sqrt(squares[0] / f32(k) + bitcast<f32>(P[2]));
#endif
#ifdef F16
    for (var j = 0u; j < 4u && col + j < k; j++) {
        OUT[i + j] = bitcast<u32>(round_f16(value(i + j, col + j, scale)));
    }
#else
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
#ifdef Q8_0
    var id = 0.0;
    if (amax != 0.0) {
        id = 127.0 / amax;
    }
    let q = vec4<i32>(round(x * id));
    let d = round_f16(amax / 127.0);
    let block_len = 32u;
#endif
#ifdef Q8_K
    var q = vec4<i32>(0);
    var d = 0.0;
    if (amax != 0.0) {
        let iscale = -127.0 / vmax;
        q = vec4<i32>(min(round(iscale * x), vec4<f32>(127.0)));
        d = 1.0 / iscale;
    }
    let block_len = 256u;
#endif
    if (valid) {
        OUT[i / 4u] = pack_codes(q);
        if (tid % GROUP == 0u) {
            OUT[P[1] + i / block_len] = bitcast<u32>(d);
        }
    }
#endif
}
