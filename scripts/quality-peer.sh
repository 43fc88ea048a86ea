#!/usr/bin/env bash
# make quality-peer: llama.cpp's formats and qwen35's cache policies on the demo model, on the same
# token windows, each against its own 16-bit base.
#
# 1. llama.cpp from the pinned llama-cpp-python source (scripts/peer-llama.sh, shared with bench-peer).
# 2. models/qwen35-demo as an F16 GGUF (scripts/peer_gguf.py checkpoint: the tensors and the BPE
#    tokenizer written with llama.cpp's gguf package and the tensor transforms of its converter;
#    convert_hf_to_gguf.py itself needs torch, which PyPI serves only with the CUDA stack).
# 3. llama-perplexity --kl-divergence-base on the evaluation text (windows of CTX tokens, the second
#    half of each scored). Its file holds the windows' tokens: qwen35's tokenizer must give the same
#    ids, and qwen35's BF16 perplexity on those positions must equal llama.cpp's F16 one (relative
#    0.1%; log-probabilities of the first window within 0.02 nats), or the script stops, table-less.
# 4. llama-quantize to Q8_0, Q4_K_M, Q4_0, IQ4_NL; llama-perplexity --kl-divergence against F16.
# 5. qwen35 prepare --policy P of the demo model (P+gptq: with --calibrate on a calibration text from the
#    model's training corpus, scripts/calib-text.py, which needs the python3.11-doc package and installs
#    it when missing; P+mix: with the --set lines of models/qwen35-demo-mix.txt, 22 matrices at BFP8);
#    its figures on the same positions from `qwen35 logits`
#    (scripts/peer_quality.py measure: PPL, mean / 99th-percentile KL, top-1) and, as a cross-check,
#    from `qwen35 eval --kld-base` (full windows less first halves).
# 6. bench-data/quality.json and a markdown table (with decode speed at the 9B shapes from
#    bench-data/peer.json and bench.json where they exist).
# Usage: scripts/quality-peer.sh [BUILD_DIR] [--dry-run]
# Environment: Q35_QUALITY_TEXT (default models/qwen35-demo-eval.txt), Q35_QUALITY_CTX (512),
#   Q35_QUALITY_POLICIES ("bf16,default,bfp8,bfp4-all,tuned,default+gptq,bfp4-all+gptq,default+gptq+mix"),
#   Q35_QUALITY_OUT (bench-data/quality.json), Q35_QUALITY_THREADS (2; the figures do not depend on it),
#   Q35_QUALITY_CALIB (the calibration text; default: written by scripts/calib-text.py --stride 32).
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=quality-peer; HELP_LINES=2,29p
# shellcheck source=peer-args.sh
. scripts/peer-args.sh
MODEL=models/qwen35-demo
TEXT=${Q35_QUALITY_TEXT:-models/qwen35-demo-eval.txt}
CTX=${Q35_QUALITY_CTX:-512}
POLICIES=${Q35_QUALITY_POLICIES:-bf16,default,bfp8,bfp4-all,tuned,default+gptq,bfp4-all+gptq,default+gptq+mix}
CALIB=${Q35_QUALITY_CALIB:-}
MIX=models/qwen35-demo-mix.txt
OUTJ=${Q35_QUALITY_OUT:-bench-data/quality.json}
QT=${Q35_QUALITY_THREADS:-2}
FORMATS=(Q8_0 Q4_K_M Q4_0 IQ4_NL)
[[ "$QT" =~ ^[0-9]+$ ]] && [ "$QT" -ge 1 ] || die "Q35_QUALITY_THREADS='$QT': a positive integer"
[[ "$CTX" =~ ^[0-9]+$ ]] && [ "$CTX" -ge 8 ] && [ $((CTX % 2)) = 0 ] || die "Q35_QUALITY_CTX='$CTX': an even number >= 8"
[ -f "$TEXT" ] || die "no text $TEXT"
[ -f "$MODEL/config.json" ] || die "no model $MODEL"
IFS=, read -r -a PLIST <<<"$POLICIES"
for p in "${PLIST[@]}"; do
    [[ "$p" =~ ^(bf16|default|bfp8|bfp4-all|tuned)(\+gptq)?(\+mix)?$ ]] \
        || die "policy '$p' not known (bf16, default, bfp8, bfp4-all, tuned; +gptq, +mix after one)"
