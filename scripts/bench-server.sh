#!/usr/bin/env bash
# Server load benchmark: `hearth serve` and llama.cpp's `llama-server`, same model file, same
# threads, one after the other, each driven by `hearth bench --server` (streaming chat requests,
# exactly GEN_LEN tokens each via max_tokens/n_predict + ignore_eos) at several concurrencies.
# Each server is restarted per concurrency C with C batch places (hearth --max-batch C; llama-server
# -np C with C x CTX context). One untimed request warms each server up.
# Usage: scripts/bench-server.sh [LLAMA_SERVER] [MODEL.gguf]
# Env: HEARTH_THREADS=2 HEARTH_CONCURRENCIES="1 4 16" HEARTH_PROMPT_LEN=32 HEARTH_GEN_LEN=16 HEARTH_CTX=512
# HEARTH_MIN_REQUESTS=4 (N = max(MIN_REQUESTS, 2C)) HEARTH_PORT=18470
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${HEARTH_CACHE_DIR:-$HOME/.cache/hearth}"
LLAMA_SERVER=${1:-$CACHE/llama.cpp/build/bin/llama-server}
MODEL=${2:-$CACHE/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
THREADS=${HEARTH_THREADS:-2}; CONCURRENCIES=${HEARTH_CONCURRENCIES:-"1 4 16"}
PROMPT_LEN=${HEARTH_PROMPT_LEN:-32}; GEN_LEN=${HEARTH_GEN_LEN:-16}
CTX=${HEARTH_CTX:-512}; MIN_REQUESTS=${HEARTH_MIN_REQUESTS:-4}; PORT=${HEARTH_PORT:-18470}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
cargo build --release -q -p hearth
HEARTH="$CARGO_TARGET_DIR/release/hearth"
OUT=$(mktemp -d)
SERVER_PID=
stop() { if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=; fi; }
trap stop EXIT

wait_healthy() {
  for _ in $(seq 1 240); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then return 0; fi
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "server exited; log: $OUT/server.log" >&2; tail -20 "$OUT/server.log" >&2; exit 1; }
    sleep 0.5
  done
  echo "server never became healthy" >&2; exit 1
}

for server in hearth llama; do
  for c in $CONCURRENCIES; do
    n=$(( 2 * c > MIN_REQUESTS ? 2 * c : MIN_REQUESTS ))
    if [ "$server" = hearth ]; then
      "$HEARTH" serve -m "$MODEL" --backend cpu -t "$THREADS" -c "$CTX" --max-batch "$c" --port "$PORT" --quiet >"$OUT/server.log" 2>&1 &
    else
      "$LLAMA_SERVER" -m "$MODEL" -t "$THREADS" -np "$c" -c $(( c * CTX )) --port "$PORT" >"$OUT/server.log" 2>&1 &
    fi
    SERVER_PID=$!
    wait_healthy
    "$HEARTH" bench --server "http://127.0.0.1:$PORT" --concurrency 1 --requests 1 --prompt-len "$PROMPT_LEN" --gen-len 2 --json >/dev/null
    "$HEARTH" bench --server "http://127.0.0.1:$PORT" --concurrency "$c" --requests "$n" --prompt-len "$PROMPT_LEN" --gen-len "$GEN_LEN" --json >"$OUT/$server-$c.json"
    echo "$server C=$c: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%.1f tok/s, %d/%d ok" % (r["output_tok_s"], r["completed"], r["requests"]))' "$OUT/$server-$c.json")" >&2
    stop
  done
done

python3 - "$OUT" "$CONCURRENCIES" "$THREADS" "$PROMPT_LEN" "$GEN_LEN" <<'PY'
import json, sys
out, cs, threads, p, g = sys.argv[1], [int(c) for c in sys.argv[2].split()], sys.argv[3], sys.argv[4], sys.argv[5]
r = {(s, c): json.load(open(f"{out}/{s}-{c}.json")) for s in ("hearth", "llama") for c in cs}
print(f"threads={threads}, prompt ~{p} words (chat), {g} generated tokens per request, N = max(4, 2C)\n")
print("| server | C | requests ok | output tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | tok/s vs C=1 | hearth / llama-server tok/s |")
print("|---|---|---|---|---|---|---|---|")
for s, name in (("hearth", "hearth serve"), ("llama", "llama-server")):
    for c in cs:
        x = r[(s, c)]
        scale = x["output_tok_s"] / r[(s, cs[0])]["output_tok_s"]
        vs = r[("hearth", c)]["output_tok_s"] / r[("llama", c)]["output_tok_s"] if s == "hearth" else 1.0
        print(f"| {name} | {c} | {x['completed']}/{x['requests']} | {x['output_tok_s']:.1f} | {x['ttft_ms']['p50']:.0f} / {x['ttft_ms']['p99']:.0f} "
              f"| {x['itl_ms']['p50']:.0f} / {x['itl_ms']['p99']:.0f} | {scale:.2f}x | {'%.2fx' % vs if s == 'hearth' else ''} |")
PY
