#!/usr/bin/env bash
# llama.cpp's tokenizer test data (models/ggml-vocab-*.gguf with their .inp/.out: texts and the ids
# llama.cpp gives them), from the sources vendored in the llama-cpp-python 0.3.36 sdist (the tree
# the goldens come from, sha256-checked), into ~/.cache/hearth/llama-vocabs; a no-op once there.
# crates/hearth-core/tests/tokenizer_vocabs.rs reads them. pip prepares an sdist's metadata before
# downloading it: scikit-build-core with CMake >= 3.21 (both installed by .ci/run) does that without
# building anything.
set -euo pipefail
OUT=${HEARTH_LLAMA_VOCABS:-${HEARTH_CACHE_DIR:-$HOME/.cache/hearth}/llama-vocabs}
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
[ -f "$OUT/ggml-vocab-qwen2.gguf.out" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation llama-cpp-python==0.3.36 -d "$tmp"
echo "$SHA256  $tmp/llama_cpp_python-0.3.36.tar.gz" | sha256sum -c --quiet
mkdir -p "$OUT.partial"
tar xzf "$tmp/llama_cpp_python-0.3.36.tar.gz" -C "$OUT.partial" --strip-components=4 --wildcards \
    'llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-*'
rm -rf "$OUT"
mv "$OUT.partial" "$OUT"
