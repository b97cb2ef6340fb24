//! WGSL sources (the top-level `shaders/` directory, compiled into the binary), a tiny
//! `#ifdef NAME` / `#else` / `#endif` preprocessor, and the pipeline cache.

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
    Attention,
    Elementwise,
    Sampling,
}

impl ShaderFile {
    pub fn name(self) -> &'static str {
        match self {
            ShaderFile::Quant => "quant.wgsl",
            ShaderFile::MatmulQ8 => "matmul_q8.wgsl",
            ShaderFile::ActQuant => "act_quant.wgsl",
            ShaderFile::Norm => "norm.wgsl",
            ShaderFile::Rope => "rope.wgsl",
            ShaderFile::Attention => "attention.wgsl",
            ShaderFile::Elementwise => "elementwise.wgsl",
            ShaderFile::Sampling => "sampling.wgsl",
        }
    }

    /// The file's text, and the shared functions appended to it (elementwise activations).
    pub fn source(self) -> String {
        const ACTIVATION_FNS: &str = include_str!("../../../shaders/activation_fns.wgsl");
        match self {
            ShaderFile::ActQuant | ShaderFile::Elementwise => format!("{}\n{ACTIVATION_FNS}", self.own_source()),
            _ => self.own_source().to_string(),
        }
    }

    fn own_source(self) -> &'static str {
        match self {
            ShaderFile::Quant => include_str!("../../../shaders/quant.wgsl"),
            ShaderFile::MatmulQ8 => include_str!("../../../shaders/matmul_q8.wgsl"),
            ShaderFile::ActQuant => include_str!("../../../shaders/act_quant.wgsl"),
            ShaderFile::Norm => include_str!("../../../shaders/norm.wgsl"),
            ShaderFile::Rope => include_str!("../../../shaders/rope.wgsl"),
            ShaderFile::Attention => include_str!("../../../shaders/attention.wgsl"),
            ShaderFile::Elementwise => include_str!("../../../shaders/elementwise.wgsl"),
            ShaderFile::Sampling => include_str!("../../../shaders/sampling.wgsl"),
        }
    }
}

/// Keeps the lines whose enclosing `#ifdef` conditions hold for `defines`. Directives must stand
/// alone on their line (leading whitespace allowed); nesting is supported; `#ifdef A || B` holds
/// if any of the names is defined.
pub fn preprocess(file: &str, source: &str, defines: &[&str]) -> Result<String, WgpuError> {
    // Each open block: (condition of this branch, whether we are past `#else`).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let mut out = String::with_capacity(source.len());
    let bad = |line: usize, reason: &str| WgpuError::Shader {
        file: file.to_string(),
        message: format!("line {}: {reason}", line + 1),
    };
    for (n, line) in source.lines().enumerate() {
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
        return Err(bad(source.lines().count(), "unterminated #ifdef"));
    }
    Ok(out)
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
    use super::preprocess;

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
