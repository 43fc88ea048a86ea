#!/usr/bin/env python3
"""MTP acceptance of greedy speculative decoding with full and reduced-vocabulary draft heads.

Usage: scripts/draft-vocab-acceptance.py [--model DIR] [--text FILE] [--spec-k K] [--draft-vocab FILE ...]
                                         [--sizes 1024,2048 [--corpus DIR]] [--temperature T ...]

Like the "model's own greedy text" measure of models/README.md: prompt k is the first 32 tokens of the
k-th of 16 equal slices of the held-out text; `qwen35 run` generates 96 tokens from it with speculation,
once with the full draft head and once per --draft-vocab file, and the speculation counters it prints
are summed. Every run must give the same tokens (the draft head cannot change greedy output): the
script fails if one does not. --sizes first writes draft vocabularies of those sizes with
`qwen35 draft-vocab` from the demo model's training text (scripts/train_demo_model.py's corpus, the
held-out files left out), into the system's temporary directory. --temperature also measures sampled
acceptance at each temperature through `qwen35 serve` (the same prompts, seed = prompt index, the counters
of its /metrics).
"""
import argparse
import re
import importlib.util
import json
import socket
import time
import urllib.request
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "build" / "qwen35"
COUNTERS = re.compile(r"speculation: k=\d+, draft head (\d+) of (\d+) rows, (\d+) steps, (\d+) drafts, (\d+) accepted")


def metrics(url):
    out = {}
    for line in urllib.request.urlopen(url + "/metrics", timeout=30).read().decode().splitlines():
        if line.startswith("vllm:spec_decode_num"):
            name, value = line.rsplit(" ", 1)
            name = re.sub(r"\{.*\}", "", name)
            out[name] = out.get(name, 0.0) + float(value)
    return out


def sampled_acceptance(a, prompts, dv, temperature):
    """(drafts, accepted) of sampled requests served by qwen35 serve."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(BIN), "serve", "-m", a.model, "--port", str(port), "-t", a.threads, "--spec-k", str(a.spec_k)]
    proc = subprocess.Popen(cmd + (["--draft-vocab", dv] if dv else []), stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        before = metrics(url)
        for i, p in enumerate(prompts):
            body = json.dumps({"prompt": p, "max_tokens": a.new, "temperature": temperature, "seed": i,
                               "ignore_eos": True}).encode()
            req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=300).read()
        after = metrics(url)
    finally:
        proc.terminate()
        proc.wait()
    key = "vllm:spec_decode_num_%s_tokens_total"
    return (after[key % "draft"] - before[key % "draft"], after[key % "accepted"] - before[key % "accepted"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "qwen35-demo"))
    ap.add_argument("--text", default=str(ROOT / "models" / "qwen35-demo-eval.txt"))
    ap.add_argument("--spec-k", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--draft-vocab", nargs="*", default=[])
    ap.add_argument("--sizes", default="", help="comma-separated draft vocabulary sizes to build from the corpus")
    ap.add_argument("--corpus", default="/usr/share/doc/python3.11/html/_sources")
    ap.add_argument("--temperature", type=float, nargs="*", default=[])
    a = ap.parse_args()
    if a.sizes:
        spec = importlib.util.spec_from_file_location("train_demo_model", ROOT / "scripts" / "train_demo_model.py")
        train = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(train)
        train_texts = train.load_corpus(a.corpus)[0]
        tmp = Path(tempfile.mkdtemp(prefix="q35-draft-vocab-"))
        (tmp / "train.txt").write_text("\n\n".join(train_texts))
        for size in a.sizes.split(","):
            out = tmp / f"draft-vocab-{size}.txt"
            subprocess.run([str(BIN), "draft-vocab", "-m", a.model, "--text", str(tmp / "train.txt"), "--size", size,
                            "-o", str(out), "--check", a.text], check=True)
            a.draft_vocab.append(str(out))
    tok = subprocess.run([str(BIN), "tokenize", "-m", a.model, "--file", a.text, "--ids-only", "--no-special"],
                         capture_output=True, text=True, check=True)
    ids = [int(x) for x in tok.stdout.split()]
    stride = len(ids) // a.prompts
    prompts = [ids[k * stride:k * stride + a.prompt_len] for k in range(a.prompts)]
    reference = None
    print(f"{a.model}: {a.prompts} prompts of {a.prompt_len} held-out tokens, {a.new} greedy tokens each, k={a.spec_k}")
    for dv in [None] + a.draft_vocab:
        steps = drafts = accepted = 0
        outputs = []
        rows = None
        for p in prompts:
            cmd = [str(BIN), "run", "-m", a.model, "-t", a.threads, "--prompt-ids", ",".join(map(str, p)), "-n", str(a.new),
                   "--spec-k", str(a.spec_k)] + (["--draft-vocab", dv] if dv else [])
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
            m = COUNTERS.search(r.stderr)
            if not m:
                sys.exit(f"no speculation counters in:\n{r.stderr}")
            rows = f"{m.group(1)} of {m.group(2)}"
            steps += int(m.group(3))
            drafts += int(m.group(4))
            accepted += int(m.group(5))
            outputs.append(r.stdout.strip())
        if reference is None:
            reference = outputs
        elif outputs != reference:
            sys.exit(f"draft vocabulary {dv} changed the greedy output")
        print(f"draft head {rows} rows{' (' + dv + ')' if dv else ''}: {drafts} drafts, {accepted} accepted, "
              f"acceptance {accepted / drafts:.3f}, {(steps + accepted) / steps:.3f} tokens per step")
        for t in a.temperature:
            d, acc = sampled_acceptance(a, prompts, dv, t)
            print(f"  sampled at temperature {t}: {int(d)} drafts, {int(acc)} accepted, acceptance {acc / d:.3f}")
    print("greedy output identical in every run")


if __name__ == "__main__":
    main()
