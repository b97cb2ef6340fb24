#!/usr/bin/env bash
# Decode speed of qwen2.5-coder-1.5b with and without speculative decoding (greedy, 2 threads):
# no speculation, the 0.5B as draft model, prompt lookup; on a code-editing and a prose prompt;
# each speculative mode with the default cost-driven draft lengths and with --fixed-draft-length.
# Each prompt's three runs go back to back; the load average is printed before and after (the
# machine may be shared: compare rows of one run, not runs).
# Usage: scripts/bench-speculative.sh [path/to/hearth] [max tokens]
set -euo pipefail
HEARTH=${1:-${CARGO_TARGET_DIR:-target}/release/hearth}
N=${2:-128}
CODE='Rewrite this function with type hints:
def merge_counts(first, second):
    result = dict(first)
    for key, value in second.items():
        result[key] = result.get(key, 0) + value
    return result
'
PROSE='Write a short paragraph about why lighthouses were important for sailors.'
run() { # label prompt extra-args...
  local label=$1 prompt=$2; shift 2
  "$HEARTH" run -m qwen2.5-coder-1.5b -t 2 --quiet --chat --temperature 0 -n "$N" --json -p "$prompt" "$@" |
    python3 -c "import json,sys; r=json.load(sys.stdin); s=r.get('speculative') or {}; print('| $label | %d | %.1f | %s | %s | %s |' % (len(r['tokens']), r['decode_tok_s'], ('%.0f%%' % (100*s['acceptance_rate'])) if s else '-', ('%.2f' % s['mean_accepted_per_step']) if s else '-', s.get('target_forward_passes', '-') if s else '-'))"
}
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo '| prompt / mode | tokens | decode tok/s | acceptance | accepted per pass | target passes |'
echo '|---|---|---|---|---|---|'
for p in code prose; do
  if [ $p = code ]; then prompt=$CODE; else prompt=$PROSE; fi
  run "$p, no speculation" "$prompt"
  run "$p, draft qwen2.5-coder-0.5b" "$prompt" --draft-model qwen2.5-coder-0.5b
  run "$p, draft qwen2.5-coder-0.5b, fixed length" "$prompt" --draft-model qwen2.5-coder-0.5b --fixed-draft-length
  run "$p, prompt lookup" "$prompt" --lookup
  run "$p, prompt lookup, fixed length" "$prompt" --lookup --fixed-draft-length
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
