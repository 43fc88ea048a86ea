/* sched.c: the scheduler (sched.h): slots, the wait queue, prompt
 * evaluation in chunks, batched decode and speculative steps, sampling, stop
 * strings, and prefix reuse (warm slots here, snapshots in prefix_cache.c).
 * Tasks come in through q35_sched_submit from the routes' threads; events go
 * out into each task; counts go into the metrics sink of its config.
 *
 * One thread owns every session. Each turn of its loop:
 *   1. admits waiting sequences into free slots (FIFO);
 *   2. drops sequences whose client went away;
 *   3. evaluates one chunk of each admitted prompt (so a long prompt delays
 *      the others' next token by one chunk at most), first restoring the
 *      longest cached prefix (sched_prefill.c, images included);
 *   4. runs one q35_generation_batch_step over every decoding sequence
 *      (MTP drafts verified in the same forward pass; each sequence's
 *      sampler, min_tokens, stop ids and EOS handled by its generation;
 *      logit_bias, json_object and json_schema as its logits hook,
 *      which masks draft rows too), so the weights are
 *      read once per step for all of them.
 *
 * Prefix reuse, two levels. A slot whose sequence ended keeps its state
 * ("warm"; the session knows the token ids it holds): a request whose prompt extends that
 * history, as a multi-turn follow-up does, continues in the slot with no
 * copy at all. Behind it, the prefix cache: snapshots of the whole state (KV
 * rows and GDN states) keyed by the token ids they cover, taken one token
 * before the end of each prompt, and of a warm slot's state when another
 * request takes the slot over, and for chat where the conversation so far
 * ends ("<|im_start|>assistant\n" after the last user turn): the template
 * drops the think block from earlier assistant turns, so that is the longest
 * prefix a follow-up turn shares. A lookup uses the longest warm slot or entry
 * that is a proper prefix of the new prompt (at least one token is left to
 * evaluate, for the logits). Entries are evicted least recently used first
 * when their bytes pass the budget. Choices 2..n of a request wait for the
 * first one's prompt snapshot instead of evaluating the same prompt again.
 * A request for its prompt's logprobs (echo with logprobs, prompt_logprobs)
 * skips both levels on choice 0, whose chunks then write every row's
 * logits (rows_cap rows at a time) for q35_prompt_lp_fill. */
#include "server/sched_int.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- sequences ---- */

static void seq_free(seq *s) {
    if (!s) return;
    free(s->tokens);
    q35_generation_free(s->gen);
    q35_sampler_free(s->sampler);
    q35_stop_free(&s->stop);
    q35_text_decoder_free(s->dec);
    free(s);
}

static char *dup_n(const char *p, size_t n) {
    char *d = malloc(n + 1);
    if (d) { memcpy(d, p, n); d[n] = 0; }
    return d;
}

/* Ends a sequence: the end-of-generation snapshot, the slot, the counts. */
static void seq_end(q35_sched *S, seq *s, int finish) {
    q35_task *r = s->req;
    q35_session *sess = S->sessions[s->slot];
    warm_slot *w = &S->warm[s->slot];
    w->held = finish != Q35_FIN_ERROR && q35_session_tokens(sess, NULL); /* the session knows what it holds */
    if (w->held) {
        w->salt = q35_salt_hash(r->api.cache_salt);
        w->cacheable = r->api.cache_prompt; /* an abort leaves a consistent state too */
        w->last_used = ++S->warm_clock;
        /* the session holds the prompt's images; generated tokens add none */
        free(w->spans);
        w->n_spans = 0;
        w->spans = r->api.n_spans ? malloc(sizeof *w->spans * (size_t)r->api.n_spans) : NULL;
        if (w->spans) {
            memcpy(w->spans, r->api.spans, sizeof *w->spans * (size_t)r->api.n_spans);
            w->n_spans = r->api.n_spans;
        } else if (r->api.n_spans) {
            w->held = false; /* without its key the state cannot be told apart */
        }
    }
    /* the slot is free before the client can see its last event */
    pthread_mutex_lock(&S->mu);
    S->slots[s->slot] = NULL;
    S->n_running--;
    pthread_mutex_unlock(&S->mu);
    /* only this thread finishes choices, so n_finished is stable here; the
     * counters are updated before the client can see the end */
    if (r->n_finished + 1 == r->n_choices) q35_metrics_request_done(S->metrics, finish, q35_now_seconds() - r->t_arrive);
    pthread_mutex_lock(&r->mu);
    r->completion_tokens[s->choice] = s->n_gen;
    r->n_finished++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    q35_task_release(r);
    seq_free(s);
}

