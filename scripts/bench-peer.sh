#!/usr/bin/env bash
# make bench-peer: qwen35 against llama.cpp on this machine, at the exact Qwen3.5-9B shapes.
#
# 1. llama.cpp from the pinned llama-cpp-python source distribution (scripts/peer-llama.sh: download,
#    sha256, CPU build under bench-data/peer/, once).
# 2. Random-weight GGUF files of architecture qwen35 at the 9B shapes, from the config.json that
#    `qwen35 prepare --synthetic qwen3.5-9b` writes (scripts/peer_gguf.py): Q4_0 with random nibbles
#    and block scales, then llama-quantize --allow-requantize into the two usual mixes, Q4_0 and
#    Q4_K_M (bench-data/peer/gguf/, once); the qwen35 synthetic cache as make bench makes it.
# 3. ROUNDS rounds, each running, for each thread count, llama-bench on both files (prompt PROMPT,
#    decode DECODE tokens) and qwen35 speed (same prompt and decode lengths, plain decoding), in an
#    order that alternates between rounds. Writes bench-data/peer.json (every figure, the ranges and
#    the ratios qwen35 / llama.cpp) and prints a table.
# Usage: scripts/bench-peer.sh [BUILD_DIR] [--dry-run]
#   --dry-run: check the arguments and the environment, print the plan; download, build, run nothing.
# Environment: Q35_PEER_THREADS (default "1,2"), Q35_PEER_ROUNDS (2), Q35_PEER_PROMPT (512),
#   Q35_PEER_DECODE (32), Q35_PEER_FORMATS ("Q4_0,Q4_K_M"), Q35_PEER_OUT (bench-data/peer.json),
#   Q35_PEER_ISA (native: each engine's best for this CPU; avx2: llama.cpp built for AVX2 + FMA + F16C only
#   and qwen35's avx2 kernels, as on a CPU without AVX-512; default output bench-data/peer-avx2.json).
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=bench-peer; HELP_LINES=2,21p
# shellcheck source=peer-args.sh
. scripts/peer-args.sh
THREADS=${Q35_PEER_THREADS:-1,2}
ROUNDS=${Q35_PEER_ROUNDS:-2}
PROMPT=${Q35_PEER_PROMPT:-512}
DECODE=${Q35_PEER_DECODE:-32}
FORMATS=${Q35_PEER_FORMATS:-Q4_0,Q4_K_M}
ISA=${Q35_PEER_ISA:-native}
case "$ISA" in
    native) OUTJ=${Q35_PEER_OUT:-bench-data/peer.json}; Q35_ISA_ENV=() ;;
    avx2) OUTJ=${Q35_PEER_OUT:-bench-data/peer-avx2.json}; Q35_ISA_ENV=(Q35_KERNELS=avx2)
          grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo || die "Q35_PEER_ISA=avx2: this CPU has no AVX2 + FMA" ;;
    *) die "Q35_PEER_ISA='$ISA': native or avx2" ;;
