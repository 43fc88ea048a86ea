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
#    (--mmap): bench-data/speed-mmap.json.
# 3. Runs the kernel and tokenizer micro-benchmarks where they are built, and
#    the json_schema token mask at the Qwen3.5 vocabulary (bench_schema: ms
#    per masked row, and its share of the decode step above).
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

make -s "$BUILD/bench_kernels" BUILD="$BUILD" && "$BUILD/bench_kernels" --quick --json bench-data/kernels.json
if [ -x scripts/bench-tokenizer.sh ]; then scripts/bench-tokenizer.sh "$BUILD"; fi
# grammar-constrained decoding: the json_schema mask of one row at the Qwen3.5
# vocabulary, and its share of the decode step bench.json measured
if [ -f tests/data/tokenizers-gen/qwen35/tokenizer.json ]; then
    STEP_MS=$(python3 -c 'import json; d = json.load(open("bench.json")); print(1000 / max(r["tok_s"] for r in d["decode"]))' 2>/dev/null || echo 0)
    make -s "$BUILD/bench_schema" BUILD="$BUILD" && "$BUILD/bench_schema" --decode-ms "$STEP_MS"
fi
