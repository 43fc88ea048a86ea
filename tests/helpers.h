/* helpers.h: file and loading helpers shared by the tests. */
#ifndef Q35_TEST_HELPERS_H
#define Q35_TEST_HELPERS_H

#include "qwen35.h"

#include <stddef.h>
#include <stdint.h>

/* A whole file into a malloc'd buffer (NULL on failure). */
char *test_slurp(const char *path, size_t *len);
/* Writes a whole file; 0 on success. */
int test_spit(const char *path, const void *data, size_t len);
/* Loads an engine from dir and frees it again; the status and err say how it went. */
q35_status test_try_load(const char *dir, q35_error *err);

/* A draft oracle (a session's draft hook): the reference continuation seq
 * of the tokens at positions base.., wrong at about a third of the
 * positions (a fixed hash), so that steps see full acceptance, partial
 * acceptance and rejection. */
typedef struct { const int32_t *seq; int32_t base, n; } oracle;
int32_t oracle_hook(void *ctx, int32_t pos, int32_t proposed);

#endif
