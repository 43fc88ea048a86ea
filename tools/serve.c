/* serve.c: `qwen35 serve`, an OpenAI-compatible HTTP server (see serve.h).
 *
 * libmicrohttpd runs one thread per connection. A connection's thread reads
 * the body (bounded in size and time), checks the route, the method and the
 * API key, parses the request (src/api.c), tokenizes it and hands it to the
 * scheduler (serve_sched.c). Then it either waits for every choice to finish
 * and sends one JSON body, or streams SSE chunks from a content-reader
 * callback as the scheduler appends token events. While it waits it polls
 * its socket, so a client that hangs up cancels its request at once. */
#include "cli.h"
#include "serve.h"
#include "base/utf8.h"
#include "base/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static serve_config C;
static long g_cache_mb = -1, g_spec_k = -1; /* -1: the defaults */
static const char *g_draft_vocab; /* --draft-vocab FILE */
static q35_engine *g_engine;
static const q35_model_info *g_info;
static q35_api_limits g_limits;
static atomic_int g_ready;
static atomic_int g_stopping;
static atomic_int g_live_streams; /* streaming responses MHD still holds */
static atomic_ullong g_req_counter;

/* ---- text ----
 * With the model directory's tokenizer, generated ids stream through a
 * q35_detokenizer (special tokens skipped, as vLLM's default). Without one
 * the server still serves token-id prompts, and each token shows as "<id>". */

static q35_tokenizer *g_tok;

struct text_decoder {
    q35_detokenizer *d;
    char buf[24];
};

text_decoder *decoder_new(void) {
    text_decoder *t = calloc(1, sizeof *t);
    q35_error err;
    if (t && g_tok && q35_detokenizer_new(g_tok, 1, &t->d, &err)) { free(t); return NULL; }
    return t;
}
void decoder_free(text_decoder *t) {
    if (!t) return;
    q35_detokenizer_free(t->d);
    free(t);
}
const char *decoder_feed(text_decoder *t, int32_t token, size_t *len) {
    if (t->d) return q35_detokenizer_feed(t->d, token, len);
    int n = snprintf(t->buf, sizeof t->buf, "<%d>", (int)token);
    *len = (size_t)n;
    return t->buf;
}
const char *decoder_flush(text_decoder *t, size_t *len) {
    if (t->d) return q35_detokenizer_flush(t->d, len);
    t->buf[0] = 0;
    *len = 0;
    return t->buf;
}

static int have_tokenizer(void) { return g_tok != NULL; }

/* A JSON string of text that may not be valid UTF-8 (a token's bytes):
 * as is when valid, else vLLM's "bytes:\\xNN..." form. */
static json_t *jtext(const char *s, size_t n) {
    if (q35_utf8_valid(s, n)) return json_stringn(s, n);
    char *b = malloc(6 + 4 * n + 1);
    if (!b) return json_string("");
    size_t k = (size_t)sprintf(b, "bytes:");
    for (size_t i = 0; i < n; i++) k += (size_t)sprintf(b + k, "\\x%02x", (unsigned char)s[i]);
    json_t *j = json_stringn(b, k);
    free(b);
    return j;
}

static json_t *token_bytes_json(int32_t id) {
    json_t *a = json_array();
    size_t n = 0;
    const char *b = g_tok ? q35_token_bytes(g_tok, id, &n) : NULL;
    for (size_t i = 0; b && i < n; i++) json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}

/* ---- metrics ---- */

static struct {
    pthread_mutex_t mu;
    q35_hist ttft, itl, e2e;
    unsigned long long prompt_tokens, gen_tokens;
    unsigned long long finished[FIN_ERROR + 1];
    unsigned long long rejected;
} M = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void metrics_init(void) {
    static const double ttft_b[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
    static const double itl_b[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
    static const double e2e_b[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                                   40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
    q35_hist_init(&M.ttft, ttft_b, (int)(sizeof ttft_b / sizeof *ttft_b));
    q35_hist_init(&M.itl, itl_b, (int)(sizeof itl_b / sizeof *itl_b));
    q35_hist_init(&M.e2e, e2e_b, (int)(sizeof e2e_b / sizeof *e2e_b));
}

void metrics_first_token(double s) { pthread_mutex_lock(&M.mu); q35_hist_observe(&M.ttft, s); pthread_mutex_unlock(&M.mu); }
void metrics_token_gap(double s) { pthread_mutex_lock(&M.mu); q35_hist_observe(&M.itl, s); pthread_mutex_unlock(&M.mu); }
void metrics_tokens(int32_t p, int32_t g) {
    pthread_mutex_lock(&M.mu);
    M.prompt_tokens += (unsigned long long)p;
    M.gen_tokens += (unsigned long long)g;
    pthread_mutex_unlock(&M.mu);
}
void metrics_request_done(int finish, double e2e) {
    pthread_mutex_lock(&M.mu);
    M.finished[finish]++;
    q35_hist_observe(&M.e2e, e2e);
    pthread_mutex_unlock(&M.mu);
}

/* VmRSS / VmHWM from /proc/self/status, in bytes. */
static void read_rss(double *rss, double *hwm) {
    *rss = *hwm = 0;
    FILE *fp = fopen("/proc/self/status", "r");
    if (!fp) return;
    char line[256];
    while (fgets(line, sizeof line, fp)) {
        long kb;
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) *rss = (double)kb * 1024;
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) *hwm = (double)kb * 1024;
    }
    fclose(fp);
}

/* One more sample of a metric whose HELP and TYPE lines are out already. */
static void prom_sample(char **b, size_t *n, size_t *cap, const char *name, const char *labels, unsigned long long v) {
    char line[700];
    snprintf(line, sizeof line, "%s{%s} %llu\n", name, labels, v);
    size_t ll = strlen(line);
    char *nb = realloc(*b, *n + ll + 1);
    if (nb) { *b = nb; memcpy(*b + *n, line, ll + 1); *n += ll; *cap = *n + 1; }
}

static char *metrics_text(size_t *len) {
    char *b = NULL;
    size_t n = 0, cap = 0;
    char lab[300];
    snprintf(lab, sizeof lab, "model_name=\"%s\"", C.served_name);
    sched_stats st;
    sched_get_stats(&st);
    double rss, hwm;
    read_rss(&rss, &hwm);
    pthread_mutex_lock(&M.mu);
    q35_prom_value(&b, &n, &cap, "vllm:num_requests_running", "gauge", "Requests in the decode batch.", lab, st.running);
    q35_prom_value(&b, &n, &cap, "vllm:num_requests_waiting", "gauge", "Sequences waiting for a slot.", lab, st.waiting);
    q35_prom_value(&b, &n, &cap, "vllm:prompt_tokens_total", "counter", "Prompt tokens processed.", lab, (double)M.prompt_tokens);
    q35_prom_value(&b, &n, &cap, "vllm:generation_tokens_total", "counter", "Tokens generated.", lab, (double)M.gen_tokens);
    static const char *const reasons[] = {"none", "stop", "length", "abort", "error"};
    char l2[400];
    for (int i = FIN_STOP; i <= FIN_ERROR; i++) {
        snprintf(l2, sizeof l2, "%s,finished_reason=\"%s\"", lab, reasons[i]);
        if (i == FIN_STOP) q35_prom_value(&b, &n, &cap, "vllm:request_success_total", "counter", "Finished requests by reason.", l2, (double)M.finished[i]);
        else prom_sample(&b, &n, &cap, "vllm:request_success_total", l2, M.finished[i]);
    }
    q35_prom_value(&b, &n, &cap, "qwen35:requests_rejected_total", "counter", "Requests refused because the queue was full.", lab, (double)M.rejected);
    q35_prom_hist(&b, &n, &cap, "vllm:time_to_first_token_seconds", "Time to first token.", lab, &M.ttft);
    q35_prom_hist(&b, &n, &cap, "vllm:inter_token_latency_seconds", "Time between two tokens of a sequence.", lab, &M.itl);
    q35_prom_hist(&b, &n, &cap, "vllm:e2e_request_latency_seconds", "Request latency, arrival to last token.", lab, &M.e2e);
    pthread_mutex_unlock(&M.mu);
    q35_prom_value(&b, &n, &cap, "vllm:spec_decode_num_drafts_total", "counter", "Speculation steps (MTP drafts verified).", lab, (double)st.spec_steps);
    q35_prom_value(&b, &n, &cap, "vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", lab, (double)st.spec_drafts);
    q35_prom_value(&b, &n, &cap, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", lab, (double)st.spec_accepted);
    for (int j = 0; j < st.spec_k && j < Q35_SPEC_K_MAX; j++) { /* draft j of a step is accepted only after 0..j-1 */
        snprintf(l2, sizeof l2, "%s,position=\"%d\"", lab, j);
        if (!j) q35_prom_value(&b, &n, &cap, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                               "Draft tokens accepted, by their position in a step.", l2, (double)st.spec_accepted_at[j]);
        else prom_sample(&b, &n, &cap, "vllm:spec_decode_num_accepted_tokens_per_pos_total", l2, st.spec_accepted_at[j]);
    }
    q35_prom_value(&b, &n, &cap, "vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", lab, (double)st.cache_queries);
    q35_prom_value(&b, &n, &cap, "vllm:prefix_cache_hits_total", "counter", "Prompt tokens restored from the prefix cache.", lab, (double)st.cache_hits);
    q35_prom_value(&b, &n, &cap, "qwen35:prefix_cache_bytes", "gauge", "Bytes held by prefix cache snapshots.", lab, (double)st.cache_bytes);
    q35_prom_value(&b, &n, &cap, "qwen35:prefix_cache_entries", "gauge", "Snapshots in the prefix cache.", lab, (double)st.cache_entries);
    q35_prom_value(&b, &n, &cap, "process_resident_memory_bytes", "gauge", "Resident memory (VmRSS).", "", rss);
    q35_prom_value(&b, &n, &cap, "process_resident_memory_peak_bytes", "gauge", "Peak resident memory (VmHWM).", "", hwm);
    *len = n;
    return b;
}

/* ---- HTTP helpers ---- */

static enum MHD_Result send_body(struct MHD_Connection *c, unsigned status, const char *type, char *body, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body ? body : (char *)"", body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) { free(body); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return MHD_NO;
    return send_body(c, status, "application/json", s, strlen(s));
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *msg, const char *param) {
    char *s = q35_api_error_json((int)status, msg, param);
    if (!s) return MHD_NO;
    return send_body(c, status, "application/json", s, strlen(s));
}

/* Has the peer closed the connection? */
static bool peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
    char ch;
    ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0;
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Waits on r->cv for up to 100 ms (r->mu held). */
static void wait_a_little(request *r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

/* ---- responses ---- */

static const char *finish_name(int f) {
    switch (f) {
    case FIN_STOP: return "stop";
    case FIN_LENGTH: return "length";
    case FIN_ABORT: return "abort";
    default: return "error";
    }
}

/* A token as logprobs show it: its text, or "token_id:N" without a tokenizer. */
static json_t *token_str(int32_t id) {
    size_t n = 0;
    const char *t = g_tok ? q35_token_bytes(g_tok, id, &n) : NULL;
    if (t) return jtext(t, n);
    char b[32];
    snprintf(b, sizeof b, "token_id:%d", (int)id);
    return json_string(b);
}

static json_t *usage_json(request *r) {
    long long p = 0, g = 0;
    for (int32_t i = 0; i < r->api.n_prompts; i++) p += r->prompt_len[i];
    for (int32_t i = 0; i < r->n_choices; i++) g += r->completion_tokens[i];
    return json_pack("{s:I, s:I, s:I, s:{s:i}}", "prompt_tokens", p, "completion_tokens", g, "total_tokens", p + g,
                     "prompt_tokens_details", "cached_tokens", r->cached_tokens);
}

/* Legacy completions logprobs of one event, appended into lp's arrays. */
static void add_completion_logprobs(json_t *lp, const tok_event *e, size_t offset) {
    json_array_append_new(json_object_get(lp, "tokens"), token_str(e->token));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(e->logprob));
    json_t *top = json_object();
    for (int i = 0; i < e->n_top; i++) {
        json_t *k = token_str(e->top_ids[i]);
        json_object_set_new(top, json_string_value(k), json_real(e->top_lp[i]));
        json_decref(k);
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)offset));
}

