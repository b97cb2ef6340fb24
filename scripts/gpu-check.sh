#!/usr/bin/env bash
# The WebGPU backend on a real GPU, in one prepared run. The GPU machine has no Rust toolchain and
# no network and receives at most 64 MiB of files, so the real models cannot travel:
#
#   scripts/gpu-check.sh prepare        # here: builds and packs gpu-run/ (~50 MB, git-ignored):
#                                       #   the stripped `hearth`, conformance and hearth-wgpu unit
#                                       #   test binaries, the Vulkan loader and glvnd packages, the
#                                       #   built-in models' skeletons (`hearth models skeleton`:
#                                       #   header and tokenizer only), and llama.cpp's llama-bench
#                                       #   (Vulkan) where a portable build is at hand
#   scripts/gpu-check.sh run            # there (the device tool: carry gpu-run, command
#                                       #   `scripts/gpu-check.sh run`): writes everything to $OUT
#
# `run` builds the models from their skeletons (`hearth models synth`: the real shapes and weight
# types, random weights), runs the op conformance suite against the CPU oracle and the kernels'
# unit tests with HEARTH_REQUIRE_GPU=1, then `hearth bench --backend wgpu` (plain and --profile:
# device time per kernel family, dispatches and weight bytes per decode token; and the profile at
# a long context), `--backend cpu` and llama.cpp's Vulkan llama-bench on each model, and prints a
# summary. About 3 minutes on an H200.
# Environment for `run`: HEARTH_GPU_CHECK_MODELS (default: all three), HEARTH_GPU_CHECK_P / _N
# (prompt and generated tokens, default 512 / 128), HEARTH_GPU_CHECK_LONG_P (the long-context
# profile's prompt, default 4096), HEARTH_GPU_CHECK_ALLOW_CPU=1 (accept a
# software adapter such as lavapipe, for rehearsing the run here).
set -euo pipefail
cd "$(dirname "$0")/.."
PACK=gpu-run
MODELS_ALL="qwen2.5-coder-0.5b gemma-3-270m qwen2.5-coder-1.5b"

prepare() {
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/hearth/target}"
  cargo build --release -q -p hearth
  local conformance
  conformance=$(cargo test --release -p hearth-wgpu --test conformance --no-run 2>&1 |
    sed -n 's/.*Executable tests\/conformance.rs (\(.*\))/\1/p' | tail -1)
  [ -x "$conformance" ] || { echo "conformance test binary not found" >&2; exit 1; }
  local unit
  unit=$(cargo test --release -p hearth-wgpu --lib --no-run 2>&1 |
    sed -n 's/.*Executable unittests src\/lib.rs (\(.*\))/\1/p' | tail -1)
  [ -x "$unit" ] || { echo "hearth-wgpu unit test binary not found" >&2; exit 1; }
  rm -rf "$PACK" && mkdir -p "$PACK/bin" "$PACK/lib" "$PACK/models"
  strip -o "$PACK/bin/hearth" "$CARGO_TARGET_DIR/release/hearth"
  strip -o "$PACK/bin/conformance" "$conformance"
  strip -o "$PACK/bin/wgpu-unit" "$unit"
  cp -L /usr/lib/x86_64-linux-gnu/libvulkan.so.1 "$PACK/lib/"
  # The NVIDIA Vulkan driver lives in libGLX_nvidia.so.0, which needs glvnd's libraries; a
  # CUDA-only image lacks them.
  mkdir -p "$PACK/debs"
  (cd "$PACK/debs" && apt-get download -qq libvulkan1 libglvnd0 libgl1 libglx0 libegl1 libopengl0 libgles2)
  for m in $MODELS_ALL; do
    "$PACK/bin/hearth" models skeleton "$m" -o "$PACK/models/$m.skel.gguf" >/dev/null
  done
  # llama.cpp's Vulkan backend, the same-device peer, when a portable build is at hand
  # (HEARTH_LLAMA_PORTABLE=1 scripts/build-llama-vulkan.sh DIR); xz keeps its SPIR-V in the budget.
  local llama=${HEARTH_LLAMA_VULKAN:-$HOME/.cache/hearth/llama-vulkan-portable}/build/bin/llama-bench
  if [ -x "$llama" ]; then
    strip -o "$PACK/bin/llama-bench" "$llama"
    xz -T0 -6 "$PACK/bin/llama-bench"
    cp -L /usr/lib/x86_64-linux-gnu/libgomp.so.1 "$PACK/lib/"
  fi
  git rev-parse HEAD >"$PACK/commit"
  du -sh "$PACK"
}

