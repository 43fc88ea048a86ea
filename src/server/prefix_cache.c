/* prefix_cache.c: state snapshots keyed by token prefixes (prefix_cache.h).
 * The scheduler stores one where a prompt's state is worth keeping (one
 * token before its end, at a chat turn's boundary, a warm slot's history
 * before another request takes the slot) and restores the longest match
 * before evaluating a new prompt. */
#include "server/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

int32_t q35_image_spans_before(const q35_image_span *s, int32_t ns, int32_t n) {
    int32_t k = 0;
    while (k < ns && s[k].pos < n) k++;
    return k;
}

bool q35_image_spans_agree(const q35_image_span *a, int32_t na, const q35_image_span *b, int32_t nb, int32_t n) {
    int32_t ka = q35_image_spans_before(a, na, n), kb = q35_image_spans_before(b, nb, n);
    if (ka != kb) return false;
    for (int32_t k = 0; k < ka; k++)
        if (a[k].pos != b[k].pos || a[k].len != b[k].len || memcmp(a[k].sha256, b[k].sha256, sizeof a[k].sha256)) return false;
    return true;
}

bool q35_prefix_agrees(const int32_t *held, int32_t n, const q35_image_span *held_spans, int32_t n_held,
                       const int32_t *prompt, const q35_image_span *spans, int32_t n_spans) {
    if (!q35_image_spans_agree(held_spans, n_held, spans, n_spans, n)) return false;
    int32_t at = 0, k_end = q35_image_spans_before(spans, n_spans, n);
    for (int32_t k = 0; k <= k_end; k++) {
        int32_t stop = k < k_end ? spans[k].pos : n; /* the text before image k, or the tail */
        if (stop > at && memcmp(held + at, prompt + at, sizeof *held * (size_t)(stop - at))) return false;
        if (k < k_end) at = spans[k].pos + spans[k].len < n ? spans[k].pos + spans[k].len : n;
    }
    return true;
}

uint64_t q35_salt_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a; 0 is the shared partition */
    if (!s) return 0;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h | 1;
}

void q35_prefix_cache_init(q35_prefix_cache *c, size_t budget) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->budget = budget;
}

static void cache_drop(q35_prefix_cache *c, int i) {
    q35_snapshot_free(c->e[i].snap);
    free(c->e[i].tokens);
    free(c->e[i].spans);
    c->used -= c->e[i].bytes;
    c->e[i] = c->e[--c->n];
}

void q35_prefix_cache_free(q35_prefix_cache *c) {
    pthread_mutex_lock(&c->mu);
    while (c->n) cache_drop(c, c->n - 1);
    free(c->e);
    c->e = NULL;
    c->cap = 0;
    pthread_mutex_unlock(&c->mu);
}

void q35_prefix_cache_usage(q35_prefix_cache *c, q35_prefix_cache_usage_t *u) {
    pthread_mutex_lock(&c->mu);
    *u = (q35_prefix_cache_usage_t){(size_t)c->n, c->used, c->budget, c->hits, c->misses, c->evictions};
    pthread_mutex_unlock(&c->mu);
}

void q35_prefix_cache_store(q35_prefix_cache *c, q35_session *sess, const int32_t *tokens, int32_t n,
                            const q35_image_span *spans, int32_t n_spans, uint64_t salt) {
    if (n < 1 || !c->budget) return;
    n_spans = q35_image_spans_before(spans, n_spans, n);
    for (int i = 0; i < c->n; i++)
        if (c->e[i].n == n && c->e[i].salt == salt &&
            q35_prefix_agrees(c->e[i].tokens, n, c->e[i].spans, c->e[i].n_spans, tokens, spans, n_spans)) {
            c->e[i].last_used = ++c->clock;
            return;
        }
    q35_snapshot *snap;
    q35_error err;
    if (q35_snapshot_take(sess, &snap, &err)) return;
    size_t bytes = q35_snapshot_bytes(snap) + sizeof *tokens * (size_t)n + sizeof *spans * (size_t)n_spans;
    if (bytes > c->budget) { q35_snapshot_free(snap); return; }
    pthread_mutex_lock(&c->mu);
    while (c->n && c->used + bytes > c->budget) {
        int lru = 0;
        for (int i = 1; i < c->n; i++)
            if (c->e[i].last_used < c->e[lru].last_used) lru = i;
        cache_drop(c, lru);
        c->evictions++;
    }
    if (c->n == c->cap) {
        int nc = c->cap ? 2 * c->cap : 16;
        q35_cache_entry *ne = realloc(c->e, sizeof *ne * (size_t)nc);
        if (!ne) { pthread_mutex_unlock(&c->mu); q35_snapshot_free(snap); return; }
        c->e = ne;
        c->cap = nc;
    }
    int32_t *copy = malloc(sizeof *copy * (size_t)n);
    q35_image_span *sc = n_spans ? malloc(sizeof *sc * (size_t)n_spans) : NULL;
    if (!copy || (n_spans && !sc)) { pthread_mutex_unlock(&c->mu); free(copy); free(sc); q35_snapshot_free(snap); return; }
    memcpy(copy, tokens, sizeof *copy * (size_t)n);
    if (n_spans) memcpy(sc, spans, sizeof *sc * (size_t)n_spans);
    c->e[c->n++] = (q35_cache_entry){copy, n, sc, n_spans, salt, snap, bytes, ++c->clock};
    c->used += bytes;
    pthread_mutex_unlock(&c->mu);
}

const q35_snapshot *q35_prefix_cache_find(q35_prefix_cache *c, const int32_t *prompt, int32_t n,
                                          const q35_image_span *spans, int32_t n_spans, uint64_t salt) {
    int best = -1;
    for (int i = 0; i < c->n; i++) {
        q35_cache_entry *e = &c->e[i];
        if (e->salt != salt || e->n >= n || (best >= 0 && e->n <= c->e[best].n)) continue;
        if (q35_prefix_agrees(e->tokens, e->n, e->spans, e->n_spans, prompt, spans, n_spans))
            best = i;
    }
    pthread_mutex_lock(&c->mu);
    if (best < 0) c->misses++;
    else c->hits++;
    pthread_mutex_unlock(&c->mu);
    if (best < 0) return NULL;
    c->e[best].last_used = ++c->clock;
    return c->e[best].snap;
}