static json_t *chat_logprob_entry(const tok_event *e) {
    json_t *top = json_array();
    for (int i = 0; i < e->n_top; i++)
        json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", token_str(e->top_ids[i]), "logprob",
                                             (double)e->top_lp[i], "bytes", token_bytes_json(e->top_ids[i])));
    return json_pack("{s:o, s:f, s:o, s:o}", "token", token_str(e->token), "logprob", (double)e->logprob, "bytes",
                     token_bytes_json(e->token), "top_logprobs", top);
}

static json_t *stop_reason_json(const tok_event *e) {
    if (e->stop_str) return json_string(e->stop_str);
    if (e->stop_id >= 0) return json_integer(e->stop_id);
    return json_null();
}

static char *echo_text(request *r, int32_t prompt_index) {
    q35_api_prompt *p = &r->api.prompts[prompt_index];
    if (p->text) return strdup(p->text);
    size_t cap = (size_t)r->prompt_len[prompt_index] * 14 + 1, n = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = 0;
    for (int32_t i = 0; i < r->prompt_len[prompt_index]; i++)
        n += (size_t)snprintf(s + n, cap - n, "<%d>", (int)r->prompt_ids[prompt_index][i]);
    return s;
}

/* ---- chat output: reasoning, content and tool calls ---- */

static json_t *tool_call_id(void) {
    char b[40];
    snprintf(b, sizeof b, "call_%08x%08x%08x", arc4random(), arc4random(), arc4random());
    return json_string(b);
}

/* One parser delta as a chat.completion.chunk delta object. */
static json_t *delta_json(const q35_delta *d) {
    json_t *t = jtext(d->text, d->len);
    switch (d->kind) {
    case Q35_DELTA_CONTENT: return json_pack("{s:o}", "content", t);
    case Q35_DELTA_REASONING: return json_pack("{s:O, s:o}", "reasoning_content", t, "reasoning", t);
    case Q35_DELTA_TOOL_NAME:
        return json_pack("{s:[{s:i, s:o, s:s, s:{s:o, s:s}}]}", "tool_calls", "index", d->tool_index, "id", tool_call_id(),
                         "type", "function", "function", "name", t, "arguments", "");
    default:
        return json_pack("{s:[{s:i, s:{s:o}}]}", "tool_calls", "index", d->tool_index, "function", "arguments", t);
    }
}

/* The assistant message for generated text: content, reasoning_content (and
 * vLLM's reasoning) and tool_calls. *n_tools counts the calls found. */
static json_t *chat_message(request *r, const char *text, size_t len, int *n_tools) {
    q35_output_parser *p = NULL;
    q35_error err;
    const q35_delta *d;
    size_t nd;
    *n_tools = 0;
    if (q35_output_parser_new(r->tools_json, r->think, &p, &err) || q35_output_parser_feed(p, text, len, &d, &nd, &err) ||
        q35_output_parser_finish(p, &d, &nd, &err)) {
        q35_output_parser_free(p);
        return json_pack("{s:s, s:o, s:n, s:[]}", "role", "assistant", "content", jtext(text, len), "reasoning_content", "tool_calls");
    }
    const char *content = q35_output_parser_content(p), *reasoning = q35_output_parser_reasoning(p);
    char *calls = q35_output_parser_tool_calls_json(p);
    json_t *tc = calls ? json_loads(calls, 0, NULL) : NULL;
    free(calls);
    if (!json_is_array(tc)) { json_decref(tc); tc = json_array(); }
    for (size_t i = 0; i < json_array_size(tc); i++) json_object_set_new(json_array_get(tc, i), "id", tool_call_id());
    *n_tools = (int)json_array_size(tc);
    json_t *m = json_pack("{s:s, s:o, s:o}", "role", "assistant", "content",
                          *content || !*n_tools ? jtext(content, strlen(content)) : json_null(), "tool_calls", tc);
    json_t *rc = *reasoning ? jtext(reasoning, strlen(reasoning)) : json_null();
    json_object_set(m, "reasoning_content", rc);
    json_object_set_new(m, "reasoning", rc);
    q35_output_parser_free(p);
    return m;
}

