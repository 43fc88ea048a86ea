#!/usr/bin/env bash
# Tokenizer throughput: the C encoder (one thread) beside Hugging Face
# tokenizers on the same corpus and the same tokenizer.json.
#
# usage: scripts/bench-tokenizer.sh [BUILD_DIR] [MODEL_DIR]
#   BUILD_DIR  where qwen35 was built (default build)
#   MODEL_DIR  a directory with tokenizer.json (default: the Qwen3.5 one made
#              by scripts/tokenizer-files.py)
# The corpus is every line of the golden inputs (tests/data/tokenizer) that is
# valid UTF-8, repeated to about 4 MB; each line is encoded as one document.
# Prints MB/s and tokens/s for each and writes bench-data/tokenizer.json.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
MODEL=${2:-tests/data/tokenizers-gen/qwen35}
PY=.venv/bin/python
# The test venv and the generated Qwen3.5 tokenizer files come from
# scripts/install-deps.sh (a no-op when they are there: a fresh clone has
# neither); HF's tokenizers library, the side compared against, goes into
# that venv when it is not there yet
if [ ! -x "$PY" ] || [ ! -f "$MODEL/tokenizer.json" ]; then scripts/install-deps.sh; fi
if ! "$PY" -c "import tokenizers" 2>/dev/null; then
    .venv/bin/pip install -q --disable-pip-version-check -r scripts/requirements-bench.txt
fi
if [ ! -f "$MODEL/tokenizer.json" ]; then
    echo "bench-tokenizer: $MODEL/tokenizer.json missing (run scripts/install-deps.sh)" >&2
    exit 1
fi
mkdir -p bench-data
CORPUS=bench-data/tokenizer-corpus.txt
"$PY" - "$CORPUS" <<'PYEOF'
import sys
lines = []
for hexline in open("tests/data/tokenizer/inputs.txt"):
    try:
        text = bytes.fromhex(hexline.strip()).decode("utf-8")
    except UnicodeDecodeError:
        continue
    lines.extend(l for l in text.replace("\r", "").split("\n") if l)
data = "\n".join(lines) + "\n"
with open(sys.argv[1], "w", encoding="utf-8") as f:
    f.write(data * max(1, (4 << 20) // len(data.encode())))
PYEOF
C_JSON=$("$BUILD/qwen35" tokenize -m "$MODEL" --file "$CORPUS" --bench)
HF_JSON=$("$PY" - "$MODEL/tokenizer.json" "$CORPUS" <<'PYEOF'
import json, os, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
docs = [l for l in open(sys.argv[2], encoding="utf-8").read().split("\n") if l]
nbytes = sum(len(d.encode()) for d in docs)
def timed(fn):
    n, tokens, t0 = 0, 0, time.perf_counter()
    while True:
        tokens += fn()
        n += 1
        t = time.perf_counter() - t0
        if t >= 3.0:
            return n * nbytes / t / 1e6, tokens / t
single = timed(lambda: sum(len(tok.encode(d).ids) for d in docs))
batch = timed(lambda: sum(len(e.ids) for e in tok.encode_batch(docs)))
print(json.dumps({"encode_mb_per_s": round(single[0], 2), "encode_tokens_per_s": round(single[1]),
                  "encode_batch_mb_per_s": round(batch[0], 2), "encode_batch_tokens_per_s": round(batch[1]),
                  "batch_threads": os.cpu_count()}))
PYEOF
)
CPU=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed 's/^ //' || echo unknown)
"$PY" - "$C_JSON" "$HF_JSON" "$CPU" "$CORPUS" <<'PYEOF'
import json, os, sys
c, hf, cpu, corpus = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"tokenizer throughput, {os.path.getsize(corpus) / 1e6:.1f} MB corpus, {cpu}")
print(f"  qwen35 C encoder, 1 thread           {c['mb_per_s']:8.2f} MB/s  {c['tokens_per_s']:12.0f} tok/s")
print(f"  HF tokenizers encode, 1 thread       {hf['encode_mb_per_s']:8.2f} MB/s  {hf['encode_tokens_per_s']:12.0f} tok/s")
print(f"  HF tokenizers encode_batch, {hf['batch_threads']} thr    {hf['encode_batch_mb_per_s']:8.2f} MB/s  {hf['encode_batch_tokens_per_s']:12.0f} tok/s")
json.dump({"cpu": cpu, "c": c, "hf": hf}, open("bench-data/tokenizer.json", "w"), indent=1)
PYEOF