done
[ -z "$CALIB" ] || [ -f "$CALIB" ] || die "no calibration text $CALIB"
BIN="$BUILD/qwen35"
W=bench-data/peer/quality

if [ "$DRY" = 1 ]; then
    echo "quality-peer (dry run): $MODEL on $TEXT, windows of $CTX; llama.cpp F16, ${FORMATS[*]}; qwen35 ${PLIST[*]}"
    [ -x "$BIN" ] && echo "qwen35: $BIN" || echo "qwen35: $BIN missing (make builds it)"
    scripts/peer-llama.sh --check
    echo "work: $W; output: $OUTJ"
    exit 0
fi
[ -x "$BIN" ] || die "$BIN not found: run make first"
eval "$(scripts/peer-llama.sh)" || die "setting up llama.cpp failed"
mkdir -p "$W"
rm -f "$W"/*.json
t_start=$(date +%s)

F16=$W/demo-F16.gguf
if [ ! -f "$F16" ]; then
    echo "quality-peer: writing $F16"
    "$PEER_PY" scripts/peer_gguf.py checkpoint "$MODEL" "$F16.part" || { rm -f "$F16.part"; die "writing the GGUF failed"; }
    mv "$F16.part" "$F16"
fi

# llama-perplexity's results go to stdout (.log), its progress to stderr (.err): kept apart, as the
# two streams into one file lose lines
ppl() {   # log file -> perplexity (llama-perplexity's "Final estimate" or "Mean PPL(Q)")
    sed -n -e 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' -e 's/^Mean PPL(Q) *: *\([0-9.]*\).*/\1/p' "$1" "${1%.log}.err" | tail -1
}
echo "quality-peer: llama.cpp F16 base over $TEXT (windows of $CTX)"
for try in 1 2 3 4 5; do
    "$PEER_BIN/llama-perplexity" -m "$F16" -f "$TEXT" -c "$CTX" -b "$CTX" -t "$QT" --kl-divergence-base "$W/base.kld" \
        > "$W/F16.log" 2> "$W/F16.err" || { tail -15 "$W/F16.err" >&2; die "llama.cpp could not load or evaluate $F16 (log: $W/F16.err)"; }
    [ -n "$(ppl "$W/F16.log")" ] && break
done
[ -n "$(ppl "$W/F16.log")" ] || { tail -15 "$W/F16.err" >&2; die "llama-perplexity printed no perplexity for $F16"; }
"$PEER_PY" scripts/peer_quality.py tokens "$W/base.kld" --qwen35 "$BIN" --text "$TEXT" --tokenizer "$MODEL" \
    --ids-out "$W/ids.txt" > "$W/windows.json" || die "the two engines' token windows differ (see above); no table"
echo "quality-peer: $(cat "$W/windows.json")"
"$PEER_PY" scripts/peer_quality.py check "$W/base.kld" --qwen35 "$BIN" --model "$MODEL" -t "$QT" --tol-ppl 0.001 \
    > "$W/check.json" || die "llama.cpp F16 and qwen35 BF16 disagree on the same windows (see above); no table"
echo "quality-peer: F16 against BF16: $(cat "$W/check.json")"

