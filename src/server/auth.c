/* auth.c: API-key checks (auth.h). Keys are compared through their SHA-256
 * digests in constant time, so neither where they differ nor their lengths
 * show in the timing. */
#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <string.h>
#include <strings.h>

bool q35_secret_equal(const char *a, size_t a_len, const char *b, size_t b_len) {
    unsigned char ha[SHA256_DIGEST_LENGTH], hb[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)a, a_len, ha);
    SHA256((const unsigned char *)b, b_len, hb);
    return CRYPTO_memcmp(ha, hb, sizeof ha) == 0;
}

bool q35_bearer_ok(const char *header, const char *key) {
    if (!header || !key) return false;
    /* the scheme is case-insensitive (RFC 7235); the token is not */
    if (strncasecmp(header, "Bearer ", 7)) return false;
    const char *tok = header + 7;
    while (*tok == ' ') tok++;
    size_t n = strlen(tok);
    while (n && tok[n - 1] == ' ') n--;
    return q35_secret_equal(tok, n, key, strlen(key));
}
