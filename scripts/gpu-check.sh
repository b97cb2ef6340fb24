#!/usr/bin/env bash
# On a machine with a GPU (e.g. NVIDIA with its Vulkan driver): the WebGPU op-conformance suite
# against the CPU oracle, then `hearth bench --backend wgpu` and `--backend cpu` on the three
# built-in models, and a one-screen summary. Budget: under 10 minutes.
# Models come from $HEARTH_MODELS_DIR (default ~/.cache/hearth/models; `hearth models fetch all`).
# Usage: scripts/gpu-check.sh [PROMPT_TOKENS] [GEN_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
P=${1:-512}; N=${2:-128}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/hearth/target}"
export HEARTH_REQUIRE_GPU=1
MODELS="${HEARTH_MODELS_DIR:-${HEARTH_CACHE_DIR:-$HOME/.cache/hearth}/models}"
out=$(mktemp -d)

cargo build --release -q -p hearth
echo "== op conformance (wgpu vs cpu)"
cargo test --release -q -p hearth-wgpu --test conformance 2>&1 | tee "$out/ops.log" | grep -E "test result|FAILED|panicked" || true

for m in qwen2.5-coder-0.5b-instruct-q4_k_m gemma-3-270m-q4_k_m qwen2.5-coder-1.5b-instruct-q4_k_m; do
  for b in wgpu cpu; do
    "$CARGO_TARGET_DIR/release/hearth" bench -m "$MODELS/$m.gguf" --backend "$b" -p "$P" -n "$N" -r 3 --json --quiet >"$out/$m.$b.json"
  done
done

python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("\n== summary (tok/s: prefill / decode; wgpu per-token counters)")
for m in ["qwen2.5-coder-0.5b-instruct-q4_k_m", "gemma-3-270m-q4_k_m", "qwen2.5-coder-1.5b-instruct-q4_k_m"]:
    w = json.loads((out / f"{m}.wgpu.json").read_text())
    c = json.loads((out / f"{m}.cpu.json").read_text())
    t = w["per_decode_token"]
    print(f"{m:40s} wgpu {w['prefill_tok_s']['mean']:8.1f} / {w['decode_tok_s']['mean']:7.1f}   "
          f"cpu {c['prefill_tok_s']['mean']:7.1f} / {c['decode_tok_s']['mean']:6.1f}   "
          f"graph ops {t['graph_ops']:.0f} dispatches {t['dispatches']:.0f} submits {t['submits']:.1f} new pipelines {t['pipelines_created']:.0f} "
          f"new bind groups {t['bind_groups_created']:.0f}")
PY
grep -q "test result: ok" "$out/ops.log" || { echo "op conformance FAILED (log: $out/ops.log)"; exit 1; }
