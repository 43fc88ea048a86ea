#!/usr/bin/env bash
# make bench: the engine's speed at the exact Qwen3.5-9B shapes.
#
# 1. Builds, once, a synthetic weight cache with the 9B shapes and random
#    weights (bench-data/, ignored by git; about 5 GB with the default policy).
# 2. Runs `qwen35 speed` on it: decode tok/s at 1 and 2 threads with GB/s and
#    the share of the read bandwidth it measures itself, prompt tok/s at 254,
#    512 and 2048 tokens, time to first token at 254, batched and speculative
#    step costs (also with reduced-vocabulary draft heads of 16k, 32k and 64k
#    rows), peak RSS, and at the largest thread count decode and a 512-token
#    prompt after 8k and 32k positions of context against none, with the
#    memory per 1k positions. Writes bench.json. Then decode once more with the
#    weights served from the mapped file instead of huge-page memory
#    (--mmap): bench-data/speed-mmap.json; and the context depths again with
#    the 8-bit KV cache (--kv-cache q8): bench-data/speed-kv-q8.json.
# 3. The vision tower at the 9B tower's shapes (synthetic BF16 weights): one
#    448x448 image's encode time and the time to first token it adds to a
#    short text prompt on the cache above, at each thread count
#    (`qwen35 speed --vision`): bench-data/vision.json, also bench.json's
#    "vision".
# 4. Runs the kernel and tokenizer micro-benchmarks where they are built, the
#    json_schema token mask at the Qwen3.5 vocabulary (bench_schema: ms per
#    masked row, and its share of the decode step above), and the sampler at
#    that vocabulary (bench_sampler: ms per token for greedy, temperature,
#    top-p, min-p, top-k, speculation's distribution and logprobs, and its
#    share of the decode step): bench-data/sampler.json.
# Environment: Q35_BENCH_THREADS (default "1,2"), Q35_BENCH_PROMPTS
# (default "254,512,2048"), Q35_BENCH_POLICY (default "default"),
# Q35_BENCH_DRAFT_ROWS (default "16384,32768,65536"; 0: none),
# Q35_BENCH_DEPTHS (default "8192,32768").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN="$BUILD/qwen35"
POLICY=${Q35_BENCH_POLICY:-default}
CACHE=bench-data/qwen3.5-9b-synthetic-$POLICY

if [ -f "$CACHE/manifest.json" ] && ! "$BIN" info "$CACHE" >/dev/null 2>&1; then
    echo "bench: $CACHE is not a cache this qwen35 reads (an older format): building it again"
    rm -rf "$CACHE"
fi
if [ ! -f "$CACHE/manifest.json" ]; then
    echo "bench: building the synthetic Qwen3.5-9B cache in $CACHE (once)"
    mkdir -p bench-data
    "$BIN" prepare --synthetic qwen3.5-9b --policy "$POLICY" --out "$CACHE"
fi
"$BIN" speed -m "$CACHE" -t "${Q35_BENCH_THREADS:-1,2}" --prompt "${Q35_BENCH_PROMPTS:-254,512,2048}" \
    --draft-rows "${Q35_BENCH_DRAFT_ROWS:-16384,32768,65536}" --depth "${Q35_BENCH_DEPTHS:-8192,32768}" --json bench.json
# decode again with the weights served from the mapped file (4 KiB pages)
echo
echo "bench: decode with --mmap (weights served from the page cache)"
"$BIN" speed -m "$CACHE" -t "${Q35_BENCH_THREADS:-1,2}" --prompt 16 --spec-k 0 --draft-rows 0 --mmap \
    --json bench-data/speed-mmap.json

# long contexts with the 8-bit KV cache, at the largest thread count
echo
echo "bench: context depths with --kv-cache q8"
MAXT=$(echo "${Q35_BENCH_THREADS:-1,2}" | tr ',' '\n' | sort -n | tail -1)
"$BIN" speed -m "$CACHE" -t "$MAXT" --prompt 16 --spec-k 0 --draft-rows 0 --depth "${Q35_BENCH_DEPTHS:-8192,32768}" \
    --kv-cache q8 --json bench-data/speed-kv-q8.json

# the vision tower: one 448x448 image per thread count, and the prompt time it adds
echo
"$BIN" speed --vision -m "$CACHE" -t "${Q35_BENCH_THREADS:-1,2}" --json bench-data/vision.json
python3 - <<'PY'
import json
b, v = json.load(open("bench.json")), json.load(open("bench-data/vision.json"))
b["vision"] = v
json.dump(b, open("bench.json", "w"), indent=2)
print(f"\nvision tower, 9B shapes, {v['image'][0]}x{v['image'][1]} image ({v['tokens']} image tokens), {v['tower_dtype']} weights")
print(f"{'threads':>7} {'encode s':>9} {'ttft text s':>12} {'ttft image s':>13} {'added s':>8}")
for r in v["runs"]:
    print(f"{r['threads']:>7} {r['encode_s']:>9.2f} {r['ttft_text_s']:>12.2f} {r['ttft_image_s']:>13.2f} {r['added_ttft_s']:>8.2f}")
PY

make -s "$BUILD/bench_kernels" BUILD="$BUILD" && "$BUILD/bench_kernels" --quick --json bench-data/kernels.json
if [ -x scripts/bench-tokenizer.sh ]; then scripts/bench-tokenizer.sh "$BUILD"; fi
# grammar-constrained decoding: the json_schema mask of one row at the Qwen3.5
# vocabulary, and its share of the decode step bench.json measured
STEP_MS=$(python3 -c 'import json; d = json.load(open("bench.json")); print(1000 / max(r["tok_s"] for r in d["decode"]))' 2>/dev/null || echo 0)
if [ -f tests/data/tokenizers-gen/qwen35/tokenizer.json ]; then
    make -s "$BUILD/bench_schema" BUILD="$BUILD" && "$BUILD/bench_schema" --decode-ms "$STEP_MS"
fi
# choosing the token: the sampler at the Qwen3.5 vocabulary
make -s "$BUILD/bench_sampler" BUILD="$BUILD" && "$BUILD/bench_sampler" --decode-ms "$STEP_MS" --json bench-data/sampler.json
