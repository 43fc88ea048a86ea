/* prefix_cache.h: the scheduler's prefix cache (prefix_cache.c): snapshots
 * of a session's whole state (KV rows and GDN states) keyed by the token ids
 * they cover, the images among them and a salt (the request's cache_salt
 * partition), evicted least recently used first past a byte budget. Only the
 * scheduler thread stores and restores; other threads read the counts under
 * mu.
 *
 * An image is a run of equal <|image_pad|> ids in the prompt, so the ids
 * alone cannot tell two images apart: each key also carries the spans of
 * the images it covers (position, length, SHA-256 of the image's bytes),
 * and a state matches a prompt only where every image that starts inside
 * it is the same image at the same place. The state before the first
 * image that differs is still shared. */
#ifndef Q35_SERVER_PREFIX_CACHE_H
#define Q35_SERVER_PREFIX_CACHE_H

#include "qwen35.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One image's place in a prompt. */
typedef struct q35_image_span {
    int32_t pos, len;          /* prompt positions [pos, pos + len) hold its tokens */
    uint8_t sha256[32];        /* of the image's bytes */
} q35_image_span;

/* Whether the images of two keys that start before position n are the same
 * images at the same places (spans in prompt order). */
bool q35_image_spans_agree(const q35_image_span *a, int32_t na, const q35_image_span *b, int32_t nb, int32_t n);
/* The number of spans that start before n (spans in prompt order). */
int32_t q35_image_spans_before(const q35_image_span *s, int32_t ns, int32_t n);
/* Whether held[0..n) with its images held_spans (a session's history, a
 * cache key) is the start of prompt with its images spans: the images that
 * start before n agree and every other id is equal. The rows of an agreeing
 * image are not compared: a session's history records them as the engine's
 * image tags (q35_session_eval_images), a prompt as <|image_pad|> ids. */
bool q35_prefix_agrees(const int32_t *held, int32_t n, const q35_image_span *held_spans, int32_t n_held,
                       const int32_t *prompt, const q35_image_span *spans, int32_t n_spans);

typedef struct q35_cache_entry {
    int32_t *tokens;
    int32_t n;
    q35_image_span *spans;     /* the images inside tokens[0..n), or NULL */
    int32_t n_spans;
    uint64_t salt;
    q35_snapshot *snap;
    size_t bytes;
    uint64_t last_used;
} q35_cache_entry;

typedef struct q35_prefix_cache {
    pthread_mutex_t mu;        /* guards n, used and the counters against readers */
    q35_cache_entry *e;
    int n, cap;
    size_t used, budget;
    uint64_t clock;
    unsigned long long hits, misses, evictions; /* lookups that restored an entry or found none; entries dropped for room */
} q35_prefix_cache;

/* The partition of a cache_salt: 0 for none (the shared one). */
uint64_t q35_salt_hash(const char *salt);

void q35_prefix_cache_init(q35_prefix_cache *c, size_t budget);
void q35_prefix_cache_free(q35_prefix_cache *c);
/* Snapshots sess as the state after tokens[0..n) with the images spans
 * (those of the whole prompt may be given; the ones inside are kept) in
 * partition salt (refreshes an equal entry). */
void q35_prefix_cache_store(q35_prefix_cache *c, q35_session *sess, const int32_t *tokens, int32_t n,
                            const q35_image_span *spans, int32_t n_spans, uint64_t salt);
/* The snapshot of the longest entry that is a proper prefix of
 * prompt[0..n) with the same images (spans: the prompt's) in partition
 * salt (marked used; counted as a hit, or a miss when there is none), or
 * NULL; valid until the next store. */
const q35_snapshot *q35_prefix_cache_find(q35_prefix_cache *c, const int32_t *prompt, int32_t n,
                                          const q35_image_span *spans, int32_t n_spans, uint64_t salt);
/* What the cache holds and has done, read under the lock. */
typedef struct q35_prefix_cache_usage_t {
    size_t entries, bytes, budget;
    unsigned long long hits, misses, evictions;
} q35_prefix_cache_usage_t;
void q35_prefix_cache_usage(q35_prefix_cache *c, q35_prefix_cache_usage_t *u);

#endif
