/* prefix_cache.h: the scheduler's prefix cache (prefix_cache.c): snapshots
 * of a session's whole state (KV rows and GDN states) keyed by the token ids
 * they cover and a salt (the request's cache_salt partition), evicted least
 * recently used first past a byte budget. Only the scheduler thread stores
 * and restores; other threads read the counts under mu. */
#ifndef Q35_SERVER_PREFIX_CACHE_H
#define Q35_SERVER_PREFIX_CACHE_H

#include "qwen35.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct q35_cache_entry {
    int32_t *tokens;
    int32_t n;
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
/* Snapshots sess as the state after tokens[0..n) (refreshes an equal entry). */
void q35_prefix_cache_store(q35_prefix_cache *c, q35_session *sess, const int32_t *tokens, int32_t n, uint64_t salt);
/* The snapshot of the longest entry that is a proper prefix of
 * prompt[0..n) in partition salt (marked used; counted as a hit, or a miss
 * when there is none), or NULL; valid until the next store. */
const q35_snapshot *q35_prefix_cache_find(q35_prefix_cache *c, const int32_t *prompt, int32_t n, uint64_t salt);
/* What the cache holds and has done, read under the lock. */
typedef struct q35_prefix_cache_usage_t {
    size_t entries, bytes, budget;
    unsigned long long hits, misses, evictions;
} q35_prefix_cache_usage_t;
void q35_prefix_cache_usage(q35_prefix_cache *c, q35_prefix_cache_usage_t *u);

#endif
