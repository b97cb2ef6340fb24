#!/usr/bin/env python3
"""Structured output (JSON Schema constrained decoding), Hearth's server next to llama.cpp's
llama-server on the same GGUF model, over a sample of JSONSchemaBench schemas
(~/.cache/hearth/jsonschemabench/sample.json, built by scripts/jsonschemabench_sample.py).

Each server runs alone (never both at once, so they do not share the cores): first every schema on
`hearth serve`, then the server is stopped and every schema goes to `llama-server`. Each schema is one
non-streaming POST /v1/chat/completions, greedy (temperature 0), with OpenAI's
`response_format: {"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}`, which both
servers accept. One short unconstrained request warms each server up first and is not counted.

Per schema and engine it records: whether the schema was accepted (HTTP 200; a 400 is "schema
refused"), the answer, its finish_reason, whether it parses as JSON and validates under the schema
(jsonschema's Draft202012Validator, format checking off; also, for information, under the validator
of the draft the schema declares), completion tokens, the request's wall time and
tok/s = completion_tokens / wall time (prompt processing included).

A server crash or a timeout (--timeout, default 120 s) records an error for that schema, and the
server is restarted for the next one.

Prints a Markdown table (also written to --table when given) and writes the raw results to --out.

Usage:
  scripts/bench_structured.py --hearth BIN --llama-server BIN --model GGUF \\
      [--schemas ~/.cache/hearth/jsonschemabench/sample.json] [--max-tokens 256] [--threads 2] \\
      [--ctx 4096] [--timeout 120] [--engines hearth,llama.cpp] [--limit N] \\
      [--llama-env KEY=VALUE] [--out results.json] [--table results.md]
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys

import bench_servers
from bench_servers import Failed, send

try:
    import jsonschema
except ImportError:  # install on first use
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "jsonschema"], check=True)
    import jsonschema

SYSTEM = "You are a helpful assistant that answers in JSON."
USER = "Generate a realistic JSON object that follows this JSON schema:\n"
ROOT = pathlib.Path(__file__).resolve().parent.parent


def validate(schema, text):
    """Parse and validate; (parses, valid, errors, valid_declared_draft)."""
    try:
        instance = json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        return False, False, [f"not JSON: {e}"], False
    out = []
    for cls in (jsonschema.Draft202012Validator,
                jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)):
        try:
            errors = [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"[:300]
                      for e in cls(schema, format_checker=None).iter_errors(instance)]
            out.append((not errors, errors[:5]))
        except Exception as e:  # unresolvable $ref, a schema jsonschema cannot use
            out.append((None, [f"validator failed: {type(e).__name__}: {e}"[:300]]))
    (valid, errors), (valid_declared, _) = out
    return True, valid, errors, valid_declared


def run_schema(server, item, args):
    schema = item["schema"]
    body = {
        "model": server.model_id,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER + json.dumps(schema)}],
        "temperature": 0,
        "max_tokens": args.max_tokens,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}},
    }
    row = {"engine": server.engine, "subset": item["subset"], "name": item["name"], "status": None, "accepted": False,
           "error": None, "text": None, "finish_reason": None, "parses": None, "valid": None,
           "valid_declared_draft": None, "validation_errors": None, "completion_tokens": None,
           "prompt_tokens": None, "wall_s": None, "tok_s": None, "usage": None, "timings": None,
           "load_avg_1m": os.getloadavg()[0]}
    try:
        status, reply, raw, row["wall_s"] = send(server, body, args.timeout)
    except Failed as e:
        row["error"] = f"{e.kind}: {e}"
        return row
    row["status"] = status
    if status != 200 or not reply or "choices" not in reply:
        row["error"] = ("schema refused: " if status == 400 else f"HTTP {status}: ") + raw[:1000]
        return row
    row["accepted"] = True
    choice = reply["choices"][0]
    row["text"] = (choice.get("message") or {}).get("content") or ""
    row["finish_reason"] = choice.get("finish_reason")
    usage = reply.get("usage") or {}
    row["usage"], row["timings"] = usage, reply.get("timings")
    row["completion_tokens"], row["prompt_tokens"] = usage.get("completion_tokens"), usage.get("prompt_tokens")
    if row["completion_tokens"] and row["wall_s"] > 0:
        row["tok_s"] = row["completion_tokens"] / row["wall_s"]
    row["parses"], row["valid"], row["validation_errors"], row["valid_declared_draft"] = validate(schema, row["text"])
    return row


def describe(item, row):
    state = ("ERROR " + row["error"][:120]) if row["error"] else (
        f"{row['finish_reason']} valid={row['valid']} {row['completion_tokens']} tok {row['tok_s'] or 0:.1f} tok/s")
    return f"{item['subset']}/{item['name']}: {state}"


def run_engine(engine, items, args):
    rows, server = bench_servers.run_engine(engine, items, args, "bench-structured", run_schema, describe)
    return rows, server.starts


def summary(rows):
    total = len(rows)
    accepted = [r for r in rows if r["accepted"]]
    stopped = [r for r in accepted if r["finish_reason"] == "stop"]
    speeds = [r["tok_s"] for r in accepted if r["tok_s"]]
    return {
        "total": total,
        "accepted": len(accepted),
        "refused": sum(1 for r in rows if r["status"] == 400),
        "errors": sum(1 for r in rows if not r["accepted"] and r["status"] != 400),
        "valid": sum(1 for r in rows if r["valid"]),
        "stop": len(stopped),
        "length": sum(1 for r in accepted if r["finish_reason"] == "length"),
        "invalid_at_stop": sum(1 for r in stopped if r["valid"] is False),
        "unvalidated": sum(1 for r in accepted if r["parses"] and r["valid"] is None),
        "median_tok_s": statistics.median(speeds) if speeds else None,
    }


def table(results, items, args, meta):
    engines = [e for e in ("hearth", "llama.cpp") if e in results]
    s = {e: summary(results[e]) for e in engines}
    ratio = None
    if all(e in s and s[e]["median_tok_s"] for e in ("hearth", "llama.cpp")):
        ratio = s["hearth"]["median_tok_s"] / s["llama.cpp"]["median_tok_s"]
    pct = lambda a, b: f"{a}/{b} ({100 * a / b:.0f}%)" if b else f"{a}/{b}"
    fmt = lambda x: f"{x:.1f}" if x is not None else "n/a"
    lines = [
        f"Structured output on {len(items)} JSONSchemaBench schemas, {pathlib.Path(args.model).name}, "
        f"max_tokens {args.max_tokens}, {args.threads} threads, CPU, temperature 0, one request at a time"
        + (f"; llama-server environment: {' '.join(f'{k}={v}' for k, v in args.llama_env.items())}." if args.llama_env else "."),
        "",
        "| engine | schemas accepted (compiled) | valid answers (coverage) | finished with stop | cut at max_tokens "
        "| invalid answers among stop (compliance) | errors | median tok/s | hearth/llama.cpp |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in engines:
        x = s[e]
        rel = (f"{ratio:.2f}x" if ratio else "n/a") if e == "hearth" else ("1.00x" if ratio else "n/a")
        lines.append(f"| {e} | {pct(x['accepted'], x['total'])} | {pct(x['valid'], x['total'])} | {x['stop']} | "
                     f"{x['length']} | {x['invalid_at_stop']} of {x['stop']} | {x['errors']} | {fmt(x['median_tok_s'])} | {rel} |")
    # The same speed comparison on the schemas both accepted, paired.
    if len(engines) == 2:
        by = {e: {(r["subset"], r["name"]): r for r in results[e]} for e in engines}
        common = [k for k in by["hearth"] if by["hearth"][k]["tok_s"] and by["llama.cpp"].get(k, {}).get("tok_s")]
        if common:
            ratios = [by["hearth"][k]["tok_s"] / by["llama.cpp"][k]["tok_s"] for k in common]
            lines += ["", f"On the {len(common)} schemas both accepted: median tok/s hearth "
                      f"{statistics.median(by['hearth'][k]['tok_s'] for k in common):.1f}, llama.cpp "
                      f"{statistics.median(by['llama.cpp'][k]['tok_s'] for k in common):.1f}; "
                      f"median of the per-schema ratios hearth/llama.cpp {statistics.median(ratios):.2f}x."]
        # Per subset, valid answers.
        subsets = list(dict.fromkeys(i["subset"] for i in items))
        lines += ["", "| subset | " + " | ".join(f"{e} accepted | {e} valid" for e in engines) + " |",
                  "|---|" + "---|---|" * len(engines)]
        for sub in subsets:
            cells = []
            for e in engines:
                rs = [r for r in results[e] if r["subset"] == sub]
                cells += [f"{sum(r['accepted'] for r in rs)}/{len(rs)}", f"{sum(bool(r['valid']) for r in rs)}/{len(rs)}"]
            lines.append(f"| {sub} | " + " | ".join(cells) + " |")
        diff = []
        for k in by["hearth"]:
            h, l = by["hearth"][k], by["llama.cpp"].get(k)
            if l and (h["accepted"] != l["accepted"] or bool(h["valid"]) != bool(l["valid"])):
                diff.append(f"- {k[0]}/{k[1]}: hearth {describe(h)}; llama.cpp {describe(l)}")
        if diff:
            lines += ["", "Schemas where the engines differ:", *diff]
    for e in engines:
        bad = [r for r in results[e] if r["accepted"] and r["finish_reason"] == "stop" and r["valid"] is False]
        if bad:
            lines += ["", f"{e}: invalid answers that finished with stop:"]
            lines += [f"- {r['subset']}/{r['name']}: {'; '.join(r['validation_errors'] or [])[:300]}" for r in bad]
    lines += ["", f"Engines: {meta['versions']}. Host: {meta['host']}."]
    return "\n".join(lines)


def describe(r):
    if not r["accepted"]:
        return (r["error"] or "error").splitlines()[0][:160]
    v = "valid" if r["valid"] else ("invalid" if r["valid"] is False else "not validated")
    return f"{v} ({r['finish_reason']}, {r['completion_tokens']} tokens)"


def jsonschema_version():
    try:
        import importlib.metadata
        return importlib.metadata.version("jsonschema")
    except Exception:
        return "?"


def version(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        text = (p.stdout + p.stderr).strip().splitlines()
        return " ".join(l.strip() for l in text if l.strip() and not l.startswith("load_backend"))[:200]
    except Exception as e:
        return f"? ({e})"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hearth", required=True)
    p.add_argument("--llama-server", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--schemas", default=str(pathlib.Path.home() / ".cache/hearth/jsonschemabench/sample.json"))
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--engines", default="hearth,llama.cpp", help="comma-separated: hearth, llama.cpp")
    p.add_argument("--limit", type=int, default=0, help="only the first N schemas (0: all)")
    p.add_argument("--llama-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for llama-server only, e.g. OMP_WAIT_POLICY=passive (repeatable). llama.cpp's "
                        "OpenMP threads spin while they wait; on cores shared with other work that can cut its "
                        "decode speed by 10x or more")
    p.add_argument("--out", default="bench_structured.json", help="raw per-schema results (JSON)")
    p.add_argument("--table", help="also write the Markdown table here")
    args = p.parse_args()
    args.llama_env = dict(kv.split("=", 1) for kv in args.llama_env)

    items = json.load(open(args.schemas))
    if args.limit:
        items = items[: args.limit]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "args": vars(args),
        "versions": "; ".join(f"{e}: {version([args.hearth, '--version'] if e == 'hearth' else [args.llama_server, '--version'])}"
                              for e in engines),
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start",
        "system": SYSTEM, "user_prefix": USER, "jsonschema": jsonschema_version(),
    }
    results, starts = {}, {}
    for e in engines:  # one server at a time
        results[e], starts[e] = run_engine(e, items, args)
    meta["server_starts"] = starts
    meta["host"] += f", {os.getloadavg()[0]:.2f} at end"
    md = table(results, items, args, meta)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "summary": {e: summary(r) for e, r in results.items()}, "results": results}, f, indent=1)
    if args.table:
        with open(args.table, "w") as f:
            f.write(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