static json_t *full_response(request *r) {
    bool chat = r->api.kind == Q35_API_CHAT;
    json_t *choices = json_array();
    for (int32_t c = 0; c < r->n_choices; c++) {
        char *text = NULL;
        size_t len = 0, cap = 0;
        if (r->api.echo) {
            char *e = echo_text(r, c / r->api.n);
            if (e) { len = strlen(e); cap = len + 1; text = e; }
        }
        json_t *lp = NULL, *ids = json_array();
        if (r->api.logprobs >= 0)
            lp = chat ? json_pack("{s:[]}", "content")
                      : json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
        const tok_event *last = NULL;
        for (size_t i = 0; i < r->n_ev; i++) {
            const tok_event *e = &r->ev[i];
            if (e->choice != c) continue;
            if (e->token >= 0) {
                json_array_append_new(ids, json_integer(e->token));
                if (lp && chat) json_array_append_new(json_object_get(lp, "content"), chat_logprob_entry(e));
                else if (lp) add_completion_logprobs(lp, e, len);
            }
            if (e->len) {
                if (len + e->len + 1 > cap) {
                    cap = 2 * (len + e->len + 1);
                    char *nt = realloc(text, cap);
                    if (!nt) break;
                    text = nt;
                }
                memcpy(text + len, e->text, e->len);
                len += e->len;
                text[len] = 0;
            }
            if (e->finish) last = e;
        }
        int fin = last ? last->finish : FIN_ERROR;
        json_t *ch;
        if (chat) {
            int n_tools;
            json_t *msg = chat_message(r, text ? text : "", len, &n_tools);
            ch = json_pack("{s:i, s:o, s:o, s:s, s:o}", "index", c, "message", msg, "logprobs", lp ? lp : json_null(),
                           "finish_reason", n_tools && fin == FIN_STOP ? "tool_calls" : finish_name(fin),
                           "stop_reason", last ? stop_reason_json(last) : json_null());
        } else {
            ch = json_pack("{s:i, s:o, s:o, s:s, s:o}", "index", c, "text", jtext(text ? text : "", len), "logprobs",
                           lp ? lp : json_null(), "finish_reason", finish_name(fin), "stop_reason",
                           last ? stop_reason_json(last) : json_null());
        }
        free(text);
        if (r->api.return_token_ids) json_object_set_new(ch, "token_ids", ids);
        else json_decref(ids);
        json_array_append_new(choices, ch);
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:n}", "id", r->id, "object", chat ? "chat.completion" : "text_completion",
                     "created", (json_int_t)r->created, "model", C.served_name, "choices", choices, "usage", usage_json(r),
                     "system_fingerprint");
}

/* ---- streaming ---- */

typedef struct stream_state {
    request *r;
    int fd;
    char *out;
    size_t out_len, out_cap, out_off;
    size_t next_ev;
    bool *started;             /* (n_choices) role / echo chunk sent */
    q35_output_parser **parsers; /* (n_choices) chat only */
    int *n_tools;              /* (n_choices) tool calls streamed */
    size_t *text_off;          /* (n_choices) completions text_offset */
    bool finished;             /* [DONE] queued */
} stream_state;

static json_t *chunk_base(request *r, json_t *choices) {
    bool chat = r->api.kind == Q35_API_CHAT;
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", r->id, "object", chat ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)r->created, "model", C.served_name, "choices", choices);
}

static void append_chunk(stream_state *st, json_t *choice) {
    json_t *chunk = chunk_base(st->r, json_pack("[o]", choice));
    q35_sse_append_json(&st->out, &st->out_len, &st->out_cap, chunk);
    json_decref(chunk);
}

/* Chat: the event's text goes through the choice's output parser; each
 * delta it yields becomes a chunk, and the choice's end a last chunk with
 * the finish reason ("tool_calls" when calls were made). */
static void stream_chat_event(stream_state *st, const tok_event *e, bool want_lp) {
    request *r = st->r;
    int32_t c = e->choice;
    q35_error err;
    if (!st->parsers[c] && q35_output_parser_new(r->tools_json, r->think, &st->parsers[c], &err)) st->parsers[c] = NULL;
    json_t *lp = want_lp ? json_pack("{s:[o]}", "content", chat_logprob_entry(e)) : NULL;
    for (int pass = 0; pass < 2; pass++) {
        const q35_delta *d = NULL;
        size_t nd = 0;
        if (pass == 0 && e->len) {
            if (st->parsers[c]) q35_output_parser_feed(st->parsers[c], e->text, e->len, &d, &nd, &err);
            else append_chunk(st, json_pack("{s:i, s:{s:o}, s:n, s:n}", "index", c, "delta", "content",
                                            jtext(e->text, e->len), "logprobs", "finish_reason"));
        }
        if (pass == 1 && e->finish && st->parsers[c]) q35_output_parser_finish(st->parsers[c], &d, &nd, &err);
        for (size_t i = 0; i < nd; i++) {
            if (d[i].kind == Q35_DELTA_TOOL_NAME) st->n_tools[c]++;
            append_chunk(st, json_pack("{s:i, s:o, s:o, s:n}", "index", c, "delta", delta_json(&d[i]), "logprobs",
                                       lp ? lp : json_null(), "finish_reason"));
            lp = NULL;
        }
    }
    if (lp) append_chunk(st, json_pack("{s:i, s:{}, s:o, s:n}", "index", c, "delta", "logprobs", lp, "finish_reason"));
    if (e->finish)
        append_chunk(st, json_pack("{s:i, s:{}, s:n, s:s, s:o}", "index", c, "delta", "logprobs", "finish_reason",
                                   st->n_tools[c] && e->finish == FIN_STOP ? "tool_calls" : finish_name(e->finish),
                                   "stop_reason", stop_reason_json(e)));
}

