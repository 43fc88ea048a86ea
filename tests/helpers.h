/* helpers.h: file and loading helpers shared by the bad-input tests. */
#ifndef Q35_TEST_HELPERS_H
#define Q35_TEST_HELPERS_H

#include "qwen35.h"

#include <stddef.h>

/* A whole file into a malloc'd buffer (NULL on failure). */
char *test_slurp(const char *path, size_t *len);
/* Writes a whole file; 0 on success. */
int test_spit(const char *path, const void *data, size_t len);
/* Loads an engine from dir and frees it again; the status and err say how it went. */
q35_status test_try_load(const char *dir, q35_error *err);

#endif
