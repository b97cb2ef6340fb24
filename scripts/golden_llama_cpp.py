#!/usr/bin/env python3
"""llama.cpp's reference outputs for a model, in the format of tests/fixtures/golden/<model>.json:
the four prompts the other models' fixtures use (three plain, one ChatML chat turn), greedy, 48
tokens, with every step's top-5 log-probabilities, through `llama-server /completion` with
`--ctx-checkpoints 0` (the whole prompt in one batch, as the other fixtures were made). With
--perplexity, also `llama-perplexity -c 512` over tests/fixtures/golden/ppl_gpl3_4k.txt, merged
into tests/fixtures/golden/perplexity.json.

Usage:
  scripts/golden_llama_cpp.py --llama-bin DIR --model GGUF [--perplexity] [--threads 2]
DIR holds llama-server (and llama-perplexity): a CPU build of the llama.cpp commit the fixtures name.
"""
import argparse
import hashlib
import json
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests/fixtures/golden"
PROMPTS = {
    "a": "The capital of France is",
    "b": "def fibonacci(n):",
    "c": "Once upon a time, in a small village,",
    "d": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
         "Write a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n",
}
N_PREDICT = 48
PORT = 18080


def call(path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.load(r)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def version(binary):
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stderr.strip()
    commit = re.search(r"commit ([0-9a-f]+)", out)
    return out, commit.group(1) if commit else None


def case(case_id, prompt):
    request = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0,
               "repeat_penalty": 1.0, "seed": 42, "cache_prompt": False, "return_tokens": True, "stream": False,
               "ignore_eos": False}
    reply = call("/completion", dict(request, n_probs=5, post_sampling_probs=False))
    with_bos = call("/tokenize", {"content": prompt, "add_special": True, "parse_special": True, "with_pieces": True})
    without_bos = call("/tokenize", {"content": prompt, "add_special": False, "parse_special": True})["tokens"]
    prompt_ids = [t["id"] for t in with_bos["tokens"]]
    steps = []
    for p in reply["completion_probabilities"]:
        top = [{"id": t["id"], "token": t["token"], "logprob": t["logprob"]} for t in p["top_logprobs"]]
        steps.append({"token_id": p["id"], "token": p["token"], "logprob": p["logprob"], "top": top})
    margins = [(s["top"][0]["logprob"] - s["top"][1]["logprob"], k) for k, s in enumerate(steps) if len(s["top"]) > 1]
    generated = reply["tokens"]
    detokenized = call("/detokenize", {"tokens": generated})["content"]
    return {
        "id": case_id,
        "prompt": prompt,
        "prompt_token_ids": prompt_ids,
        "bos_added": prompt_ids != without_bos,
        "prompt_token_ids_without_bos": without_bos,
        "prompt_pieces": [t["piece"] for t in with_bos["tokens"]],
        "generated_token_ids": generated,
        "n_generated": len(generated),
        "generated_text": reply["content"],
        "detokenized_generated_ids": detokenized,
        "generated_pieces": [s["token"] for s in steps],
        "stop_type": reply.get("stop_type"),
        "stopping_word": reply.get("stopping_word", ""),
        "tokens_evaluated": reply.get("tokens_evaluated"),
        "top5_logprobs_per_step": steps,
        "request": request,
        "min_top1_top2_margin": {
            "nats": min(margins)[0] if margins else None,
            "step": min(margins)[1] if margins else None,
            "steps_with_margin_below_0.1": [k for m, k in margins if m < 0.1],
        },
    }


def perplexity(args, model, stem, commit):
    binary = pathlib.Path(args.llama_bin) / "llama-perplexity"
    text = GOLDEN / "ppl_gpl3_4k.txt"
    cmd = [str(binary), "-m", str(model), "-f", str(text), "-c", "512", "-t", str(args.threads)]
    # The running estimates and the final one go to different streams: read both.
    log = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True).stdout
    running = [float(x) for x in re.findall(r"\[\d+\]\s*([0-9.]+),", log)]
    final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    chunks = re.search(r"calculating perplexity over (\d+) chunks", log)
    reference = json.loads((GOLDEN / "perplexity.json").read_text())
    if reference["llama_cpp"]["commit"][:9] != (commit or "")[:9]:
        sys.exit(f"llama-perplexity is commit {commit}, the fixture's is {reference['llama_cpp']['commit']}")
    return reference, {
        "cmd": f"llama-perplexity -m {model.name} -f {text.name} -c 512 -t {args.threads}",
        "n_chunks": int(chunks.group(1)),
        "ppl": float(final.group(1)),
        "ppl_stderr": float(final.group(2)),
        **({"running_ppl_after_each_chunk": running} if running else {}),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-bin", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--perplexity", action="store_true")
    args = p.parse_args()
    model = pathlib.Path(args.model)
    stem = model.stem
    server = pathlib.Path(args.llama_bin) / "llama-server"
    version_string, commit = version(server)
    cmd = [str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(PORT), "-t", str(args.threads),
           "-c", "4096", "-np", "1", "--no-webui", "-s", "42", "--ctx-checkpoints", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(600):
            try:
                call("/health")
                break
            except OSError:
                time.sleep(0.2)
        props = call("/props")
        cases = [case(case_id, prompt) for case_id, prompt in PROMPTS.items()]
        text = (GOLDEN / "ppl_gpl3_4k.txt").read_text()
        n_tokens = len(call("/tokenize", {"content": text, "add_special": True})["tokens"])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    golden = {
        "llama_cpp": {"commit": commit, "version_string": version_string},
        "model_file": model.name,
        "model_sha256": sha256(model),
        "server_cmd": " ".join(["llama-server", "-m", model.name] + cmd[3:]),
        "sampling": "greedy: temperature=0 (llama.cpp keeps only the max-logit token), top_k=1, seed=42, "
                    "repeat_penalty=1, cache_prompt=false; generation stops early at an end-of-generation token",
        "n_predict": N_PREDICT,
        "props": {k: props.get(k) for k in ("build_info", "chat_template", "bos_token", "eos_token")},
        "cases": cases,
    }
    (GOLDEN / f"{stem}.json").write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {GOLDEN / f'{stem}.json'}")
    if args.perplexity:
        reference, result = perplexity(args, model, stem, commit)
        result = {"cmd": result["cmd"], "n_tokens_in_file": n_tokens, **{k: v for k, v in result.items() if k != "cmd"}}
        reference["results"][stem] = result
        (GOLDEN / "perplexity.json").write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
        print(f"{stem}: perplexity {result['ppl']} over {n_tokens} tokens")


if __name__ == "__main__":
    main()
