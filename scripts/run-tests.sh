#!/usr/bin/env bash
# Runs every test: the source layout check (scripts/check-layers.py), then
# the C unit tests (build/test_runner) and the end-to-end tests in tests/e2e
# that drive the built programs, once on each backend
# (Q35_BACKEND=cpu, then the scalar reference, Q35_BACKEND=ref: the same
# tests and goldens hold on both). Prints one combined "N passed, N failed"
# as its last line and exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
passed=0; failed=0

out=$(mktemp); trap 'rm -f "$out"' EXIT
# the layer rules of docs/architecture.md, the size limit, no server globals
if python3 scripts/check-layers.py --objects "$BUILD"; then passed=$((passed+1)); else failed=$((failed+1)); fi
for backend in ${Q35_TEST_BACKENDS:-cpu ref}; do
    export Q35_BACKEND=$backend
    echo "== backend $backend"
    "$BUILD/test_runner" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out" | tail -n1)
    if [ -z "$line" ]; then echo "test_runner did not finish (exit $rc)"; failed=$((failed+1));
    else passed=$((passed + ${line%% *})); f=${line#*, }; failed=$((failed + ${f%% *})); fi

    if ls tests/e2e/test_*.py >/dev/null 2>&1; then
        PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
        Q35_BIN="$PWD/$BUILD/qwen35" "$PY" -m pytest -q -p no:cacheprovider tests/e2e 2>&1 | tee "$out"
        summary=$(tail -n1 "$out")
        p=$(grep -oE '[0-9]+ passed' <<<"$summary" | grep -oE '[0-9]+' || echo 0)
        f=0; for n in $(grep -oE '[0-9]+ (failed|errors?)' <<<"$summary" | grep -oE '^[0-9]+'); do f=$((f+n)); done
        if [ "$p" = 0 ] && [ "$f" = 0 ]; then failed=$((failed+1)); echo "e2e: no result"; fi
        passed=$((passed+p)); failed=$((failed+f))
    fi
done
# The CUDA sources compile (no GPU code runs here): the library and the test
# runner with make CUDA=1, when nvcc is there; one test, pass or fail.
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
if [ -x "$NVCC" ] || command -v nvcc >/dev/null 2>&1; then
    echo "== make CUDA=1 BUILD=build-cuda (compile only)"
    t=$(date +%s)
    if make -s CUDA=1 BUILD=build-cuda build-cuda/test_runner >"$out" 2>&1; then passed=$((passed+1)); r=ok
    else failed=$((failed+1)); r=FAIL; cat "$out"; fi
    echo "$r   cuda.build ($(( $(date +%s) - t )) s)"
fi
# The AVX-512 kernels' tests against tables built with plain-C stand-ins for
# the intrinsics (scripts/test-avx512-emu.sh), so that a machine without
# AVX-512 tests their logic too and the stand-ins keep up; one test.
echo "== AVX-512 kernels under the emulator"
t=$(date +%s)
if scripts/test-avx512-emu.sh "$BUILD" >"$out" 2>&1; then passed=$((passed+1)); r=ok
else failed=$((failed+1)); r=FAIL; cat "$out"; fi
echo "$r   avx512_emu ($(( $(date +%s) - t )) s)"
# The libFuzzer targets build (make fuzz, clang), so an API change cannot
# leave one behind; one test, pass or fail. Running them is make fuzz's job.
if command -v clang >/dev/null 2>&1; then
    echo "== make fuzz (build only)"
    t=$(date +%s)
    if make -s fuzz >"$out" 2>&1; then passed=$((passed+1)); r=ok
    else failed=$((failed+1)); r=FAIL; cat "$out"; fi
    echo "$r   fuzz.build ($(( $(date +%s) - t )) s)"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
