/* auth.h: API-key checks (auth.c). */
#ifndef Q35_SERVER_AUTH_H
#define Q35_SERVER_AUTH_H

#include <stdbool.h>
#include <stddef.h>

/* Compares two secrets in time independent of where they differ and of
 * their lengths (both are hashed with SHA-256 first). */
bool q35_secret_equal(const char *a, size_t a_len, const char *b, size_t b_len);
/* Checks an Authorization header value against the key: "Bearer KEY". */
bool q35_bearer_ok(const char *header, const char *key);

#endif
