/* sched_prefill.c: a sequence's prompt into its slot's session (sched.c's
 * step 3): the prefix reuse (the warm slot's own state or the prefix
 * cache's longest snapshot), then the rest in chunks, with the snapshots
 * worth keeping taken on the way; and the free slot a waiting sequence
 * goes to.
 *
 * A prompt holding images (chat image parts, images.h) goes the same way.
 * Its images are encoded by the vision tower once per request, here on the
 * scheduler's thread (the engine is not concurrent), when its first choice
 * starts. A state is reused only up to before the first image that differs
 * (prefix_cache.h's spans: position, length, SHA-256 of the bytes); the
 * session's history records image rows as tags rather than the prompt's
 * <|image_pad|> ids, so histories are compared with q35_prefix_agrees,
 * which takes the rows of agreeing images as equal. A chunk never splits an
 * image (q35_session_eval_images takes whole images), and its images go
 * with it. */
#include "server/sched_int.h"
#include "server/images.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The session holds all of s's prompt but its last token: cache that state
 * (once) and let the request's other choices of this prompt go on. */
static void prompt_snapshot(q35_sched *S, seq *s, q35_session *sess) {
    q35_task *r = s->req;
    if (s->snap_done) return;
    s->snap_done = true;
    if (!r->api.cache_prompt && !r->prompt_lp) return;
    if (s->n_eval > 0 && r->api.cache_prompt)
        q35_prefix_cache_store(&S->cache, sess, s->prompt, s->n_eval, r->api.spans, r->api.n_spans, q35_salt_hash(r->api.cache_salt));
    pthread_mutex_lock(&r->mu);
    r->prompt_ready[s->prompt_index] = true;
    pthread_mutex_unlock(&r->mu);
}

/* The request's images through the vision tower, once, by its first
 * choice to start; the others share the embeddings (the task frees them). */
static q35_status encode_images(q35_sched *S, q35_task *r, q35_error *err) {
    if (r->embeds) return Q35_OK;
    int32_t n = r->api.n_images;
    q35_image_pixels *px = malloc(sizeof *px * (size_t)n);
    q35_image_embeds **out = calloc((size_t)n, sizeof *out);
    q35_status st = px && out ? Q35_OK : q35_fail(err, Q35_ERR_NOMEM, "out of memory for %d images", n);
    for (int32_t k = 0; !st && k < n; k++) px[k] = r->api.images[k].pixels; /* the rows stay the request's */
    if (!st) st = q35_engine_encode_images(S->engine, px, n, out, err);
    if (!st) r->embeds = out;
    else free(out);
    free(px);
    return st;
}

/* q35_session_reuse for a prompt holding images, whose comparisons were
 * made here (q35_prefix_agrees; the library's would compare the history's
 * image tags with the prompt's pads): the session's own state when it
 * extends the prompt, else snap (found for this prompt) when it covers
 * more, else nothing. The prompt tokens the session then holds. */
static int32_t reuse_with_images(q35_session *sess, bool extends, int32_t n_own, const q35_snapshot *snap) {
    int32_t n_snap = 0;
    q35_error err;
    if (snap && q35_snapshot_tokens(snap, &n_snap) && n_snap > (extends ? n_own : 0)) {
        if (!q35_snapshot_restore(sess, snap, &err)) return n_snap;
    } else if (extends) {
        return n_own;
    }
    q35_session_reset(sess);
    return 0;
}

/* n prompt rows from `from`, cut before an image the chunk would split, or
 * stretched over it when the chunk starts with it: an image is evaluated
 * whole, in one call. */
static int32_t whole_images(const q35_image_span *sp, int32_t ns, int32_t from, int32_t n) {
    for (int32_t k = 0; k < ns; k++) {
        int32_t a = sp[k].pos, b = sp[k].pos + sp[k].len;
        if (a < from + n && b > from + n) return a > from ? a - from : b - from;
    }
    return n;
}

/* prompt[from .. from + n) into the session, with the images among them. */
static q35_status eval_chunk(q35_session *sess, const q35_task *r, const int32_t *prompt, int32_t from, int32_t n,
                             float *row, int flags, q35_error *err) {
    if (!r->embeds) return q35_session_eval(sess, prompt + from, n, row, flags, err);
    int32_t k0 = q35_image_spans_before(r->api.spans, r->api.n_spans, from);
    int32_t k1 = q35_image_spans_before(r->api.spans, r->api.n_spans, from + n);
    return q35_session_eval_images(sess, prompt + from, n, r->embeds + k0, k1 - k0, row, flags, err);
}