static void stream_event(stream_state *st, const tok_event *e) {
    request *r = st->r;
    bool chat = r->api.kind == Q35_API_CHAT;
    int32_t c = e->choice;
    if (!st->started[c]) {
        st->started[c] = true;
        json_t *ch = NULL;
        if (chat)
            ch = json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", c, "delta", "role", "assistant", "content", "", "logprobs", "finish_reason");
        else if (r->api.echo) {
            char *t = echo_text(r, c / r->api.n);
            ch = json_pack("{s:i, s:s, s:n, s:n}", "index", c, "text", t ? t : "", "logprobs", "finish_reason");
            st->text_off[c] += t ? strlen(t) : 0;
            free(t);
        }
        if (ch) {
            json_t *chunk = chunk_base(r, json_pack("[o]", ch));
            q35_sse_append_json(&st->out, &st->out_len, &st->out_cap, chunk);
            json_decref(chunk);
        }
    }
    bool want_lp = r->api.logprobs >= 0 && e->token >= 0;
    if (chat) {
        stream_chat_event(st, e, want_lp);
        return;
    }
    if (!e->len && !e->finish && !want_lp) return;
    json_t *lp = json_null();
    if (want_lp) {
        if (chat) lp = json_pack("{s:[o]}", "content", chat_logprob_entry(e));
        else {
            lp = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
            add_completion_logprobs(lp, e, st->text_off[c]);
        }
    }
    st->text_off[c] += e->len;
    json_t *text = json_stringn(e->text ? e->text : "", e->len);
    json_t *ch;
    if (chat) {
        json_t *delta = json_object();
        if (e->len) json_object_set_new(delta, "content", text);
        else json_decref(text);
        ch = json_pack("{s:i, s:o, s:o}", "index", c, "delta", delta, "logprobs", lp);
    } else {
        ch = json_pack("{s:i, s:o, s:o}", "index", c, "text", text, "logprobs", lp);
    }
    json_object_set_new(ch, "finish_reason", e->finish ? json_string(finish_name(e->finish)) : json_null());
    json_object_set_new(ch, "stop_reason", e->finish ? stop_reason_json(e) : json_null());
    if (r->api.return_token_ids && e->token >= 0) json_object_set_new(ch, "token_ids", json_pack("[i]", e->token));
    json_t *chunk = chunk_base(r, json_pack("[o]", ch));
    q35_sse_append_json(&st->out, &st->out_len, &st->out_cap, chunk);
    json_decref(chunk);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_state *st = cls;
    request *r = st->r;
    while (st->out_off == st->out_len) {
        if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        st->out_len = st->out_off = 0;
        pthread_mutex_lock(&r->mu);
        while (st->next_ev == r->n_ev && r->n_finished < r->n_choices && !r->error) {
            if (peer_gone(st->fd)) {
                atomic_store(&r->cancelled, 1);
                pthread_mutex_unlock(&r->mu);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            wait_a_little(r);
        }
        size_t upto = r->n_ev;
        bool done = r->n_finished == r->n_choices;
        char *error = r->error ? strdup(r->error) : NULL;
        pthread_mutex_unlock(&r->mu);
        /* events are appended, never moved while we read below index upto
         * except by realloc, so copy under the lock one at a time */
        for (; st->next_ev < upto; st->next_ev++) {
            pthread_mutex_lock(&r->mu);
            tok_event e = r->ev[st->next_ev];
            pthread_mutex_unlock(&r->mu);
            if (e.finish == FIN_ERROR || e.finish == FIN_ABORT) continue;
            stream_event(st, &e);
        }
        if (error) {
            char *ej = q35_api_error_json(atomic_load(&g_stopping) ? 503 : 500, error, NULL);
            if (ej) q35_sse_append_raw(&st->out, &st->out_len, &st->out_cap, ej);
            free(ej);
            free(error);
            q35_sse_append_raw(&st->out, &st->out_len, &st->out_cap, "[DONE]");
            st->finished = true;
        } else if (done && st->next_ev == upto) {
            if (r->api.include_usage) {
                json_t *chunk = chunk_base(r, json_array());
                json_object_set_new(chunk, "usage", usage_json(r));
                q35_sse_append_json(&st->out, &st->out_len, &st->out_cap, chunk);
                json_decref(chunk);
            }
            q35_sse_append_raw(&st->out, &st->out_len, &st->out_cap, "[DONE]");
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
    atomic_fetch_sub(&g_live_streams, 1);
    pthread_mutex_lock(&st->r->mu);
    bool done = st->r->n_finished == st->r->n_choices;
    pthread_mutex_unlock(&st->r->mu);
    if (!done) atomic_store(&st->r->cancelled, 1);
    for (int32_t i = 0; st->parsers && i < st->r->n_choices; i++) q35_output_parser_free(st->parsers[i]);
    free(st->parsers);
    free(st->n_tools);
    request_release(st->r);
    free(st->out);
    free(st->started);
    free(st->text_off);
    free(st);
}

/* ---- request handling ---- */

typedef struct conn_ctx {
    char *body;
    size_t len, cap;
    double t_start;
    bool too_large;
} conn_ctx;

/* Text (to tokenize) of prompt i, or NULL when it is token ids; chat renders
 * its messages with the Qwen3.5 template. *owned is set when the caller
 * must free the text. */
static int prompt_text(request *r, int32_t i, int add_generation_prompt, char **text, bool *owned, char *msg,
                       size_t msg_size, int *status) {
    *owned = false;
    *text = NULL;
    if (r->api.kind != Q35_API_CHAT) {
        *text = r->api.prompts[i].text;
        return 0;
    }
    char *mj = json_dumps(r->api.messages, JSON_COMPACT);
    char *tj = r->tools_json;
    q35_chat_options o = {.add_generation_prompt = add_generation_prompt, .enable_thinking = r->think};
    q35_error err = {0};
    q35_status st = mj ? q35_chat_render(mj, tj, &o, text, &err) : Q35_ERR_NOMEM;
    free(mj);
    if (st) {
        *status = st == Q35_ERR_ARG ? 400 : 500;
        snprintf(msg, msg_size, "%s", st == Q35_ERR_NOMEM ? "out of memory" : err.msg);
        return -1;
    }
    *owned = true;
    return 0;
}

/* Where a follow-up of this chat stops sharing its prompt: the template
 * writes an earlier assistant turn as "<|im_start|>assistant\n" + content,
 * without the think block the generation prompt opened, so the state worth
 * keeping ends just after "<|im_start|>assistant\n". 0 when unknown. */
static int32_t turn_boundary(request *r) {
    char *text, msg[256];
    bool owned;
    int status;
    if (prompt_text(r, 0, 0, &text, &owned, msg, sizeof msg, &status)) return 0;
    int32_t *ids = NULL, *head = NULL;
    size_t n = 0, m = 0;
    q35_error err;
    static const char opener[] = "<|im_start|>assistant\n";
    int32_t at = 0;
    if (!q35_tokenize(g_tok, text, strlen(text), 1, &ids, &n, &err) &&
        !q35_tokenize(g_tok, opener, sizeof opener - 1, 1, &head, &m, &err)) {
        const int32_t *p = r->prompt_ids[0];
        size_t np = (size_t)r->prompt_len[0];
        if (n <= np && !memcmp(ids, p, n * sizeof *p)) {
            at = (int32_t)n;
            if (n + m <= np && !memcmp(head, p + n, m * sizeof *p)) at += (int32_t)m;
        }
    }
    free(ids);
    free(head);
    if (owned) free(text);
    return at;
}

static int tokenize_prompts(request *r, char *msg, size_t msg_size, int *status) {
    if (r->api.kind == Q35_API_CHAT) r->api.n_prompts = 1;
    int32_t np = r->api.n_prompts;
    r->prompt_ids = calloc((size_t)np, sizeof *r->prompt_ids);
    r->prompt_len = calloc((size_t)np, sizeof *r->prompt_len);
    r->max_tokens = calloc((size_t)np, sizeof *r->max_tokens);
    r->prompt_ready = calloc((size_t)np, sizeof *r->prompt_ready);
    if (!r->prompt_ids || !r->prompt_len || !r->max_tokens || !r->prompt_ready) { *status = 500; snprintf(msg, msg_size, "out of memory"); return -1; }
    for (int32_t i = 0; i < np; i++) {
        bool is_text = r->api.kind == Q35_API_CHAT || r->api.prompts[i].text;
        if (is_text && !have_tokenizer()) {
            *status = 501;
            snprintf(msg, msg_size, r->api.kind == Q35_API_CHAT
                     ? "this model directory has no tokenizer, so chat is not available; use /v1/completions with token ids"
                     : "this model directory has no tokenizer, so text prompts are not available; send token ids");
            return -1;
        }
        if (is_text) {
            char *text;
            bool owned;
            if (prompt_text(r, i, 1, &text, &owned, msg, msg_size, status)) return -1;
            size_t n = 0;
            q35_error err = {0};
            /* special tokens written in the text are parsed, as HF's encode does by default */
            q35_status st = q35_tokenize(g_tok, text, strlen(text), 1, &r->prompt_ids[i], &n, &err);
            if (owned) free(text);
            if (st) { *status = st == Q35_ERR_NOMEM ? 500 : 400; snprintf(msg, msg_size, "%s", err.msg); return -1; }
            if (n == 0 || n > INT32_MAX / 2) { *status = 400; snprintf(msg, msg_size, "the prompt is empty after tokenization"); return -1; }
            r->prompt_len[i] = (int32_t)n;
            for (size_t k = 0; k < n; k++)
                if (r->prompt_ids[i][k] >= g_info->vocab_size) {
                    *status = 400;
                    snprintf(msg, msg_size, "the tokenizer gave id %d, outside the model's vocabulary of %d", r->prompt_ids[i][k], g_info->vocab_size);
                    return -1;
                }
        } else {
            q35_api_prompt *p = &r->api.prompts[i];
            r->prompt_ids[i] = malloc(sizeof(int32_t) * (size_t)p->n_ids);
            if (!r->prompt_ids[i]) { *status = 500; snprintf(msg, msg_size, "out of memory"); return -1; }
            memcpy(r->prompt_ids[i], p->ids, sizeof(int32_t) * (size_t)p->n_ids);
            r->prompt_len[i] = p->n_ids;
        }
        if ((*status = q35_api_check_length(&r->api, r->prompt_len[i], &g_limits, &r->max_tokens[i], msg, msg_size))) return -1;
    }
    if (r->api.kind == Q35_API_CHAT) r->turn_ckpt = turn_boundary(r);
    return 0;
}

static enum MHD_Result handle_generate(struct MHD_Connection *c, conn_ctx *cc, q35_api_kind kind) {
    char msg[1024], param[128];
    request *r = calloc(1, sizeof *r);
    if (!r) return send_error(c, 500, "out of memory", NULL);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1;
    r->t_arrive = cc->t_start;
    int status = q35_api_parse(cc->body ? cc->body : "", cc->len, kind, &g_limits, &r->api, msg, sizeof msg, param, sizeof param);
    if (status) { request_release(r); return send_error(c, (unsigned)status, msg, param); }
    if (r->api.json_object && (!have_tokenizer() || r->api.enable_thinking > 0)) {
        request_release(r);
        return send_error(c, 400, have_tokenizer() ? "response_format json_object does not combine with enable_thinking"
                                                   : "response_format json_object needs the tokenizer, which this model directory lacks",
                          "response_format");
    }
    if (r->api.tool_choice && (r->api.tool_choice_named || !strcmp(r->api.tool_choice, "required"))) {
        request_release(r);
        return send_error(c, 400, "tool_choice 'required' and named functions need constrained decoding, which this "
                                  "server does not have; use 'auto' or 'none'", "tool_choice");
    }
    /* tool_choice "none": the tools are neither shown to the model nor parsed */
    if (r->api.tools && !(r->api.tool_choice && !strcmp(r->api.tool_choice, "none")))
        r->tools_json = json_dumps(r->api.tools, JSON_COMPACT);
    r->think = r->api.enable_thinking > 0; /* the 9B template thinks only when asked */
    if (!r->api.has_seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->api.sampling.seed = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec ^ atomic_fetch_add(&g_req_counter, 1) << 32;
    }
    if (tokenize_prompts(r, msg, sizeof msg, &status)) { request_release(r); return send_error(c, (unsigned)status, msg, NULL); }
    r->n_choices = r->api.n_prompts * r->api.n;
    r->completion_tokens = calloc((size_t)r->n_choices, sizeof *r->completion_tokens);
    if (!r->completion_tokens) { request_release(r); return send_error(c, 500, "out of memory", NULL); }
    snprintf(r->id, sizeof r->id, "%s-%016llx%08llx", kind == Q35_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)r->api.sampling.seed ^ (unsigned long long)time(NULL), (unsigned long long)atomic_fetch_add(&g_req_counter, 1));
    r->created = (long long)time(NULL);
    if (!sched_submit(r)) {
        if (atomic_load(&g_stopping)) {
            request_release(r);
            return send_error(c, 503, "the server is shutting down", NULL);
        }
        pthread_mutex_lock(&M.mu);
        M.rejected++;
        pthread_mutex_unlock(&M.mu);
        request_release(r);
        snprintf(msg, sizeof msg, "the server is busy: %d requests are already waiting (--max-queue); retry later", C.max_queue);
        return send_error(c, 429, msg, NULL);
    }
    int fd = conn_fd(c);
    if (r->api.stream) {
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
            request_release(r);
            return send_error(c, 500, "out of memory", NULL);
        }
        st->r = r;
        st->fd = fd;
        atomic_fetch_add(&g_live_streams, 1); /* stream_free counts it down, also on failure below */
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, st, stream_free);
        if (!resp) { stream_free(st); return MHD_NO; }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        /* the idle limit is for clients that stall; a stream may wait on
         * the queue or a long prompt, so it has none, and its connection
         * ends with it (hang-ups are caught by polling the socket) */
        MHD_add_response_header(resp, "Connection", "close");
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    pthread_mutex_lock(&r->mu);
    while (r->n_finished < r->n_choices) {
        if (peer_gone(fd)) {
            atomic_store(&r->cancelled, 1);
            pthread_mutex_unlock(&r->mu);
            request_release(r);
            return MHD_NO;
        }
        wait_a_little(r);
    }
    pthread_mutex_unlock(&r->mu);
    enum MHD_Result ret;
    if (r->error) ret = send_error(c, atomic_load(&g_stopping) ? 503 : 500, r->error, NULL);
    else ret = send_json(c, 200, full_response(r));
    request_release(r);
    return ret;
}

/* /tokenize: {prompt} or a chat form {messages, tools, chat_template_kwargs}
 * -> {count, max_model_len, tokens, token_strs?}; /detokenize: {tokens} ->
 * {prompt}. Shapes as vLLM's. */
static enum MHD_Result handle_tokenize(struct MHD_Connection *c, conn_ctx *cc, bool detok) {
    json_error_t jerr;
    json_t *root = json_loadb(cc->body ? cc->body : "", cc->len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return send_error(c, 400, "the request body must be a JSON object", NULL);
    }
    json_t *model = json_object_get(root, "model");
    if (model && json_is_string(model) && strcmp(json_string_value(model), C.served_name)) {
        char msg[400];
        snprintf(msg, sizeof msg, "The model `%.200s` does not exist.", json_string_value(model));
        json_decref(root);
        return send_error(c, 404, msg, "model");
    }
    if (!g_tok) {
        json_decref(root);
        return send_error(c, 501, detok ? "this model directory has no tokenizer, so /detokenize is not available"
                                         : "this model directory has no tokenizer, so /tokenize is not available", NULL);
    }
    char msg[1024];
    q35_error err = {0};
    if (detok) {
        json_t *t = json_object_get(root, "tokens");
        int32_t *ids = NULL, n = 0;
        if (q35_api_parse_ids(t, q35_tokenizer_n_ids(g_tok), &ids, &n)) {
            json_decref(root);
            snprintf(msg, sizeof msg, "'tokens' must be a list of token ids below %d", q35_tokenizer_n_ids(g_tok));
            return send_error(c, 400, msg, "tokens");
        }
        json_decref(root);
        char *text = NULL;
        size_t len = 0;
        q35_status st = q35_detokenize(g_tok, ids, (size_t)n, 0, &text, &len, &err);
        free(ids);
        if (st) return send_error(c, 500, err.msg, NULL);
        json_t *j = json_pack("{s:o}", "prompt", jtext(text, len));
        free(text);
        return send_json(c, 200, j);
    }
    /* the chat form goes through the same validation as a chat request */
    bool chat = json_object_get(root, "messages") != NULL;
    json_t *rts = json_object_get(root, "return_token_strs");
    bool want_strs = json_is_true(rts);
    json_t *ags = json_object_get(root, "add_generation_prompt");
    int add_gen = ags ? json_is_true(ags) : 1;
    json_object_del(root, "return_token_strs");
    json_object_del(root, "add_generation_prompt");
    char *body = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!body) return send_error(c, 500, "out of memory", NULL);
    q35_api_request r;
    char param[128];
    int st = q35_api_parse(body, strlen(body), chat ? Q35_API_CHAT : Q35_API_COMPLETION, &g_limits, &r, msg, sizeof msg,
                           param, sizeof param);
    free(body);
    if (st) return send_error(c, (unsigned)st, msg, param);
    char *text = NULL;
    bool owned = false;
    if (chat) {
        char *mj = json_dumps(r.messages, JSON_COMPACT), *tj = r.tools ? json_dumps(r.tools, JSON_COMPACT) : NULL;
        q35_chat_options o = {.add_generation_prompt = add_gen, .enable_thinking = r.enable_thinking > 0};
        q35_status cs = mj ? q35_chat_render(mj, tj, &o, &text, &err) : Q35_ERR_NOMEM;
        free(mj);
        free(tj);
        if (cs) {
            q35_api_request_free(&r);
            return send_error(c, cs == Q35_ERR_ARG ? 400 : 500, cs == Q35_ERR_NOMEM ? "out of memory" : err.msg, "messages");
        }
        owned = true;
    } else if (r.n_prompts != 1) {
        q35_api_request_free(&r);
        return send_error(c, 400, "/tokenize takes one prompt", "prompt");
    } else {
        text = r.prompts[0].text;
    }
    json_t *tokens = json_array(), *strs = want_strs ? json_array() : NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    q35_status ts = Q35_OK;
    if (text) ts = q35_tokenize(g_tok, text, strlen(text), 1, &ids, &n, &err);
    else { /* token ids pass through */
        n = (size_t)r.prompts[0].n_ids;
        ids = malloc(sizeof *ids * (n ? n : 1));
        if (ids) memcpy(ids, r.prompts[0].ids, sizeof *ids * n);
        else ts = Q35_ERR_NOMEM;
    }
    if (owned) free(text);
    q35_api_request_free(&r);
    if (ts) { json_decref(tokens); json_decref(strs); return send_error(c, 400, err.msg, "prompt"); }
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(tokens, json_integer(ids[i]));
        if (strs) json_array_append_new(strs, token_str(ids[i]));
    }
    free(ids);
    json_t *j = json_pack("{s:I, s:i, s:o}", "count", (json_int_t)n, "max_model_len", g_limits.max_model_len, "tokens", tokens);
    if (strs) json_object_set_new(j, "token_strs", strs);
    return send_json(c, 200, j);
}

