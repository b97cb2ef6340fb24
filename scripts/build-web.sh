#!/usr/bin/env bash
# Builds the hearth-llm npm package into web/hearth-llm/dist/ (offline once dependencies are cached):
#   1. crates/hearth-wasm for wasm32-unknown-unknown, release (+simd128 from .cargo/config.toml)
#   2. wasm-bindgen --target web (the CLI must match the wasm-bindgen version in Cargo.lock:
#      cargo install wasm-bindgen-cli --version <that version>)
#   3. wasm-opt from npm's binaryen when installed (`npm install` at the repo root); skipped otherwise
#   4. the JS sources and index.d.ts next to the generated bindings
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
dist="$root/web/hearth-llm/dist"

want="$(grep -A1 '^name = "wasm-bindgen"$' "$root/Cargo.lock" | sed -n 's/^version = "\(.*\)"$/\1/p')"
have="$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" || true
if [[ "$have" != "$want" ]]; then
  echo "wasm-bindgen-cli $want is needed (found '${have:-none}'): cargo install wasm-bindgen-cli --version $want" >&2
  exit 1
fi

cargo build --manifest-path "$root/Cargo.toml" --release --target wasm32-unknown-unknown -p hearth-wasm
rm -rf "$dist"
mkdir -p "$dist"
wasm-bindgen --target web --out-dir "$dist" --out-name hearth_wasm "$target_dir/wasm32-unknown-unknown/release/hearth_wasm.wasm"

wasm_opt="$root/node_modules/.bin/wasm-opt"
if [[ -x "$wasm_opt" && "${HEARTH_SKIP_WASM_OPT:-0}" != 1 ]]; then
  "$wasm_opt" -O3 --enable-reference-types --enable-bulk-memory --enable-nontrapping-float-to-int \
    --enable-sign-ext --enable-simd --enable-mutable-globals --enable-multivalue \
    "$dist/hearth_wasm_bg.wasm" -o "$dist/hearth_wasm_bg.opt.wasm"
  mv "$dist/hearth_wasm_bg.opt.wasm" "$dist/hearth_wasm_bg.wasm"
else
  echo "wasm-opt skipped (run npm install at the repo root for binaryen)" >&2
fi

cp "$root"/web/hearth-llm/src/*.js "$root/web/hearth-llm/src/index.d.ts" "$dist/"
ls -l "$dist"
