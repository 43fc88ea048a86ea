#!/usr/bin/env bash
# Runs the kernel tests (tests/test_kernels.c, and the attention tests of tests/test_ops.c) against src/backend/cpu/kernels/avx512.c
# and src/backend/cpu/kernels/avx512bf16.c (the avx512 and avx512bf16 tables) with every
# AVX-512 intrinsic replaced by the plain-C stand-ins of
# tests/emu/avx512_emu.h, for machines without AVX-512. Slow but exact.
# Needs `make` to have built build/libqwen35.a. Left out: the dispatch and
# prefetch-level tests (the emulated tables are not what cpuid picks), the
# read probe and the scratch test (nothing of avx512.c in them), and the
# ops tests of kernels the avx512 tables take from avx2.c (GDN, softmax,
# gates, conv). About two minutes, most of it the compile.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT="$BUILD/emu"
mkdir -p "$OUT"
CFLAGS="-std=c11 -D_GNU_SOURCE -O1 -g -fno-var-tracking-assignments -Iinclude -Isrc -Isrc/backend/cpu/kernels -Itests"
EMU="-mavx2 -mfma -mf16c -include tests/emu/avx512_emu.h"
sed -e 's/q35_kernels_avx512 =/q35_kernels_avx512_emu =/' -e 's/q35_kernels_avx512bf16 =/q35_kernels_avx512bf16_emu =/' \
    src/backend/cpu/kernels/avx512.c > "$OUT/avx512_emu.c"
sed 's/#include "avx512.c"/#include "avx512_emu.c"/' src/backend/cpu/kernels/avx512bf16.c > "$OUT/avx512bf16_emu.c"
# the two big objects at once (about a minute each)
cc $CFLAGS $EMU -c "$OUT/avx512_emu.c" -o "$OUT/avx512_emu.o" &
pid=$!
cc $CFLAGS $EMU -c "$OUT/avx512bf16_emu.c" -o "$OUT/avx512bf16_emu.o"
wait $pid
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
# runs the named tests of a runner; each name must be a test that ran and passed
run_named() {
    local bin=$1; shift
    local log; log=$("$bin" "$@" 2>&1) || { echo "$log"; return 1; }
    echo "$log"
    grep -qx "$# passed, 0 failed" <<<"$log" || { echo "test-avx512-emu: expected $# tests to pass" >&2; return 1; }
}
run_named "$OUT/test_ops_emu" ops.attend_heads_match_ref ops.attend_rows_equal_rows_alone ops.kv_q8_rows_and_attention_over_them \
    ops.gemm_f32_matches_ref_and_rows_do_not_depend_on_their_neighbours
KERNEL_TESTS="kernels.f32_matches_ref kernels.f16_matches_ref kernels.bf16_matches_ref kernels.bfp8_matches_ref
    kernels.bfp4_matches_ref kernels.extreme_values_match_ref kernels.bfp_typical_error kernels.get_row_matches_ref
    kernels.batch_and_split_invariant kernels.bfp_gemv_matches_panel_tile kernels.bfp_gemv_exponent_add_matches_panel_tile
    kernels.bfp_small_batches_match_single_tokens kernels.bfp_small_batches_exponent_add_edges
    kernels.bfp_wide_matches_single_tokens kernels.bf16_x_rounding_is_exact
    kernels.matmul_n_equals_separate_calls kernels.read_stream_reads_everything kernels.bfp_is_the_exact_integer_dot"
run_named "$OUT/test_kernels_emu" $KERNEL_TESTS
# the emulator answers yes to AVX512_VBMI (tests/emu/avx512_emu.h); the bfp4 GEMV without it too
Q35_EMU_NO_VBMI=1 run_named "$OUT/test_kernels_emu" kernels.bfp4_matches_ref kernels.extreme_values_match_ref \
    kernels.bfp_gemv_matches_panel_tile kernels.bfp_gemv_exponent_add_matches_panel_tile \
    kernels.bfp_small_batches_match_single_tokens kernels.bfp_small_batches_exponent_add_edges \
    kernels.bfp_is_the_exact_integer_dot
