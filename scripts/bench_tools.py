#!/usr/bin/env python3
"""Tool-calling accuracy, Hearth's server next to llama.cpp's llama-server (`--jinja`) on the same GGUF
model, over cases of the Berkeley Function Calling Leaderboard (BFCL), scored with BFCL's AST rules.

Data: BFCL's questions and possible answers ship in the `bfcl-eval` wheel on PyPI (Apache 2.0, see its
METADATA and bfcl_eval/data/README.md). They are not copied into this repository; fetch them once with

  mkdir -p ~/.cache/hearth/bfcl && cd ~/.cache/hearth/bfcl && pip download --no-deps bfcl-eval \\
      && unzip -q bfcl_eval-*.whl -d "$(basename bfcl_eval-*.whl .whl)"

--bfcl-dir is the wheel's bfcl_eval/data folder (default: the newest ~/.cache/hearth/bfcl/bfcl_eval-*/
bfcl_eval/data). Categories are BFCL's non-live and live Python AST ones: `simple` (BFCL_v4_simple_python.json,
or v3's BFCL_v3_simple.json), `multiple`, and also `live_simple`, `live_multiple`, `parallel`,
`parallel_multiple`; the first --limit cases of each (default 50).

Each server runs alone (never both at once): every case on `hearth serve`, then the server is stopped and
every case goes to `llama-server`. Each case is one non-streaming POST /v1/chat/completions with the case's
first turn of messages, its functions as OpenAI `tools`, `tool_choice` "auto" (--tool-choice: "required"
constrains both servers to call one of the functions), `parallel_tool_calls` true only in the parallel
categories (the servers' defaults differ), temperature 0 and max_tokens 256 (--max-tokens). One short request without tools warms each server up first and is not counted.

Functions become tools the way BFCL's OpenAI handler makes them: `.` in a name becomes `_` (OpenAI's
names are ^[a-zA-Z0-9_-]+$; the answers' names are renamed the same way), `dict` becomes `object`, `float`
`number`, `tuple` `array`, and `any` loses its type; description, properties, required, enum, items,
default, minimum and maximum are kept, BFCL's `optional` and `format` dropped.

Scoring follows BFCL's ast_checker, simplified: as many calls as the answer has (one for simple and
multiple; for parallel categories each answer call must match a different model call, in any order), the
function's name equal, every required parameter present, none that the function does not declare or the
answer does not list, every parameter the answer lists without `""` (`""` marks one that may be omitted)
present, and each given value among the answer's allowed values: strings as BFCL compares them (lower-cased,
without spaces and , . / - _ * ^), numbers numerically (an int matches a float and the other way round; BFCL
refuses 5.0 for an integer parameter), booleans only as booleans, lists item by item, dicts key by key.
Every case lands in one of: correct, wrong call (a call that fails a rule, or arguments that are not JSON),
no call (an answer without tool_calls), error (HTTP 4xx/5xx, a timeout, a lost connection; the first
message of each kind is printed).

Prints a Markdown table (also written to --table when given), the server commands and the command line;
--out writes the raw per-case results.

Usage:
  scripts/bench_tools.py --hearth BIN --llama-server BIN --model GGUF \\
      [--bfcl-dir DIR] [--categories simple,multiple] [--limit 50] [--max-tokens 256] [--threads 2] \\
      [--ctx 4096] [--timeout 120] [--llama-env KEY=VALUE] [--out results.json] [--table results.md]
Either --hearth or --llama-server may be left out to run only the other.
"""
import argparse
import glob
import json
import pathlib
import re
import shlex
import sys

import bench_servers
from bench_servers import Failed, send

ENGINES = ("hearth", "llama-server")
PYTHON_CATEGORIES = ("simple", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple",
                     "live_parallel", "live_parallel_multiple")
TYPES = {"dict": "object", "object": "object", "float": "number", "double": "number", "number": "number",
         "integer": "integer", "int": "integer", "long": "integer", "string": "string", "str": "string",
         "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array", "tuple": "array", "any": None}
KEPT = ("description", "enum", "default", "minimum", "maximum")


