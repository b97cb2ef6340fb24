#!/usr/bin/env bash
# Builds the hearth-llm npm package into web/hearth-llm/dist/ (offline once dependencies are cached)
# with wasm-pack in its no-install mode, which downloads nothing:
#   1. crates/hearth-wasm for wasm32-unknown-unknown, release (+simd128 from .cargo/config.toml)
#   2. wasm-bindgen --target web, the CLI on PATH, which must match the wasm-bindgen version in
#      Cargo.lock (cargo install wasm-bindgen-cli --version <that version>)
#   3. wasm-opt from npm's binaryen when installed (`npm install` at the repo root), with the
#      flags in crates/hearth-wasm/Cargo.toml's wasm-pack metadata; skipped otherwise
#   4. the JS sources and index.d.ts next to the generated bindings
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dist="$root/web/hearth-llm/dist"
wasm_pack_version=0.15.1

want="$(grep -A1 '^name = "wasm-bindgen"$' "$root/Cargo.lock" | sed -n 's/^version = "\(.*\)"$/\1/p')"
have="$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" || true
if [[ "$have" != "$want" ]]; then
  echo "wasm-bindgen-cli $want is needed (found '${have:-none}'): cargo install wasm-bindgen-cli --version $want" >&2
  exit 1
fi
have="$(wasm-pack --version 2>/dev/null | awk '{print $2}')" || true
if [[ "$have" != "$wasm_pack_version" ]]; then
  echo "wasm-pack $wasm_pack_version is needed (found '${have:-none}'): cargo install wasm-pack --locked --version $wasm_pack_version" >&2
  exit 1
fi

# wasm-pack runs the first wasm-opt on PATH: npm's, or none.
opt=()
if [[ ! -x "$root/node_modules/.bin/wasm-opt" || "${HEARTH_SKIP_WASM_OPT:-0}" == 1 ]]; then
  echo "wasm-opt skipped (run npm install at the repo root for binaryen)" >&2
  opt=(--no-opt)
fi
rm -rf "$dist"
PATH="$root/node_modules/.bin:$PATH" wasm-pack build "$root/crates/hearth-wasm" --release --target web \
  --mode no-install --no-pack --no-gitignore --out-dir "$dist" --out-name hearth_wasm "${opt[@]}"

cp "$root"/web/hearth-llm/src/*.js "$root"/web/hearth-llm/src/*.d.ts "$dist/"
ls -l "$dist"
