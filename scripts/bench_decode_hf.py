#!/usr/bin/env python3
"""transformers' Qwen3.5 language model with random weights at the shapes of a config.json, timed as
`qwen35 speed` times the engine: a prompt (time to first token) and greedy decode steps, one sequence.
The reference beside qwen35 on the same device (scripts/gpu-check.sh runs it on the H200 in bfloat16).

Usage (the reference stack of scripts/requirements-reference.txt, or the GPU machine's own):

    python3 scripts/bench_decode_hf.py --config DIR_OR_CONFIG_JSON [--device cuda|cpu]
        [--dtype bfloat16|float16|float32] [--prompt 254] [--decode 32] [--threads N] [--json FILE]

DIR_OR_CONFIG_JSON: a checkpoint or weight-cache directory holding config.json (the synthetic 9B cache's,
`qwen35 prepare --synthetic qwen3.5-9b`, has the exact 9B shapes), or the file itself. The model is
transformers' Qwen3_5ForCausalLM built from the config's text_config on the device, weights drawn by its
own initializer (no checkpoint is read), in --dtype; the vision tower and the MTP layer are not built
(transformers has no MTP head). Each measurement runs once as a warm-up first (allocations, kernel
choices), then: the prompt's forward with an empty cache and logits for its last position only (TTFT),
then --decode steps of one token each, the argmax of each step's logits fed back. Each step is timed on
its own, synchronised on the device (the argmax goes back to the host as in a serving loop);
decode_tok_s = 1 / the median step, decode_mean_tok_s = steps / their total time.
The Gated DeltaNet layers run on the flash-linear-attention kernels where that package imports and the
device is CUDA, else on transformers' torch fallback: the JSON says which ("gdn_path").
Exit status 2, with a line saying why, where torch or transformers is missing, transformers has no
Qwen3.5 model, or the device is absent.
"""

import argparse
import inspect
import json
import os
import statistics
import sys
import time


def fail(msg):
    print(f"bench_decode_hf: {msg}", file=sys.stderr)
    sys.exit(2)


def gdn_path(dev):
    """Which Gated DeltaNet transformers runs: its fla kernels need the package and a CUDA device."""
    if dev.type != "cuda":
        return "torch fallback"
    try:
        import fla  # noqa: F401
    except Exception:  # an installed fla that fails to import (e.g. no triton) is not used either
        return "torch fallback"
    return "fla"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="directory with config.json, or the file")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--prompt", type=int, default=254)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--json", help="write the result here too")
    a = ap.parse_args()
    if a.prompt < 1 or a.decode < 1:
        fail("--prompt and --decode must be at least 1")
    path = os.path.join(a.config, "config.json") if os.path.isdir(a.config) else a.config
    try:
        with open(path) as f:
            full = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"cannot read a config from {path}: {e}")

    try:
        import torch
        import transformers
    except ImportError as e:
        fail(f"needs torch and transformers: {e}")
    try:
        from transformers import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM
    except ImportError:
        fail(f"transformers {transformers.__version__} has no Qwen3.5 model (Qwen3_5ForCausalLM): it needs 5.0 or newer")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        fail("--device cuda but torch sees no CUDA device")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    text = dict(full.get("text_config", full))
    text.pop("model_type", None)
    cfg = Qwen3_5TextConfig(**text)
    dev, dt = torch.device(a.device), getattr(torch, a.dtype)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(dev):
        model = Qwen3_5ForCausalLM._from_config(cfg, dtype=dt).eval()
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    sync()
    build_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator(device="cpu").manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (1, a.prompt), generator=gen).to(dev)

    # the cache's argument and output field: past_key_values, renamed cache in later 5.x releases
    cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def run(n_decode):
        """TTFT of the prompt and the time of each of n_decode single-token steps after it."""
        with torch.no_grad():
            sync()
            t = time.perf_counter()
            out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
            tok = out.logits[:, -1:].argmax(-1)
            tok.cpu()
            ttft = time.perf_counter() - t
            cache = getattr(out, cache_name)
            steps = []
            for _ in range(n_decode):
                t = time.perf_counter()
                out = model(input_ids=tok, use_cache=True, **{cache_name: cache})
                cache = getattr(out, cache_name)
                tok = out.logits[:, -1:].argmax(-1)
                tok.cpu()
                steps.append(time.perf_counter() - t)
            # positions the cache holds: prompt + steps when every step read and extended it
            held = int(cache.get_seq_length()) if hasattr(cache, "get_seq_length") else None
            return ttft, steps, held

    run(min(a.decode, 4))  # warm-up
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    ttft, steps, held = run(a.decode)
    if held is not None and held != a.prompt + a.decode:
        sys.exit(f"bench_decode_hf: the cache holds {held} positions after the run, not {a.prompt + a.decode}")
    median = statistics.median(steps)
    peak = torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else None
    res = dict(
        what="transformers decode", device=str(dev),
        device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        dtype=a.dtype, params=n_params, layers=cfg.num_hidden_layers, hidden=cfg.hidden_size,
        vocab=cfg.vocab_size, prompt_tokens=a.prompt, decode_steps=a.decode, ttft_s=ttft,
        prompt_tok_s=a.prompt / ttft, decode_tok_s=1.0 / median, decode_mean_tok_s=a.decode / sum(steps),
        cache_positions=held, build_s=build_s, peak_mib=peak, gdn_path=gdn_path(dev),
        attn=model.config._attn_implementation, torch=torch.__version__,
        transformers=transformers.__version__)
    print(f"transformers {a.dtype} on {res['device_name']}: {n_params / 1e9:.2f} G parameters, "
          f"prompt {a.prompt} TTFT {ttft * 1e3:.1f} ms ({res['prompt_tok_s']:.1f} tok/s), "
          f"decode {res['decode_tok_s']:.2f} tok/s, GDN {res['gdn_path']}"
          + (f", peak {peak:.0f} MiB" if peak is not None else ""))
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