# ---- BFCL data ----

def default_bfcl_dir():
    found = sorted(glob.glob(str(pathlib.Path.home() / ".cache/hearth/bfcl/bfcl_eval-*/bfcl_eval/data")))
    return found[-1] if found else None


def category_files(bfcl_dir, category):
    """(questions, possible answers) for a category, BFCL v4 names first, then v3's."""
    d = pathlib.Path(bfcl_dir)
    for name in (f"BFCL_v4_{category}_python", f"BFCL_v4_{category}", f"BFCL_v3_{category}"):
        if (d / f"{name}.json").exists() and (d / "possible_answer" / f"{name}.json").exists():
            return d / f"{name}.json", d / "possible_answer" / f"{name}.json"
    raise SystemExit(f"no BFCL data for category '{category}' in {d} "
                     f"(looked for BFCL_v4_{category}[_python].json, BFCL_v3_{category}.json and possible_answer/)")


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_cases(args):
    cases = []
    for category in args.categories:
        if category not in PYTHON_CATEGORIES:
            raise SystemExit(f"category '{category}': only BFCL's Python AST categories are scored here "
                             f"({', '.join(PYTHON_CATEGORIES)})")
        questions, answers = category_files(args.bfcl_dir, category)
        truth = {a["id"]: a["ground_truth"] for a in read_jsonl(answers)}
        items = read_jsonl(questions)
        if args.limit:
            items = items[: args.limit]
        for q in items:
            cases.append({"category": category, "id": q["id"], "messages": q["question"][0],
                          "functions": q["function"], "ground_truth": truth[q["id"]],
                          "file": str(questions)})
    return cases


def tool_name(name):
    return name.replace(".", "_")


def schema(s):
    """A BFCL parameter description as JSON Schema."""
    out = {}
    t = s.get("type")
    if t is not None:
        mapped = TYPES.get(t, "string")  # BFCL's OpenAI handler also falls back to string
        if mapped:
            out["type"] = mapped
    for k in KEPT:
        if k in s:
            out[k] = s[k]
    if isinstance(s.get("properties"), dict):
        out["properties"] = {k: schema(v) for k, v in s["properties"].items()}
        if out.get("type") is None:
            out["type"] = "object"
    if isinstance(s.get("required"), list):
        out["required"] = s["required"]
    if isinstance(s.get("items"), dict):
        out["items"] = schema(s["items"])
    return out


def tools(functions):
    result = []
    for f in functions:
        params = schema(f.get("parameters") or {"type": "dict", "properties": {}})
        params["type"] = "object"
        params.setdefault("properties", {})
        result.append({"type": "function", "function": {"name": tool_name(f["name"]),
                                                        "description": f.get("description", ""),
                                                        "parameters": params}})
    return result


# ---- scoring (BFCL's ast_checker, simplified) ----

def standardize(s):
    """BFCL's standardize_string: no spaces or , . / - _ * ^, lower case, ' as "."""
    return re.sub(r"[ ,./\-_*^]", "", s).lower().replace("'", '"')


def same(value, answer):
    """Whether a model's value matches one allowed answer value."""
    if isinstance(answer, bool) or isinstance(value, bool):
        return type(value) is bool and type(answer) is bool and value == answer
    if isinstance(answer, (int, float)):
        return isinstance(value, (int, float)) and float(value) == float(answer)
    if isinstance(answer, str):
        return isinstance(value, str) and standardize(value) == standardize(answer)
    if isinstance(answer, list):
        return isinstance(value, list) and len(value) == len(answer) and all(map(same, value, answer))
    if isinstance(answer, dict):  # a dict's answer lists allowed values per key, "" where the key may be left out
        if not isinstance(value, dict):
            return False
        alts = {k: v if isinstance(v, list) else [v] for k, v in answer.items()}
        return (all(k in alts and any(same(v, a) for a in alts[k]) for k, v in value.items())
                and all(k in value or "" in a for k, a in alts.items()))
    return value == answer