void q35_seq_fail(q35_sched *S, seq *s, const char *msg) {
    q35_task *r = s->req;
    pthread_mutex_lock(&r->mu);
    if (!r->error) r->error = strdup(msg);
    pthread_mutex_unlock(&r->mu);
    q35_event ev = {.choice = s->choice, .token = -1, .text = strdup(""), .finish = Q35_FIN_ERROR, .stop_id = -1};
    q35_task_push(r, &ev);
    seq_end(S, s, Q35_FIN_ERROR);
}

/* Handles the token just sampled from row `logits` (raw copy in S->raw when
 * logprobs are wanted). Returns true when the sequence ended. */
static bool seq_take_token(q35_sched *S, seq *s, int32_t tok, int32_t why) {
    q35_task *r = s->req;
    double now = q35_now_seconds();
    if (s->n_gen == 0) {
        q35_metrics_first_token(S->metrics, now - r->t_arrive);
        pthread_mutex_lock(&r->mu);
        if (r->t_first_token == 0) r->t_first_token = now;
        pthread_mutex_unlock(&r->mu);
    } else {
        q35_metrics_token_gap(S->metrics, now - s->t_last);
    }
    s->t_last = now;
    s->tokens[s->n_prompt + s->n_gen++] = tok;
    /* the counters move token by token, as the request runs */
    q35_metrics_tokens(S->metrics, s->n_gen == 1 && s->choice % r->api.n == 0 ? s->n_prompt : 0, 1);
    if (s->json_wait) s->json_wait = tok != S->think_end;
    else if (s->schema && !s->json_done) {
        bool ok = S->tok_bytes[tok] && q35_schema_feed(s->schema, &s->gs, S->tok_bytes[tok], S->tok_len[tok]);
        s->json_done = !ok || q35_schema_complete(s->schema, &s->gs);
    } else if (s->json_on && !s->json_done) {
        q35_json_prefix_feed(&s->json, S->tok_bytes[tok], S->tok_len[tok]);
        s->json_done = q35_json_prefix_complete(&s->json);
    }

    q35_event ev = {.choice = s->choice, .token = tok, .stop_id = -1};
    if (r->api.logprobs >= 0) {
        ev.n_top = r->api.logprobs;
        ev.logprob = q35_logprobs(S->raw, S->V, tok, ev.n_top, ev.top_ids, ev.top_lp);
        if (ev.logprob == -INFINITY) ev.logprob = -9999.0f;
        for (int i = 0; i < ev.n_top; i++)
            if (ev.top_lp[i] == -INFINITY) ev.top_lp[i] = -9999.0f;
    }
    bool eos = why == Q35_STOP_EOS;
    int32_t sid = why == Q35_STOP_TOKEN ? tok : -1;
    long rel = 0;
    if (!eos && sid < 0) {
        size_t n;
        const char *piece = q35_text_decoder_feed(s->dec, tok, &n);
        /* stop strings count only from min_tokens on, as vLLM's do */
        int32_t n_stop = s->stop.n_stop;
        if (s->n_gen < r->api.min_tokens) s->stop.n_stop = 0;
        rel = q35_stop_feed(&s->stop, piece, n);
        s->stop.n_stop = n_stop;
    }
    if (s->stop.matched >= 0) {
        ev.finish = Q35_FIN_STOP;
        ev.stop_str = strdup(s->stop.stop[s->stop.matched]);
    } else if (eos || sid >= 0) {
        ev.finish = Q35_FIN_STOP;
        ev.stop_id = sid;
    } else if (s->json_done) {
        ev.finish = Q35_FIN_STOP; /* the object is complete */
    } else if (why == Q35_STOP_LENGTH || why == Q35_STOP_CONTEXT) {
        ev.finish = Q35_FIN_LENGTH;
    }
    if (ev.finish && s->stop.matched < 0) {
        size_t n;
        const char *tail = q35_text_decoder_flush(s->dec, &n);
        if (n) q35_stop_feed(&s->stop, tail, n);
        rel = (long)q35_stop_finish(&s->stop);
        if (s->stop.matched >= 0) { /* the flushed tail completed a stop string */
            rel = (long)strlen(q35_stop_text(&s->stop));
            const char *hit = strstr(q35_stop_text(&s->stop), s->stop.stop[s->stop.matched]);
            if (hit) rel = hit - q35_stop_text(&s->stop);
            ev.finish = Q35_FIN_STOP;
            ev.stop_str = strdup(s->stop.stop[s->stop.matched]);
        }
    }
    if (rel < 0) rel = 0;
    ev.text = dup_n(q35_stop_text(&s->stop), (size_t)rel);
    ev.len = ev.text ? (size_t)rel : 0;
    q35_stop_consume(&s->stop, (size_t)rel);
    q35_task_push(r, &ev);
    if (ev.finish) { seq_end(S, s, ev.finish); return true; }
    return false;
}