esac
export PEER_ISA=$ISA
[[ "$THREADS" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "Q35_PEER_THREADS='$THREADS': a list like 1,2"
[[ "$ROUNDS" =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 2 ] || die "Q35_PEER_ROUNDS='$ROUNDS': at least 2"
[[ "$PROMPT" =~ ^[0-9]+$ ]] && [ "$PROMPT" -ge 1 ] || die "Q35_PEER_PROMPT='$PROMPT': a positive integer"
[[ "$DECODE" =~ ^[0-9]+$ ]] && [ "$DECODE" -ge 1 ] || die "Q35_PEER_DECODE='$DECODE': a positive integer"
IFS=, read -r -a FMTS <<<"$FORMATS"
for f in "${FMTS[@]}"; do
    case "$f" in Q4_0|Q4_K_M|Q4_K_S|Q5_K_M|Q8_0|IQ4_NL) ;; *) die "format '$f' not handled (Q4_0, Q4_K_M, Q4_K_S, Q5_K_M, Q8_0, IQ4_NL)";; esac
done
IFS=, read -r -a TLIST <<<"$THREADS"
BIN="$BUILD/qwen35"
CACHE=bench-data/qwen3.5-9b-synthetic-default
GG=bench-data/peer/gguf
RAW=$GG/qwen35-9b-random-q4_0-raw.gguf

if [ "$DRY" = 1 ]; then
    echo "bench-peer (dry run): threads ${TLIST[*]}, $ROUNDS rounds, prompt $PROMPT, decode $DECODE, formats ${FMTS[*]}, instruction sets $ISA"
    [ -x "$BIN" ] && echo "qwen35: $BIN" || echo "qwen35: $BIN missing (make builds it)"
    [ -f "$CACHE/manifest.json" ] && echo "cache: $CACHE (present)" || echo "cache: $CACHE (would be built, ~5 GB)"
    scripts/peer-llama.sh --check
    for f in "${FMTS[@]}"; do
        g=$GG/qwen35-9b-random-$f.gguf
        [ -f "$g" ] && echo "gguf: $g (present)" || echo "gguf: $g (would be written)"
    done
    echo "output: $OUTJ"
    exit 0
fi

[ -x "$BIN" ] || die "$BIN not found: run make first"
eval "$(scripts/peer-llama.sh)" || die "setting up llama.cpp failed"
if [ -f "$CACHE/manifest.json" ] && ! "$BIN" info "$CACHE" >/dev/null 2>&1; then
    echo "bench-peer: $CACHE is not a cache this qwen35 reads (an older format): building it again"
    rm -rf "$CACHE"
fi
if [ ! -f "$CACHE/manifest.json" ]; then
    echo "bench-peer: building the synthetic Qwen3.5-9B cache in $CACHE (once)"
    mkdir -p bench-data
    "$BIN" prepare --synthetic qwen3.5-9b --policy default --out "$CACHE" || die "qwen35 prepare --synthetic failed"
fi
mkdir -p "$GG"

# llama.cpp's files, once; each is checked by loading it in llama-bench (one decoded token)
probe() {
    local g=$1 log=$GG/probe.log
    if ! "$PEER_BIN/llama-bench" -m "$g" -t 1 -p 0 -n 1 -r 1 --no-warmup > "$log" 2>&1; then
        tail -15 "$log" >&2
        die "llama.cpp refused $g (log: $log)"
    fi
}
need_raw=0
for f in "${FMTS[@]}"; do [ -f "$GG/qwen35-9b-random-$f.gguf" ] || need_raw=1; done
if [ "$need_raw" = 1 ] && [ ! -f "$RAW" ]; then
    echo "bench-peer: writing the random-weight 9B GGUF (Q4_0, ~5 GB) from $CACHE/config.json"
    "$PEER_PY" scripts/peer_gguf.py synthetic "$CACHE/config.json" "$RAW.part" \
        || { rm -f "$RAW.part"; die "writing the GGUF failed"; }
    mv "$RAW.part" "$RAW"
fi
for f in "${FMTS[@]}"; do
    g=$GG/qwen35-9b-random-$f.gguf
    [ -f "$g" ] && continue
    echo "bench-peer: llama-quantize --allow-requantize -> $f"
    "$PEER_BIN/llama-quantize" --allow-requantize "$RAW" "$g.part" "$f" > "$GG/quantize-$f.log" 2>&1 \
        || { rm -f "$g.part"; tail -15 "$GG/quantize-$f.log" >&2; die "llama-quantize to $f failed (log: $GG/quantize-$f.log)"; }
    mv "$g.part" "$g"
    probe "$g"
done
rm -f "$RAW"   # only the mixes are measured

RUNS=bench-data/peer/runs/$(date -u +%Y%m%dT%H%M%SZ)$([ "$ISA" = native ] || echo "-$ISA")
mkdir -p "$RUNS"
echo "bench-peer: $ROUNDS rounds, threads ${TLIST[*]}, prompt $PROMPT, decode $DECODE, instruction sets $ISA; runs in $RUNS"
run_llama() {   # format threads round
    local g=$GG/qwen35-9b-random-$1.gguf out=$RUNS/llama-$1-t$2-r$3.json
    echo "  round $3, $2 thread(s): llama.cpp $1"
    cut -d' ' -f1 /proc/loadavg > "$out.load"
    "$PEER_BIN/llama-bench" -m "$g" -t "$2" -p "$PROMPT" -n "$DECODE" -r 1 --no-warmup -o json \
        > "$out" 2> "$out.log" || { tail -15 "$out.log" >&2; die "llama-bench failed on $g (log: $out.log)"; }
}
run_q35() {     # threads round
    local out=$RUNS/qwen35-t$1-r$2.json
    echo "  round $2, $1 thread(s): qwen35"
    cut -d' ' -f1 /proc/loadavg > "$out.load"
    env "${Q35_ISA_ENV[@]}" "$BIN" speed -m "$CACHE" -t "$1" --prompt "$PROMPT" --decode "$DECODE" --spec-k 0 --draft-rows 0 \
        --json "$out" > "$out.log" 2>&1 || { tail -15 "$out.log" >&2; die "qwen35 speed failed (log: $out.log)"; }
}
t_start=$(date +%s)
for ((r = 1; r <= ROUNDS; r++)); do
    for t in "${TLIST[@]}"; do
        if (( r % 2 )); then
            for f in "${FMTS[@]}"; do run_llama "$f" "$t" "$r"; done
            run_q35 "$t" "$r"
        else
            run_q35 "$t" "$r"
            for ((i = ${#FMTS[@]} - 1; i >= 0; i--)); do run_llama "${FMTS[$i]}" "$t" "$r"; done
        fi
    done
done
secs=$(( $(date +%s) - t_start ))
"$PEER_PY" scripts/peer_report.py bench --runs "$RUNS" --gguf-dir "$GG" --formats "$FORMATS" --threads "$THREADS" \
    --rounds "$ROUNDS" --prompt "$PROMPT" --decode "$DECODE" --seconds "$secs" --version "$PEER_VERSION" \
    --sha256 "$PEER_SHA256" --isa "$ISA" --llama-flags="$PEER_CMAKE_FLAGS" --out "$OUTJ" || die "writing $OUTJ failed"
