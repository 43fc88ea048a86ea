/* helpers.c: see helpers.h. */
#include "helpers.h"
#include "base/util.h"

#include <stdio.h>
#include <string.h>

char *test_slurp(const char *path, size_t *len) {
    char *buf = NULL;
    return q35_read_file(path, &buf, len, NULL) ? NULL : buf;
}

int test_spit(const char *path, const void *data, size_t len) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = fwrite(data, 1, len, fp);
    return (fclose(fp) == 0 && w == len) ? 0 : -1;
}

q35_status test_try_load(const char *dir, q35_error *err) {
    q35_engine *e = NULL;
    memset(err, 0, sizeof *err);
    q35_status st = q35_engine_load(dir, NULL, &e, err);
    q35_engine_free(e);
    return st;
}

int32_t oracle_hook(void *ctx, int32_t pos, int32_t proposed) {
    oracle *o = ctx;
    int32_t i = pos - o->base;
    if (i < 0 || i >= o->n) return proposed;
    return (((uint32_t)pos * 2654435761u) >> 28) % 3 == 0 ? (o->seq[i] + 1) % 7 : o->seq[i];
}