def check_call(call, expected, functions):
    """None if the model's call (name, arguments) matches the expected {name: {param: [allowed]}}, else why not."""
    (gt_name, allowed), = expected.items()
    name, args = call
    if name != tool_name(gt_name):
        return f"called {name}, expected {tool_name(gt_name)}"
    doc = next((f for f in functions if f["name"] == gt_name), None)
    declared = ((doc or {}).get("parameters") or {}).get("properties") or {}
    for p in ((doc or {}).get("parameters") or {}).get("required") or []:
        if p not in args:
            return f"missing required parameter {p}"
    for p, v in args.items():
        if p not in declared or p not in allowed:
            return f"unexpected parameter {p}"
        if not any(same(v, a) for a in allowed[p]):
            return f"{p}={json.dumps(v)}, allowed {json.dumps(allowed[p])}"
    for p, a in allowed.items():
        if p not in args and "" not in a:
            return f"missing parameter {p} (not optional in the answer)"
    return None


def score(calls, ground_truth, functions):
    """None if the calls match the ground truth one to one (in any order), else why not."""
    if len(calls) != len(ground_truth):
        return f"{len(calls)} calls, expected {len(ground_truth)}"
    free = list(range(len(calls)))
    for expected in ground_truth:
        why = None
        for i in free:
            why = check_call(calls[i], expected, functions)
            if why is None:
                free.remove(i)
                break
        if why is not None:
            return why
    return None


# ---- running ----

def error_kind(status, reply, raw):
    err = (reply or {}).get("error") if isinstance(reply, dict) else None
    kind = err.get("type") or err.get("code") if isinstance(err, dict) else None
    message = (err.get("message") if isinstance(err, dict) else err) or raw
    return f"HTTP {status}" + (f" {kind}" if kind else ""), str(message)[:500]


def run_case(server, case, args):
    body = {
        "model": server.model_id,
        "messages": case["messages"],
        "tools": tools(case["functions"]),
        "tool_choice": args.tool_choice,
        # (The servers' defaults differ: OpenAI's and hearth's true, llama-server's false; BFCL's
        # categories say how many calls an answer holds.)
        "parallel_tool_calls": case["category"].startswith("parallel"),
        "temperature": 0,
        "max_tokens": args.max_tokens,
    }
    row = {"engine": server.engine, "category": case["category"], "id": case["id"], "outcome": None,
           "error_kind": None, "error": None, "why": None, "calls": None, "content": None, "finish_reason": None,
           "wall_s": None}

    def fail(kind, message):
        row["outcome"], row["error_kind"], row["error"] = "error", kind, message
        return row

    try:
        status, reply, raw, row["wall_s"] = send(server, body, args.timeout)
    except Failed as e:
        return fail(e.kind, str(e))
    if status != 200 or not isinstance(reply, dict) or not reply.get("choices"):
        return fail(*error_kind(status, reply, raw))
    choice = reply["choices"][0]
    message = choice.get("message") or {}
    row["content"], row["finish_reason"] = message.get("content"), choice.get("finish_reason")
    tool_calls = message.get("tool_calls") or []
    if not tool_calls:
        row["outcome"] = "no call"
        return row
    calls = []
    for tc in tool_calls:
        fn = tc.get("function") or {}
        arguments = fn.get("arguments")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            parsed = None
        row["calls"] = (row["calls"] or []) + [{"name": fn.get("name"), "arguments": arguments}]
        if not isinstance(parsed, dict):
            row["outcome"], row["why"] = "wrong call", f"arguments are not a JSON object: {str(arguments)[:200]}"
            return row
        calls.append((fn.get("name"), parsed))
    row["why"] = score(calls, case["ground_truth"], case["functions"])
    row["outcome"] = "correct" if row["why"] is None else "wrong call"
    return row


def describe(case, row):
    detail = {"error": f"{row['error_kind']}: {(row['error'] or '')[:120]}", "wrong call": row["why"],
              "no call": f"text: {(row['content'] or '')[:80]!r}"}.get(row["outcome"], "")
    return f"{case['id']}: {row['outcome']} {detail}"


