/* stream.c: streaming responses (stream.h). The route queues a response
 * whose content comes from stream_reader, which libmicrohttpd calls on the
 * connection's thread: it waits for the task's next events (polling the
 * socket, so a hang-up cancels the task), turns each into chunks (chat text
 * through the choice's output parser) and frames them as server-sent
 * events; the end, an error or [DONE] closes the stream. The connection
 * table's watchdog (conn.c) watches it: a client that reads nothing for
 * --write-timeout, or leaves too many events unread, is cut off and its
 * task cancelled. */
#include "server/stream.h"
#include "server/llama.h"
#include "server/response.h"
#include "server/sse.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>


/* ---- streaming ---- */

typedef struct stream_state {
    q35_server *srv;
    q35_task *r;
    int fd;
    char *out;
    size_t out_len, out_cap, out_off;
    size_t next_ev;
    bool *started;             /* (n_choices) role / echo chunk sent */
    q35_output_parser **parsers; /* (n_choices) chat only */
    int *n_tools;              /* (n_choices) tool calls streamed */
    size_t *text_off;          /* (n_choices) completions text_offset */
    bool finished;             /* [DONE] queued */
    q35_stream_watch watch;    /* what the watchdog sees */
} stream_state;

static void append_chunk(stream_state *st, json_t *choice) {
    json_t *chunk = st->r->llama ? q35_llama_chunk(choice) : q35_chunk_base(st->srv->cfg.served_name, st->r, json_pack("[o]", choice));
    q35_sse_append_json(&st->out, &st->out_len, &st->out_cap, chunk);
    json_decref(chunk);
}

/* Chat: the event's text goes through the choice's output parser; each
 * delta it yields becomes a chunk, and the choice's end a last chunk with
 * the finish reason ("tool_calls" when calls were made). */
static void stream_chat_event(stream_state *st, const q35_event *e, bool want_lp) {
    q35_task *r = st->r;
    int32_t c = e->choice;
    q35_error err;
    if (!st->parsers[c] && q35_output_parser_new(r->tools_json, r->think, &st->parsers[c], &err)) st->parsers[c] = NULL;
    json_t *lp = want_lp ? json_pack("{s:[o]}", "content", q35_chat_logprob_entry(st->srv->tok, e)) : NULL;
    for (int pass = 0; pass < 2; pass++) {
        const q35_delta *d = NULL;
        size_t nd = 0;
        if (pass == 0 && e->len) {
            if (st->parsers[c]) q35_output_parser_feed(st->parsers[c], e->text, e->len, &d, &nd, &err);
            else append_chunk(st, json_pack("{s:i, s:{s:o}, s:n, s:n}", "index", c, "delta", "content",
                                            q35_json_text(e->text, e->len), "logprobs", "finish_reason"));
        }
        if (pass == 1 && e->finish && st->parsers[c]) q35_output_parser_finish(st->parsers[c], &d, &nd, &err);
        for (size_t i = 0; i < nd; i++) {
            if (d[i].kind == Q35_DELTA_TOOL_NAME) st->n_tools[c]++;
            append_chunk(st, json_pack("{s:i, s:o, s:o, s:n}", "index", c, "delta", q35_delta_json(&d[i]), "logprobs",
                                       lp ? lp : json_null(), "finish_reason"));
            lp = NULL;
        }
    }
    if (lp) append_chunk(st, json_pack("{s:i, s:{}, s:o, s:n}", "index", c, "delta", "logprobs", lp, "finish_reason"));
    if (e->finish)
        append_chunk(st, json_pack("{s:i, s:{}, s:n, s:s, s:o}", "index", c, "delta", "logprobs", "finish_reason",
                                   st->n_tools[c] && e->finish == Q35_FIN_STOP ? "tool_calls" : q35_finish_name(e->finish),
                                   "stop_reason", q35_stop_reason_json(e)));
}

static void stream_event(stream_state *st, const q35_event *e) {
    q35_task *r = st->r;
    bool chat = r->api.kind == Q35_API_CHAT;
    int32_t c = e->choice;
    if (!st->started[c]) {
        st->started[c] = true;
        json_t *ch = NULL;
        if (chat)
            ch = json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", c, "delta", "role", "assistant", "content", "", "logprobs", "finish_reason");
        else if (r->api.echo) {
            char *t = q35_echo_text(st->srv->tok, r, c / r->api.n);
            json_t *lp = json_null();
            if (r->api.logprobs >= 0 && r->prompt_lp) {
                lp = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
                q35_prompt_logprobs_add(st->srv->tok, lp, r, c / r->api.n);
            }
            ch = json_pack("{s:i, s:s, s:o, s:n}", "index", c, "text", t ? t : "", "logprobs", lp, "finish_reason");
            st->text_off[c] += t ? strlen(t) : 0;
            free(t);
        }
        if (ch) append_chunk(st, ch);
    }
    bool want_lp = r->api.logprobs >= 0 && e->token >= 0 && !r->api.echo_only;
    if (chat) {
        stream_chat_event(st, e, want_lp);
        return;
    }
    size_t len = r->api.echo_only ? 0 : e->len; /* echo without generation: the finish alone follows the prompt */
    if (!len && !e->finish && !want_lp) return;
    json_t *lp = json_null();
    if (want_lp) {
        lp = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
        q35_completion_logprobs_add(st->srv->tok, lp, e, st->text_off[c]);
    }
    st->text_off[c] += len;
    json_t *text = json_stringn(e->text ? e->text : "", len);
    json_t *ch = json_pack("{s:i, s:o, s:o}", "index", c, "text", text, "logprobs", lp);
    json_object_set_new(ch, "finish_reason", e->finish ? json_string(q35_finish_name(e->finish)) : json_null());
    json_object_set_new(ch, "stop_reason", e->finish ? q35_stop_reason_json(e) : json_null());
    if (r->api.return_token_ids && e->token >= 0 && !r->api.echo_only) json_object_set_new(ch, "token_ids", json_pack("[i]", e->token));
    append_chunk(st, ch);
}

