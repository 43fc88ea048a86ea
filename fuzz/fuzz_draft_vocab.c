/* libFuzzer target: the draft vocabulary list parser on arbitrary bytes.
 * Any input must give distinct ids inside the vocabulary, or an error;
 * never a crash, a leak or an out-of-bounds read. */
#include "core/session.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    enum { V = 1000 };
    /* copy so that ASan sees exactly `size` bytes */
    char *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    int32_t *ids = NULL, n = 0;
    q35_error err;
    if (q35_draft_vocab_parse(buf, size, "fuzz", V, &ids, &n, &err) == Q35_OK) {
        static unsigned char seen[V];
        memset(seen, 0, sizeof seen);
        assert(n > 0 && n <= V);
        for (int32_t i = 0; i < n; i++) {
            assert(ids[i] >= 0 && ids[i] < V && !seen[ids[i]]);
            seen[ids[i]] = 1;
        }
        free(ids);
    } else {
        assert(!ids && err.msg[0]);
    }
    free(buf);
    return 0;
}