/* Masks the row (V logits) to the tokens in S->live, and the end-of-sequence ids too when the document is
 * whole. */
static void mask_row(const q35_sched *S, float *row, int32_t V, bool whole) {
    for (int i = 0; whole && i < S->n_eos; i++)
        if (S->eos[i] >= 0 && S->eos[i] < S->V) S->live[S->eos[i]] = 1;
    for (int32_t t = 0; t < V; t++)
        if (t >= S->V || !S->live[t]) row[t] = -INFINITY;
}

/* json_object: only tokens whose bytes continue a JSON object, after
 * </think> when the prompt opened a think block (the end of sequence once
 * the object is whole). Draft rows come here too, as for json_schema
 * below: the state is s->json fed the step's earlier drafts. */
static void seq_json_mask(seq *s, float *row, int32_t V, const int32_t *prev, int32_t n_prev) {
    const q35_sched *S = s->sched;
    q35_json_prefix js = s->json;
    bool wait = s->json_wait, ok = true;
    for (int32_t i = s->n_gen; i < n_prev && ok; i++) {
        int32_t t = prev[i];
        if (wait) wait = t != S->think_end;
        else ok = t < S->V && S->tok_bytes[t] && q35_json_prefix_feed(&js, S->tok_bytes[t], S->tok_len[t]);
    }
    if (wait) { /* the reasoning is free, but ends with </think>, not a tool call */
        if (S->tool_open >= 0 && S->tool_open < V) row[S->tool_open] = -INFINITY;
        return;
    }
    bool whole = !ok || q35_json_prefix_complete(&js); /* a whole object (or none possible) ends: EOS alone */
    if (whole) memset(S->live, 0, (size_t)S->V);
    else q35_token_trie_mask_by(S->trie, q35_json_prefix_byte, &js, sizeof js, q35_json_prefix_in_string(&js), S->live);
    mask_row(S, row, V, whole);
}

/* json_schema (and a forced tool call, compiled the same way by request.c):
 * only tokens whose bytes continue a document valid for the
 * schema (the end of sequence once it is whole), after </think> when the
 * prompt opened a think block. Draft rows come here too: the state is the
 * one after s's output, fed the step's earlier drafts (prev[s->n_gen..]),
 * so a draft outside the grammar cannot be chosen. */
static void seq_schema_mask(seq *s, float *row, int32_t V, const int32_t *prev, int32_t n_prev) {
    const q35_sched *S = s->sched;
    q35_schema_state st;
    q35_schema_copy(&st, &s->gs);
    bool wait = s->json_wait, ok = true;
    for (int32_t i = s->n_gen; i < n_prev && ok; i++) {
        int32_t t = prev[i];
        if (wait) wait = t != S->think_end;
        else ok = S->tok_bytes[t] && q35_schema_feed(s->schema, &st, S->tok_bytes[t], S->tok_len[t]);
    }
    if (wait) {
        if (S->tool_open >= 0 && S->tool_open < V) row[S->tool_open] = -INFINITY;
        return;
    }
    bool whole = ok && q35_schema_complete(s->schema, &st);
    if (ok && !q35_schema_closed(s->schema, &st)) q35_token_trie_mask(S->trie, s->schema, &st, S->live);
    else memset(S->live, 0, (size_t)S->V);
    mask_row(S, row, V, whole);
}

/* s's q35_logits_fn: logit_bias, then json_object's mask. The bias depends
 * on the row alone, so it serves draft rows too. */
