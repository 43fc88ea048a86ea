/* tests/emu/emu_find.c: for scripts/test-avx512-emu.sh only (not part of the
 * test runner): answers "avx512" and "avx512bf16" with the emulated tables,
 * so that tests/test_kernels.c checks them like the real ones. */
#include "backend/cpu/kernels/kernels.h"

#include <string.h>

extern const q35_kernels q35_kernels_avx512_emu, q35_kernels_avx512bf16_emu;

q35_status emu_find(const char *name, const q35_kernels **out, q35_error *err);

q35_status emu_find(const char *name, const q35_kernels **out, q35_error *err) {
    if (!strcmp(name, "avx512")) {
        *out = &q35_kernels_avx512_emu;
        return Q35_OK;
    }
    if (!strcmp(name, "avx512bf16")) {
        *out = &q35_kernels_avx512bf16_emu;
        return Q35_OK;
    }
    return q35_kernels_find(name, out, err);
}