typedef struct route { const char *path, *method; int id; bool auth; } route;
enum { R_COMPLETIONS, R_CHAT, R_MODELS, R_HEALTH, R_METRICS, R_TOKENIZE, R_DETOKENIZE, R_VERSION };
static const route routes[] = {
    {"/v1/completions", "POST", R_COMPLETIONS, true},
    {"/v1/chat/completions", "POST", R_CHAT, true},
    {"/v1/models", "GET", R_MODELS, true},
    {"/health", "GET", R_HEALTH, false},
    {"/metrics", "GET", R_METRICS, false},
    {"/tokenize", "POST", R_TOKENIZE, true},
    {"/detokenize", "POST", R_DETOKENIZE, true},
    {"/version", "GET", R_VERSION, false},
};

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)cls; (void)version;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        cc->t_start = q35_now_seconds();
        *con_cls = cc;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > C.max_body) cc->too_large = true;
        return MHD_YES;
    }
    if (*upload_size) {
        if (q35_now_seconds() - cc->t_start > C.timeout_s) return MHD_NO; /* a body that trickles in */
        if (!cc->too_large && cc->len + *upload_size > C.max_body) cc->too_large = true;
        if (!cc->too_large) {
            if (cc->len + *upload_size + 1 > cc->cap) {
                size_t nc = cc->cap ? cc->cap : 4096;
                while (nc < cc->len + *upload_size + 1) nc *= 2;
                char *nb = realloc(cc->body, nc);
                if (!nb) return MHD_NO;
                cc->body = nb;
                cc->cap = nc;
            }
            memcpy(cc->body + cc->len, upload, *upload_size);
            cc->len += *upload_size;
            cc->body[cc->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->too_large) {
        char msg[200];
        snprintf(msg, sizeof msg, "the request body is over this server's limit of %zu bytes", C.max_body);
        return send_error(c, 413, msg, NULL);
    }

    const route *rt = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (!strcmp(url, routes[i].path)) rt = &routes[i];
    if (!rt) {
        char msg[300];
        snprintf(msg, sizeof msg, "no route %.200s", url);
        return send_error(c, 404, msg, NULL);
    }
    if (rt->auth && C.api_key &&
        !q35_bearer_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"), C.api_key))
        return send_error(c, 401, "Invalid or missing API key: send 'Authorization: Bearer <key>'", NULL);
    if (strcmp(method, rt->method) && !(rt->id != R_COMPLETIONS && rt->id != R_CHAT && !strcmp(method, "HEAD") && !strcmp(rt->method, "GET"))) {
        char msg[200];
        snprintf(msg, sizeof msg, "method %.20s is not allowed on %s; use %s", method, rt->path, rt->method);
        char *s = q35_api_error_json(405, msg, NULL);
        struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(r, "Content-Type", "application/json");
        MHD_add_response_header(r, "Allow", rt->method);
        enum MHD_Result ret = MHD_queue_response(c, 405, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (!atomic_load(&g_ready) && rt->id != R_VERSION)
        return send_error(c, 503, "Loading model", NULL);
    switch (rt->id) {
    case R_HEALTH: return send_json(c, 200, json_pack("{s:s}", "status", "ok"));
    case R_VERSION: return send_json(c, 200, json_pack("{s:s}", "version", Q35_VERSION));
    case R_MODELS:
        return send_json(c, 200, json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:s, s:n, s:i, s:[]}]}", "object", "list", "data",
                                           "id", C.served_name, "object", "model", "created", (json_int_t)time(NULL),
                                           "owned_by", "qwen35", "root", C.model_path, "parent", "max_model_len",
                                           g_limits.max_model_len, "permission"));
    case R_METRICS: {
        size_t n;
        char *t = metrics_text(&n);
        return send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", t, n);
    }
    case R_TOKENIZE: return handle_tokenize(c, cc, false);
    case R_DETOKENIZE: return handle_tokenize(c, cc, true);
    case R_COMPLETIONS: return handle_generate(c, cc, Q35_API_COMPLETION);
    case R_CHAT: return handle_generate(c, cc, Q35_API_CHAT);
    }
    return MHD_NO;
}