/* Evaluates the next chunk of s's prompt; on the last one samples. */
void q35_seq_prefill(q35_sched *S, seq *s) {
    q35_task *r = s->req;
    q35_session *sess = S->sessions[s->slot];
    q35_error err;
    /* prompt logprobs: choice 0 of each prompt evaluates all of it (a
     * cached prefix has no logits), a chunk of rows_cap rows at a time */
    bool plp = r->prompt_lp && s->choice % r->api.n == 0;
    if (!s->looked_up) {
        int32_t j = s->choice % r->api.n;
        if (j > 0 && (r->api.cache_prompt || r->prompt_lp) && !atomic_load(&r->cancelled)) {
            /* wait for choice 0's snapshot of the same prompt (and its logprobs) */
            pthread_mutex_lock(&r->mu);
            bool ready = r->prompt_ready[s->prompt_index] || r->error;
            pthread_mutex_unlock(&r->mu);
            if (!ready) return;
        }
        if (r->api.n_images && encode_images(S, r, &err)) {
            char msg[sizeof err.msg + 40];
            snprintf(msg, sizeof msg, "the images could not be encoded: %s", err.msg);
            q35_seq_fail(S, s, msg);
            return;
        }
        s->looked_up = true;
        int32_t hit = 0, n_own = 0;
        uint64_t salt = q35_salt_hash(r->api.cache_salt);
        warm_slot *w = &S->warm[s->slot];
        const int32_t *own = w->held ? q35_session_tokens(sess, &n_own) : NULL;
        /* the slot's own state is this request's to continue only in its
         * partition, and only with the same images where it holds any: the
         * library compares token ids, which an image's pad run shares with
         * every other image's */
        bool own_ok = r->api.cache_prompt && !plp && own && w->cacheable && w->salt == salt &&
                      q35_image_spans_agree(w->spans, w->n_spans, r->api.spans, r->api.n_spans, n_own);
        bool extends = own_ok && n_own < s->n_prompt &&
                       q35_prefix_agrees(own, n_own, w->spans, w->n_spans, s->prompt, r->api.spans, r->api.n_spans);
        if (!extends && own && w->cacheable)
            q35_prefix_cache_store(&S->cache, sess, own, n_own, w->spans, w->n_spans, w->salt); /* keep the old state */
        if (!own_ok) q35_session_reset(sess);
        /* the library keeps the session's history or restores the cached
         * snapshot, whichever covers more of the prompt */
        const q35_snapshot *snap =
            r->api.cache_prompt && !plp ? q35_prefix_cache_find(&S->cache, s->prompt, s->n_prompt, r->api.spans, r->api.n_spans, salt) : NULL;
        if (r->embeds) {
            hit = reuse_with_images(sess, extends, n_own, snap);
        } else if (q35_session_reuse(sess, s->prompt, s->n_prompt, snap, &hit, &err)) {
            q35_session_reset(sess);
            hit = 0;
        }
        w->held = false;
        pthread_mutex_lock(&S->mu);
        S->cache_queries += (unsigned long long)s->n_prompt;
        S->cache_hits += (unsigned long long)hit;
        pthread_mutex_unlock(&S->mu);
        if (s->choice % r->api.n == 0) {
            pthread_mutex_lock(&r->mu);
            r->cached_tokens += hit;
            pthread_mutex_unlock(&r->mu);
        }
        s->n_eval = hit;
    }
    /* the snapshot falls one token before the end: the last token is fed
     * alone, so a repeat of this prompt can restore it and still get logits */
    int32_t snap_at = s->n_prompt - 1, turn = r->turn_snap;
    if (s->n_eval == snap_at) prompt_snapshot(S, s, sess);
    int32_t end = s->n_eval < snap_at ? snap_at : s->n_prompt;
    if (turn > s->n_eval && turn < snap_at) end = turn; /* stop there for the turn snapshot */
    int32_t n = end - s->n_eval;
    if (n > S->prefill_chunk) n = S->prefill_chunk;
    bool rows = plp && s->n_eval + n != s->n_prompt; /* the last chunk is the last token alone */
    if (rows && n > S->rows_cap) n = S->rows_cap;
    if (r->api.n_spans) n = whole_images(r->api.spans, r->api.n_spans, s->n_eval, n);
    if (rows && n > S->rows_cap) {
        q35_seq_fail(S, s, "prompt logprobs: an image is longer than the rows a prompt chunk keeps");
        return;
    }
    bool last = s->n_eval + n == s->n_prompt;
    float *row = S->logits;
    if (n > 0 && eval_chunk(sess, r, s->prompt, s->n_eval, n, last ? row : rows ? S->rows : NULL,
                            rows ? Q35_EVAL_ALL_LOGITS : 0, &err)) {
        q35_seq_fail(S, s, err.msg);
        return;
    }
    if (rows && n > 0) q35_prompt_lp_fill(&r->prompt_lp[s->prompt_index], S->rows, S->V, s->n_eval, n, s->prompt);
    s->n_eval += n;
    if (s->n_eval == turn && turn < snap_at && r->api.cache_prompt && s->choice % r->api.n == 0)
        q35_prefix_cache_store(&S->cache, sess, s->prompt, turn, r->api.spans, r->api.n_spans, q35_salt_hash(r->api.cache_salt));
    if (s->n_eval == snap_at) prompt_snapshot(S, s, sess);
    if (!last) return;
    pthread_mutex_lock(&r->mu);
    r->n_started++;
    pthread_mutex_unlock(&r->mu);
    s->state = SEQ_DECODE;
    q35_seq_begin(S, s, row);
}

/* The free slot for s: the one whose warm history s extends the furthest,
 * else an empty one, else the least recently used; -1 when none is free. */
int q35_sched_pick_slot(q35_sched *S, const seq *s) {
    int best = -1, empty = -1, lru = -1;
    int32_t best_n = 0;
    uint64_t salt = q35_salt_hash(s->req->api.cache_salt);
    for (int i = 0; i < S->n_slots; i++) {
        if (S->slots[i]) continue;
        const warm_slot *w = &S->warm[i];
        int32_t n = 0;
        const int32_t *held = w->held ? q35_session_tokens(S->sessions[i], &n) : NULL;
        if (!held || !n) { if (empty < 0) empty = i; continue; }
        if (lru < 0 || w->last_used < S->warm[lru].last_used) lru = i;
        if (s->req->api.cache_prompt && w->cacheable && w->salt == salt && n < s->n_prompt && n > best_n &&
            q35_prefix_agrees(held, n, w->spans, w->n_spans, s->prompt, s->req->api.spans, s->req->api.n_spans)) {
            best = i;
            best_n = n;
        }
    }
    return best >= 0 ? best : empty >= 0 ? empty : lru;
}
