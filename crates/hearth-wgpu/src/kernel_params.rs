//! Each kernel's parameters (binding 0, a uniform) as a `#[repr(C)]` struct of 4-byte fields,
//! mirrored field for field by a WGSL `struct` of the same name in the kernel's `.wgsl` file. A test
//! reads every file that declares one and compares its fields, names, order and types, with the
//! Rust definition, so the two cannot drift; nothing is addressed by position.

use bytemuck::{Pod, Zeroable};

/// A kernel's parameter block (what `Builder::push` uploads).
pub(crate) trait KernelParams: Pod {}

/// How the shaders declare a parameter block, for the mirror test.
#[cfg(test)]
trait WgslMirror {
    /// The WGSL struct's name.
    const WGSL_NAME: &'static str;
    /// (name, WGSL type) of each field, in order.
    const FIELDS: &'static [(&'static str, &'static str)];
    /// The shader files that declare the struct.
    const FILES: &'static [&'static str];
}

/// Declares parameter structs: the Rust struct and its description for the mirror test. Fields
/// are `u32` or `f32`, which WGSL spells the same way and lays out at the same offsets.
macro_rules! kernel_params {
    ($(
        $(#[doc = $doc:literal])*
        struct $name:ident in [$($file:literal),+] {
            $($(#[doc = $field_doc:literal])* $field:ident: $ty:ident,)*
        }
    )*) => {$(
        $(#[doc = $doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
        pub(crate) struct $name {
            $($(#[doc = $field_doc])* pub $field: $ty,)*
        }

        impl KernelParams for $name {}

        #[cfg(test)]
        impl WgslMirror for $name {
            const WGSL_NAME: &'static str = stringify!($name);
            const FIELDS: &'static [(&'static str, &'static str)] = &[$((stringify!($field), stringify!($ty)),)*];
            const FILES: &'static [&'static str] = &[$($file),+];
        }
    )*};
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

    /// quant.wgsl `matmul` and matmul_q8.wgsl: one chunk of a weight, or sibling weights in
    /// segments (q/k/v, gate/up) on the same activations.
    struct MatMulParams in ["quant.wgsl", "matmul_q8.wgsl"] {
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
    }

    /// elementwise.wgsl.
    struct ElementwiseParams in ["elementwise.wgsl"] {
        len: u32,
        groups_x: u32,
        /// `scale`'s factor.
        factor: f32,
        /// `last_rows`' row length.
        cols: u32,
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
    use crate::shader::ShaderFile;

    const ALL_FILES: [ShaderFile; 9] = ShaderFile::ALL;

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

    fn check<P: WgslMirror>() {
        assert_eq!(std::mem::size_of::<P>(), 4 * P::FIELDS.len(), "{}: 4-byte fields only", P::WGSL_NAME);
        let rust: Vec<(String, String)> = P::FIELDS.iter().map(|(f, t)| (f.to_string(), t.to_string())).collect();
        let declaring: Vec<&str> = ALL_FILES
            .iter()
            .filter(|file| wgsl_fields(file.own_source(), P::WGSL_NAME).is_some())
            .map(|file| file.name())
            .collect();
        assert_eq!(declaring, P::FILES, "the files that declare {}", P::WGSL_NAME);
        for file in ALL_FILES.iter().filter(|file| P::FILES.contains(&file.name())) {
            let wgsl = wgsl_fields(file.own_source(), P::WGSL_NAME).expect("declared");
            assert_eq!(wgsl, rust, "{} in {} against kernel_params.rs", P::WGSL_NAME, file.name());
        }
    }

    #[test]
    fn every_wgsl_parameter_struct_mirrors_its_rust_struct() {
        check::<EmbedParams>();
        check::<MatMulParams>();
        check::<ActQuantParams>();
        check::<NormParams>();
        check::<RopeParams>();
        check::<StoreKvParams>();
        check::<HeadsParams>();
        check::<AttentionParams>();
        check::<ElementwiseParams>();
        check::<TopKParams>();
    }

    #[test]
    fn every_shader_binds_its_parameters_as_a_declared_struct() {
        // A kernel that went back to positional words would bind an array at binding 0.
        for file in ALL_FILES {
            for line in file.own_source().lines().filter(|l| l.contains("@binding(0)")) {
                let ty = line.rsplit(':').next().unwrap_or("").trim().trim_end_matches(';');
                let declared = [
                    EmbedParams::WGSL_NAME,
                    MatMulParams::WGSL_NAME,
                    ActQuantParams::WGSL_NAME,
                    NormParams::WGSL_NAME,
                    RopeParams::WGSL_NAME,
                    StoreKvParams::WGSL_NAME,
                    HeadsParams::WGSL_NAME,
                    AttentionParams::WGSL_NAME,
                    ElementwiseParams::WGSL_NAME,
                    TopKParams::WGSL_NAME,
                ];
                assert!(declared.contains(&ty), "{}: binding 0 is `{ty}`, not a kernel_params.rs struct", file.name());
            }
        }
    }
}
