//! Each kernel's parameters (binding 0, a uniform) as a `#[repr(C)]` struct of 4-byte fields,
//! mirrored field for field by a WGSL `struct` of the same name in the kernel's `.wgsl` file. A test
//! reads every file that declares one and compares its fields, names, order and types, with the
//! Rust definition, so the two cannot drift; nothing is addressed by position.

use bytemuck::{Pod, Zeroable};

/// A kernel's parameter block (what `Builder::push` uploads).
pub(crate) trait KernelParams: Pod {}

/// How the shaders declare one parameter struct, for the mirror test.
#[cfg(test)]
struct Mirror {
    name: &'static str,
    size: usize,
    /// (name, WGSL type) of each field, in order.
    fields: &'static [(&'static str, &'static str)],
    /// The shader files that declare the struct.
    files: &'static [&'static str],
}

/// Declares the parameter structs, and `MIRRORS` (what the mirror test compares with the
/// shaders). Fields are `u32` or `f32`, which WGSL spells the same way and lays out at the same
/// offsets.
macro_rules! kernel_params {
    ($(
        $(#[doc = $doc:literal])*
        struct $name:ident in [$($file:literal),+] {
            $($(#[doc = $field_doc:literal])* $field:ident: $ty:ident,)*
        }
    )*) => {
        $(
            $(#[doc = $doc])*
            #[repr(C)]
            #[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
            pub(crate) struct $name {
                $($(#[doc = $field_doc])* pub $field: $ty,)*
            }

            impl KernelParams for $name {}
        )*

        #[cfg(test)]
        const MIRRORS: &[Mirror] = &[$(Mirror {
            name: stringify!($name),
            size: std::mem::size_of::<$name>(),
            fields: &[$((stringify!($field), stringify!($ty)),)*],
            files: &[$($file),+],
        },)*];
    };
}

kernel_params! {
    /// quant.wgsl `embed`: one chunk of an embedding table.
    struct EmbedParams in ["quant.wgsl"] {
        /// The chunk's first row (a table too large for one binding is split into row ranges).
        row0: u32,
        rows: u32,
        row_len: u32,
        /// Bytes of a row as the file stores it.
        row_bytes: u32,
    }

    /// quant.wgsl `matmul` and matmul_q8.wgsl (declared in matmul_params.wgsl, appended to
    /// both): one chunk of a weight, or sibling weights in segments (q/k/v, gate/up) on the same
    /// activations.
    struct MatMulParams in ["matmul_params.wgsl"] {
        row0: u32,
        rows: u32,
        /// k: values in a weight row and in an activation row.
        row_len: u32,
        row_bytes: u32,
        /// Output columns (the weight's rows).
        n: u32,
        n_tokens: u32,
        /// The folded grid's x width (`compile::fold`).
        groups_x: u32,
        /// The word of the 8-bit activations where their scales start (act_quant.wgsl's layout).
        scales_at: u32,
        seg1_first_group: u32,
        seg1_rows: u32,
        seg1_row_bytes: u32,
        seg1_n: u32,
        seg2_first_group: u32,
        seg2_rows: u32,
        seg2_row_bytes: u32,
        seg2_n: u32,
        /// EXPERTS: experts chosen per token (the product has `n_used * n` columns).
        n_used: u32,
        /// EXPERTS: experts of the weight, `rows` rows each.
        n_expert: u32,
        /// EXPERTS: whole experts a binding holds (the last binding may hold fewer).
        experts_per_binding: u32,
    }

    /// act_quant.wgsl: rounding activations (with their producer as a prologue).
    struct ActQuantParams in ["act_quant.wgsl"] {
        k: u32,
        scales_at: u32,
        eps: f32,
        /// 256-value chunks of a row each workgroup rounds.
        chunks: u32,
        /// SUM: the first norm's epsilon.
        first_eps: f32,
    }

    /// norm.wgsl.
    struct NormParams in ["norm.wgsl"] {
        n_groups: u32,
        groups_x: u32,
        /// Values per group.
        group: u32,
        eps: f32,
    }

    /// rope.wgsl.
    struct RopeParams in ["rope.wgsl"] {
        n_tokens: u32,
        n_heads: u32,
        head_dim: u32,
        n_rot: u32,
        /// freq_base^(-2 / n_rot).
        theta_scale: f32,
        freq_scale: f32,
        /// YaRN: ext_factor (0: none), the correction range and the cos/sin scale.
        yarn_ext: f32,
        yarn_low: f32,
        yarn_high: f32,
        mscale: f32,
        cols: u32,
        groups_x: u32,
        /// SECOND: the second buffer's heads and row length.
        n_heads2: u32,
        cols2: u32,
    }

    /// kv_store.wgsl `store_kv`.
    struct StoreKvParams in ["kv_store.wgsl"] {
        n_tokens: u32,
        width: u32,
        groups_x: u32,
        layer: u32,
        /// SECOND: the values' row length.
        width2: u32,
    }

    /// kv_store.wgsl `prepare_heads`: the chain from the q/k/v projections to the KV store.
    struct HeadsParams in ["kv_store.wgsl"] {
        n_tokens: u32,
        n_q_heads: u32,
        n_k_heads: u32,
        n_v_heads: u32,
        head_dim: u32,
        n_rot: u32,
        theta_scale: f32,
        freq_scale: f32,
        /// YaRN: ext_factor (0: none), the correction range and the cos/sin scale.
        yarn_ext: f32,
        yarn_low: f32,
        yarn_high: f32,
        mscale: f32,
        layer: u32,
        groups_x: u32,
        eps: f32,
        q_scale: f32,
        k_scale: f32,
        /// Where each vector starts in the joined constants (0 where absent).
        q_norm_at: u32,
        k_norm_at: u32,
        freq_factors_at: u32,
        k_offset_at: u32,
        v_offset_at: u32,
    }

    /// attention.wgsl `attention` and `attention_reduce`.
    struct AttentionParams in ["attention.wgsl"] {
        n_tokens: u32,
        n_head: u32,
        n_head_kv: u32,
        head_dim: u32,
        scale: f32,
        /// Sliding window (0: none).
        window: u32,
        /// Soft-cap of the scores (0: none).
        softcap: f32,
        groups_x: u32,
        layer: u32,
        /// Splits in the grid (1 where the attention dispatch merges them itself).
        grid_splits: u32,
        /// Query heads a workgroup computes, of one KV head.
        group: u32,
        /// The reduce's 8-bit rounding: the word where its scales start.
        scales_at: u32,
        /// Values per value (and output) head: head_dim, or MLA's latent width.
        v_head_dim: u32,
        /// Values of the stored rows V is read from: n_head_kv * v_head_dim, or the key rows'
        /// width where the values are their start (ValueRows::KeyPrefix).
        v_row_width: u32,
    }

    /// experts.wgsl: routing and combining a mixture of experts.
    struct ExpertParams in ["experts.wgsl"] {
        n_tokens: u32,
        n_expert: u32,
        n_used: u32,
        scale: f32,
        /// COMBINE: values of a token's output row.
        cols: u32,
        groups_x: u32,
        /// TALLY: the router's first counter (tally.rs).
        tally_base: u32,
        /// GROUPS: expert groups, and how many of them are chosen from.
        n_group: u32,
        n_group_used: u32,
    }

    /// elementwise.wgsl.
    struct ElementwiseParams in ["elementwise.wgsl"] {
        len: u32,
        groups_x: u32,
        /// `scale`'s factor.
        factor: f32,
        /// `last_rows`' row length.
        cols: u32,
        /// `concat`'s slices of a and of b.
        group_a: u32,
        group_b: u32,
    }

    /// sampling.wgsl: per-row top-k.
    struct TopKParams in ["sampling.wgsl"] {
        n_rows: u32,
        n_vocab: u32,
        chunk_len: u32,
        n_chunks: u32,
        k: u32,
    }
}

/// The bytes of a parameter buffer: the struct, zero-padded to a multiple of 16 bytes (a
/// uniform binding's size is rounded up to that on some backends).
pub(crate) fn uniform_bytes<P: KernelParams>(params: &P) -> Vec<u8> {
    let mut bytes = bytemuck::bytes_of(params).to_vec();
    bytes.resize(bytes.len().div_ceil(16) * 16, 0);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shader::{ShaderFile, MATMUL_PARAMS};

    /// (name, text) of every WGSL file that may declare a parameter struct.
    fn wgsl_files() -> Vec<(&'static str, &'static str)> {
        ShaderFile::ALL.iter().map(|f| (f.name(), f.own_source())).chain([MATMUL_PARAMS]).collect()
    }

    /// (name, type) of the fields of `struct name { ... }` in `source`, comments skipped; `None`
    /// when the file declares no such struct.
    fn wgsl_fields(source: &str, name: &str) -> Option<Vec<(String, String)>> {
        let start = source.find(&format!("struct {name} {{"))?;
        let body = &source[start..];
        let body = &body[body.find('{')? + 1..body.find('}')?];
        Some(
            body.lines()
                .map(|line| line.split("//").next().unwrap_or("").trim())
                .filter(|line| !line.is_empty())
                .map(|line| {
                    let (field, ty) = line.trim_end_matches(',').split_once(':').expect("`name: type,`");
                    (field.trim().to_string(), ty.trim().to_string())
                })
                .collect(),
        )
    }

    #[test]
    fn every_wgsl_parameter_struct_mirrors_its_rust_struct() {
        for mirror in MIRRORS {
            assert_eq!(mirror.size, 4 * mirror.fields.len(), "{}: 4-byte fields only", mirror.name);
            let rust: Vec<(String, String)> =
                mirror.fields.iter().map(|(f, t)| (f.to_string(), t.to_string())).collect();
            let declaring: Vec<(&str, Vec<(String, String)>)> = wgsl_files()
                .into_iter()
                .filter_map(|(file, text)| Some((file, wgsl_fields(text, mirror.name)?)))
                .collect();
            let names: Vec<&str> = declaring.iter().map(|(file, _)| *file).collect();
            assert_eq!(names, mirror.files, "the files that declare {}", mirror.name);
            for (file, wgsl) in declaring {
                assert_eq!(wgsl, rust, "{} in {file} against kernel_params.rs", mirror.name);
            }
        }
    }

    #[test]
    fn every_shader_binds_its_parameters_as_a_declared_struct() {
        // A kernel that went back to positional words would bind an array at binding 0.
        for (file, text) in wgsl_files() {
            for line in text.lines().filter(|l| l.contains("@binding(0)")) {
                let ty = line.rsplit(':').next().unwrap_or("").trim().trim_end_matches(';');
                assert!(
                    MIRRORS.iter().any(|m| m.name == ty),
                    "{file}: binding 0 is `{ty}`, not a kernel_params.rs struct"
                );
            }
        }
    }
}
