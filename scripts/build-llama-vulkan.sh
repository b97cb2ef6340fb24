#!/usr/bin/env bash
# Builds llama.cpp's Vulkan backend (llama-bench, test-backend-ops) from the sources vendored in
# the llama-cpp-python 0.3.36 sdist, the tree the goldens come from: the same-device peer of our
# WebGPU kernels on lavapipe (docs/BENCHMARKS.md). Needs glslc, libvulkan-dev, spirv-headers, cmake, a C++
# compiler and PyPI. Debian 12's Vulkan headers lack VK_EXT_layer_settings, which ggml-vulkan.cpp
# uses only to configure validation layers at instance creation; that block is dropped.
# Usage: scripts/build-llama-vulkan.sh [OUT_DIR]   (default ~/.cache/hearth/llama-vulkan; ~30 min on 2 cores)
#        HEARTH_LLAMA_PORTABLE=1 scripts/build-llama-vulkan.sh ~/.cache/hearth/llama-vulkan-portable
set -euo pipefail
OUT=${1:-${HEARTH_CACHE_DIR:-$HOME/.cache/hearth}/llama-vulkan}
SRC="$OUT/src"
mkdir -p "$OUT"
if [ ! -d "$SRC" ]; then
  tmp=$(mktemp -d)
  # Without build isolation pip prepares the sdist's metadata with the installed scikit-build-core
  # instead of fetching (and building) cmake first.
  python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation llama-cpp-python==0.3.36 -d "$tmp"
  tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
  mv "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp "$SRC"
  python3 - "$SRC/ggml/src/ggml-vulkan/ggml-vulkan.cpp" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
a = s.index("    VkBool32 enable_best_practice = layer_settings;")
b = s.index("    vk::LayerSettingsCreateInfoEXT layer_setting_info(settings);\n") + len("    vk::LayerSettingsCreateInfoEXT layer_setting_info(settings);\n")
s = s[:a] + s[b:]
s = s.replace("layers, extensions, &layer_setting_info);", "layers, extensions, nullptr);")
open(p, "w").write(s)
PY
fi
# HEARTH_LLAMA_PORTABLE=1: static binaries for any x86-64 CPU, to carry to the GPU machine
# (scripts/gpu-check.sh prepare).
native=ON shared=ON
if [ "${HEARTH_LLAMA_PORTABLE:-0}" = 1 ]; then native=OFF shared=OFF; fi
cmake -S "$SRC" -B "$OUT/build" -DGGML_VULKAN=ON -DGGML_NATIVE=$native -DBUILD_SHARED_LIBS=$shared -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$OUT/build" -j "${HEARTH_JOBS:-$(nproc)}" --target llama-bench test-backend-ops
echo "$OUT/build/bin/llama-bench"
