/* source.h: where an image's bytes come from: a chat request's
 * `image_url.url` (or, for the command line, a plain path) resolved to the
 * bytes of one file, under a policy the server's operator sets.
 *
 *   data:   always: `data:[type/subtype][;param=value]*;base64,PAYLOAD`, the
 *           type an image type (or absent, or application/octet-stream);
 *           the payload standard base64 (RFC 4648 section 4: A-Z a-z 0-9 + /),
 *           ASCII whitespace anywhere ignored (line-wrapped MIME output),
 *           the final '=' padding optional; any other byte, '=' inside the
 *           payload, or a length that leaves one dangling character is an
 *           error naming the offset. Non-base64 data URLs are refused.
 *   http:, https:  only when the policy lists the URL's host (exact,
 *           case-insensitive match, as vLLM's --allowed-media-domains);
 *           fetched with libcurl, at most max_bytes, within timeout_s for
 *           the whole fetch, following at most max_redirects redirects, each
 *           to http(s) on a listed host too (every hop is checked before it
 *           is requested); a status other than 2xx is an error.
 *   file:   only under the policy's directory (vLLM's
 *           --allowed-local-media-path): the path is resolved with
 *           realpath (symlinks followed) and must then lie strictly inside
 *           the resolved directory, so a symlink cannot lead out of it; a
 *           regular file of at most max_bytes.
 * Any other scheme is refused.
 *
 * Errors: Q35_ERR_ARG for a URL the policy refuses or one that is not well
 * formed, Q35_ERR_FORMAT for a bad base64 payload, Q35_ERR_IO for a fetch or
 * read that failed (including a time-out and a size over the limit), each
 * with a message that says which rule it broke. */
#ifndef Q35_MEDIA_SOURCE_H
#define Q35_MEDIA_SOURCE_H

#include "qwen35.h"

#include <stddef.h>
#include <stdint.h>

typedef struct q35_media_policy {
    const char *allowed_domains;    /* host names, separated by commas and/or spaces; NULL or "": http(s) refused */
    const char *allowed_local_path; /* a directory; NULL or "": file:// and local paths refused */
    size_t max_bytes;               /* the most bytes one image may have (0: Q35_MEDIA_DEFAULT_MAX_BYTES) */
    double timeout_s;               /* a whole fetch, redirects included (<= 0: Q35_MEDIA_DEFAULT_TIMEOUT_S) */
    int max_redirects;              /* < 0: Q35_MEDIA_DEFAULT_REDIRECTS */
} q35_media_policy;

#define Q35_MEDIA_DEFAULT_MAX_BYTES (32u << 20)
#define Q35_MEDIA_DEFAULT_TIMEOUT_S 5.0 /* vLLM's VLLM_IMAGE_FETCH_TIMEOUT */
#define Q35_MEDIA_DEFAULT_REDIRECTS 3

/* libcurl's global set-up, once, before threads fetch (a process that
 * never calls it gets it at its first fetch, which is not thread-safe with
 * every libcurl build). 0, or -1 when libcurl cannot start. */
int q35_media_global_init(void);

/* Standard base64 (the rules above) into a new buffer (*out, *n; free it);
 * more than max_bytes decoded bytes is Q35_ERR_ARG. */
q35_status q35_base64_decode(const char *s, size_t len, size_t max_bytes, uint8_t **out, size_t *n, q35_error *err);

/* A data URL (the whole string, starting "data:") into its bytes. */
q35_status q35_data_url_decode(const char *url, size_t len, size_t max_bytes, uint8_t **out, size_t *n,
                               q35_error *err);

/* Whether host is one of the policy's domains (case-insensitive). */
int q35_media_domain_allowed(const q35_media_policy *p, const char *host);

/* Any URL of the schemes above into its bytes (*out, *n; free it). */
q35_status q35_media_load_url(const q35_media_policy *p, const char *url, uint8_t **out, size_t *n, q35_error *err);

/* A local path (the command line's form; no scheme) under the policy's
 * directory, as a file:// URL's path is; a relative one is taken from the
 * working directory. */
q35_status q35_media_load_path(const q35_media_policy *p, const char *path, uint8_t **out, size_t *n, q35_error *err);

/* What a command line or a request file names an image with: a URL (it has
 * a scheme: "data:", or letters then "://") through q35_media_load_url,
 * anything else as a local path through q35_media_load_path. */
q35_status q35_media_load(const q35_media_policy *p, const char *url_or_path, uint8_t **out, size_t *n, q35_error *err);

#endif
