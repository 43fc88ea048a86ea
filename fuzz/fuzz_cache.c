/* libFuzzer target: the weight cache header and table parser on arbitrary
 * bytes. The table's SHA-256 is recomputed into each input first, so that
 * mutations reach the record checks instead of stopping at the hash. Any
 * input must give Q35_OK with in-bounds tensors of consistent size, or an
 * error; never a crash, a leak or an out-of-bounds read. */
#include "formats/cache.h"

#include <assert.h>
#include <openssl/evp.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    if (size >= Q35_CACHE_HEADER_BYTES) {
        uint64_t n = 0;
        for (int i = 3; i >= 0; i--) n = n << 8 | buf[16 + i];
        uint64_t table = (uint64_t)Q35_CACHE_HEADER_BYTES, bytes = n * Q35_CACHE_RECORD_BYTES;
        if (n <= (1u << 20) && table + bytes <= size) {
            unsigned len = 32;
            EVP_Digest(buf + table, (size_t)bytes, buf + 48, &len, EVP_sha256(), NULL);
        }
    }
    q35_st_file f = {0};
    q35_error err;
    if (q35_cache_parse(buf, size, "fuzz", &f, &err) == Q35_OK) {
        for (int32_t i = 0; i < f.n_entries; i++) {
            const q35_tensor *t = &f.entries[i].tensor;
            const uint8_t *p = t->data;
            assert(p >= buf && p + t->nbytes <= buf + size);
            assert(t->nbytes == q35_cache_tensor_bytes(t->dtype, t->ndim, t->shape));
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
