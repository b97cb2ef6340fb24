#!/usr/bin/env bash
# Structured output's cost: the same chat prompt decoded under a JSON Schema and free (as many
# tokens, --ignore-eos), alternating, R pairs per model, CPU backend. Prints decode tok/s of both,
# their ratio (median of the paired ratios), mask p50/p99 and the tokens the grammar forced.
# Usage: scripts/bench-constrained.sh [THREADS] [R]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-2}; R=${2:-3}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/hearth/target}"
cargo build --release -q -p hearth
HEARTH="$CARGO_TARGET_DIR/release/hearth"
SCHEMA=$(mktemp)
trap 'rm -f "$SCHEMA"' EXIT
cat > "$SCHEMA" <<'JSON'
{"type": "object", "properties": {"languages": {"type": "array", "minItems": 12, "maxItems": 12, "items": {
  "type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "year": {"type": "integer"},
  "paradigm": {"enum": ["functional", "imperative", "object-oriented", "logic", "multi-paradigm"]}},
  "required": ["name", "year", "paradigm"], "additionalProperties": false}}},
 "required": ["languages"], "additionalProperties": false}
JSON
PROMPT="List twelve programming languages with the year each appeared and its main paradigm, as JSON."
printf '| model | constrained tok/s | free tok/s | ratio | tokens | forced | mask p50 µs | mask p99 µs |\n|---|---|---|---|---|---|---|---|\n'
# (Gemma 3 270M has no chat template.)
for m in qwen2.5-coder-0.5b qwen2.5-coder-1.5b; do
  rows=()
  for _ in $(seq "$R"); do
    c=$("$HEARTH" run -m "$m" -t "$THREADS" --quiet --json --chat -p "$PROMPT" --temperature 0 -n 400 --json-schema "$SCHEMA")
    n=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])["tokens"]))' "$c")
    f=$("$HEARTH" run -m "$m" -t "$THREADS" --quiet --json --chat -p "$PROMPT" --temperature 0 -n "$n" --ignore-eos)
    rows+=("$c" "$f")
  done
  python3 - "$m" "${rows[@]}" <<'PY'
import json, statistics, sys
m, rows = sys.argv[1], [json.loads(r) for r in sys.argv[2:]]
pairs = list(zip(rows[0::2], rows[1::2]))
ct = statistics.median(c["decode_tok_s"] for c, _ in pairs)
ft = statistics.median(f["decode_tok_s"] for _, f in pairs)
ratio = statistics.median(c["decode_tok_s"] / f["decode_tok_s"] for c, f in pairs)
c = pairs[-1][0]
masks = sorted(c["constraint"]["mask_us"])
p = lambda q: masks[min(len(masks) - 1, int(q * len(masks)))]
print(f"| {m} | {ct:.1f} | {ft:.1f} | {ratio:.2f}x | {len(c['tokens'])} | {c['constraint']['forced_tokens']} | {p(0.5):.0f} | {p(0.99):.0f} |")
PY
done
