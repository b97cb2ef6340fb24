#!/usr/bin/env python3
"""Decode speed of qwen2.5-coder-1.5b with and without speculative decoding (greedy, chat).

Modes: no speculation, the 0.5B as draft model, prompt lookup, and lookup first with the draft
model where nothing matches (`--lookup --draft-model`). Prompts: scripts/speculative-prompts/
(code-*: code edits, prose-*: free prose), each generated to its end of turn (at most N tokens).
Each prompt's modes run back to back and the whole set REPS times; a row reports the best rep
(the machine may be shared). Greedy speculation gives the plain run's tokens, checked here.
`decode tok/s` counts every token after the first, so it includes the draft model's read of the
prompt (it comes after the first token); `without prompt read` leaves that read out.
Extra arguments go to `hearth run`, e.g. `--system "Reply with the edited code only."`.

`--follow-up` (among the extra arguments) measures the second turn of a chat instead: for each
code prompt with a follow-up edit in scripts/speculative-follow-ups/, the plain greedy answer to
the prompt, then that edit of it (`hearth run --messages`), whose answer copies the first.

Usage: scripts/bench_speculative.py [path/to/hearth] [max tokens] [reps] [extra hearth args...]
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent
target_dir = os.environ.get("CARGO_TARGET_DIR", "target")
HEARTH = sys.argv[1] if len(sys.argv) > 1 else f"{target_dir}/release/hearth"
MAX_TOKENS = int(sys.argv[2]) if len(sys.argv) > 2 else 320
REPS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
EXTRA = [a for a in sys.argv[4:] if a != "--follow-up"]
FOLLOW_UP = "--follow-up" in sys.argv[4:]
DRAFT = ["--draft-model", "qwen2.5-coder-0.5b"]
# (name, hearth run arguments, environment). The last two start the draft policy from nothing
# (HEARTH_PASS_COSTS=off) instead of the pass costs measured once and kept: the A/B of that.
LEARNT = {"HEARTH_PASS_COSTS": "off"}
ALL_MODES = [
    ("no speculation", [], {}),
    ("draft model", DRAFT, {}),
    ("prompt lookup", ["--lookup"], {}),
    ("lookup, then draft model", ["--lookup", *DRAFT], {}),
    ("draft model, costs learnt online", DRAFT, LEARNT),
    ("prompt lookup, costs learnt online", ["--lookup"], LEARNT),
]
MODES = ALL_MODES[:4]
# HEARTH_MODES=0,2 runs those modes only (by index; 0, no speculation, is every ratio's baseline).
if os.environ.get("HEARTH_MODES"):
    MODES = [ALL_MODES[int(i)] for i in os.environ["HEARTH_MODES"].split(",")]


def run(prompt, args, env=None):
    """`prompt`: the user's message, or the path of a conversation file (`--messages`)."""
    source = ["--messages", str(prompt)] if isinstance(prompt, pathlib.Path) else ["--chat", "-p", prompt]
    cmd = [HEARTH, "run", "-m", "qwen2.5-coder-1.5b", "-t", "2", "--quiet", "--temperature", "0",
           "-n", str(MAX_TOKENS), "--json", *source, *args, *EXTRA]
    env = {**os.environ, **(env or {})}
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)


def follow_up_conversations(folder):
    """Per code prompt with a follow-up: a conversation file of the prompt, its plain greedy
    answer and the follow-up edit."""
    conversations = []
    for edit in sorted(ROOT.glob("speculative-follow-ups/*.txt")):
        first = (ROOT / "speculative-prompts" / edit.name).read_text()
        answer = run(first, [])["text"]
        messages = [{"role": "user", "content": first}, {"role": "assistant", "content": answer},
                    {"role": "user", "content": edit.read_text()}]
        path = pathlib.Path(folder) / f"{edit.stem}-follow-up.json"
        path.write_text(json.dumps(messages))
        conversations.append(path)
    return conversations


def main():
    with tempfile.TemporaryDirectory() as folder:
        prompts = follow_up_conversations(folder) if FOLLOW_UP else sorted(ROOT.glob("speculative-prompts/*.txt"))
        measure(prompts)


