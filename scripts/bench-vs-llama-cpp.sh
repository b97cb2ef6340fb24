#!/usr/bin/env bash
# Side-by-side CPU benchmark: `hearth bench` and llama.cpp's `llama-bench`, same model, same threads,
# one after the other in one run. Usage: scripts/bench-vs-llama-cpp.sh LLAMA_BENCH_BINARY [THREADS] [P] [N] [R]
# (llama-bench comes from a llama.cpp build, e.g. the sources vendored in the llama-cpp-python sdist.)
# HEARTH_BENCH_MODELS: the models, as cached model stems or .gguf paths (default: the built-in Qwen
# and Gemma models). HEARTH_ARGS and LLAMA_ARGS: more arguments for each side, e.g. experts in
# host memory beside a GPU: HEARTH_ARGS="--backend wgpu --moe-offload" LLAMA_ARGS="-ngl 99 -ncmoe 99"
# with a Vulkan build of llama-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_BENCH=${1:?path to llama-bench}
THREADS=${2:-2}; P=${3:-128}; N=${4:-32}; R=${5:-3}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/hearth/target}"
cargo build --release -q -p hearth
HEARTH="$CARGO_TARGET_DIR/release/hearth"
MODELS="${HEARTH_CACHE_DIR:-$HOME/.cache/hearth}/models"
printf '| model | hearth pp%s | llama.cpp pp%s | ratio | hearth tg%s | llama.cpp tg%s | ratio |\n|---|---|---|---|---|---|---|\n' "$P" "$P" "$N" "$N"
for m in ${HEARTH_BENCH_MODELS:-qwen2.5-coder-0.5b-instruct-q4_k_m gemma-3-270m-q4_k_m qwen2.5-coder-1.5b-instruct-q4_k_m}; do
  path="$m"
  [[ "$m" == *.gguf ]] || path="$MODELS/$m.gguf"
  m=$(basename "$path" .gguf)
  # shellcheck disable=SC2086 # the extra arguments are words
  h=$("$HEARTH" bench -m "$path" -t "$THREADS" -p "$P" -n "$N" -r "$R" --json --quiet ${HEARTH_ARGS:-})
  # shellcheck disable=SC2086
  l=$("$LLAMA_BENCH" -m "$path" -t "$THREADS" -p "$P" -n "$N" -r "$R" -o json ${LLAMA_ARGS:-} 2>/dev/null)
  python3 - "$m" "$h" "$l" <<'PY'
import json, sys
m, h, l = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
lp = next(x["avg_ts"] for x in l if x["n_prompt"] > 0)
lt = next(x["avg_ts"] for x in l if x["n_gen"] > 0)
hp, ht = h["prefill_tok_s"]["mean"], h["decode_tok_s"]["mean"]
print(f"| {m} | {hp:.1f} | {lp:.1f} | {hp/lp:.2f}x | {ht:.1f} | {lt:.1f} | {ht/lt:.2f}x |")
PY
done
