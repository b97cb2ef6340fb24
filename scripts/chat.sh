#!/usr/bin/env bash
# The private chat app in one command: builds the hearth-llm package if web/hearth-llm/dist is missing
# (scripts/build-web.sh; needs `npm ci` and wasm-bindgen-cli), fetches the default model
# (qwen2.5-coder-0.5b, 491 MB) into the cache if needed, and serves web/chat on 127.0.0.1.
#   scripts/chat.sh [--port 8080]
# Environment: HEARTH_MODELS_DIR (the models served under /models/), PORT.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
models_dir="${HEARTH_MODELS_DIR:-${HEARTH_CACHE_DIR:-$HOME/.cache/hearth}/models}"
model_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

if [[ ! -f "$root/web/hearth-llm/dist/index.js" ]]; then
  echo "chat.sh: building the hearth-llm package (scripts/build-web.sh)…" >&2
  [[ -d "$root/node_modules" ]] || (cd "$root" && npm ci)
  "$root/scripts/build-web.sh"
fi

if [[ ! -f "$models_dir/$model_file" ]]; then
  echo "chat.sh: fetching the default model into $models_dir…" >&2
  if [[ -n "${HEARTH_MODELS_DIR:-}" && -z "${HEARTH_CACHE_DIR:-}" ]]; then
    echo "chat.sh: note: hearth fetches into \$HEARTH_CACHE_DIR/models; set HEARTH_CACHE_DIR so it lands in $models_dir" >&2
  fi
  cargo run --manifest-path "$root/Cargo.toml" --release -p hearth -- models fetch qwen2.5-coder-0.5b
fi

exec node "$root/web/chat/serve.js" "$@"