def run_engine(engine, cases, args):
    rows, server = bench_servers.run_engine(engine, cases, args, "bench-tools", run_case, describe)
    return rows, server.cmd


OUTCOMES = ("correct", "wrong call", "no call", "error")


def table(results, args, commands):
    lines = [
        f"BFCL tool calling (AST), {pathlib.Path(args.model).name}, first {args.limit or 'all'} cases per category, "
        f"tool_choice {args.tool_choice}, temperature 0, max_tokens {args.max_tokens}, {args.threads} threads, CPU, "
        f"one request at a time"
        + (f"; llama-server environment: {' '.join(f'{k}={v}' for k, v in args.llama_env.items())}." if args.llama_env else "."),
        "",
        "| engine | category | cases | correct | wrong call | no call | error | accuracy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for engine, rows in results.items():
        groups = [(c, [r for r in rows if r["category"] == c]) for c in args.categories]
        if len(groups) > 1:
            groups.append(("all", rows))
        for category, rs in groups:
            n = {o: sum(r["outcome"] == o for r in rs) for o in OUTCOMES}
            acc = f"{100 * n['correct'] / len(rs):.1f}%" if rs else "n/a"
            lines.append(f"| {engine} | {category} | {len(rs)} | {n['correct']} | {n['wrong call']} | "
                         f"{n['no call']} | {n['error']} | {acc} |")
    for engine, rows in results.items():
        kinds = {}
        for r in rows:
            if r["outcome"] == "error":
                kinds.setdefault(r["error_kind"], [0, r["id"], r["error"]])[0] += 1
        if kinds:
            lines += ["", f"{engine} errors, the first message of each kind:"]
            lines += [f"- {k} ({n}x, first on {cid}): {msg}" for k, (n, cid, msg) in kinds.items()]
    lines += ["", "Servers:"] + [f"- {e}: `{shlex.join(c)}`" for e, c in commands.items() if c]
    lines += ["", "Command:", "", "    " + shlex.join([sys.argv[0]] + sys.argv[1:])]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hearth", help="the hearth binary (left out: llama-server only)")
    p.add_argument("--llama-server", help="llama.cpp's llama-server binary (left out: hearth only)")
    p.add_argument("--model", required=True, help="a GGUF file, e.g. ~/.cache/hearth/models/...gguf")
    p.add_argument("--bfcl-dir", default=default_bfcl_dir(),
                   help="bfcl_eval/data from the unzipped bfcl-eval wheel "
                        "(default: the newest ~/.cache/hearth/bfcl/bfcl_eval-*/bfcl_eval/data)")
    p.add_argument("--categories", default="simple,multiple", help="comma-separated BFCL categories")
    p.add_argument("--limit", type=int, default=50, help="the first N cases of each category (0: all)")
    p.add_argument("--tool-choice", default="auto", choices=["auto", "required"])
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--llama-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for llama-server only, e.g. OMP_WAIT_POLICY=passive (repeatable). llama.cpp's "
                        "OpenMP threads spin while they wait; on cores shared with other work that can cut its "
                        "decode speed by 10x or more")
    p.add_argument("--out", help="write the raw per-case results (JSON) here")
    p.add_argument("--table", help="also write the Markdown table here")
    args = p.parse_args()
    args.llama_env = dict(kv.split("=", 1) for kv in args.llama_env)
    args.categories = [c.strip() for c in args.categories.split(",") if c.strip()]
    if not args.hearth and not args.llama_server:
        p.error("give --hearth, --llama-server or both")
    if not args.bfcl_dir:
        p.error("no BFCL data under ~/.cache/hearth/bfcl; fetch it as the docstring says, or give --bfcl-dir")

    cases = load_cases(args)
    engines = [e for e, b in zip(ENGINES, (args.hearth, args.llama_server)) if b]
    results, commands = {}, {}
    for e in engines:  # one server at a time
        results[e], commands[e] = run_engine(e, cases, args)
    md = table(results, args, commands)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "commands": commands, "results": results}, f, indent=1)
    if args.table:
        with open(args.table, "w") as f:
            f.write(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
