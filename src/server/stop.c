/* stop.c: the stop-string matcher (stop.h). Generated text goes in piece by
 * piece; what could still grow into a stop string stays held, the rest is
 * released to the client, and the first complete match ends the text. */
#include "server/stop.h"
#include "server/buf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void q35_stop_init(q35_stop_matcher *m, char **stop, int32_t n_stop) {
    memset(m, 0, sizeof *m);
    m->stop = stop;
    m->n_stop = n_stop;
    m->matched = -1;
}

void q35_stop_free(q35_stop_matcher *m) {
    free(m->buf);
    memset(m, 0, sizeof *m);
    m->matched = -1;
}

const char *q35_stop_text(const q35_stop_matcher *m) { return m->buf ? m->buf : ""; }

void q35_stop_consume(q35_stop_matcher *m, size_t n) {
    if (n > m->len) n = m->len;
    memmove(m->buf, m->buf + n, m->len - n);
    m->len -= n;
    if (m->buf) m->buf[m->len] = 0;
}

long q35_stop_feed(q35_stop_matcher *m, const char *text, size_t len) {
    if (m->matched >= 0) return 0;
    size_t old = m->len;
    if (q35_text_append(&m->buf, &m->len, &m->cap, text, len)) return -1;
    if (!m->n_stop) return (long)m->len;
    /* the earliest complete match; only a match that ends in the new text
     * can be new, so the search starts where one could begin */
    size_t best = SIZE_MAX;
    for (int32_t i = 0; i < m->n_stop; i++) {
        size_t sl = strlen(m->stop[i]);
        size_t from = old + 1 > sl ? old + 1 - sl : 0;
        for (size_t p = from; p + sl <= m->len; p++)
            if (!memcmp(m->buf + p, m->stop[i], sl)) {
                if (p < best) { best = p; m->matched = i; }
                break;
            }
    }
    if (m->matched >= 0) return (long)best;
    /* hold the longest suffix that is a proper prefix of a stop string */
    size_t hold = 0;
    for (int32_t i = 0; i < m->n_stop; i++) {
        size_t sl = strlen(m->stop[i]);
        for (size_t k = sl - 1 < m->len ? sl - 1 : m->len; k > hold; k--)
            if (!memcmp(m->buf + m->len - k, m->stop[i], k)) { hold = k; break; }
    }
    return (long)(m->len - hold);
}

size_t q35_stop_finish(q35_stop_matcher *m) { return m->matched >= 0 ? 0 : m->len; }
