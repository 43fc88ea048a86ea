/* fuzz_media_source.c: arbitrary bytes through the data: URL and base64
 * parsers (src/media/source.c). The first byte picks the parser: a data: URL
 * (the rest prefixed with "data:"), or bare base64. Any input must give
 * bytes within the limit or an error; never a crash, a leak or an
 * out-of-bounds access. Decoding what was decoded re-encoded must give it
 * back (checked with a small encoder here). Seeds: fuzz/corpus/media_source. */
#include "media/source.h"

#include <stdlib.h>
#include <string.h>

static char *encode(const uint8_t *d, size_t n, size_t *len) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc(n / 3 * 4 + 5), *p = o;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (uint32_t)d[i + 1] << 8 | d[i + 2];
        *p++ = A[v >> 18]; *p++ = A[v >> 12 & 63]; *p++ = A[v >> 6 & 63]; *p++ = A[v & 63];
    }
    if (n - i == 1) { uint32_t v = (uint32_t)d[i] << 16; *p++ = A[v >> 18]; *p++ = A[v >> 12 & 63]; *p++ = '='; *p++ = '='; }
    if (n - i == 2) { uint32_t v = (uint32_t)d[i] << 16 | (uint32_t)d[i + 1] << 8; *p++ = A[v >> 18]; *p++ = A[v >> 12 & 63]; *p++ = A[v >> 6 & 63]; *p++ = '='; }
    *len = (size_t)(p - o);
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    const size_t limit = 1 << 16;
    q35_error err;
    uint8_t *out = NULL;
    size_t n = 0;
    q35_status st;
    if (data[0] & 1) {
        char *u = malloc(size - 1 + 5);
        memcpy(u, "data:", 5);
        memcpy(u + 5, data + 1, size - 1);
        st = q35_data_url_decode(u, size - 1 + 5, limit, &out, &n, &err);
        free(u);
    } else {
        char *s = malloc(size - 1 ? size - 1 : 1);
        memcpy(s, data + 1, size - 1);
        st = q35_base64_decode(s, size - 1, limit, &out, &n, &err);
        free(s);
    }
    if (st == Q35_OK) {
        if (!out || !n || n > limit) abort();
        size_t len;
        char *again = encode(out, n, &len);
        uint8_t *back;
        size_t m;
        if (q35_base64_decode(again, len, limit, &back, &m, &err) != Q35_OK || m != n || memcmp(back, out, n)) abort();
        free(back);
        free(again);
        free(out);
    } else if (out || n) {
        abort();
    }
    return 0;
}