# Where the NVIDIA Vulkan driver is: its ICD manifest, or one written for its library when the
# machine has the driver's libraries but no manifest (a container with the driver mounted in).
vulkan_driver() {
  local d
  for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
    ls "$d"/nvidia*.json >/dev/null 2>&1 && return 0
  done
  # A driver mounted into a container keeps its manifest beside its libraries, where the loader
  # does not look by itself.
  for d in /usr/local/nvidia/share/vulkan/icd.d /usr/local/nvidia/etc/vulkan/icd.d; do
    if ls "$d"/nvidia*.json >/dev/null 2>&1; then
      local manifest
      manifest=$(ls "$d"/nvidia*.json | head -1)
      export VK_DRIVER_FILES="$manifest" VK_ICD_FILENAMES="$manifest"
      return 0
    fi
  done
  local lib
  lib=$( (ldconfig -p 2>/dev/null | awk '/libGLX_nvidia.so.0/ {print $NF; exit}') || true)
  [ -n "$lib" ] || lib=$(find / -name 'libGLX_nvidia.so.0' 2>/dev/null | head -1 || true)
  if [ -n "$lib" ]; then
    mkdir -p "$OUT/icd"
    printf '{"file_format_version":"1.0.0","ICD":{"library_path":"%s","api_version":"1.3.0"}}\n' "$lib" >"$OUT/icd/nvidia_icd.json"
    export VK_DRIVER_FILES="$OUT/icd/nvidia_icd.json" VK_ICD_FILENAMES="$OUT/icd/nvidia_icd.json"
  fi
}

