#!/usr/bin/env python3
"""Decode speed of `hearth serve` plain, with `--lookup`, with `--draft-model` and with both, one
request at a time (an editor or a chat client talking to its own server): qwen2.5-coder-1.5b (the 0.5B drafts),
greedy, streaming.

The servers run side by side; each prompt of scripts/speculative-prompts/ goes to each in turn,
REPS times over the set, and a row reports the best rep of each. Decode tok/s is measured by the
client: the tokens after the first over the time from the first streamed text to the last. The
answers must be equal (greedy). The speculative servers carry their draft policy from request to
request, as in real use.

With HEARTH_CONCURRENCY=C (C > 1) in the environment, each server instead gets all the code prompts at
once, C in flight at a time, and a row reports its throughput: the answers' tokens over the wall
time from the first request to the last answer (prompt reads included), the best of REPS.
HEARTH_MODES=plain,lookup (a comma-separated subset of plain, lookup, draft-model, lookup-draft-model)
picks the servers.

Usage: [HEARTH_CONCURRENCY=C] [HEARTH_MODES=...] scripts/bench_serve_speculative.py [path/to/hearth] [max tokens] [reps] [system prompt]
"""
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent
target_dir = os.environ.get("CARGO_TARGET_DIR", "target")
HEARTH = sys.argv[1] if len(sys.argv) > 1 else f"{target_dir}/release/hearth"
MAX_TOKENS = int(sys.argv[2]) if len(sys.argv) > 2 else 400
REPS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
SYSTEM = sys.argv[4] if len(sys.argv) > 4 else None
MODEL = "qwen2.5-coder-1.5b"
DRAFT = ["--draft-model", "qwen2.5-coder-0.5b"]
SERVERS = {"plain": [], "lookup": ["--lookup"], "draft-model": DRAFT, "lookup-draft-model": ["--lookup", *DRAFT]}
MODES = [m for m in os.environ.get("HEARTH_MODES", ",".join(SERVERS)).split(",") if m]


def start(extra):
    cmd = [HEARTH, "serve", "-m", MODEL, "-t", "2", "--quiet", "--port", "0", *extra]
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for line in server.stderr:
        if "listening on http://" in line:
            return server, line.split("listening on http://")[1].strip()
    sys.exit(f"{' '.join(cmd)} exited before listening")


def ask(address, user):
    messages = ([{"role": "system", "content": SYSTEM}] if SYSTEM else []) + [{"role": "user", "content": user}]
    body = {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    request = urllib.request.Request(f"http://{address}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    sent = time.perf_counter()
    text, first, last, usage = "", None, None, None
    with urllib.request.urlopen(request) as response:
        for line in response:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {}).get("content") or ""
                if delta:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text += delta
    tokens = usage["completion_tokens"]
    decode = (tokens - 1) / (last - first) if last and last > first else 0.0
    details = usage.get("completion_tokens_details") or {}
    return {"text": text, "tokens": tokens, "ttft_s": first - sent, "decode_tok_s": decode,
            "accepted": details.get("accepted_prediction_tokens"), "rejected": details.get("rejected_prediction_tokens")}


def in_flight(prompts, addresses, concurrency):
    """Throughput of each server on all the prompts, `concurrency` requests in flight."""
    best = {}
    for _ in range(REPS):
        answers = {}
        for mode, address in addresses.items():
            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                results = list(pool.map(lambda path: ask(address, path.read_text()), prompts))
            seconds = time.perf_counter() - started
            answers[mode] = [r["text"] for r in results]
            tokens = sum(r["tokens"] for r in results)
            accepted = sum(r["accepted"] or 0 for r in results)
            verified = accepted + sum(r["rejected"] or 0 for r in results)
            if mode not in best or tokens / seconds > best[mode][0]:
                best[mode] = (tokens / seconds, tokens, seconds, accepted, verified)
        if any(a != answers[MODES[0]] for a in answers.values()):
            sys.exit("the servers' answers differ")
    print(f"| {concurrency} in flight | tokens | seconds | tok/s | vs {MODES[0]} | drafts accepted / verified |")
    print("|---|---|---|---|---|---|")
    for mode in MODES:
        rate, tokens, seconds, accepted, verified = best[mode]
        drafts = f"{accepted} / {verified}" if mode != "plain" else "-"
        print(f"| {mode} | {tokens} | {seconds:.1f} | {rate:.1f} | {rate / best[MODES[0]][0]:.2f}x | {drafts} |")


def main():
    prompts = sorted(ROOT.glob("speculative-prompts/*.txt"))
    servers = {mode: start(SERVERS[mode]) for mode in MODES}
    addresses = {mode: address for mode, (_, address) in servers.items()}
    concurrency = int(os.environ.get("HEARTH_CONCURRENCY", "1"))
    try:
        if concurrency > 1:
            in_flight([p for p in prompts if p.stem.startswith("code")], addresses, concurrency)
            return
        best = {}
        for _ in range(REPS):
            for path in prompts:
                user = path.read_text()
                results = {mode: ask(address, user) for mode, address in addresses.items()}
                if any(r["text"] != results[MODES[0]]["text"] for r in results.values()):
                    sys.exit(f"{path.name}: the servers' answers differ")
                for mode, r in results.items():
                    key = (path.stem, mode)
                    if key not in best or r["decode_tok_s"] > best[key]["decode_tok_s"]:
                        best[key] = r
    finally:
        for server, _ in servers.values():
            server.kill()
    base = MODES[0]
    others = MODES[1:]
    print(f"| prompt | tokens | {base} tok/s | " + " | ".join(f"{m} tok/s | vs {base} | accepted / verified" for m in others) + " |")
    print("|---|---|---|" + "---|---|---|" * len(others))
    totals = {}
    for path in prompts:
        a = best[(path.stem, base)]
        cells = []
        for mode in others:
            b = best[(path.stem, mode)]
            verified = (b["accepted"] or 0) + (b["rejected"] or 0)
            cells.append(f"{b['decode_tok_s']:.1f} | {b['decode_tok_s'] / a['decode_tok_s']:.2f}x | {b['accepted']} / {verified}")
        print(f"| {path.stem} | {a['tokens']} | {a['decode_tok_s']:.1f} | " + " | ".join(cells) + " |")
        kind = path.stem.split("-")[0]
        for mode in MODES:
            r = best[(path.stem, mode)]
            t = totals.setdefault((kind, mode), [0, 0.0])
            t[0] += r["tokens"] - 1
            t[1] += (r["tokens"] - 1) / r["decode_tok_s"]
    print()
    print("| all prompts of a kind | " + " | ".join(f"{m} tok/s" for m in MODES) + f" | " + " | ".join(f"{m} vs {base}" for m in others) + " |")
    print("|---|" + "---|" * (len(MODES) + len(others)))
    for kind in sorted({kind for kind, _ in totals}):
        rate = {mode: totals[(kind, mode)][0] / totals[(kind, mode)][1] for mode in MODES}
        print(f"| {kind} | " + " | ".join(f"{rate[m]:.1f}" for m in MODES) + " | "
              + " | ".join(f"{rate[m] / rate[base]:.2f}x" for m in others) + " |")


if __name__ == "__main__":
    main()
