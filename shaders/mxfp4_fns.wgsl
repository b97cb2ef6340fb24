// MXFP4 (OCP microscaling FP4) decoding, appended to quant.wgsl and matmul_q8.wgsl: a code's value
// is mxfp4_value(q) * e8m0_half(e), its E2M1 value doubled (an integer) times half the block's
// E8M0 scale, as ggml and hearth-core's quant/legacy.rs compute it.

// The doubled E2M1 value of 4-bit code q: 0, 1, 2, 3, 4, 6, 8, 12, and their negatives for
// q >= 8 (sign bit 3, magnitude m = q & 7: m below 2, else (2 + m % 2) << (m / 2 - 1)).
fn mxfp4_value(q: u32) -> i32 {
    let m = q & 7u;
    let magnitude = select(i32((2u + (m & 1u)) << ((m >> 1u) - 1u)), i32(m), m < 2u);
    return select(magnitude, -magnitude, q >= 8u);
}

// Four codes, one in the low nibble of each byte of `codes`, as four packed int8 values.
fn mxfp4_bytes(codes: u32) -> u32 {
    var packed = 0u;
    for (var i = 0u; i < 4u; i++) {
        packed |= (u32(mxfp4_value((codes >> (8u * i)) & 0xfu)) & 0xffu) << (8u * i);
    }
    return packed;
}

// 2^(e - 128): half the scale of E8M0 exponent e (a subnormal for e < 2).
fn e8m0_half(e: u32) -> f32 {
    return bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
}