static void seq_logits(void *ctx, float *row, int32_t V, const int32_t *prev, int32_t n_prev) {
    seq *s = ctx;
    const q35_api_request *a = &s->req->api;
    for (int32_t i = 0; i < a->n_bias; i++) row[a->bias_ids[i]] += a->bias[i];
    if (s->schema) seq_schema_mask(s, row, V, prev, n_prev);
    else if (s->json_on) seq_json_mask(s, row, V, prev, n_prev);
}

/* Starts s's generation from its prompt's last logits row. */
void q35_seq_begin(q35_sched *S, seq *s, float *row) {
    const q35_api_request *a = &s->req->api;
    bool hook = s->json_on || s->schema || a->n_bias;
    q35_gen_params gp = {.sampler = s->sampler, .logits_fn = hook ? seq_logits : NULL, .logits_ctx = s,
                         .max_tokens = s->max_tokens, .min_tokens = a->min_tokens, .ignore_eos = a->ignore_eos,
                         .eos_ids = S->eos, .n_eos_ids = S->n_eos, .stop_ids = a->stop_token_ids,
                         .n_stop_ids = a->n_stop_token_ids};
    q35_error err;
    q35_gen_out o;
    if (a->logprobs >= 0) memcpy(S->raw, row, sizeof *row * (size_t)S->V);
    if (q35_generation_new(S->sessions[s->slot], &gp, &s->gen, &err) || q35_generation_begin(s->gen, row, &o, &err)) {
        q35_seq_fail(S, s, err.msg);
        return;
    }
    s->last = o.tokens[0];
    seq_take_token(S, s, o.tokens[0], o.stop);
}


/* One step for every decoding sequence in one batch (the weights are read
 * once for all their rows); each yields 1..k+1 tokens, sent in order. */
static void decode_step(q35_sched *S, seq **list, int n) {
    q35_spec_stats before = {0}, after = {0};
    for (int i = 0; i < n; i++) {
        q35_spec_stats st = q35_session_spec_stats(S->sessions[list[i]->slot]);
        before.steps += st.steps; before.drafts += st.drafts; before.accepted += st.accepted;
        for (int j = 0; j < Q35_SPEC_K_MAX; j++) before.accepted_at[j] += st.accepted_at[j];
        S->batch_gen[i] = list[i]->gen;
    }
    q35_error err;
    if (q35_generation_batch_step(S->batch_gen, n, S->batch_out, &err)) {
        for (int i = 0; i < n; i++) q35_seq_fail(S, list[i], err.msg);
        return;
    }
    for (int i = 0; i < n; i++) {
        q35_spec_stats st = q35_session_spec_stats(S->sessions[list[i]->slot]);
        after.steps += st.steps; after.drafts += st.drafts; after.accepted += st.accepted;
        for (int j = 0; j < Q35_SPEC_K_MAX; j++) after.accepted_at[j] += st.accepted_at[j];
    }
    pthread_mutex_lock(&S->mu);
    S->spec_steps += (unsigned long long)(after.steps - before.steps);
    S->spec_drafts += (unsigned long long)(after.drafts - before.drafts);
    S->spec_accepted += (unsigned long long)(after.accepted - before.accepted);
    for (int j = 0; j < Q35_SPEC_K_MAX; j++) S->spec_accepted_at[j] += (unsigned long long)(after.accepted_at[j] - before.accepted_at[j]);
    pthread_mutex_unlock(&S->mu);
    for (int i = 0; i < n; i++) {
        seq *s = list[i];
        const q35_gen_out *o = &S->batch_out[i];
        const float *rows = s->req->api.logprobs >= 0 ? q35_session_step_logits(S->sessions[s->slot]) : NULL;
        for (int32_t k = 0; k < o->n_tokens; k++) {
            if (rows) memcpy(S->raw, rows + (size_t)k * (size_t)S->V, sizeof *S->raw * (size_t)S->V);
            s->last = o->tokens[k];
            if (seq_take_token(S, s, o->tokens[k], k + 1 == o->n_tokens ? o->stop : Q35_STOP_NONE)) break;
        }
    }
}

