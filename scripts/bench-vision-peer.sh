#!/usr/bin/env bash
# make bench-vision-peer: qwen35's vision tower against transformers' on this machine, at the Qwen3.5-9B
# tower's shapes (27 blocks, width 1152, MLP 4304, 16 heads, merge 2, out 4096; random weights on both
# sides), one square image of SIDE pixels (448: 784 patches, 196 image tokens).
#
# 1. The reference stack (scripts/requirements-reference.txt, from PyPI) in a virtual environment:
#    Q35_REF_VENV if set (an existing one, e.g. /work/refvenv), else .venv-ref (ignored by git), made and
#    filled once when it cannot import torch and transformers.
# 2. ROUNDS rounds, each timing, for each thread count, `qwen35 speed --vision` (best of 2) and
#    scripts/bench_vision_hf.py (transformers' Qwen3_5VisionModel in float32 with the sdpa attention,
#    best of 2 after a warm-up run), in an order that alternates between rounds.
# 3. Writes bench-data/vision-peer.json (every figure, the ranges, the ratio transformers / qwen35) and
#    prints a table.
# Why float32 + sdpa: qwen35 computes the tower in fp32 (BF16 weights widened exactly, fp32
# activations and accumulation), which is transformers' float32; sdpa is transformers' default attention
# on CPU (torch's fused scaled_dot_product_attention), the fastest it offers there. bfloat16 in torch
# would round every activation to 8 bits, a different accuracy class.
# Usage: scripts/bench-vision-peer.sh [BUILD_DIR] [--dry-run]
#   --dry-run: check the arguments and the environment, print the plan; install and run nothing.
# Environment: Q35_REF_VENV, Q35_VPEER_THREADS (default "1,2"), Q35_VPEER_ROUNDS (2), Q35_VPEER_SIDE (448),
#   Q35_VPEER_OUT (bench-data/vision-peer.json).
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=bench-vision-peer; HELP_LINES=2,22p
# shellcheck source=peer-args.sh
. scripts/peer-args.sh
THREADS=${Q35_VPEER_THREADS:-1,2}
ROUNDS=${Q35_VPEER_ROUNDS:-2}
SIDE=${Q35_VPEER_SIDE:-448}
OUTJ=${Q35_VPEER_OUT:-bench-data/vision-peer.json}
VENV=${Q35_REF_VENV:-.venv-ref}
[[ "$THREADS" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "Q35_VPEER_THREADS='$THREADS': a list like 1,2"
[[ "$ROUNDS" =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 2 ] || die "Q35_VPEER_ROUNDS='$ROUNDS': at least 2"
[[ "$SIDE" =~ ^[0-9]+$ ]] && [ "$SIDE" -ge 32 ] && [ $((SIDE % 32)) = 0 ] || die "Q35_VPEER_SIDE='$SIDE': a multiple of 32"
IFS=, read -r -a TLIST <<<"$THREADS"
BIN="$BUILD/qwen35"
have_ref() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import torch, transformers' 2>/dev/null; }

if [ "$DRY" = 1 ]; then
    echo "bench-vision-peer (dry run): threads ${TLIST[*]}, $ROUNDS rounds, ${SIDE}x$SIDE image"
    [ -x "$BIN" ] && echo "qwen35: $BIN" || echo "qwen35: $BIN missing (make builds it)"
    have_ref && echo "reference stack: $VENV (present)" || echo "reference stack: $VENV (would be installed from PyPI)"
    echo "output: $OUTJ"
    exit 0
fi

[ -x "$BIN" ] || die "$BIN not found: run make first"
if ! have_ref; then
    [ -n "${Q35_REF_VENV:-}" ] && die "Q35_REF_VENV=$VENV cannot import torch and transformers"
    echo "bench-vision-peer: installing the reference stack into $VENV (once)"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q -r scripts/requirements-reference.txt
    have_ref || die "$VENV still cannot import torch and transformers"
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$(dirname "$OUTJ")"
for ((r = 0; r < ROUNDS; r++)); do
    for t in "${TLIST[@]}"; do
        if [ $((r % 2)) = 0 ]; then order="qwen35 transformers"; else order="transformers qwen35"; fi
        for who in $order; do
            echo "bench-vision-peer: round $((r + 1)), $t thread(s), $who"
            if [ "$who" = qwen35 ]; then
                "$BIN" speed --vision --image-side "$SIDE" -t "$t" --json "$TMP/q-$r-$t.json" >/dev/null
            else
                "$VENV/bin/python" scripts/bench_vision_hf.py --side "$SIDE" --threads "$t" --json "$TMP/h-$r-$t.json" >/dev/null
            fi
        done
    done
done
python3 - "$TMP" "$OUTJ" "$ROUNDS" "$THREADS" "$SIDE" <<'PY'
import json, os, platform, sys, time
tmp, out, rounds, threads, side = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(","), int(sys.argv[5])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
res = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=f"{cpu}, {os.cpu_count()} cpus",
           load_avg=os.getloadavg(), image=[side, side], rounds=rounds, rows=[])
print(f"\nvision tower at the 9B shapes, {side}x{side} image; seconds per encode, the best of 2 in each round")
print(f"{'threads':>7} {'qwen35 s (rounds)':>24} {'transformers s (rounds)':>26} {'ratio':>6}")
for t in threads:
    q = [json.load(open(f"{tmp}/q-{r}-{t}.json"))["runs"][0] for r in range(rounds)]
    h = [json.load(open(f"{tmp}/h-{r}-{t}.json")) for r in range(rounds)]
    qs, hs = [x["encode_s"] for x in q], [x["runs"][0]["encode_s"] for x in h]
    row = dict(threads=int(t), qwen35_s=qs, qwen35_kernels=json.load(open(f"{tmp}/q-0-{t}.json"))["kernels"],
               transformers_s=hs, transformers=dict(dtype=h[0]["dtype"], attn=h[0]["attn"], torch=h[0]["torch"],
                                                    version=h[0]["transformers"]),
               ratio_transformers_over_qwen35=min(hs) / min(qs))
    res["rows"].append(row)
    fmt = lambda v: f"{min(v):.2f} ({', '.join(f'{x:.2f}' for x in v)})"
    print(f"{t:>7} {fmt(qs):>24} {fmt(hs):>26} {row['ratio_transformers_over_qwen35']:>6.2f}")
print(f"transformers {h[0]['transformers']} (torch {h[0]['torch']}) {h[0]['dtype']}, attention {h[0]['attn']}; "
      f"{res['machine']}, load average {res['load_avg'][0]:.1f} at the end")
json.dump(res, open(out, "w"), indent=1)
print(f"wrote {out}")
PY