static void request_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls; (void)c; (void)toe;
    conn_ctx *cc = *con_cls;
    if (cc) { free(cc->body); free(cc); }
    *con_cls = NULL;
}

/* ---- start-up ---- */

/* Bytes per context position of one session, measured with snapshots. */
static size_t bytes_per_position(q35_engine *e) {
    q35_session *s;
    q35_error err;
    if (q35_session_new(e, 4, &s, &err)) return 0;
    size_t b[2] = {0, 0};
    int32_t tok = 0;
    for (int i = 0; i < 2; i++) {
        q35_snapshot *snap;
        if (q35_session_eval(s, &tok, 1, NULL, 0, &err) || q35_snapshot_take(s, &snap, &err)) { q35_session_free(s); return 0; }
        b[i] = q35_snapshot_bytes(snap);
        q35_snapshot_free(snap);
    }
    q35_session_free(s);
    return b[1] > b[0] ? b[1] - b[0] : 0;
}

static size_t mem_available(void) {
    FILE *fp = fopen("/proc/meminfo", "r");
    if (!fp) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    fclose(fp);
    return kb * 1024;
}

/* EOS ids: the config's, plus generation_config.json's (an int or a list). */
static int read_eos(const char *dir, int32_t *eos, int max) {
    int n = 0;
    if (g_info->eos_token_id >= 0) eos[n++] = g_info->eos_token_id;
    char *path = q35_path_join(dir, "generation_config.json");
    json_t *g = path ? json_load_file(path, 0, NULL) : NULL;
    free(path);
    json_t *v = json_object_get(g, "eos_token_id");
    for (size_t i = 0; v && i < (json_is_array(v) ? json_array_size(v) : 1) && n < max; i++) {
        json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(x)) continue;
        int32_t id = (int32_t)json_integer_value(x);
        bool dup = false;
        for (int k = 0; k < n; k++) dup |= eos[k] == id;
        if (!dup) eos[n++] = id;
    }
    json_decref(g);
    return n;
}

