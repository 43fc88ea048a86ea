#!/usr/bin/env bash
# Runs the kernel tests (tests/test_kernels.c, and the attention tests of tests/test_ops.c) against src/backend/cpu/kernels/avx512.c
# and src/backend/cpu/kernels/avx512bf16.c (the avx512 and avx512bf16 tables) with every
# AVX-512 intrinsic replaced by the plain-C stand-ins of
# tests/emu/avx512_emu.h, for machines without AVX-512. Slow but exact.
# Needs `make` to have built build/libqwen35.a. The dispatch tests are left
# out: the emulated tables are not what cpuid picks.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT="$BUILD/emu"
mkdir -p "$OUT"
CFLAGS="-std=c11 -D_GNU_SOURCE -O1 -g -Iinclude -Isrc -Isrc/backend/cpu/kernels -Itests"
EMU="-mavx2 -mfma -mf16c -include tests/emu/avx512_emu.h"
sed -e 's/q35_kernels_avx512 =/q35_kernels_avx512_emu =/' -e 's/q35_kernels_avx512bf16 =/q35_kernels_avx512bf16_emu =/' \
    src/backend/cpu/kernels/avx512.c > "$OUT/avx512_emu.c"
sed 's/#include "avx512.c"/#include "avx512_emu.c"/' src/backend/cpu/kernels/avx512bf16.c > "$OUT/avx512bf16_emu.c"
cc $CFLAGS $EMU -c "$OUT/avx512_emu.c" -o "$OUT/avx512_emu.o"
cc $CFLAGS $EMU -c "$OUT/avx512bf16_emu.c" -o "$OUT/avx512bf16_emu.o"
sed -e 's/q35_kernels_find(names\[i\]/emu_find(names[i]/' \
    -e 's/^#include <stdint.h>$/#include <stdint.h>\nq35_status emu_find(const char *, const q35_kernels **, q35_error *);/' \
    tests/test_kernels.c > "$OUT/test_kernels_emu.c"
cc $CFLAGS "$OUT/test_kernels_emu.c" tests/emu/emu_find.c tests/test_main.c "$OUT/avx512_emu.o" \
    "$OUT/avx512bf16_emu.o" "$BUILD/libqwen35.a" -lm -lpthread -o "$OUT/test_kernels_emu"
sed -e 's/q35_kernels_find(names\[i\]/emu_find(names[i]/' \
    -e 's/^#include "test.h"$/#include "test.h"\nq35_status emu_find(const char *, const q35_kernels **, q35_error *);/' \
    tests/test_ops.c > "$OUT/test_ops_emu.c"
cc $CFLAGS "$OUT/test_ops_emu.c" tests/emu/emu_find.c tests/test_main.c "$OUT/avx512_emu.o" \
    "$OUT/avx512bf16_emu.o" "$BUILD/libqwen35.a" -lm -lpthread -o "$OUT/test_ops_emu"
"$OUT/test_ops_emu" ops.attend_heads_match_ref ops.attend_rows_equal_rows_alone
"$OUT/test_kernels_emu" kernels.f32_matches_ref kernels.f16_matches_ref kernels.bf16_matches_ref \
    kernels.bfp8_matches_ref kernels.bfp4_matches_ref kernels.extreme_values_match_ref kernels.bfp_typical_error \
    kernels.get_row_matches_ref kernels.batch_and_split_invariant kernels.bf16_x_rounding_is_exact \
    kernels.matmul_n_equals_separate_calls kernels.read_stream_reads_everything
