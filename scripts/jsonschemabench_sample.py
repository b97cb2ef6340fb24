#!/usr/bin/env python3
"""Builds the JSONSchemaBench sample scripts/bench_structured.py reads: from a checkout of
https://github.com/guidance-ai/jsonschemabench (measured at ba103c73756198dd9b149ddc7db7867da7a077f6),
the first 10 schema files by sorted name of six subsets of data/, skipping files over 20 KiB.
The data carries no license in that repository, so the sample is built where it runs, not committed.

Usage: scripts/jsonschemabench_sample.py CHECKOUT [OUT]   (OUT: ~/.cache/hearth/jsonschemabench/sample.json)
"""
import json
import pathlib
import sys

SUBSETS = ["Github_easy", "Github_medium", "Glaiveai2K", "Snowplow", "Kubernetes", "JsonSchemaStore"]
PER_SUBSET, MAX_BYTES = 10, 20 * 1024

checkout = pathlib.Path(sys.argv[1])
out = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else pathlib.Path.home() / ".cache/hearth/jsonschemabench/sample.json"
sample = []
for subset in SUBSETS:
    files = sorted(p for p in (checkout / "data" / subset).iterdir() if p.suffix == ".json")
    kept = [p for p in files if p.stat().st_size <= MAX_BYTES][:PER_SUBSET]
    sample += [{"subset": subset, "name": p.stem, "schema": json.loads(p.read_text())} for p in kept]
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(sample))
print(f"{len(sample)} schemas -> {out}")
