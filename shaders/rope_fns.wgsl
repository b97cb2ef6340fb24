// RoPE's rotation, shared by rope.wgsl and kv_store.wgsl (appended to both by shader.rs).

// (cos, sin) of pair i's angle at position pos: freq_scale * (pos * theta_scale^i) / ff, with
// theta_scale^i by repeated multiplication, as ggml computes it. With YaRN (yarn = (ext_factor,
// corr_low, corr_high, mscale), ext_factor != 0), the angle blends that interpolated angle with
// the extrapolated one, (pos * theta_scale^i) / ff, and cos and sin are scaled, as ggml's
// rope_yarn (and hearth-core's RopeYarn) computes them.
fn rope_cos_sin(pos: f32, i: u32, theta_scale: f32, freq_scale: f32, ff: f32, yarn: vec4<f32>) -> vec2<f32> {
    var theta = pos;
    for (var j = 0u; j < i; j++) {
        theta = theta * theta_scale;
    }
    let extrapolated = theta / ff;
    let interpolated = freq_scale * extrapolated;
    if (yarn.x == 0.0) {
        return vec2<f32>(cos(interpolated), sin(interpolated));
    }
    let ramp = (f32(i) - yarn.y) / max(0.001, yarn.z - yarn.y);
    let mix = (1.0 - clamp(ramp, 0.0, 1.0)) * yarn.x;
    let angle = interpolated * (1.0 - mix) + extrapolated * mix;
    return vec2<f32>(cos(angle) * yarn.w, sin(angle) * yarn.w);
}

// The pair (a, b) rotated by the angle whose (cos, sin) is cs.
fn rope_rotate(a: f32, b: f32, cs: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(fma(a, cs.x, -(b * cs.y)), fma(a, cs.y, b * cs.x));
}
