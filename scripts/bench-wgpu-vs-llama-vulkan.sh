#!/usr/bin/env bash
# Side by side on the same Vulkan device (lavapipe here): `hearth bench --backend wgpu` and
# llama.cpp's Vulkan backend (`llama-bench -ngl 99`, from scripts/build-llama-vulkan.sh), same
# GGUF, one after the other in one run; HEARTH_BASE=path/to/an/older/hearth adds its figures as a
# third column. lavapipe measures instructions, not GPU speed (docs/BENCHMARKS.md).
# Usage: scripts/bench-wgpu-vs-llama-vulkan.sh [LLAMA_BENCH] [P] [N]
#   env: HEARTH_MODELS (default: the three built-in models), HEARTH_BASE
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_BENCH=${1:-${HEARTH_CACHE_DIR:-$HOME/.cache/hearth}/llama-vulkan/build/bin/llama-bench}
P=${2:-16}; N=${3:-8}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/hearth/target}"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}
cargo build --release -q -p hearth
HEARTH="$CARGO_TARGET_DIR/release/hearth"
MODELS_DIR="${HEARTH_CACHE_DIR:-$HOME/.cache/hearth}/models"
MODELS=${HEARTH_MODELS:-"gemma-3-270m-q4_k_m qwen2.5-coder-0.5b-instruct-q4_k_m qwen2.5-coder-1.5b-instruct-q4_k_m"}
printf '| model | hearth pp%s | llama.cpp pp%s | ratio | hearth tg%s | llama.cpp tg%s | ratio |' "$P" "$P" "$N" "$N"
[ -n "${HEARTH_BASE:-}" ] && printf ' previous hearth pp / tg |'
printf '\n|---|---|---|---|---|---|---|%s\n' "${HEARTH_BASE:+---|}"
for m in $MODELS; do
  g="$MODELS_DIR/$m.gguf"
  h=$("$HEARTH" bench -m "$g" --backend wgpu -p "$P" -n "$N" -r 1 --json --quiet)
  l=$("$LLAMA_BENCH" -m "$g" -ngl 99 -p "$P" -n "$N" -r 1 -o json 2>/dev/null)
  b=${HEARTH_BASE:+$("$HEARTH_BASE" bench -m "$g" --backend wgpu -p "$P" -n "$N" -r 1 --json --quiet)}
  python3 - "$m" "$h" "$l" "${b:-null}" <<'PY'
import json, sys
m, h, l, b = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
lp = next(x["avg_ts"] for x in l if x["n_prompt"] > 0)
lt = next(x["avg_ts"] for x in l if x["n_gen"] > 0)
hp, ht = h["prefill_tok_s"]["mean"], h["decode_tok_s"]["mean"]
row = f"| {m} | {hp:.2f} | {lp:.2f} | {hp/lp:.2f}x | {ht:.2f} | {lt:.2f} | {ht/lt:.2f}x |"
if b:
    row += f" {b['prefill_tok_s']['mean']:.2f} / {b['decode_tok_s']['mean']:.2f} |"
print(row)
PY
done