run() {
  OUT=${OUT:?set OUT to the folder for the results}
  mkdir -p "$OUT"
  local P=${HEARTH_GPU_CHECK_P:-512} N=${HEARTH_GPU_CHECK_N:-128} LONG_P=${HEARTH_GPU_CHECK_LONG_P:-4096}
  local models=${HEARTH_GPU_CHECK_MODELS:-$MODELS_ALL}
  local bin="$PWD/$PACK/bin" work=${TMPDIR:-/tmp}/hearth-gpu-check
  export LD_LIBRARY_PATH="$PWD/$PACK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
  if [ "${HEARTH_GPU_CHECK_ALLOW_CPU:-0}" != 1 ]; then export HEARTH_REQUIRE_GPU=1; fi
  if ! ldconfig -p | grep -q libGLdispatch.so.0; then
    for f in "$PACK"/debs/*.deb; do dpkg -x "$f" /; done
    ldconfig
  fi
  vulkan_driver
  { cat "$PACK/commit"; uname -a; nvidia-smi 2>&1 || true; env | grep -E '^VK_' || true; } >"$OUT/machine.txt"
  # What the Vulkan loader finds, for when no adapter comes up.
  VK_LOADER_DEBUG=error,warn,driver "$bin/conformance" bad_input_is_an_error_not_a_panic >"$OUT/vulkan-probe.log" 2>&1 || true
  mkdir -p "$work"
  echo "== models from skeletons"
  for m in $models; do
    [ -f "$work/$m.gguf" ] || "$bin/hearth" models synth "$PACK/models/$m.skel.gguf" -o "$work/$m.gguf"
  done
  echo "== op conformance (wgpu vs the CPU oracle)"
  local status=0
  "$bin/conformance" >"$OUT/conformance.log" 2>&1 || status=$?
  # The kernels' own unit tests (exact division on this device among them).
  "$bin/wgpu-unit" >>"$OUT/conformance.log" 2>&1 || status=$?
  grep -E "wgpu adapter|test result|FAILED|panicked" "$OUT/conformance.log" | sort -u | head -20
  # The clocks while the benchmarks run: a GPU that stays at a low clock between small kernels
  # makes every dispatch look slow.
  local sampler=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,utilization.gpu,power.draw --format=csv -lms 250 \
      >"$OUT/clocks.csv" 2>/dev/null &
    sampler=$!
  fi
  for m in $models; do
    echo "== $m"
    "$bin/hearth" bench -m "$work/$m.gguf" --backend wgpu -p "$P" -n "$N" -r 2 --quiet --json >"$OUT/$m.wgpu.json" 2>>"$OUT/bench.log" || status=$?
    "$bin/hearth" bench -m "$work/$m.gguf" --backend wgpu -p "$P" -n "$((N / 4 + 1))" -r 1 --quiet --profile \
      >"$OUT/$m.wgpu-profile.txt" 2>>"$OUT/bench.log" || status=$?
    "$bin/hearth" bench -m "$work/$m.gguf" --backend cpu -p "$((P / 4 + 1))" -n "$((N / 4 + 1))" -r 1 --quiet --json \
      >"$OUT/$m.cpu.json" 2>>"$OUT/bench.log" || status=$?
    grep -A14 "^profile" "$OUT/$m.wgpu-profile.txt" || true
    # Decode at a long context: attention's share as it grows.
    echo "-- $m at a ${LONG_P}-token context"
    "$bin/hearth" bench -m "$work/$m.gguf" --backend wgpu -p "$LONG_P" -n 17 -r 1 --quiet --profile \
      >"$OUT/$m.wgpu-long.txt" 2>>"$OUT/bench.log" || status=$?
    grep -E "^decode|^profile|attention" "$OUT/$m.wgpu-long.txt" || true
  done
  if [ -f "$PACK/bin/llama-bench.xz" ]; then
    xz -dc "$PACK/bin/llama-bench.xz" >"$work/llama-bench" && chmod +x "$work/llama-bench"
    for m in $models; do
      echo "== llama.cpp Vulkan: $m"
      timeout 120 "$work/llama-bench" -m "$work/$m.gguf" -ngl 99 -p "$P" -n "$N" -r 2 -o json \
        >"$OUT/$m.llama-vulkan.json" 2>>"$OUT/llama-bench.log" || echo "llama-bench failed on $m (llama-bench.log)"
    done
  fi
  if [ -n "$sampler" ]; then
    kill "$sampler" 2>/dev/null || true
    echo "== SM clock while benchmarking (MHz): $(awk -F', ' 'NR > 1 {print $2}' "$OUT/clocks.csv" | sort -n | uniq -c | sort -rn | head -5 | tr '\n' ' ')"
  fi
  echo "== summary (tok/s: prefill / decode)"
  for m in $models; do
    local w c
    w=$(tr -d '\n ' <"$OUT/$m.wgpu.json" | sed -n 's/.*"prefill_tok_s":{"mean":\([0-9.e+-]*\).*"decode_tok_s":{"mean":\([0-9.e+-]*\).*/\1 \2/p')
    c=$(tr -d '\n ' <"$OUT/$m.cpu.json" | sed -n 's/.*"prefill_tok_s":{"mean":\([0-9.e+-]*\).*"decode_tok_s":{"mean":\([0-9.e+-]*\).*/\1 \2/p')
    local l=""
    if [ -s "$OUT/$m.llama-vulkan.json" ]; then
      l=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(" ".join("%.1f" % x["avg_ts"] for x in r), r[0].get("backends"), r[0].get("gpu_info"))' \
        "$OUT/$m.llama-vulkan.json" 2>/dev/null || true)
      l="  llama.cpp-vulkan $l"
    fi
    echo "$m  wgpu $w  cpu $c$l" | tee -a "$OUT/summary.txt"
  done
  grep -q "test result: ok" "$OUT/conformance.log" || { echo "op conformance FAILED (see conformance.log)"; status=1; }
  return "$status"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 prepare | run" >&2; exit 2 ;;
esac