static ssize_t stream_read(stream_state *st, char *buf, size_t max);

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_state *st = cls;
    ssize_t n = stream_read(st, buf, max);
    atomic_store(&st->watch.consumed, st->next_ev);
    return n;
}

static ssize_t stream_read(stream_state *st, char *buf, size_t max) {
    q35_task *r = st->r;
    while (st->out_off == st->out_len) {
        if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        st->out_len = st->out_off = 0;
        pthread_mutex_lock(&r->mu);
        while (st->next_ev == r->n_ev && r->n_finished < r->n_choices && !r->error) {
            if (q35_http_peer_gone(st->fd)) {
                atomic_store(&r->cancelled, 1);
                pthread_mutex_unlock(&r->mu);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            q35_http_wait(r);
        }
        size_t upto = r->n_ev;
        bool done = r->n_finished == r->n_choices;
        char *error = r->error ? strdup(r->error) : NULL;
        pthread_mutex_unlock(&r->mu);
        /* events are appended, never moved while we read below index upto
         * except by realloc, so copy under the lock one at a time */
        for (; st->next_ev < upto; st->next_ev++) {
            pthread_mutex_lock(&r->mu);
            q35_event e = r->ev[st->next_ev];
            pthread_mutex_unlock(&r->mu);
            if (e.finish == Q35_FIN_ERROR || e.finish == Q35_FIN_ABORT) continue;
            stream_event(st, &e);
        }
        if (error) {
            char *ej = q35_api_error_json(atomic_load(&st->srv->stopping) ? 503 : 500, error, NULL);
            if (ej) q35_sse_append_raw(&st->out, &st->out_len, &st->out_cap, ej);
            free(ej);
            free(error);
            q35_sse_append_raw(&st->out, &st->out_len, &st->out_cap, "[DONE]");
            st->finished = true;
        } else if (done && st->next_ev == upto) {
            if (r->api.include_usage && !r->llama) {
                json_t *chunk = q35_chunk_base(st->srv->cfg.served_name, r, json_array());
                json_object_set_new(chunk, "usage", q35_usage_json(r));
                q35_sse_append_json(&st->out, &st->out_len, &st->out_cap, chunk);
                json_decref(chunk);
            }
            if (!r->llama) q35_sse_append_raw(&st->out, &st->out_len, &st->out_cap, "[DONE]"); /* llama-server sends none */
            st->finished = true;
        }
    }
    size_t n = st->out_len - st->out_off;
    if (n > max) n = max;
    memcpy(buf, st->out + st->out_off, n);
    st->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream_state *st = cls;
    q35_conn_unwatch(&st->srv->conns, &st->watch);
    atomic_fetch_sub(&st->srv->live_streams, 1);
    pthread_mutex_lock(&st->r->mu);
    bool done = st->r->n_finished == st->r->n_choices;
    pthread_mutex_unlock(&st->r->mu);
    if (!done) atomic_store(&st->r->cancelled, 1);
    for (int32_t i = 0; st->parsers && i < st->r->n_choices; i++) q35_output_parser_free(st->parsers[i]);
    free(st->parsers);
    free(st->n_tools);
    q35_task_release(st->r);
    free(st->out);
    free(st->started);
    free(st->text_off);
    free(st);
}

/* ---- request handling ---- */


enum MHD_Result q35_stream_respond(q35_server *srv, struct MHD_Connection *c, q35_task *r, int fd) {
    stream_state *st = calloc(1, sizeof *st);
    if (st) {
        st->started = calloc((size_t)r->n_choices, sizeof *st->started);
        st->text_off = calloc((size_t)r->n_choices, sizeof *st->text_off);
        st->parsers = calloc((size_t)r->n_choices, sizeof *st->parsers);
        st->n_tools = calloc((size_t)r->n_choices, sizeof *st->n_tools);
    }
    if (!st || !st->started || !st->text_off || !st->parsers || !st->n_tools) {
        if (st) { free(st->started); free(st->text_off); free(st->parsers); free(st->n_tools); free(st); }
        atomic_store(&r->cancelled, 1);
        q35_task_release(r);
        return q35_http_send_error(c, 500, "out of memory", NULL);
    }
    st->srv = srv;
    st->r = r;
    st->fd = fd;
    st->watch.task = r;
    atomic_fetch_add(&srv->live_streams, 1); /* stream_free counts it down, also on failure below */
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, st, stream_free);
    if (!resp) { stream_free(st); return MHD_NO; }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    q35_http_headers(c, resp, 200);
    /* the idle limit is for clients that stall; a stream may wait on
     * the queue or a long prompt, so it has none, and its connection
     * ends with it (hang-ups are caught by polling the socket) */
    MHD_add_response_header(resp, "Connection", "close");
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    /* a bounded socket buffer: what a client leaves unread stays in the
     * task, where the watchdog sees it (the kernel would grow it to MiBs) */
    int sndbuf = Q35_STREAM_SNDBUF;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    q35_conn_watch(&srv->conns, c, &st->watch);
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}
