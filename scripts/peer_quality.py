#!/usr/bin/env python3
"""The qwen35 half of make quality-peer, on exactly llama-perplexity's token windows.

llama-perplexity --kl-divergence-base FILE stores the evaluated tokens (n_chunk windows of n_ctx)
and, for the scored positions of each window (n_ctx/2 .. n_ctx-2, each predicting the next token),
the base model's log-probabilities. This script reads those windows and measures qwen35 on them:

  peer_quality.py tokens BASE.kld --text FILE --qwen35 BIN --tokenizer DIR --ids-out FILE
      checks that qwen35's tokenizer gives the same ids as llama.cpp's for the text (the windows are
      its first n_chunk*n_ctx tokens), writes them (one window after another) to --ids-out.
  peer_quality.py check BASE.kld --qwen35 BIN --model BF16_DIR [--tol-ppl R] [--tol-lp X]
      llama.cpp's F16 log-probabilities (from BASE.kld) against qwen35's BF16 ones on every scored
      position: perplexities within a relative R (default 0.002), and on the first window the largest
      |log p| difference over tokens with p > 1e-3 within X nats (default 0.02). Exit 1 if not.
  peer_quality.py measure BASE.kld --qwen35 BIN --model CACHE [--model CACHE2 ...] --base BF16_DIR
      for each model, one JSON line: perplexity, mean / 99th-percentile / max KL(base || model), top-1 agreement over the scored
      positions, from `qwen35 logits` of both models per window (JSON on stdout).
  peer_quality.py eval-halves BASE.kld --qwen35 BIN --model CACHE --base BF16_DIR --work DIR
      the same mean figures from `qwen35 eval --kld-base` alone: the full windows (--ctx n_ctx) less
      their first halves (--ctx n_ctx/2+1), since each position sees only its own window's prefix.
  peer_quality.py windows OUT.kld --qwen35 BIN --text FILE --tokenizer DIR [--n-ctx 512]
      the windows llama-perplexity cuts from the text (its first n_chunk*n_ctx tokens, n_chunk =
      tokens // n_ctx; `tokens` checks the two tokenizers agree), from qwen35's tokenizer, as a file
      of that format with the tokens only: measure and eval-halves then score a new cache policy on
      the scored positions of the table without llama.cpp.
"""
import argparse
import json
import math
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def read_kld(path, with_logprobs=True):
    with open(path, "rb") as f:
        if f.read(8) != b"_logits_":
            raise SystemExit(f"peer_quality: {path} is not a llama-perplexity --kl-divergence-base file")
        n_ctx, n_vocab, n_chunk = struct.unpack("<Iii", f.read(12))
        toks = np.frombuffer(f.read(4 * n_ctx * n_chunk), dtype=np.int32).reshape(n_chunk, n_ctx)
        first = n_ctx // 2
        n_rows = n_ctx - 1 - first
        nv = 2 * ((n_vocab + 1) // 2) + 4
        lp = None
        if with_logprobs:
            raw = np.fromfile(f, dtype=np.uint16, count=n_chunk * n_rows * nv)
            if raw.size != n_chunk * n_rows * nv:
                raise SystemExit(f"peer_quality: {path} is truncated")
            lp = raw.reshape(n_chunk, n_rows, nv)
    return {"n_ctx": n_ctx, "n_vocab": n_vocab, "n_chunk": n_chunk, "tokens": toks, "first": first,
            "n_rows": n_rows, "lp": lp}


def llama_logprobs(k, c):
    """the base log-probabilities of window c, as llama-perplexity dequantizes them: [n_rows, n_vocab]."""
    rows = k["lp"][c]
    sc = rows[:, 0:2].copy().view(np.float32)[:, 0]
    mn = rows[:, 2:4].copy().view(np.float32)[:, 0]
    q = rows[:, 4:4 + k["n_vocab"]].astype(np.float32)
    return sc[:, None] * q + mn[:, None]


def q35_logits(bin_, model, ids, threads):
    with tempfile.NamedTemporaryFile(suffix=".f32") as t:
        r = subprocess.run([bin_, "logits", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-o", t.name,
                            "-t", str(threads)], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"peer_quality: qwen35 logits -m {model} failed: {r.stderr.strip()[-400:]}")
        x = np.fromfile(t.name, dtype=np.float32)
    return x.reshape(len(ids), -1)


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


def scored(k, c, logits):
    """rows first..n_ctx-2 of a window's logits, and the tokens they predict."""
    f = k["first"]
    return logits[f:k["n_ctx"] - 1], k["tokens"][c, f + 1:k["n_ctx"]]


def cmd_tokens(a):
    k = read_kld(a.kld, with_logprobs=False)
    r = subprocess.run([a.qwen35, "tokenize", "-m", a.tokenizer, "--file", a.text, "--ids-only"],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"peer_quality: qwen35 tokenize failed: {r.stderr.strip()}")
    mine = np.array([int(x) for x in r.stdout.replace(",", " ").split()], dtype=np.int32)
    flat = k["tokens"].reshape(-1)
    n = flat.size
    if mine.size < n:
        raise SystemExit(f"peer_quality: token mismatch: llama.cpp evaluated {n} tokens, qwen35's tokenizer gives "
                         f"{mine.size} for the whole text")
    bad = np.nonzero(mine[:n] != flat)[0]
    if bad.size:
        i = int(bad[0])
        raise SystemExit(f"peer_quality: token mismatch: the two tokenizers first differ at token {i} "
                         f"(llama.cpp {flat[i]}, qwen35 {mine[i]}); {bad.size} of {n} differ")
    Path(a.ids_out).write_text(" ".join(map(str, flat.tolist())) + "\n")
    print(json.dumps({"n_ctx": k["n_ctx"], "n_chunk": k["n_chunk"], "tokens": int(n), "text_tokens": int(mine.size),
                      "scored_per_window": k["n_rows"], "first_scored": k["first"]}))


def cmd_windows(a):
    r = subprocess.run([a.qwen35, "tokenize", "-m", a.tokenizer, "--file", a.text, "--ids-only"],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"peer_quality: qwen35 tokenize failed: {r.stderr.strip()}")
    ids = np.array([int(x) for x in r.stdout.replace(",", " ").split()], dtype=np.int32)
    cfg = json.loads((Path(a.tokenizer) / "config.json").read_text())
    n_vocab = (cfg.get("text_config") or cfg)["vocab_size"]
    n_chunk = ids.size // a.n_ctx
    if n_chunk < 1:
        raise SystemExit(f"peer_quality: {a.text} has {ids.size} tokens, fewer than one window of {a.n_ctx}")
    with open(a.kld, "wb") as f:
        f.write(b"_logits_" + struct.pack("<Iii", a.n_ctx, n_vocab, n_chunk))
        f.write(ids[:n_chunk * a.n_ctx].tobytes())
    print(json.dumps({"n_ctx": a.n_ctx, "n_chunk": n_chunk, "tokens": n_chunk * a.n_ctx, "text_tokens": int(ids.size)}))


def cmd_check(a):
    k = read_kld(a.kld)
    nll_l = nll_q = 0.0
    n = 0
    worst = 0.0
    worst_pos = None
    for c in range(k["n_chunk"]):
        lq = log_softmax(q35_logits(a.qwen35, a.model, k["tokens"][c].tolist(), a.threads))
        rows, nxt = scored(k, c, lq)
        ll = llama_logprobs(k, c)
        idx = np.arange(len(nxt))
        nll_q -= rows[idx, nxt].sum()
        nll_l -= ll[idx, nxt].astype(np.float64).sum()
        n += len(nxt)
        if c == 0:
            mask = np.exp(rows) > 1e-3
            d = np.where(mask, np.abs(rows - ll), 0.0)
            worst = float(d.max())
            worst_pos = int(np.unravel_index(np.argmax(d), d.shape)[0]) + k["first"]
    ppl_l, ppl_q = math.exp(nll_l / n), math.exp(nll_q / n)
    rel = abs(ppl_l - ppl_q) / ppl_q
    out = {"scored": n, "llama_f16_ppl": ppl_l, "qwen35_bf16_ppl": ppl_q, "ppl_rel_diff": rel,
           "window0_max_abs_logprob_diff": worst, "window0_worst_position": worst_pos,
           "tol_ppl": a.tol_ppl, "tol_logprob": a.tol_lp}
    print(json.dumps(out))
    if rel > a.tol_ppl:
        sys.stderr.write(f"peer_quality: window mismatch: llama.cpp F16 perplexity {ppl_l:.4f} and qwen35 BF16 "
                         f"{ppl_q:.4f} on the same {n} positions differ by {100 * rel:.3f}% "
                         f"(tolerance {100 * a.tol_ppl:.2f}%)\n")
        return 1
    if worst > a.tol_lp:
        sys.stderr.write(f"peer_quality: logits mismatch: on the first window llama.cpp F16 and qwen35 BF16 log-probabilities "
                         f"differ by {worst:.4f} nats at position {worst_pos} (tolerance {a.tol_lp})\n")
        return 1
    return 0


def cmd_measure(a):
    """every --model against the base, the base's logits computed once per window; --out-dir DIR/q-NAME.json."""
    k = read_kld(a.kld, with_logprobs=False)
    acc = {m: {"nll": 0.0, "agree": 0, "kls": []} for m in a.model}
    nll_b = 0.0
    for c in range(k["n_chunk"]):
        ids = k["tokens"][c].tolist()
        lp, nxt = scored(k, c, log_softmax(q35_logits(a.qwen35, a.base, ids, a.threads)))
        idx = np.arange(len(nxt))
        nll_b -= lp[idx, nxt].sum()
        pb = np.exp(lp)
        top_b = lp.argmax(axis=1)
        for m in a.model:
            lq, _ = scored(k, c, log_softmax(q35_logits(a.qwen35, m, ids, a.threads)))
            acc[m]["nll"] -= lq[idx, nxt].sum()
            acc[m]["kls"].append((pb * (lp - lq)).sum(axis=1))
            acc[m]["agree"] += int((top_b == lq.argmax(axis=1)).sum())
    for m in a.model:
        kl = np.concatenate(acc[m]["kls"])
        n = kl.size
        out = {"model": m, "base": a.base, "scored": int(n), "perplexity": math.exp(acc[m]["nll"] / n),
               "base_perplexity": math.exp(nll_b / n), "kld_mean": float(kl.mean()),
               "kld_p99": float(np.percentile(kl, 99.0)), "kld_max": float(kl.max()),
               "top1_agreement": acc[m]["agree"] / n}
        print(json.dumps(out))


def q35_eval(a, ids, ctx):
    with tempfile.NamedTemporaryFile("w", suffix=".ids", dir=a.work, delete=False) as t:
        t.write(" ".join(map(str, ids)) + "\n")
    r = subprocess.run([a.qwen35, "eval", "-m", a.model, "--ids", t.name, "--ctx", str(ctx), "--kld-base", a.base,
                        "-t", str(a.threads), "--json"], capture_output=True, text=True)
    Path(t.name).unlink()
    if r.returncode:
        raise SystemExit(f"peer_quality: qwen35 eval failed: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout)


def cmd_eval_halves(a):
    k = read_kld(a.kld, with_logprobs=False)
    T = k["tokens"]
    h = k["first"] + 1
    A = q35_eval(a, T.reshape(-1).tolist(), k["n_ctx"])
    B = q35_eval(a, T[:, :h].reshape(-1).tolist(), h)
    na, nb = A["scored"], B["scored"]
    n = na - nb
    if na != k["n_chunk"] * (k["n_ctx"] - 1) or nb != k["n_chunk"] * (h - 1) or n != k["n_chunk"] * k["n_rows"]:
        raise SystemExit(f"peer_quality: window mismatch: qwen35 eval scored {na} and {nb} positions, "
                         f"expected {k['n_chunk'] * (k['n_ctx'] - 1)} and {k['n_chunk'] * (h - 1)}")
    out = {"model": a.model, "scored": n, "eval_full": A, "eval_first_halves": B,
           "perplexity": math.exp((na * math.log(A["perplexity"]) - nb * math.log(B["perplexity"])) / n),
           "base_perplexity": math.exp((na * math.log(A["base_perplexity"]) - nb * math.log(B["base_perplexity"])) / n),
           "kld_mean": (na * A["kld_mean"] - nb * B["kld_mean"]) / n,
           "top1_agreement": round(na * A["top1_agreement"] - nb * B["top1_agreement"]) / n}
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("tokens", "check", "measure", "eval-halves", "windows"):
        p = sub.add_parser(name)
        p.add_argument("kld")
        p.add_argument("--qwen35", required=True)
        p.add_argument("-t", "--threads", type=int, default=1)
        if name == "windows":
            p.add_argument("--text", required=True)
            p.add_argument("--tokenizer", required=True)
            p.add_argument("--n-ctx", type=int, default=512)
        elif name == "tokens":
            p.add_argument("--text", required=True)
            p.add_argument("--tokenizer", required=True)
            p.add_argument("--ids-out", required=True)
        elif name == "measure":
            p.add_argument("--model", required=True, action="append")
        else:
            p.add_argument("--model", required=True)
        if name in ("measure", "eval-halves"):
            p.add_argument("--base", required=True)
        if name == "eval-halves":
            p.add_argument("--work", required=True)
        if name == "check":
            p.add_argument("--tol-ppl", type=float, default=0.002)
            p.add_argument("--tol-lp", type=float, default=0.02)
    a = ap.parse_args()
    return {"tokens": cmd_tokens, "check": cmd_check, "measure": cmd_measure, "eval-halves": cmd_eval_halves,
            "windows": cmd_windows}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
