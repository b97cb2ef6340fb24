//! WGSL sources (the top-level `shaders/` directory, compiled into the binary), a tiny
//! `#ifdef NAME` / `#else` / `#endif` / `#foreach` preprocessor, and the pipeline cache.

use crate::WgpuError;
use std::collections::HashMap;

/// One `.wgsl` file per kernel family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShaderFile {
    Quant,
    MatmulQ8,
    ActQuant,
    Norm,
    Rope,
    KvStore,
    Attention,
    Elementwise,
    Sampling,
    Experts,
}

impl ShaderFile {
    #[cfg(test)]
    pub const ALL: [ShaderFile; 10] = [
        ShaderFile::Quant,
        ShaderFile::MatmulQ8,
        ShaderFile::ActQuant,
        ShaderFile::Norm,
        ShaderFile::Rope,
        ShaderFile::KvStore,
        ShaderFile::Attention,
        ShaderFile::Elementwise,
        ShaderFile::Sampling,
        ShaderFile::Experts,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ShaderFile::Quant => "quant.wgsl",
            ShaderFile::MatmulQ8 => "matmul_q8.wgsl",
            ShaderFile::ActQuant => "act_quant.wgsl",
            ShaderFile::Norm => "norm.wgsl",
            ShaderFile::Rope => "rope.wgsl",
            ShaderFile::KvStore => "kv_store.wgsl",
            ShaderFile::Attention => "attention.wgsl",
            ShaderFile::Elementwise => "elementwise.wgsl",
            ShaderFile::Sampling => "sampling.wgsl",
            ShaderFile::Experts => "experts.wgsl",
        }
    }

    /// The file's text, and the shared declarations appended to it (elementwise activations, the
    /// KV cache's layout, RoPE's rotation, exactly rounded division, the mat-muls' parameters).
    pub fn source(self) -> String {
        const ACTIVATION_FNS: &str = include_str!("../../../shaders/activation_fns.wgsl");
        const FLOAT_FNS: &str = include_str!("../../../shaders/float_fns.wgsl");
        const KV_CACHE: &str = include_str!("../../../shaders/kv_cache.wgsl");
        const ROPE_FNS: &str = include_str!("../../../shaders/rope_fns.wgsl");
        match self {
            ShaderFile::ActQuant => format!("{}\n{ACTIVATION_FNS}\n{FLOAT_FNS}", self.own_source()),
            ShaderFile::Elementwise => format!("{}\n{ACTIVATION_FNS}", self.own_source()),
            ShaderFile::Norm => format!("{}\n{FLOAT_FNS}", self.own_source()),
            ShaderFile::Rope => format!("{}\n{ROPE_FNS}", self.own_source()),
            ShaderFile::KvStore => format!("{}\n{KV_CACHE}\n{ROPE_FNS}\n{FLOAT_FNS}", self.own_source()),
            ShaderFile::Attention => format!("{}\n{KV_CACHE}\n{ACTIVATION_FNS}\n{FLOAT_FNS}", self.own_source()),
            ShaderFile::Quant | ShaderFile::MatmulQ8 => {
                format!("{}\n{}\n{}", self.own_source(), MATMUL_PARAMS.1, MXFP4_FNS)
            }
            _ => self.own_source().to_string(),
        }
    }

    /// The file's own text, without the shared functions.
    pub(crate) fn own_source(self) -> &'static str {
        match self {
            ShaderFile::Quant => include_str!("../../../shaders/quant.wgsl"),
            ShaderFile::MatmulQ8 => include_str!("../../../shaders/matmul_q8.wgsl"),
            ShaderFile::ActQuant => include_str!("../../../shaders/act_quant.wgsl"),
            ShaderFile::Norm => include_str!("../../../shaders/norm.wgsl"),
            ShaderFile::Rope => include_str!("../../../shaders/rope.wgsl"),
            ShaderFile::KvStore => include_str!("../../../shaders/kv_store.wgsl"),
            ShaderFile::Attention => include_str!("../../../shaders/attention.wgsl"),
            ShaderFile::Elementwise => include_str!("../../../shaders/elementwise.wgsl"),
            ShaderFile::Sampling => include_str!("../../../shaders/sampling.wgsl"),
            ShaderFile::Experts => include_str!("../../../shaders/experts.wgsl"),
        }
    }
}

/// MXFP4 decoding, shared by quant.wgsl and matmul_q8.wgsl.
const MXFP4_FNS: &str = include_str!("../../../shaders/mxfp4_fns.wgsl");

