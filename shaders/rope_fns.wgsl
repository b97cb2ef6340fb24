// RoPE's rotation, shared by rope.wgsl and kv_store.wgsl (appended to both by shader.rs).

// (cos, sin) of pair i's angle at position pos: freq_scale * (pos * theta_scale^i) / ff, with
// theta_scale^i by repeated multiplication, as ggml computes it.
fn rope_cos_sin(pos: f32, i: u32, theta_scale: f32, freq_scale: f32, ff: f32) -> vec2<f32> {
    var theta = pos;
    for (var j = 0u; j < i; j++) {
        theta = theta * theta_scale;
    }
    let angle = freq_scale * (theta / ff);
    return vec2<f32>(cos(angle), sin(angle));
}

// The pair (a, b) rotated by the angle whose (cos, sin) is cs.
fn rope_rotate(a: f32, b: f32, cs: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(fma(a, cs.x, -(b * cs.y)), fma(a, cs.y, b * cs.x));
}