static seq *seq_new(q35_sched *S, q35_task *r, int32_t prompt_index, int32_t j) {
    seq *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->sched = S;
    s->req = r;
    s->prompt_index = prompt_index;
    s->choice = prompt_index * r->api.n + j;
    s->prompt = r->prompt_ids[prompt_index];
    s->n_prompt = r->prompt_len[prompt_index];
    s->max_tokens = r->max_tokens[prompt_index];
    s->tokens = malloc(sizeof *s->tokens * ((size_t)s->n_prompt + (size_t)s->max_tokens));
    q35_sampler_params sp = r->api.sampling;
    sp.seed += (uint64_t)j; /* choice j of a seeded request: its own stream */
    q35_error err;
    s->dec = q35_text_decoder_new(S->tok);
    if (!s->tokens || !s->dec || q35_sampler_new(&sp, S->V, &s->sampler, &err)) { seq_free(s); return NULL; }
    memcpy(s->tokens, s->prompt, sizeof *s->tokens * (size_t)s->n_prompt);
    q35_sampler_set_prompt(s->sampler, s->prompt, s->n_prompt);
    q35_stop_init(&s->stop, r->api.stop, r->api.n_stop);
    s->schema = S->trie ? r->api.schema : NULL;
    s->json_on = (r->api.json_object && S->tok_bytes) || s->schema;
    s->json_wait = s->json_on && r->think && S->think_end >= 0;
    q35_json_prefix_init(&s->json);
    if (s->schema) q35_schema_start(s->schema, &s->gs);
    return s;
}

bool q35_sched_submit(q35_sched *S, q35_task *r) {
    int32_t m = r->api.n_prompts * r->api.n;
    seq **list = calloc((size_t)m, sizeof *list);
    if (!list) return false;
    for (int32_t p = 0, k = 0; p < r->api.n_prompts; p++)
        for (int32_t j = 0; j < r->api.n; j++, k++)
            if (!(list[k] = seq_new(S, r, p, j))) {
                for (int32_t i = 0; i < k; i++) seq_free(list[i]);
                free(list);
                return false;
            }
    pthread_mutex_lock(&S->mu);
    if (S->stop || S->n_waiting_req >= S->max_queue) {
        pthread_mutex_unlock(&S->mu);
        for (int32_t i = 0; i < m; i++) seq_free(list[i]);
        free(list);
        return false;
    }
    pthread_mutex_lock(&r->mu);
    r->refs += m;
    pthread_mutex_unlock(&r->mu);
    for (int32_t i = 0; i < m; i++) {
        if (S->wait_tail) S->wait_tail->next = list[i]; else S->wait_head = list[i];
        S->wait_tail = list[i];
    }
    S->n_waiting_req++;
    pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
    free(list);
    return true;
}


/* Under S->mu: is any later waiting sequence from the same request? */
static bool more_waiting_of(q35_sched *S, const q35_task *r) {
    for (seq *w = S->wait_head; w; w = w->next)
        if (w->req == r) return true;
    return false;
}

static void *sched_main(void *arg) {
    q35_sched *S = arg;
    for (;;) {
        pthread_mutex_lock(&S->mu);
        for (;;) {
            if (S->stop) break;
            bool active = false;
            for (int i = 0; i < S->n_slots; i++) active |= S->slots[i] != NULL;
            if (active || S->wait_head) break;
            pthread_cond_wait(&S->cv, &S->mu);
        }
        for (int k = 0; k < S->n_slots && S->wait_head; k++) {
            int i = q35_sched_pick_slot(S, S->wait_head);
            if (i < 0) break;
            seq *s = S->wait_head;
            S->wait_head = s->next;
            if (!S->wait_head) S->wait_tail = NULL;
            s->next = NULL;
            s->slot = i;
            s->state = SEQ_PREFILL;
            S->slots[i] = s;
            S->n_running++;
            if (!more_waiting_of(S, s->req)) S->n_waiting_req--;
        }
        bool stopping = S->stop;
        pthread_mutex_unlock(&S->mu);

        for (int i = 0; i < S->n_slots; i++) {
            seq *s = S->slots[i];
            if (!s) continue;
            if (stopping || atomic_load(&s->req->cancelled)) {
                if (stopping) {
                    pthread_mutex_lock(&s->req->mu);
                    if (!s->req->error) s->req->error = strdup("the server is shutting down");
                    pthread_mutex_unlock(&s->req->mu);
                }
                q35_event ev = {.choice = s->choice, .token = -1, .text = strdup(""), .finish = Q35_FIN_ABORT, .stop_id = -1};
                q35_task_push(s->req, &ev);
                seq_end(S, s, Q35_FIN_ABORT);
            }
        }
        if (stopping) {
            pthread_mutex_lock(&S->mu);
            seq *w = S->wait_head;
            S->wait_head = S->wait_tail = NULL;
            pthread_mutex_unlock(&S->mu);
            while (w) {
                seq *next = w->next;
                q35_task *r = w->req;
                pthread_mutex_lock(&r->mu);
                if (!r->error) r->error = strdup("the server is shutting down");
                r->n_finished++;
                pthread_cond_broadcast(&r->cv);
                pthread_mutex_unlock(&r->mu);
                q35_task_release(r);
                seq_free(w);
                w = next;
            }
            break;
        }

        for (int i = 0; i < S->n_slots; i++)
            if (S->slots[i] && S->slots[i]->state == SEQ_PREFILL) q35_seq_prefill(S, S->slots[i]);

        int nb = 0;
        for (int i = 0; i < S->n_slots; i++)
            if (S->slots[i] && S->slots[i]->state == SEQ_DECODE) S->batch_seq[nb++] = S->slots[i];
        if (nb) decode_step(S, S->batch_seq, nb);
    }
    return NULL;
}

