#!/usr/bin/env bash
# Speculative decoding benchmark: see scripts/bench_speculative.py (prompts in
# scripts/speculative-prompts/). Usage: scripts/bench-speculative.sh [path/to/hearth] [max tokens] [reps]
exec python3 "$(dirname "$0")/bench_speculative.py" "$@"