def measure(prompts):
    with open("/proc/loadavg") as f:
        print(f"load average before: {' '.join(f.read().split()[:3])}")
    best = {}  # (prompt, mode) -> best report
    paired = []  # per rep: (kind, mode) -> [tokens, decode seconds]
    for _ in range(REPS):
        paired.append({})
        for path in prompts:
            prompt = path if path.suffix == ".json" else path.read_text()
            plain_tokens = None
            for mode, args, env in MODES:
                r = run(prompt, args, env)
                if plain_tokens is None:
                    plain_tokens = r["tokens"]
                elif r["tokens"] != plain_tokens:
                    sys.exit(f"{path.name}, {mode}: the tokens differ from plain greedy decoding")
                t = paired[-1].setdefault((kind_of(path), mode), [0, 0.0])
                t[0] += len(r["tokens"]) - 1
                t[1] += (len(r["tokens"]) - 1) / r["decode_tok_s"]
                key = (path.stem, mode)
                if key not in best or r["decode_tok_s"] > best[key]["decode_tok_s"]:
                    best[key] = r
    print("| prompt | mode | tokens | decode tok/s | vs plain | acceptance | accepted per pass | passes (lookup's) | draft model's prompt read |")
    print("|---|---|---|---|---|---|---|---|---|")
    totals = {}  # (kind, mode) -> [tokens, decode seconds]
    for path in prompts:
        plain = best[(path.stem, MODES[0][0])]
        for mode, _, _ in MODES:
            r = best[(path.stem, mode)]
            s = r.get("speculative") or {}
            n = len(r["tokens"])
            prepare_ms = s.get("drafter_prepare_ms", 0.0)
            spec = ("%.0f%% | %.2f | %d (%d) | %.0f ms" % (100 * s["acceptance_rate"], s["mean_accepted_per_step"],
                                                        s["target_forward_passes"], s.get("free_passes", 0),
                                                        prepare_ms)) if s else "- | - | - | -"
            print(f"| {path.stem} | {mode} | {n} | {r['decode_tok_s']:.1f} | {r['decode_tok_s'] / plain['decode_tok_s']:.2f}x | {spec} |")
            kind = kind_of(path)
            t = totals.setdefault((kind, mode), [0, 0.0, 0.0])
            # decode_tok_s counts the tokens after the first (the first comes from the prompt pass).
            t[0] += n - 1
            t[1] += (n - 1) / r["decode_tok_s"]
            t[2] += prepare_ms / 1e3 if s else 0.0
    print()
    print("| all prompts of a kind | mode | tokens | decode tok/s | vs plain | without prompt read | vs plain |")
    print("|---|---|---|---|---|---|---|")
    for kind in sorted({kind for kind, _ in totals}):
        plain_rate = totals[(kind, MODES[0][0])][0] / totals[(kind, MODES[0][0])][1]
        for mode, _, _ in MODES:
            n, sec, prepare = totals[(kind, mode)]
            rate, without = n / sec, n / (sec - prepare)
            print(f"| {kind} | {mode} | {n} | {rate:.1f} | {rate / plain_rate:.2f}x | {without:.1f} | {without / plain_rate:.2f}x |")
    # The best rep of each mode may come from different moments of a shared machine, whose memory
    # bandwidth (plain decoding's limit) swings by a third; within a rep a prompt's modes run
    # back to back, so these ratios compare like with like.
    print()
    print("| paired within each rep: kind | mode | vs plain, rep by rep | median |")
    print("|---|---|---|---|")
    for kind in sorted({kind for kind, _ in totals}):
        for mode, _, _ in MODES[1:]:
            ratios = sorted(rep[(kind, MODES[0][0])][1] / rep[(kind, mode)][1] for rep in paired)
            each = ", ".join(f"{rep[(kind, MODES[0][0])][1] / rep[(kind, mode)][1]:.2f}x" for rep in paired)
            print(f"| {kind} | {mode} | {each} | {ratios[len(ratios) // 2]:.2f}x |")
    with open("/proc/loadavg") as f:
        print(f"load average after: {' '.join(f.read().split()[:3])}")


def kind_of(path):
    return path.stem.split("-")[0] + (" follow-up" if path.suffix == ".json" else "")


if __name__ == "__main__":
    main()
