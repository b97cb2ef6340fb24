// RMS normalisation of each `group` consecutive values, optionally times a weight of length
// `group`. One 256-thread workgroup per group (grid folded into 2-D past 65535 groups).
// INPLACE: out aliases x, so X is not bound and values are read from OUT.
// RESIDUAL adds R to the normalised values (an Add folded in: out = r + norm(x)); with
// RESIDUAL_IN_PLACE the residual is OUT itself, read before it is written.
// SUBGROUPS: the sum of squares is reduced with subgroupAdd, then every thread adds the
// subgroups' sums in the same order (no shared-memory tree). SHADER_F16 changes nothing here.
// Browsers require `enable subgroups;`; Naga (native) rejects it and needs no directive.
#ifdef SUBGROUPS_DIRECTIVE
enable subgroups;
#endif

// Mirrors kernel_params.rs (a test checks the fields).
struct NormParams {
    n_groups: u32,
    // the folded grid's x width
    groups_x: u32,
    // values per group
    group: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> P: NormParams;
#ifdef INPLACE
#else
// [rows, cols] f32
@group(0) @binding(1) var<storage, read> X: array<f32>;
#endif
#ifdef WEIGHT
// [group] f32 (GGUF F32 bytes)
@group(0) @binding(2) var<storage, read> NW: array<f32>;
#endif
// [rows, cols] f32
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;
#ifdef RESIDUAL
// [rows, cols] f32
@group(0) @binding(4) var<storage, read> R: array<f32>;
#endif

var<workgroup> partial: array<f32, 256>;

fn load(i: u32) -> f32 {
#ifdef INPLACE
    return OUT[i];
#else
    return X[i];
#endif
}

@compute @workgroup_size(256)
fn rms_norm(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
#ifdef SUBGROUPS
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
#endif
) {
    let g = wg.y * P.groups_x + wg.x;
    let valid = g < P.n_groups;
    let group = P.group;
    let base = g * group;
    var s = 0.0;
    if (valid) {
        for (var i = lid.x; i < group; i += 256u) {
            let v = load(base + i);
            s += v * v;
        }
    }
#ifdef SUBGROUPS
    // Subgroups are consecutive invocations (see quant.wgsl).
    s = subgroupAdd(s);
    if (sg_lane == 0u) {
        partial[lid.x / sg_size] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < (256u + sg_size - 1u) / sg_size; i++) {
        total += partial[i];
    }
#else
    partial[lid.x] = s;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride /= 2u) {
        if (lid.x < stride) {
            partial[lid.x] += partial[lid.x + stride];
        }
        workgroupBarrier();
    }
    let total = partial[0];
#endif
    if (!valid) {
        return;
    }
    let scale = div_rn(1.0, sqrt(div_rn(total, f32(group)) + P.eps));
    for (var i = lid.x; i < group; i += 256u) {
        var v = load(base + i) * scale;
#ifdef WEIGHT
        v = v * NW[i];
#endif
#ifdef RESIDUAL
        v = R[base + i] + v;
#endif
#ifdef RESIDUAL_IN_PLACE
        v = OUT[base + i] + v;
#endif
        OUT[base + i] = v;
    }
}