/* The sampling defaults of generation_config.json (temperature, top_k,
 * top_p, min_p, repetition_penalty), as vLLM applies them; false when the
 * file names none. */
static bool read_sampling_defaults(const char *dir, q35_sampler_params *p) {
    *p = (q35_sampler_params){.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
    char *path = q35_path_join(dir, "generation_config.json");
    json_t *g = path ? json_load_file(path, 0, NULL) : NULL;
    free(path);
    bool any = false;
    json_t *v;
#define GEN_NUM(key, field, ok)                                                   \
    if ((v = json_object_get(g, key)) && json_is_number(v) && (ok)) {             \
        p->field = (float)json_number_value(v);                                   \
        any = true;                                                               \
    }
    GEN_NUM("temperature", temperature, json_number_value(v) >= 0)
    GEN_NUM("top_p", top_p, json_number_value(v) > 0 && json_number_value(v) <= 1)
    GEN_NUM("min_p", min_p, json_number_value(v) >= 0 && json_number_value(v) <= 1)
    GEN_NUM("repetition_penalty", repetition_penalty, json_number_value(v) > 0)
#undef GEN_NUM
    if ((v = json_object_get(g, "top_k")) && json_is_integer(v) && json_integer_value(v) >= 0 &&
        json_integer_value(v) <= INT32_MAX) {
        p->top_k = (int32_t)json_integer_value(v);
        any = true;
    }
    json_decref(g);
    return any;
}

static const char serve_usage[] =
    "usage: qwen35 serve [-m MODEL_DIR] [options]\n"
    "  OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions, /v1/models,\n"
    "  /health, /metrics, /tokenize, /detokenize, /version.\n"
    "  Without -m it serves the embedded demo model ($QWEN35_MODEL, else models/qwen35-demo).\n"
    "options:\n"
    "  --host ADDR              listen address (default 127.0.0.1)\n"
    "  --port N                 port (default 8000; 0 picks a free one)\n"
    "  --api-key KEY            require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize\n"
    "  --api-key-file F         the same, with the key read from the first line of F\n"
    "  --served-model-name NAME model id clients send (default Qwen/Qwen3.5-9B)\n"
    "  --max-model-len N        context per sequence (default min(262144, model maximum, memory))\n"
    "  --parallel N             sequences decoded together (default 4)\n"
    "  --max-queue N            requests waiting before 429 (default 64)\n"
    "  --max-body BYTES         request body limit (default 8388608)\n"
    "  --timeout S              idle connection and request-body time limit (default 60)\n"
    "  --prefix-cache-mb N      prefix cache budget (default min(4096, a quarter of free memory); 0: off)\n"
    "  --prefill-chunk N        prompt tokens per scheduler step (default 512)\n"
    "  --spec-k K               MTP draft tokens per step (default 1 with an MTP head; 0: off)\n"
    "  --draft-vocab FILE       draft only over these token ids (one per line, as written by\n"
    "                           `qwen35 draft-vocab`): a cheaper draft head, the same output\n"
    "  -t, --threads N          engine threads (default: one per core)\n"
    "  --mmap, --no-mmap        serve the weights from the mapped file, or read them into memory\n"
    "                           (huge pages); default: in memory where the system offers huge\n"
    "                           pages and has the memory to spare, else mapped\n";

static int parse_long(const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) return -1;
    *out = x;
    return 0;
}

/* Loads the model and starts the scheduler; the exit status (0: ready). */
static int load_and_start(void) {
    q35_error err = {0};
    q35_engine_params ep = {.n_threads = C.threads, .weights = C.weights};
    if (q35_engine_load(C.model_path, &ep, &g_engine, &err)) {
        fprintf(stderr, "qwen35 serve: %s\n", err.msg);
        return 1;
    }
    g_info = q35_engine_info(g_engine);
    char *tj = q35_path_join(C.model_path, "tokenizer.json"), *vj = q35_path_join(C.model_path, "vocab.json");
    bool has_tok_files = (tj && q35_file_exists(tj)) || (vj && q35_file_exists(vj));
    free(tj);
    free(vj);
    if (has_tok_files && q35_tokenizer_load(C.model_path, &g_tok, &err)) {
        fprintf(stderr, "qwen35 serve: %s\n", err.msg);
        q35_engine_free(g_engine);
        return 1;
    }
    size_t per_pos = bytes_per_position(g_engine), avail = mem_available();
    int32_t model_max = g_info->max_position > 0 ? g_info->max_position : 262144;
    int32_t len = model_max < 262144 ? model_max : 262144;
    const char *why = model_max < 262144 ? "the model's maximum" : "the default";
    if (per_pos && avail) {
        /* every slot holds a whole context; leave half the free memory for the rest */
        size_t cap = avail / 2 / per_pos / (size_t)C.parallel;
        if (cap < (size_t)len) { len = (int32_t)(cap > 16 ? cap : 16); why = "capped by free memory"; }
    }
    if (C.max_model_len) {
        if (C.max_model_len > model_max) {
            fprintf(stderr, "qwen35 serve: --max-model-len %d is over the model's maximum of %d\n", C.max_model_len, model_max);
            q35_engine_free(g_engine);
                return 2;
        }
        if (C.max_model_len > len) fprintf(stderr, "qwen35 serve: warning: --max-model-len %d may not fit in memory (%d would)\n", C.max_model_len, len);
        len = C.max_model_len;
        why = "--max-model-len";
    }
    size_t budget = g_cache_mb >= 0 ? (size_t)g_cache_mb << 20 : (avail / 4 < (4096ul << 20) ? avail / 4 : (4096ul << 20));
    C.cache_bytes = budget;
    C.spec_k = g_spec_k >= 0 ? (int32_t)g_spec_k : g_info->has_mtp ? 1 : 0;
    if (C.spec_k > 0 && !g_info->has_mtp) {
        fprintf(stderr, "qwen35 serve: --spec-k needs an MTP head, which %s lacks\n", C.model_path);
        q35_engine_free(g_engine);
        return 2;
    }
    if (g_draft_vocab && cli_set_draft_vocab(g_engine, g_draft_vocab, "qwen35 serve")) {
        q35_engine_free(g_engine);
        return 2;
    }
    int32_t eos[8];
    int n_eos = read_eos(C.model_path, eos, 8);
    if (g_tok) { /* the bytes of every token, for json_object */
        static const char **bytes;
        static size_t *lens;
        bytes = calloc((size_t)g_info->vocab_size, sizeof *bytes);
        lens = calloc((size_t)g_info->vocab_size, sizeof *lens);
        for (int32_t t = 0; bytes && lens && t < g_info->vocab_size; t++)
            if (t < q35_tokenizer_n_ids(g_tok) && !q35_token_is_special(g_tok, t)) bytes[t] = q35_token_bytes(g_tok, t, &lens[t]);
        if (bytes && lens) sched_set_token_bytes(bytes, lens);
    }
    /* a chat turn ends with <|im_end|> whatever generation_config says */
    static const char *const ends[] = {"<|im_end|>", "<|endoftext|>"};
    for (int i = 0; g_tok && i < 2 && n_eos < 8; i++) {
        int32_t id = q35_token_id(g_tok, ends[i], strlen(ends[i]));
        bool dup = id < 0 || id >= g_info->vocab_size;
        for (int k = 0; k < n_eos; k++) dup |= eos[k] == id;
        if (!dup) eos[n_eos++] = id;
    }
    g_limits = (q35_api_limits){.served_model_name = C.served_name, .max_model_len = len, .vocab_size = g_info->vocab_size,
                                .max_n = 16, .max_logprobs = 20, .max_total_tokens = 8 * (int64_t)len, .max_stop = 16,
                                .max_stop_len = 256, .max_prompts = 64};
    static q35_sampler_params gen_defaults;
    if (read_sampling_defaults(C.model_path, &gen_defaults)) {
        g_limits.defaults = &gen_defaults;
        fprintf(stderr, "qwen35 serve: sampling defaults from generation_config.json: temperature %g, top_k %d, top_p %g, "
                        "min_p %g, repetition_penalty %g\n", gen_defaults.temperature, gen_defaults.top_k, gen_defaults.top_p,
                gen_defaults.min_p, gen_defaults.repetition_penalty);
    }
    char msg[1200];
    if (sched_start(g_engine, &C, len, eos, n_eos, msg, sizeof msg)) {
        fprintf(stderr, "qwen35 serve: %s\n", msg);
        q35_engine_free(g_engine);
        return 1;
    }
    fprintf(stderr, "qwen35 serve: model %s as '%s'; max_model_len %d (%s; %zu bytes per position); parallel %d; "
                    "prefix cache %zu MiB; speculation k=%d, draft head %d of %d rows; tokenizer: %s\n",
            C.model_path, C.served_name, len, why, per_pos, C.parallel, budget >> 20, C.spec_k, q35_engine_draft_vocab(g_engine),
            g_info->vocab_size, have_tokenizer() ? "yes" : "none (token ids only)");
    atomic_store(&g_ready, 1);
    fprintf(stderr, "qwen35 serve: ready\n");

    return 0;
}

