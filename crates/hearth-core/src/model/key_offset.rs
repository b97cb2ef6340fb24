//! Per-layer key offsets for quantized KV caches (see `Op::StoreKv`): a constant vector the cache
//! subtracts from every stored key. Softmax ignores a shift shared by all the scores of a query,
//! so any constant is exact; a good one removes what the keys have in common. Qwen2's K bias puts
//! channels of up to ~150 into every key (the rest are ~1), which 8-bit and 4-bit blocks store
//! badly even Hadamard-rotated. After RoPE the bias of a key at position p is R_p·b: in the
//! rotated pairs of low frequency R_p barely moves it, so b itself is (almost) the common part
//! there; in fast pairs it turns around and no constant is close to it. Data-free: computed from
//! the bias and the RoPE frequencies only.

use super::config::ModelConfig;
use crate::graph::RopeMode;

/// A pair whose rotation over the training context stays under this angle gets the bias as its
/// offset: |R_p·b − b| = 2|b|·sin(angle/2) < |b| below π/3, so the stored values only shrink.
const MAX_PAIR_ANGLE: f32 = std::f32::consts::FRAC_PI_3;

/// Which offset the experiments of this change compare (HEARTH_KV_KEY_OFFSET: none, all, or
/// slow — the default).
fn policy() -> String {
    std::env::var("HEARTH_KV_KEY_OFFSET").unwrap_or_else(|_| "slow".into())
}

/// Experiment switch (HEARTH_KV_V_OFFSET=0 disables): values minus their bias.
pub fn values_offset_enabled() -> bool {
    std::env::var("HEARTH_KV_V_OFFSET").map_or(true, |v| v != "0")
}

/// The offset of one layer: [n_head_kv * head_dim], from its K bias `bias` (same shape),
/// `None` when no dimension gets one. `layer` picks the RoPE frequencies.
pub fn key_offset(cfg: &ModelConfig, layer: usize, bias: &[f32]) -> Option<Vec<f32>> {
    let hd = cfg.head_dim;
    if hd == 0 || bias.len() != cfg.n_head_kv * hd || cfg.n_rot > hd {
        return None;
    }
    let policy = policy();
    if policy == "none" {
        return None;
    }
    let la = cfg.layers.get(layer)?;
    let half = cfg.n_rot / 2;
    // Which dims of a head keep the bias: the unrotated tail always, rotated pairs if slow enough.
    let mut keep = vec![policy == "all"; hd];
    keep[cfg.n_rot..].iter_mut().for_each(|k| *k = true);
    let max_angle = if let Some(a) = policy.strip_prefix("angle:") { a.parse().unwrap_or(MAX_PAIR_ANGLE) } else { MAX_PAIR_ANGLE };
    for i in 0..half {
        let theta = la.rope_scale * la.rope_base.powf(-2.0 * i as f32 / cfg.n_rot as f32);
        if theta * cfg.n_ctx_train.saturating_sub(1) as f32 <= max_angle {
            let (a, b) = match cfg.rope_mode {
                RopeMode::Neox => (i, i + half),
                RopeMode::Normal => (2 * i, 2 * i + 1),
            };
            keep[a] = true;
            keep[b] = true;
        }
    }
    if !keep.iter().any(|&k| k) {
        return None;
    }
    Some(bias.iter().enumerate().map(|(d, &b)| if keep[d % hd] { b } else { 0.0 }).collect())
}
