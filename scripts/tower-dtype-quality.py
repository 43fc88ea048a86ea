#!/usr/bin/env python3
"""What storing the vision tower's matrices in a block dtype costs: image-prompt logits of the vision test
models (tests/data/models/vl-a, vl-b) against transformers' fp32 goldens (tests/data/golden-vl), with the
tower as stored and with its matrices as BFP8 or BFP4 (`prepare --set`), under the bf16 and default
policies. Prints, per model, request and cache, the worst relative difference over positions (max |ours -
HF| / max |HF| at a position, the measure tests/test_mm.c holds to 1e-4) and the positions whose argmax
differs from transformers'. docs/weight-cache.md quotes the output.

Usage: scripts/tower-dtype-quality.py [BUILD]   (needs BUILD/qwen35; writes under bench-data/tower-dtype/)
"""

import array
import json
import os
import shutil
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLD = os.path.join(ROOT, "tests", "data", "golden-vl")


def tower_matrices(model_dir):
    """The tower's 2-D tensors that a block dtype can hold (inputs a multiple of 16), bar the position table."""
    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return sorted(k for k, v in header.items() if k.startswith("model.visual.") and len(v.get("shape", [])) == 2
                  and v["shape"][1] % 16 == 0 and "pos_embed" not in k)


def run(*args, cwd=None):
    p = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"tower-dtype-quality: {' '.join(map(str, args))}: {p.stderr.strip()}")
    return p.stdout


def compare(path, gold_path, vocab):
    a, b = array.array("f"), array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    with open(gold_path, "rb") as f:
        b.frombytes(f.read())
    if len(a) != len(b):
        sys.exit(f"tower-dtype-quality: {path}: {len(a)} floats, golden {len(b)}")
    worst, flips = 0.0, 0
    for p in range(len(a) // vocab):
        x, y = a[p * vocab:(p + 1) * vocab], b[p * vocab:(p + 1) * vocab]
        d = max(abs(u - v) for u, v in zip(x, y)) / max(abs(v) for v in y)
        worst = max(worst, d)
        flips += max(range(vocab), key=x.__getitem__) != max(range(vocab), key=y.__getitem__)
    return worst, flips, len(a) // vocab


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    q35 = os.path.join(ROOT, build, "qwen35")
    out = os.path.join(ROOT, "bench-data", "tower-dtype")
    os.makedirs(out, exist_ok=True)
    rows = []
    for model in ("vl-a", "vl-b"):
        src = os.path.join(ROOT, "tests", "data", "models", model)
        mats = tower_matrices(src)
        variants = [("checkpoint", None, None)]
        for policy in ("bf16", "default"):
            variants += [(f"{policy}, tower as stored", policy, None), (f"{policy}, tower BFP8", policy, "bfp8"),
                         (f"{policy}, tower BFP4", policy, "bfp4")]
        for label, policy, tower in variants:
            model_path = src
            if policy:
                model_path = os.path.join(out, f"{model}-{policy}-{tower or 'stored'}")
                shutil.rmtree(model_path, ignore_errors=True)
                sets = [a for m in (mats if tower else []) for a in ("--set", f"{m}={tower}")]
                run(q35, "prepare", "--checkpoint", src, "--out", model_path, "--policy", policy, *sets)
            for req in ("one", "two"):
                name = f"{model}.{req}"
                gold = json.load(open(os.path.join(GOLD, f"{name}.golden.json")))
                lg = os.path.join(out, f"{name}.logits.f32")
                run(q35, "logits", "-m", model_path, "--chat", f"{name}.json", "-o", lg, cwd=GOLD)
                worst, flips, n = compare(lg, os.path.join(GOLD, f"{name}.prompt.f32"), gold["vocab_size"])
                rows.append(dict(model=model, request=req, cache=label, tower_matrices=len(mats) if tower else 0,
                                 worst_rel_diff=worst, argmax_differs=flips, positions=n))
    print(f"{'request':10} {'cache':28} {'tower mats':>10} {'worst rel diff':>15} {'argmax != HF':>13}")
    for r in rows:
        print(f"{r['model'] + '.' + r['request']:10} {r['cache']:28} {r['tower_matrices']:>10} "
              f"{r['worst_rel_diff']:>15.3g} {r['argmax_differs']:>6} of {r['positions']}")
    with open(os.path.join(out, "quality.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