/// (file name, text) of the mat-muls' parameter struct, shared by quant.wgsl and matmul_q8.wgsl.
pub(crate) const MATMUL_PARAMS: (&str, &str) =
    ("matmul_params.wgsl", include_str!("../../../shaders/matmul_params.wgsl"));

/// Keeps the lines whose enclosing `#ifdef` conditions hold for `defines`. Directives must stand
/// alone on their line (leading whitespace allowed); nesting is supported; `#ifdef A || B` holds
/// if any of the names is defined.
///
/// `#foreach $X in a, b if NAME, c if OTHER` … `#endforeach` (not nested) first repeats the lines
/// between them once per listed value whose condition holds, `$X` replaced by the value: code that
/// differs only in which binding it reads (matmul_q8.wgsl's segments) is written once and
/// specialised per binding, rather than choosing the binding on every access.
pub fn preprocess(file: &str, source: &str, defines: &[&str]) -> Result<String, WgpuError> {
    let bad = |line: usize, reason: &str| WgpuError::Shader {
        file: file.to_string(),
        message: format!("line {}: {reason}", line + 1),
    };
    let expanded = expand_foreach(source, defines).map_err(|(line, reason)| bad(line, reason))?;
    // Each open block: (condition of this branch, whether we are past `#else`).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let mut out = String::with_capacity(expanded.len());
    for (n, line) in expanded.lines().enumerate() {
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix("#ifdef") {
            let names: Vec<&str> = name.split("||").map(str::trim).collect();
            if names.iter().any(|name| name.is_empty()) {
                return Err(bad(n, "#ifdef without a name"));
            }
            stack.push((names.iter().any(|name| defines.contains(name)), false));
        } else if trimmed == "#else" {
            match stack.last_mut() {
                Some((cond, seen_else)) if !*seen_else => {
                    *cond = !*cond;
                    *seen_else = true;
                }
                _ => return Err(bad(n, "#else without #ifdef")),
            }
        } else if trimmed == "#endif" {
            if stack.pop().is_none() {
                return Err(bad(n, "#endif without #ifdef"));
            }
        } else if trimmed.starts_with('#') {
            return Err(bad(n, "unknown directive"));
        } else {
            if stack.iter().all(|(cond, _)| *cond) {
                out.push_str(line);
            }
        }
        // One output line per input line (directives become blank lines), so compiler messages
        // carry the file's line numbers.
        out.push('\n');
    }
    if !stack.is_empty() {
        return Err(bad(expanded.lines().count(), "unterminated #ifdef"));
    }
    Ok(out)
}

