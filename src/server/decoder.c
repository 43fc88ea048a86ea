/* decoder.c: a choice's generated ids to the text the client sees
 * (decoder.h); the scheduler feeds one per token and flushes at the end. */
#include "server/decoder.h"

#include <stdio.h>
#include <stdlib.h>

struct q35_text_decoder {
    q35_detokenizer *d;
    char buf[24];
};

q35_text_decoder *q35_text_decoder_new(const q35_tokenizer *tok) {
    q35_text_decoder *t = calloc(1, sizeof *t);
    q35_error err;
    if (t && tok && q35_detokenizer_new(tok, 1, &t->d, &err)) { free(t); return NULL; }
    return t;
}

void q35_text_decoder_free(q35_text_decoder *t) {
    if (!t) return;
    q35_detokenizer_free(t->d);
    free(t);
}

const char *q35_text_decoder_feed(q35_text_decoder *t, int32_t token, size_t *len) {
    if (t->d) return q35_detokenizer_feed(t->d, token, len);
    int n = snprintf(t->buf, sizeof t->buf, "<%d>", (int)token);
    *len = (size_t)n;
    return t->buf;
}

const char *q35_text_decoder_flush(q35_text_decoder *t, size_t *len) {
    if (t->d) return q35_detokenizer_flush(t->d, len);
    t->buf[0] = 0;
    *len = 0;
    return t->buf;
}