/* Each token's bytes (ids below the vocabulary size, specials left out),
 * which json_object needs; NULL tables without a tokenizer. */
static int token_bytes_table(q35_sched *S) {
    S->think_end = S->tok ? q35_token_id(S->tok, "</think>", 8) : -1;
    S->tool_open = S->tok ? q35_token_id(S->tok, "<tool_call>", 11) : -1;
    if (!S->tok) return 0;
    S->tok_bytes = calloc((size_t)S->V, sizeof *S->tok_bytes);
    S->tok_len = calloc((size_t)S->V, sizeof *S->tok_len);
    if (!S->tok_bytes || !S->tok_len) return -1;
    for (int32_t t = 0; t < S->V; t++)
        if (t < q35_tokenizer_n_ids(S->tok) && !q35_token_is_special(S->tok, t))
            S->tok_bytes[t] = q35_token_bytes(S->tok, t, &S->tok_len[t]);
    S->trie = q35_token_trie_new(S->tok_bytes, S->tok_len, S->V);
    S->live = malloc((size_t)S->V);
    return S->trie && S->live ? 0 : -1;
}

/* Frees the sessions, the buffers and the cache (the thread is not running). */
static void sched_release(q35_sched *S) {
    q35_prefix_cache_free(&S->cache);
    for (int i = 0; S->sessions && i < S->n_slots; i++) q35_session_free(S->sessions[i]);
    for (int i = 0; S->warm && i < S->n_slots; i++) free(S->warm[i].spans);
    free(S->warm); S->warm = NULL;
    free(S->sessions); S->sessions = NULL;
    free(S->slots); S->slots = NULL;
    free(S->logits); S->logits = NULL;
    free(S->raw); S->raw = NULL;
    free(S->rows); S->rows = NULL;
    free(S->batch_seq); S->batch_seq = NULL;
    free(S->batch_gen); S->batch_gen = NULL;
    free(S->batch_out); S->batch_out = NULL;
    free(S->tok_bytes); S->tok_bytes = NULL;
    q35_token_trie_free(S->trie); S->trie = NULL;
    free(S->live); S->live = NULL;
    free(S->tok_len); S->tok_len = NULL;
}

