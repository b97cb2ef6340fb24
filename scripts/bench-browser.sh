#!/usr/bin/env bash
# Browser benchmark, hearth-llm (wasm CPU) vs wllama, one headless Chromium run (see
# scripts/bench-browser.mjs for the method). Builds the package first unless HEARTH_SKIP_BUILD=1.
#   scripts/bench-browser.sh [--model gemma-3-270m-q4_k_m.gguf] [--tokens 64] [--reps 3] [--threads 1,2]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[[ -d "$root/node_modules/@wllama/wllama" ]] || (cd "$root" && npm install)
[[ "${HEARTH_SKIP_BUILD:-0}" == 1 ]] || "$root/scripts/build-web.sh" >/dev/null
exec node "$root/scripts/bench-browser.mjs" "$@"
