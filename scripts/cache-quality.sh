#!/usr/bin/env bash
# Measures every weight-cache policy (and the embedding / lm_head choices
# of the default policy) against the BF16 checkpoint with `qwen35 eval
# --kld-base`, on each test model, and prints one markdown table.
#   scripts/cache-quality.sh [BUILD_DIR] [MODEL_DIR...]
# Input: with TEXT=FILE, that text through each model's tokenizer; otherwise
# 1024 pseudo-random token ids (fixed LCG). Windows of 256 tokens.
#   TEXT=<(head -c 16000 models/qwen35-demo-eval.txt) scripts/cache-quality.sh build models/qwen35-demo
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; shift || true
MODELS=("$@"); [ ${#MODELS[@]} -gt 0 ] || MODELS=(tests/data/models/tiny-a tests/data/models/tiny-b tests/data/models/tiny-c)
Q=$BUILD/qwen35
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
if [ -n "${TEXT:-}" ]; then cat "$TEXT" > "$WORK/text.txt"; fi
E=model.language_model.embed_tokens.weight
VARIANTS=(
  "bf16|--policy bf16"
  "default|--policy default"
  "bfp8|--policy bfp8"
  "bfp4-all|--policy bfp4-all"
  "tuned|--policy tuned"
  "default, lm_head bf16|--policy default --set lm_head.weight=bf16"
  "default, lm_head bfp4|--policy default --set lm_head.weight=bfp4"
  "default, embed bf16|--policy default --set $E=bf16"
  "default, embed bfp4|--policy default --set $E=bfp4"
)
echo "| model | cache | PPL (base) | PPL | KLD mean | KLD max | top-1 | weight bytes | bytes/token |"
echo "|---|---|---|---|---|---|---|---|---|"
for m in "${MODELS[@]}"; do
  V=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print((c.get('text_config') or c)['vocab_size'])" "$m/config.json")
  python3 -c "import sys; V=int(sys.argv[1]); x=12345; out=[]
for i in range(1024):
    x=(x*1103515245+12345)%2**31; out.append(str(x%V))
print(' '.join(out))" "$V" > "$WORK/ids.txt"
  tied=$(grep -q '"tie_word_embeddings": true' "$m/config.json" && echo 1 || echo 0)
  for v in "${VARIANTS[@]}"; do
    name=${v%%|*}; args=${v#*|}
    if [ "$tied" = 1 ] && [[ "$name" == *lm_head* ]]; then continue; fi
    out="$WORK/c"; rm -rf "$out"
    # shellcheck disable=SC2086
    "$Q" prepare --checkpoint "$m" --out "$out" $args 2>/dev/null
    if [ -n "${TEXT:-}" ]; then input=(--text "$WORK/text.txt"); else input=(--ids "$WORK/ids.txt"); fi
    j=$("$Q" eval -m "$out" "${input[@]}" --ctx 256 --kld-base "$m" --json 2>/dev/null)
    info=$("$Q" info "$out")
    total=$(sed -n 's/^total bytes: \([0-9]*\).*/\1/p' <<<"$info")
    vision=$(sed -n 's/^vision tower: [0-9]* tensors, \([0-9]*\) bytes.*/\1/p' <<<"$info")
    total=$((total - ${vision:-0})) # weight bytes: the text model and MTP head, the tower apart
    per=$(sed -n 's/^bytes read per generated token: \([0-9]*\).*/\1/p' <<<"$info")
    python3 -c "import json,sys; j=json.loads(sys.argv[1]); print('| %s | %s | %.3f | %.3f | %.5f | %.4f | %.1f%% | %s | %s |' % (sys.argv[2], sys.argv[3], j['base_perplexity'], j['perplexity'], j['kld_mean'], j['kld_max'], 100*j['top1_agreement'], sys.argv[4], sys.argv[5]))" "$j" "$(basename "$m")" "$name" "$total" "$per"
  done
done
