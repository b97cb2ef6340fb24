// Exactly rounded f32 arithmetic, shared by the kernels that must round as the CPU does
// (appended to their sources by shader.rs, so each file's own line numbers stay as written).

// a / b rounded to nearest even, as IEEE 754 (and the CPU) divides. WGSL's `/` may be off by up
// to 2.5 ulp (Vulkan's bound, which NVIDIA's drivers use): a quotient one ulp off moves an 8-bit
// code across its rounding boundary now and then, and the integer sums away from the CPU's.
// Normal operands with a normal quotient go through a 25-step integer long division of the
// significands (24 bits and a rounding bit, the remainder as the sticky bit); zeros, subnormals,
// infinities and NaNs, which no rounding here meets, take the device's division.
fn div_rn(a: f32, b: f32) -> f32 {
    let ua = bitcast<u32>(a);
    let ub = bitcast<u32>(b);
    let ea = (ua >> 23u) & 0xffu;
    let eb = (ub >> 23u) & 0xffu;
    if (ea == 0u || ea == 255u || eb == 0u || eb == 255u) {
        return a / b;
    }
    var ma = (ua & 0x7fffffu) | 0x800000u;
    let mb = (ub & 0x7fffffu) | 0x800000u;
    // The quotient's biased exponent, with ma / mb scaled into [1, 2).
    var e = i32(ea) - i32(eb) + 127;
    if (ma < mb) {
        ma = ma << 1u;
        e -= 1;
    }
    var q = 0u;
    var r = ma;
    // r < 2 mb < 2^25 throughout.
    for (var i = 0u; i < 25u; i++) {
        q = q << 1u;
        if (r >= mb) {
            r -= mb;
            q |= 1u;
        }
        r = r << 1u;
    }
    var m = q >> 1u;
    if ((q & 1u) == 1u && (r != 0u || (m & 1u) == 1u)) {
        m += 1u;
        if (m == 0x1000000u) {
            m = 0x800000u;
            e += 1;
        }
    }
    if (e <= 0 || e >= 255) {
        return a / b;
    }
    return bitcast<f32>(((ua ^ ub) & 0x80000000u) | (u32(e) << 23u) | (m & 0x7fffffu));
}
