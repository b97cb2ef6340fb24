// Element-wise functions shared by elementwise.wgsl, act_quant.wgsl and attention.wgsl (appended
// to their sources by shader.rs, so each file's own line numbers stay as written).

// Four 8-bit codes in one word, value j in byte j.
fn pack_codes(q: vec4<i32>) -> u32 {
    let b = bitcast<vec4<u32>>(q) & vec4<u32>(0xffu);
    return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

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

// Round to nearest-even bf16 (the top half of the f32), as the CPU's conversion does; a NaN
// stays a NaN.
fn round_bf16(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return x;
    }
    return bitcast<f32>((bits + 0x7fffu + ((bits >> 16u) & 1u)) & 0xffff0000u);
}

// tanh without overflow for large |x| (exp(2x) overflows f32 past ~44).
fn safe_tanh(x: f32) -> f32 {
    let t = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - t) / (1.0 + t);
}

fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

// gpt-oss's clamped SwiGLU of a gate and an up value, as ggml's swiglu_oai with gpt-oss's
// constants (GluActivation::GPT_OSS; compile.rs refuses others): x = min(g, 7),
// y = clamp(u, ±7), x / (1 + e^(-1.702 x)) · (y + 1).
fn clamped_swiglu(g: f32, u: f32) -> f32 {
    let x = min(g, 7.0);
    let y = clamp(u, -7.0, 7.0);
    return x / (1.0 + exp(1.702 * -x)) * (y + 1.0);
}

// GELU (tanh form) of the f16-rounded input, rounded to f16, as ggml's CPU table does.
fn gelu_ggml(x: f32) -> f32 {
    if (x <= -10.0) {
        return 0.0;
    }
    if (x >= 10.0) {
        return x;
    }
    let h = round_f16(x);
    return round_f16(0.5 * h * (1.0 + safe_tanh(0.7978846 * h * (1.0 + 0.044715 * h * h))));
}