static atomic_int g_load_status = -1; /* the loader's result, -1 while it runs */
static pthread_t g_main_thread;

static void *loader_main(void *arg) {
    (void)arg;
    int rc = load_and_start();
    atomic_store(&g_load_status, rc);
    if (rc) pthread_kill(g_main_thread, SIGTERM); /* wake the main thread's sigwait */
    return NULL;
}

int cmd_serve(int argc, char **argv) {
    memset(&C, 0, sizeof C);
    C.host = "127.0.0.1";
    C.port = 8000;
    C.served_name = "Qwen/Qwen3.5-9B";
    C.parallel = 4;
    C.max_queue = 64;
    C.max_body = 8u << 20;
    C.timeout_s = 60;
    C.prefill_chunk = 512;
    static char keybuf[4096];
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "-h") || !strcmp(k, "--help")) { fputs(serve_usage, stdout); return 0; }
        if (!strcmp(k, "--no-mmap")) { C.weights = Q35_WEIGHTS_IN_MEMORY; continue; }
        if (!strcmp(k, "--mmap")) { C.weights = Q35_WEIGHTS_MAPPED; continue; }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "qwen35 serve: option %s needs a value\n%s", k, serve_usage); return 2; }
        long x;
        int bad = 0;
        if (!strcmp(k, "-m") || !strcmp(k, "--model")) C.model_path = v;
        else if (!strcmp(k, "--host")) C.host = v;
        else if (!strcmp(k, "--port")) { bad = parse_long(v, 0, 65535, &x); C.port = (int)x; }
        else if (!strcmp(k, "--api-key")) C.api_key = v;
        else if (!strcmp(k, "--api-key-file")) {
            FILE *fp = fopen(v, "r");
            if (!fp || !fgets(keybuf, sizeof keybuf, fp)) { fprintf(stderr, "qwen35 serve: cannot read a key from %s\n", v); if (fp) fclose(fp); return 2; }
            fclose(fp);
            keybuf[strcspn(keybuf, "\r\n")] = 0;
            C.api_key = keybuf;
        } else if (!strcmp(k, "--served-model-name")) C.served_name = v;
        else if (!strcmp(k, "--max-model-len")) { bad = parse_long(v, 1, 1L << 30, &x); C.max_model_len = (int32_t)x; }
        else if (!strcmp(k, "--parallel")) { bad = parse_long(v, 1, 256, &x); C.parallel = (int)x; }
        else if (!strcmp(k, "--max-queue")) { bad = parse_long(v, 0, 100000, &x); C.max_queue = (int)x; }
        else if (!strcmp(k, "--max-body")) { bad = parse_long(v, 1024, 1L << 30, &x); C.max_body = (size_t)x; }
        else if (!strcmp(k, "--timeout")) { bad = parse_long(v, 1, 86400, &x); C.timeout_s = (double)x; }
        else if (!strcmp(k, "--prefix-cache-mb")) { bad = parse_long(v, 0, 1L << 24, &g_cache_mb); }
        else if (!strcmp(k, "--prefill-chunk")) { bad = parse_long(v, 1, 1 << 20, &x); C.prefill_chunk = (int32_t)x; }
        else if (!strcmp(k, "--spec-k")) { bad = parse_long(v, 0, Q35_SPEC_K_MAX, &g_spec_k); }
        else if (!strcmp(k, "--draft-vocab")) g_draft_vocab = v;
        else if (!strcmp(k, "-t") || !strcmp(k, "--threads")) { bad = parse_long(v, 0, 1024, &x); C.threads = (int)x; }
        else { fprintf(stderr, "qwen35 serve: unknown option '%s'\n%s", k, serve_usage); return 2; }
        if (bad) { fprintf(stderr, "qwen35 serve: bad value '%s' for %s\n", v, k); return 2; }
        i++;
    }
    static char *default_model; /* kept for the life of the process */
    if (!C.model_path) C.model_path = default_model = cli_default_model(); /* the embedded demo model */
    if (C.api_key && !*C.api_key) { fprintf(stderr, "qwen35 serve: the API key is empty\n"); return 2; }

    /* signals go to the main thread only, which waits for them below */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    metrics_init();

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
    socklen_t sl;
    if (inet_pton(AF_INET, C.host, &sin->sin_addr) == 1) {
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)C.port);
        sl = sizeof *sin;
    } else if (inet_pton(AF_INET6, C.host, &sin6->sin6_addr) == 1) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)C.port);
        flags |= MHD_USE_IPv6;
        sl = sizeof *sin6;
    } else {
        fprintf(stderr, "qwen35 serve: --host must be a numeric IPv4 or IPv6 address, got '%s'\n", C.host);
        return 2;
    }
    (void)sl;
    struct MHD_Daemon *d = MHD_start_daemon(flags, (uint16_t)C.port, NULL, NULL, handle, NULL,
                                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)C.timeout_s,
                                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(C.parallel + C.max_queue + 64),
                                            MHD_OPTION_NOTIFY_COMPLETED, request_completed, NULL,
                                            MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1u << 20),
                                            MHD_OPTION_END);
    if (!d) { fprintf(stderr, "qwen35 serve: cannot listen on %s:%d: %s\n", C.host, C.port, strerror(errno)); return 1; }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : C.port;
    fprintf(stderr, "qwen35 serve: listening on http://%s:%d (loading %s)%s\n", C.host, port, C.model_path,
            C.api_key ? "" : "; no API key: every local client may use it");

    /* the model loads on its own thread, so that /health answers 503 and a
     * signal ends the process even in the middle of a long load */
    g_main_thread = pthread_self();
    pthread_t loader;
    if (pthread_create(&loader, NULL, loader_main, NULL)) {
        fprintf(stderr, "qwen35 serve: cannot start the loader thread\n");
        MHD_stop_daemon(d);
        return 1;
    }
    int sig;
    sigwait(&set, &sig);
    int rc = atomic_load(&g_load_status);
    if (rc < 0) {
        fprintf(stderr, "qwen35 serve: signal %d while loading the model, exiting\n", sig);
        _exit(1);
    }
    pthread_join(loader, NULL);
    if (rc) {
        MHD_stop_daemon(d);
        return rc;
    }
    fprintf(stderr, "qwen35 serve: signal %d, shutting down\n", sig);
    atomic_store(&g_stopping, 1);
    sched_stop();
    /* every open stream now has its error to send: let their readers write
     * the error event and [DONE] before the daemon closes the connections
     * (bounded, for clients that stopped reading) */
    for (int i = 0; i < 300 && atomic_load(&g_live_streams) > 0; i++) usleep(10000);
    MHD_stop_daemon(d);
    q35_engine_free(g_engine);
    q35_tokenizer_free(g_tok);
    return 0;
}