/// `#foreach` blocks repeated per value (see `preprocess`). Lines outside them keep their numbers
/// when the file has none before them; an error is (line, reason).
fn expand_foreach(source: &str, defines: &[&str]) -> Result<String, (usize, &'static str)> {
    let mut out = String::with_capacity(source.len());
    // The open block: its variable, the values whose conditions hold, and its lines so far.
    let mut block: Option<(String, Vec<String>, Vec<&str>)> = None;
    for (n, line) in source.lines().enumerate() {
        let trimmed = line.trim();
        if let Some(spec) = trimmed.strip_prefix("#foreach") {
            if block.is_some() {
                return Err((n, "nested #foreach"));
            }
            let (var, values) = spec.split_once(" in ").ok_or((n, "#foreach without `in`"))?;
            let var = var.trim();
            if !var.starts_with('$') || var.len() < 2 {
                return Err((n, "#foreach variable must be $NAME"));
            }
            let mut kept = Vec::new();
            for value in values.split(',') {
                let (value, holds) = match value.split_once(" if ") {
                    Some((value, name)) => (value.trim(), defines.contains(&name.trim())),
                    None => (value.trim(), true),
                };
                if value.is_empty() {
                    return Err((n, "#foreach with an empty value"));
                }
                if holds {
                    kept.push(value.to_string());
                }
            }
            block = Some((var.to_string(), kept, Vec::new()));
        } else if trimmed == "#endforeach" {
            let (var, values, lines) = block.take().ok_or((n, "#endforeach without #foreach"))?;
            for value in &values {
                for l in &lines {
                    out.push_str(&l.replace(&var, value));
                    out.push('\n');
                }
            }
        } else if let Some((_, _, lines)) = block.as_mut() {
            lines.push(line);
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    match block {
        Some(_) => Err((source.lines().count(), "unterminated #foreach")),
        None => Ok(out),
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    pub file: ShaderFile,
    pub entry: &'static str,
    /// Sorted, deduplicated.
    pub defines: Vec<&'static str>,
}

impl PipelineKey {
    pub fn new(file: ShaderFile, entry: &'static str, defines: &[&'static str]) -> Self {
        let mut defines = defines.to_vec();
        defines.sort_unstable();
        defines.dedup();
        PipelineKey { file, entry, defines }
    }
}

/// Compute pipelines by (file, entry point, defines); layouts are derived from the shader, so a
/// pipeline's bind group layout lists exactly the bindings its entry point uses.
#[derive(Default)]
pub struct PipelineCache {
    pipelines: HashMap<PipelineKey, wgpu::ComputePipeline>,
    pub created: u64,
}

impl PipelineCache {
    pub fn get(&mut self, device: &wgpu::Device, key: &PipelineKey) -> Result<wgpu::ComputePipeline, WgpuError> {
        if let Some(p) = self.pipelines.get(key) {
            return Ok(p.clone());
        }
        let source = preprocess(key.file.name(), &key.file.source(), &key.defines)?;
        let label = format!("{}:{}[{}]", key.file.name(), key.entry, key.defines.join(","));
        let scope = crate::replay::validation_scope(device);
        let descriptor =
            wgpu::ShaderModuleDescriptor { label: Some(&label), source: wgpu::ShaderSource::Wgsl(source.into()) };
        // Without Naga's clamp on every index and counter in every loop (natively; a browser
        // keeps its own checks). Safety: every index a kernel computes lies within its binding
        // for a graph `Graph::validate` accepted (the sizes come from that graph, the kernels
        // guard every partial tile), and every loop is bounded by those sizes; wgpu still
        // turns on the driver's robust buffer access where the device has it. Integer division
        // keeps its checks.
        let mut checks = wgpu::ShaderRuntimeChecks::checked();
        checks.bounds_checks = false;
        checks.force_loop_bounding = false;
        let module = unsafe { device.create_shader_module_trusted(descriptor, checks) };
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some(key.entry),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = crate::replay::pop_scope(scope) {
            return Err(WgpuError::Shader { file: label, message: e.to_string() });
        }
        self.created += 1;
        self.pipelines.insert(key.clone(), pipeline.clone());
        Ok(pipeline)
    }
}

#[cfg(test)]
mod tests {
    use super::{preprocess, ShaderFile};

    /// The router width experts.wgsl holds in workgroup memory, and the groups it scores, are the
    /// ones compile.rs refuses above.
    #[test]
    fn route_experts_capacity_mirrors_rust() {
        for declared in [
            format!("const MAX_EXPERTS: u32 = {}u;", crate::compile::MAX_ROUTED_EXPERTS),
            // A thread per expert group.
            format!("const ROUTE_WG: u32 = {}u;", crate::compile::ROUTE_GROUPS),
        ] {
            assert!(ShaderFile::Experts.own_source().contains(&declared), "experts.wgsl lacks `{declared}`");
        }
    }

    /// `div_rn` (float_fns.wgsl) gives IEEE 754's quotient bit for bit, on the adapter at hand:
    /// the divisions the roundings make (127 / amax, amax / 127, -127 / max, 1 / iscale, max / -8,
    /// a sum / its length) and random operands across the exponent range.
    #[test]
    fn div_rn_divides_as_ieee_754() {
        use wgpu::util::DeviceExt;
        let Some(gpu) = crate::device::open_for_test() else { return };
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // A float with a random significand and sign, its exponent in [lo, hi): quotients stay
        // normal (a subnormal one takes the device's division, which may flush it to zero).
        let mut random = |lo: i32, hi: i32| {
            let r = next();
            let e = lo + ((r >> 32) % (hi - lo) as u64) as i32;
            f32::from_bits(((r as u32) & 0x807f_ffff) | (((e + 127) as u32) << 23))
        };
        let mut pairs = Vec::new();
        for _ in 0..8192 {
            let amax = random(-20, 20).abs();
            pairs.extend([(127.0, amax), (amax, 127.0), (-127.0, random(-20, 20)), (1.0, random(-20, 20))]);
            pairs.extend([
                (random(-20, 20), -8.0),
                (random(-10, 30).abs(), [64.0, 896.0, 1536.0, 8960.0][pairs.len() % 4]),
            ]);
            pairs.push((random(-60, 60), random(-60, 60)));
        }
        // Quotients past f32's normal range, and operands the device divides itself.
        pairs.extend([(1e30, 1e-30), (1e-30, 1e30), (0.0, 3.0), (3.0, 0.0), (f32::INFINITY, 2.0)]);
        let n = pairs.len();
        let input: Vec<f32> = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
        let source = format!(
            "@group(0) @binding(0) var<storage, read> AB: array<vec2<f32>>;\n\
             @group(0) @binding(1) var<storage, read_write> Q: array<f32>;\n\
             @compute @workgroup_size(64)\n\
             fn main(@builtin(global_invocation_id) id: vec3<u32>) {{\n\
                 let i = id.x;\n\
                 if (i < arrayLength(&Q)) {{ Q[i] = div_rn(AB[i].x, AB[i].y); }}\n\
             }}\n{}",
            include_str!("../../../shaders/float_fns.wgsl")
        );
        let device = &gpu.device;
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("div_rn"),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("div_rn"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let ab = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: bytemuck::cast_slice(&input),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let bytes = (n * 4) as u64;
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
        let q = device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes,
            usage,
            mapped_at_creation: false,
        });
        let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes,
            usage,
            mapped_at_creation: false,
        });
        let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: ab.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: q.as_entire_binding() },
            ],
        });
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(n.div_ceil(64) as u32, 1, 1);
        }
        encoder.copy_buffer_to_buffer(&q, 0, &staging, 0, bytes);
        gpu.queue.submit([encoder.finish()]);
        staging.slice(..).map_async(wgpu::MapMode::Read, |r| r.expect("map"));
        device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
        let got: Vec<f32> = bytemuck::cast_slice(&staging.slice(..).get_mapped_range().expect("mapped")).to_vec();
        let wrong: Vec<String> = pairs
            .iter()
            .zip(&got)
            .filter(|(&(a, b), &q)| q.to_bits() != (a / b).to_bits() && !(q.is_nan() && (a / b).is_nan()))
            .take(8)
            .map(|(&(a, b), &q)| format!("{a:e} / {b:e}: {q:e}, IEEE {:e}", a / b))
            .collect();
        assert!(wrong.is_empty(), "div_rn on {}: {wrong:?}", gpu.info.adapter_name);
    }

    #[test]
    fn ifdef_else_endif_nesting() {
        let src = "a\n#ifdef X\nb\n#ifdef Y\nc\n#else\nd\n#endif\n#else\ne\n#endif\nf\n";
        let keep = |defs: &[&str]| -> Vec<String> {
            preprocess("t", src, defs).unwrap().lines().filter(|l| !l.is_empty()).map(String::from).collect()
        };
        assert_eq!(keep(&[]), ["a", "e", "f"]);
        assert_eq!(keep(&["X"]), ["a", "b", "d", "f"]);
        assert_eq!(keep(&["X", "Y"]), ["a", "b", "c", "f"]);
        assert_eq!(keep(&["Y"]), ["a", "e", "f"]);
        assert!(preprocess("t", "#ifdef X\n", &[]).is_err());
        assert!(preprocess("t", "#endif\n", &[]).is_err());
        assert!(preprocess("t", "#ifdef X\n#else\n#else\n#endif\n", &[]).is_err());
        // Line numbers are preserved.
        assert_eq!(preprocess("t", src, &[]).unwrap().lines().count(), src.lines().count());
    }

    #[test]
    fn foreach_repeats_per_value_whose_condition_holds() {
        let src = "a\n#foreach $S in 0, 1 if ONE, 2 if TWO\nw$S\n#ifdef X\nx$S\n#endif\n#endforeach\nb\n";
        let kept = |defs: &[&str]| preprocess("t", src, defs).unwrap().split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(kept(&[]), "a w0 b");
        assert_eq!(kept(&["TWO", "X"]), "a w0 x0 w2 x2 b");
        assert_eq!(kept(&["ONE", "TWO"]), "a w0 w1 w2 b");
        assert!(preprocess("t", "#foreach $S in 0\n", &[]).is_err());
        assert!(preprocess("t", "#endforeach\n", &[]).is_err());
        assert!(preprocess("t", "#foreach S in 0\n#endforeach\n", &[]).is_err());
        assert!(preprocess("t", "#foreach $S in 0\n#foreach $T in 1\n#endforeach\n#endforeach\n", &[]).is_err());
    }

    #[test]
    fn ifdef_any_of_several_names() {
        let src = "#ifdef A || B
x
#else
y
#endif
";
        let keep = |defs: &[&str]| preprocess("t", src, defs).unwrap().split_whitespace().collect::<String>();
        assert_eq!(keep(&["A"]), "x");
        assert_eq!(keep(&["B"]), "x");
        assert_eq!(keep(&["C"]), "y");
        assert!(preprocess(
            "t",
            "#ifdef A ||
#endif
",
            &[]
        )
        .is_err());
    }
}
