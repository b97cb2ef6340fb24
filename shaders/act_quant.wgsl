// Activation rounding before a mat-mul, reproducing the 8-bit (or f16) activations the CPU
// backend and llama.cpp multiply quantized weights with. The output holds the values those
// activations stand for (q * d) as f32, so the mat-mul kernel computes the same sums as the
// integer dot products, up to the order of f32 additions.
// Q8_0: blocks of 32, d = amax / 127 stored as f16, q = round_even(x * 127 / amax).
// Q8_K: blocks of 256, iscale = -127 / (value of largest magnitude), q = min(round_even(x * iscale), 127), d = 1 / iscale (f32).
// F16: each value rounded to f16.

// [n_blocks, block_len, groups_x]
@group(0) @binding(0) var<storage, read> P: array<u32>;
// [rows, k] f32, k a multiple of block_len
@group(0) @binding(1) var<storage, read> X: array<f32>;
// [rows, k] f32
@group(0) @binding(2) var<storage, read_write> OUT: array<f32>;

// Round to nearest-even f16, exactly (bit arithmetic in f16's normal range).
fn round_f16(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    let exponent = (bits >> 23u) & 0xffu;
    if (exponent >= 113u && exponent < 142u) {
        let lsb = (bits >> 13u) & 1u;
        return bitcast<f32>((bits + 0x0fffu + lsb) & ~0x1fffu);
    }
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

// One thread per block.
@compute @workgroup_size(64)
fn act_quant(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let block = (wg.y * P[2] + wg.x) * 64u + lid.x;
    if (block >= P[0]) {
        return;
    }
    let len = P[1];
    let base = block * len;
#ifdef F16
    for (var i = 0u; i < len; i++) {
        OUT[base + i] = round_f16(X[base + i]);
    }
#endif
#ifdef Q8_0
    var amax = 0.0;
    for (var i = 0u; i < len; i++) {
        amax = max(amax, abs(X[base + i]));
    }
    var id = 0.0;
    if (amax != 0.0) {
        id = 127.0 / amax;
    }
    let d = round_f16(amax / 127.0);
    for (var i = 0u; i < len; i++) {
        OUT[base + i] = round(X[base + i] * id) * d;
    }
#endif
#ifdef Q8_K
    var amax = 0.0;
    var vmax = 0.0;
    for (var i = 0u; i < len; i++) {
        let v = X[base + i];
        if (abs(v) > amax) {
            amax = abs(v);
            vmax = v;
        }
    }
    if (amax == 0.0) {
        for (var i = 0u; i < len; i++) {
            OUT[base + i] = 0.0;
        }
        return;
    }
    let iscale = -127.0 / vmax;
    let d = 1.0 / iscale;
    for (var i = 0u; i < len; i++) {
        OUT[base + i] = min(round(iscale * X[base + i]), 127.0) * d;
    }
#endif
}