for f in "${FORMATS[@]}"; do
    g=$W/demo-$f.gguf
    if [ ! -f "$g" ]; then
        "$PEER_BIN/llama-quantize" "$F16" "$g.part" "$f" > "$W/quantize-$f.log" 2>&1 \
            || { rm -f "$g.part"; tail -15 "$W/quantize-$f.log" >&2; die "llama-quantize to $f failed"; }
        mv "$g.part" "$g"
    fi
    echo "quality-peer: llama.cpp $f"
    # llama-perplexity's logger may lose its last lines at exit (common/log.cpp leaves it unflushed):
    # run again until the summary is complete
    for try in 1 2 3 4 5; do
        "$PEER_BIN/llama-perplexity" -m "$g" -c "$CTX" -b "$CTX" -t "$QT" --kl-divergence-base "$W/base.kld" --kl-divergence \
            > "$W/$f.log" 2> "$W/$f.err" || { tail -15 "$W/$f.err" >&2; die "llama-perplexity --kl-divergence failed on $g (log: $W/$f.err)"; }
        grep -q '^Same top p:' "$W/$f.log" && break
    done
    grep -q '^Same top p:' "$W/$f.log" || die "llama-perplexity's summary for $g is incomplete after 5 runs (log: $W/$f.log)"
    "$PEER_PY" scripts/peer_gguf.py info "$g" > "$W/info-$f.json"
done
"$PEER_PY" scripts/peer_gguf.py info "$F16" > "$W/info-F16.json"

if [[ ",$POLICIES," == *+gptq* ]] && [ -z "$CALIB" ]; then
    CALIB=$W/calib.txt
    if [ ! -d /usr/share/doc/python3.11/html/_sources ]; then
        echo "quality-peer: installing python3.11-doc (the demo model's corpus, for the calibration text)"
        SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
        { $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q python3.11-doc; } \
            > "$W/apt.log" 2>&1 || die "apt-get install python3.11-doc failed (log: $W/apt.log)"
    fi
    python3 scripts/calib-text.py --stride 32 -o "$CALIB" || die "writing the calibration text failed"
fi
margs=()
for p in "${PLIST[@]}"; do
    c=$W/cache-$p
    pargs=(--policy "${p%%+*}")
    [[ "$p" == *+gptq* ]] && pargs+=(--calibrate "$CALIB" -t "$QT")
    if [[ "$p" == *+mix* ]]; then
        while read -r line; do [[ -z "$line" || "$line" == \#* ]] || pargs+=(--set "$line"); done < "$MIX"
    fi
    echo "quality-peer: qwen35 $p (qwen35 eval --kld-base)"
    "$BIN" prepare --checkpoint "$MODEL" --out "$c" "${pargs[@]}" --force > "$W/prepare-$p.log" 2>&1 \
        || { tail -5 "$W/prepare-$p.log" >&2; die "qwen35 prepare $p failed"; }
    "$BIN" info "$c" > "$W/qinfo-$p.txt"
    "$PEER_PY" scripts/peer_quality.py eval-halves "$W/base.kld" --qwen35 "$BIN" --model "$c" --base "$MODEL" \
        -t "$QT" --work "$W" > "$W/qeval-$p.json" || die "qwen35 eval --kld-base on policy $p failed"
    margs+=(--model "$c")
done
echo "quality-peer: qwen35 logits of every policy and of the BF16 checkpoint, window by window"
"$PEER_PY" scripts/peer_quality.py measure "$W/base.kld" --qwen35 "$BIN" "${margs[@]}" --base "$MODEL" -t "$QT" \
    > "$W/measure.jsonl" || die "measuring the policies failed"
i=0
for p in "${PLIST[@]}"; do i=$((i + 1)); sed -n "${i}p" "$W/measure.jsonl" > "$W/q-$p.json"; done
secs=$(( $(date +%s) - t_start ))
"$PEER_PY" scripts/peer_report.py quality --work "$W" --formats "$(IFS=,; echo "${FORMATS[*]}")" \
    --policies "$POLICIES" --text "$TEXT" --ctx "$CTX" --seconds "$secs" --version "$PEER_VERSION" \
    --out "$OUTJ" || die "the table could not be made"