static int sched_init(q35_sched *S, const q35_sched_config *cfg, char *msg, size_t msg_size) {
    S->engine = cfg->engine;
    S->tok = cfg->tok;
    S->metrics = cfg->metrics;
    S->V = q35_engine_info(cfg->engine)->vocab_size;
    S->n_ctx = cfg->n_ctx;
    S->max_queue = cfg->max_queue;
    S->prefill_chunk = cfg->prefill_chunk;
    S->n_eos = cfg->n_eos < 8 ? cfg->n_eos : 8;
    memcpy(S->eos, cfg->eos, sizeof *cfg->eos * (size_t)S->n_eos);
    S->n_slots = cfg->parallel;
    S->spec_k = cfg->spec_k;
    q35_prefix_cache_init(&S->cache, cfg->cache_bytes);
    size_t ns = (size_t)S->n_slots;
    S->sessions = calloc(ns, sizeof *S->sessions);
    S->slots = calloc(ns, sizeof *S->slots);
    S->warm = calloc(ns, sizeof *S->warm);
    S->logits = malloc(sizeof *S->logits * ns * (size_t)S->V);
    S->raw = malloc(sizeof *S->raw * (size_t)S->V);
    /* prompt logprobs: 64 MiB of rows (64 at Qwen3.5's vocabulary), touched only when used */
    S->rows_cap = (int32_t)((64u << 20) / (sizeof *S->rows * (size_t)S->V));
    if (S->rows_cap > S->prefill_chunk) S->rows_cap = S->prefill_chunk;
    if (S->rows_cap < 1) S->rows_cap = 1;
    S->rows = malloc(sizeof *S->rows * (size_t)S->rows_cap * (size_t)S->V);
    S->batch_seq = calloc(ns, sizeof *S->batch_seq);
    S->batch_gen = calloc(ns, sizeof *S->batch_gen);
    S->batch_out = calloc(ns, sizeof *S->batch_out);
    if (!S->sessions || !S->slots || !S->warm || !S->logits || !S->raw || !S->rows || !S->batch_seq || !S->batch_gen || !S->batch_out ||
        token_bytes_table(S)) {
        snprintf(msg, msg_size, "out of memory for %d slots", S->n_slots);
        return -1;
    }
    for (int i = 0; i < S->n_slots; i++) {
        q35_error err;
        if (q35_session_new(S->engine, S->n_ctx, &S->sessions[i], &err) ||
            (S->spec_k > 0 && q35_session_set_spec(S->sessions[i], S->spec_k, &err))) {
            snprintf(msg, msg_size, "session %d: %s", i, err.msg);
            return -1;
        }
    }
    return 0;
}

int q35_sched_start(const q35_sched_config *cfg, q35_sched **out, char *msg, size_t msg_size) {
    *out = NULL;
    q35_sched *S = calloc(1, sizeof *S);
    if (!S) {
        snprintf(msg, msg_size, "out of memory");
        return -1;
    }
    pthread_mutex_init(&S->mu, NULL);
    pthread_cond_init(&S->cv, NULL);
    if (sched_init(S, cfg, msg, msg_size)) {
        q35_sched_free(S);
        return -1;
    }
    if (pthread_create(&S->thread, NULL, sched_main, S)) {
        snprintf(msg, msg_size, "cannot start the scheduler thread");
        q35_sched_free(S);
        return -1;
    }
    S->started = true;
    *out = S;
    return 0;
}

void q35_sched_stop(q35_sched *S) {
    pthread_mutex_lock(&S->mu);
    S->stop = true;
    pthread_cond_signal(&S->cv);
    bool started = S->started;
    S->started = false;
    pthread_mutex_unlock(&S->mu);
    if (!started) return;
    pthread_join(S->thread, NULL);
    sched_release(S);
}

void q35_sched_free(q35_sched *S) {
    if (!S) return;
    q35_sched_stop(S);
    sched_release(S);
    pthread_mutex_destroy(&S->mu);
    pthread_cond_destroy(&S->cv);
    pthread_mutex_destroy(&S->cache.mu);
    free(S);
}

void q35_sched_get_stats(q35_sched *S, q35_sched_stats *st) {
    pthread_mutex_lock(&S->mu);
    st->running = S->n_running;
    int w = 0;
    for (seq *s = S->wait_head; s; s = s->next) w++;
    st->waiting = w;
    st->cache_queries = S->cache_queries;
    st->cache_hits = S->cache_hits;
    st->spec_steps = S->spec_steps;
    st->spec_drafts = S->spec_drafts;
    st->spec_accepted = S->spec_accepted;
    memcpy(st->spec_accepted_at, S->spec_accepted_at, sizeof st->spec_accepted_at);
    st->spec_k = S->spec_k;
    pthread_mutex_unlock(&S->mu);
    q35_prefix_cache_usage_t u;
    q35_prefix_cache_usage(&S->cache, &u);
    st->cache_entries = u.entries;
    st->cache_bytes = u.bytes;
    st->cache_budget = u.budget;
    st->cache_lookup_hits = u.hits;
    st->cache_lookup_misses = u.misses;
    st->cache_evictions = u.evictions;
}
