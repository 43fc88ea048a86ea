/* task.c: the task a route and the scheduler share (sched.h): created by a
 * route, filled by the scheduler's events, freed by whichever side lets go
 * of it last. */
#include "server/sched.h"

#include <stdlib.h>
#include <string.h>

q35_task *q35_task_new(void) {
    q35_task *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->refs = 1;
    return t;
}

int q35_task_alloc(q35_task *t) {
    size_t np = (size_t)t->api.n_prompts;
    t->prompt_ids = calloc(np, sizeof *t->prompt_ids);
    t->prompt_len = calloc(np, sizeof *t->prompt_len);
    t->max_tokens = calloc(np, sizeof *t->max_tokens);
    t->prompt_ready = calloc(np, sizeof *t->prompt_ready);
    t->n_choices = t->api.n_prompts * t->api.n;
    t->completion_tokens = calloc((size_t)t->n_choices, sizeof *t->completion_tokens);
    return t->prompt_ids && t->prompt_len && t->max_tokens && t->prompt_ready && t->completion_tokens ? 0 : -1;
}

int q35_task_alloc_prompt_lp(q35_task *t) {
    if (t->api.prompt_logprobs < 0) return 0;
    t->prompt_lp = calloc((size_t)t->api.n_prompts, sizeof *t->prompt_lp);
    if (!t->prompt_lp) return -1;
    for (int32_t p = 0; p < t->api.n_prompts; p++) {
        q35_prompt_lp *l = &t->prompt_lp[p];
        size_t n = (size_t)t->prompt_len[p], k = (size_t)t->api.prompt_logprobs;
        l->n = (int32_t)n;
        l->k = (int32_t)k;
        l->logprob = calloc(n, sizeof *l->logprob);
        l->rank = calloc(n, sizeof *l->rank);
        l->top_ids = calloc(n * k + 1, sizeof *l->top_ids);
        l->top_lp = calloc(n * k + 1, sizeof *l->top_lp);
        if (!l->logprob || !l->rank || !l->top_ids || !l->top_lp) return -1;
    }
    return 0;
}

void q35_prompt_lp_fill(q35_prompt_lp *l, const float *logits, int32_t V, int32_t first, int32_t n_rows,
                        const int32_t *prompt) {
    for (int32_t i = 0; i < n_rows && first + i + 1 < l->n; i++) {
        const float *row = logits + (size_t)i * (size_t)V;
        int32_t at = first + i + 1, tok = prompt[at], above = 0;
        size_t k = (size_t)l->k;
        l->logprob[at] = q35_logprobs(row, V, tok, l->k, l->top_ids + (size_t)at * k, l->top_lp + (size_t)at * k);
        for (int32_t t = 0; t < V; t++) above += row[t] > row[tok];
        l->rank[at] = above + 1;
    }
}

void q35_task_release(q35_task *t) {
    pthread_mutex_lock(&t->mu);
    int left = --t->refs;
    pthread_mutex_unlock(&t->mu);
    if (left) return;
    for (size_t i = 0; i < t->n_ev; i++) { free(t->ev[i].text); free(t->ev[i].stop_str); }
    free(t->ev);
    for (int32_t i = 0; t->prompt_ids && i < t->api.n_prompts; i++) free(t->prompt_ids[i]);
    free(t->prompt_ids);
    for (int32_t k = 0; t->embeds && k < t->api.n_images; k++) q35_image_embeds_free(t->embeds[k]);
    free(t->embeds);
    free(t->prompt_len);
    free(t->max_tokens);
    free(t->prompt_ready);
    for (int32_t i = 0; t->prompt_lp && i < t->api.n_prompts; i++) {
        free(t->prompt_lp[i].logprob);
        free(t->prompt_lp[i].rank);
        free(t->prompt_lp[i].top_ids);
        free(t->prompt_lp[i].top_lp);
    }
    free(t->prompt_lp);
    free(t->tools_json);
    free(t->completion_tokens);
    free(t->error);
    q35_api_request_free(&t->api);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

void q35_task_push(q35_task *t, q35_event *ev) {
    pthread_mutex_lock(&t->mu);
    if (t->n_ev == t->cap_ev) {
        size_t nc = t->cap_ev ? 2 * t->cap_ev : 64;
        q35_event *ne = realloc(t->ev, nc * sizeof *ne);
        if (!ne) { /* keep the finish, lose the text */
            free(ev->text);
            free(ev->stop_str);
            if (ev->finish && t->n_ev) t->ev[t->n_ev - 1].finish = ev->finish;
            pthread_mutex_unlock(&t->mu);
            return;
        }
        t->ev = ne;
        t->cap_ev = nc;
    }
    t->ev[t->n_ev++] = *ev;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}
