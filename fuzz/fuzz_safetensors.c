/* libFuzzer target: the safetensors header parser on arbitrary bytes.
 * Any input must give Q35_OK with in-bounds tensors, or an error; never a
 * crash, a leak or an out-of-bounds read. */
#include "formats/safetensors.h"

#include <assert.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    q35_st_file f = {0};
    q35_error err;
    /* copy so that ASan sees exactly `size` bytes */
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    if (q35_st_parse(buf, size, "fuzz", &f, &err) == Q35_OK) {
        for (int32_t i = 0; i < f.n_entries; i++) {
            const q35_tensor *t = &f.entries[i].tensor;
            const uint8_t *p = t->data;
            assert(p >= buf && p + t->nbytes <= buf + size);
            volatile uint8_t sink = 0;
            for (size_t j = 0; j < t->nbytes; j++) sink ^= p[j];
            (void)sink;
        }
        for (int32_t i = 0; i < f.n_entries; i++) free(f.entries[i].name);
        free(f.entries);
    }
    free(buf);
    return 0;
}
