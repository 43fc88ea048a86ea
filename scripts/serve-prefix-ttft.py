#!/usr/bin/env python3
"""Time to first token of a growing multi-turn conversation against a
running `qwen35 serve`, with and without prefix reuse.

Each turn's prompt is the previous turn's prompt, its answer, and --new
fresh tokens (token ids, so any checkpoint works, tokenizer or not). Every
turn is sent twice, as a stream: once with the prefix cache
(cache_prompt: true, one cache_salt for the conversation) and once without
(cache_prompt: false). Prints one line per turn and, with --output, JSON.

    scripts/serve-prefix-ttft.py --url http://127.0.0.1:8000 --turns 8 --first 2000 --new 64
"""
import argparse
import json
import random
import time
import urllib.request


def stream(url, body, key):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **({"Authorization": "Bearer " + key} if key else {})})
    t0 = time.monotonic()
    ttft, ids, usage = None, [], None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices"):
                if ttft is None:
                    ttft = time.monotonic() - t0
                ids += ev["choices"][0].get("token_ids") or []
            if ev.get("usage"):
                usage = ev["usage"]
    return ttft, ids, usage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--first", type=int, default=2000, help="tokens of the first prompt")
    ap.add_argument("--new", type=int, default=64, help="fresh tokens per follow-up turn")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=320, help="draw prompt ids below this")
    ap.add_argument("--output", default=None)
    a = ap.parse_args()
    rng = random.Random(1)
    salt = "ttft-%d" % random.getrandbits(48)
    prompt = [rng.randrange(a.vocab) for _ in range(a.first)]
    rows = []
    print("turn  prompt  cached  ttft_cached_ms  ttft_cold_ms  same_output")
    for turn in range(a.turns):
        base = {"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}, "return_token_ids": True}
        hot, hot_ids, hot_usage = stream(a.url, {**base, "cache_salt": salt}, a.api_key)
        cold, cold_ids, _ = stream(a.url, {**base, "cache_prompt": False}, a.api_key)
        cached = (hot_usage or {}).get("prompt_tokens_details", {}).get("cached_tokens")
        rows.append({"turn": turn, "prompt_tokens": len(prompt), "cached_tokens": cached, "ttft_cached_ms": hot * 1e3,
                     "ttft_cold_ms": cold * 1e3, "same_output": hot_ids == cold_ids})
        print("%4d  %6d  %6s  %14.1f  %12.1f  %s" % (turn, len(prompt), cached, hot * 1e3, cold * 1e3, hot_ids == cold_ids))
        prompt = prompt + hot_ids + [rng.randrange(a.vocab) for _ in range(a.new)]
    if a.output:
        with open(a.output, "w") as f:
            json.dump({"url": a.url, "first": a.first, "new": a.new, "max_tokens": a.max_tokens, "turns": rows}, f, indent=1)


if __name__ == "__main__":
    main()
