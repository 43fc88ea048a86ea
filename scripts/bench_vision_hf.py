#!/usr/bin/env python3
"""transformers' Qwen3_5VisionModel at Qwen3.5-9B's tower shapes (random weights) on one square image, timed on
1 and 2 threads: the reference beside `qwen35 speed --vision` on the same machine.

Usage (the reference stack of scripts/requirements-reference.txt):

    python3 scripts/bench_vision_hf.py [--side 448] [--threads 1,2] [--dtype float32|bfloat16]
"""

import argparse
import json
import time

import torch
from transformers import Qwen3_5Config
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", type=int, default=448)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args()
    vcfg = Qwen3_5Config().vision_config  # transformers' defaults are the 9B tower: depth 27, width 1152, ...
    vcfg.out_hidden_size = 4096
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
            for _ in range(2):
                t0 = time.perf_counter()
                model(pixels, grid_thw=grid)
                times.append(time.perf_counter() - t0)
        runs.append(dict(threads=t, encode_s=min(times), mean_s=sum(times) / len(times)))
        print(f"transformers {a.dtype}, {a.side}x{a.side}, {t} thread(s): {min(times):.2f} s (best of 2)")
    print(json.dumps(dict(side=a.side, dtype=a.dtype, depth=vcfg.depth, hidden=vcfg.hidden_size, runs=runs)))


if __name__ == "__main__":
    main()
