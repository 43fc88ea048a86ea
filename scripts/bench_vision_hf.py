#!/usr/bin/env python3
"""transformers' Qwen3_5VisionModel at Qwen3.5-9B's tower shapes (random weights) on one square image, timed on
1 and 2 threads: the reference beside `qwen35 speed --vision` on the same machine.

Usage (the reference stack of scripts/requirements-reference.txt):

    python3 scripts/bench_vision_hf.py [--side 448] [--threads 1,2] [--dtype float32|bfloat16] [--attn sdpa|eager]
                                       [--json FILE]

It times the forward of the tower alone (no processor, no language model), as `qwen35 speed --vision` does,
under torch.no_grad(): the best and the mean of --reps runs after one warm-up run per thread count.
"""

import argparse
import json
import time

import torch
import transformers
from transformers import Qwen3_5Config
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", type=int, default=448)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--attn", default="sdpa", help="attention implementation (transformers' attn_implementation)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json", help="write the result here too")
    a = ap.parse_args()
    vcfg = Qwen3_5Config().vision_config  # transformers' defaults are the 9B tower: depth 27, width 1152, ...
    vcfg.out_hidden_size = 4096
    vcfg._attn_implementation = a.attn
    model = Qwen3_5VisionModel(vcfg).eval().to(getattr(torch, a.dtype))
    g = a.side // vcfg.patch_size
    dim = vcfg.in_channels * vcfg.temporal_patch_size * vcfg.patch_size ** 2
    pixels = torch.randn(g * g, dim).to(getattr(torch, a.dtype))
    grid = torch.tensor([[1, g, g]])
    runs = []
    for t in [int(x) for x in a.threads.split(",")]:
        torch.set_num_threads(t)
        times = []
        with torch.no_grad():
            model(pixels, grid_thw=grid)  # warm-up: first-call allocations and kernel choices
            for _ in range(a.reps):
                t0 = time.perf_counter()
                model(pixels, grid_thw=grid)
                times.append(time.perf_counter() - t0)
        runs.append(dict(threads=t, encode_s=min(times), mean_s=sum(times) / len(times)))
        print(f"transformers {a.dtype} {model.config._attn_implementation}, {a.side}x{a.side}, {t} thread(s): "
              f"{min(times):.2f} s (best of {a.reps})")
    res = dict(side=a.side, dtype=a.dtype, attn=model.config._attn_implementation, depth=vcfg.depth,
               hidden=vcfg.hidden_size, torch=torch.__version__, transformers=transformers.__version__, runs=runs)
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
