/* fuzz_tokenizer_load.c: arbitrary bytes as a model directory's
 * tokenizer.json (or, with a leading 'v', as vocab.json next to a fixed
 * merges.txt and tokenizer_config.json). Loading must fail cleanly or give a
 * tokenizer that encodes a sample text. */
#include "qwen35.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static void put(const char *name, const void *data, size_t n) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    fwrite(data, 1, n, f);
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/q35fuzz.XXXXXX");
        if (!mkdtemp(dir)) abort();
    }
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    if (size && data[0] == 'v') {
        put("vocab.json", data + 1, size - 1);
        static const char merges[] = "#version: 0.2\n\xc4\xa0 a\n";
        static const char config[] = "{\"added_tokens_decoder\":{\"300\":{\"content\":\"<x>\",\"special\":true}}}";
        put("merges.txt", merges, strlen(merges));
        put("tokenizer_config.json", config, strlen(config));
    } else put("tokenizer.json", data, size);
    q35_tokenizer *tok = NULL;
    q35_error err = {0};
    if (q35_tokenizer_load(dir, &tok, &err) == Q35_OK) {
        int32_t *ids;
        size_t n;
        if (q35_tokenize(tok, "hello <x> wörld 123", 20, 1, &ids, &n, &err) == Q35_OK) free(ids);
        q35_tokenizer_free(tok);
    } else if (!err.msg[0]) abort();
    return 0;
}
