/* routes.c: the endpoints (routes.h). A generation request is parsed
 * (request.c), checked for what this server cannot do, tokenized
 * (prompt.c) and submitted to the scheduler as a task; the connection's
 * thread then waits for every choice and sends one JSON body (response.c),
 * or hands the task to the streaming response (stream.c). While it waits it
 * polls its socket, so a client that hangs up cancels its task at once.
 * /tokenize and /detokenize use the tokenizer directly; /metrics reads the
 * counters and the scheduler's stats. */
#include "server/routes.h"
#include "server/prompt.h"
#include "server/response.h"
#include "server/stream.h"
#include "server/auth.h"
#include "server/llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The template's variant and enable_thinking: the request's, else the server's default. */
static q35_chat_options chat_options(const q35_server *srv, const q35_api_request *a) {
    int think = a->enable_thinking >= 0 ? (a->enable_thinking ? 1 : -1) : srv->default_thinking;
    return (q35_chat_options){.enable_thinking = think, .variant = srv->chat_variant};
}

static enum MHD_Result handle_generate(q35_server *srv, struct MHD_Connection *c, const q35_http_body *b, q35_api_kind kind,
                                       bool llama) {
    char msg[1024], param[128];
    q35_task *r = q35_task_new();
    if (!r) return q35_http_send_error(c, 500, "out of memory", NULL);
    r->t_arrive = b->t_start;
    r->llama = llama;
    char *body = llama ? q35_llama_completion_body(b->data ? b->data : "", b->len, msg, sizeof msg) : NULL;
    if (llama && !body) { q35_task_release(r); return q35_http_send_error(c, 400, msg, NULL); }
    int status = llama ? q35_api_parse(body, strlen(body), kind, &srv->limits, &r->api, msg, sizeof msg, param, sizeof param)
                       : q35_api_parse(b->data ? b->data : "", b->len, kind, &srv->limits, &r->api, msg, sizeof msg, param, sizeof param);
    free(body);
    if (status) { q35_task_release(r); return q35_http_send_error(c, (unsigned)status, msg, param); }
    if (r->api.ignored && srv->cfg.log_debug) fprintf(stderr, "qwen35 serve: debug: ignored request fields: %s\n", r->api.ignored);
    if ((r->api.json_object || r->api.schema) && !srv->tok) {
        q35_task_release(r);
        return q35_http_send_error(c, 400, "response_format json_object and json_schema need the tokenizer, which this model directory lacks",
                                   "response_format");
    }
    /* tool_choice "none": the tools are neither shown to the model nor parsed */
    if (r->api.tools && !(r->api.tool_choice && !strcmp(r->api.tool_choice, "none")))
        r->tools_json = json_dumps(r->api.tools, JSON_COMPACT);
    r->chat = chat_options(srv, &r->api);
    /* the prompt ends inside <think> only after a generation prompt that opens it */
    r->think = r->api.kind == Q35_API_CHAT && r->api.add_generation_prompt && !r->api.continue_final && q35_chat_thinks(&r->chat);
    if (!r->api.has_seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->api.sampling.seed = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec ^ atomic_fetch_add(&srv->req_counter, 1) << 32;
    }
    /* the images are fetched, decoded and processed before anything is queued */
    if (r->api.n_images && (status = q35_api_images_load(&r->api, &srv->images, srv->limits.max_model_len, msg, sizeof msg,
                                                         param, sizeof param))) {
        q35_task_release(r);
        return q35_http_send_error(c, (unsigned)status, msg, param);
    }
    if (q35_prompt_prepare(srv->tok, &srv->limits, r, msg, sizeof msg, &status)) {
        q35_task_release(r);
        return q35_http_send_error(c, (unsigned)status, msg, NULL);
    }
    snprintf(r->id, sizeof r->id, "%s-%016llx%08llx", kind == Q35_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)r->api.sampling.seed ^ (unsigned long long)time(NULL), (unsigned long long)atomic_fetch_add(&srv->req_counter, 1));
    r->created = (long long)time(NULL);
    if (atomic_load(&srv->draining) || !q35_sched_submit(srv->sched, r)) {
        if (atomic_load(&srv->draining) || atomic_load(&srv->stopping)) {
            q35_task_release(r);
            return q35_http_send_error(c, 503, "the server is shutting down; retry on another replica", NULL);
        }
        q35_metrics_rejected(&srv->metrics);
        q35_task_release(r);
        snprintf(msg, sizeof msg, "the server is busy: %d requests are already waiting (--max-queue); retry later", srv->cfg.max_queue);
        return q35_http_send_error(c, 429, msg, NULL);
    }
    int fd = q35_http_fd(c);
    if (r->api.stream) return q35_stream_respond(srv, c, r, fd);
    pthread_mutex_lock(&r->mu);
    while (r->n_finished < r->n_choices) {
        if (q35_http_peer_gone(fd)) {
            atomic_store(&r->cancelled, 1);
            pthread_mutex_unlock(&r->mu);
            q35_task_release(r);
            return MHD_NO;
        }
        q35_http_wait(r);
    }
    pthread_mutex_unlock(&r->mu);
    enum MHD_Result ret;
    if (r->error) ret = q35_http_send_error(c, atomic_load(&srv->stopping) ? 503 : 500, r->error, NULL);
    else if (llama) ret = q35_http_send_json(c, 200, q35_llama_response(q35_full_response(srv->tok, srv->cfg.served_name, r), r));
    else ret = q35_http_send_json(c, 200, q35_full_response(srv->tok, srv->cfg.served_name, r));
    q35_task_release(r);
    return ret;
}

/* /tokenize: {prompt} or a chat form {messages, tools, chat_template_kwargs}
 * -> {count, max_model_len, tokens, token_strs?}; /detokenize: {tokens} ->
 * {prompt}. Shapes as vLLM's; llama-server's too: /tokenize {content,
 * with_pieces?} -> {tokens} (ids, or {id, piece} with pieces), /detokenize
 * also answers {content}, /apply-template {messages...} -> {prompt}. */
static enum MHD_Result handle_tokenize(q35_server *srv, struct MHD_Connection *c, const q35_http_body *b, bool detok,
                                       bool apply_template) {
    json_error_t jerr;
    json_t *root = json_loadb(b->data ? b->data : "", b->len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return q35_http_send_error(c, 400, "the request body must be a JSON object", NULL);
    }
    json_t *model = json_object_get(root, "model");
    if (model && json_is_string(model) && strcmp(json_string_value(model), srv->cfg.served_name)) {
        char msg[400];
        snprintf(msg, sizeof msg, "The model `%.200s` does not exist.", json_string_value(model));
        json_decref(root);
        return q35_http_send_error(c, 404, msg, "model");
    }
    if (!srv->tok) {
        json_decref(root);
        return q35_http_send_error(c, 501, detok ? "this model directory has no tokenizer, so /detokenize is not available"
                                         : "this model directory has no tokenizer, so /tokenize is not available", NULL);
    }
    char msg[1024];
    q35_error err = {0};
    if (detok) {
        json_t *t = json_object_get(root, "tokens");
        int32_t *ids = NULL, n = 0;
        if (q35_api_parse_ids(t, q35_tokenizer_n_ids(srv->tok), &ids, &n)) {
            json_decref(root);
            snprintf(msg, sizeof msg, "'tokens' must be a list of token ids below %d", q35_tokenizer_n_ids(srv->tok));
            return q35_http_send_error(c, 400, msg, "tokens");
        }
        json_decref(root);
        char *text = NULL;
        size_t len = 0;
        q35_status st = q35_detokenize(srv->tok, ids, (size_t)n, 0, &text, &len, &err);
        free(ids);
        if (st) return q35_http_send_error(c, 500, err.msg, NULL);
        json_t *j = json_pack("{s:o, s:o}", "prompt", q35_json_text(text, len), "content", q35_json_text(text, len));
        free(text);
        return q35_http_send_json(c, 200, j);
    }
    /* llama-server's form: {content, with_pieces, add_special} */
    json_t *content = json_object_get(root, "content");
    bool llama = !apply_template && content && !json_object_get(root, "prompt") && !json_object_get(root, "messages");
    bool pieces = llama && json_is_true(json_object_get(root, "with_pieces"));
    if (llama) {
        json_object_set(root, "prompt", content);
        json_object_del(root, "content");
        json_object_del(root, "with_pieces");
        json_object_del(root, "add_special");
    }
    /* the chat form goes through the same validation as a chat q35_task */
    bool chat = apply_template || json_object_get(root, "messages") != NULL;
    json_t *rts = json_object_get(root, "return_token_strs");
    bool want_strs = json_is_true(rts);
    json_t *ags = json_object_get(root, "add_generation_prompt");
    int add_gen = ags ? json_is_true(ags) : 1;
    json_object_del(root, "return_token_strs");
    json_object_del(root, "add_generation_prompt");
    char *body = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!body) return q35_http_send_error(c, 500, "out of memory", NULL);
    q35_api_request r;
    char param[128];
    int st = q35_api_parse(body, strlen(body), chat ? Q35_API_CHAT : Q35_API_COMPLETION, &srv->limits, &r, msg, sizeof msg,
                           param, sizeof param);
    free(body);
    if (st) return q35_http_send_error(c, (unsigned)st, msg, param);
    char *text = NULL;
    bool owned = false;
    if (chat) {
        char *mj = json_dumps(r.messages, JSON_COMPACT), *tj = r.tools ? json_dumps(r.tools, JSON_COMPACT) : NULL;
        q35_chat_options o = chat_options(srv, &r);
        o.add_generation_prompt = add_gen;
        q35_status cs = mj ? q35_chat_render(mj, tj, &o, &text, &err) : Q35_ERR_NOMEM;
        free(mj);
        free(tj);
        if (cs) {
            q35_api_request_free(&r);
            return q35_http_send_error(c, cs == Q35_ERR_ARG ? 400 : 500, cs == Q35_ERR_NOMEM ? "out of memory" : err.msg, "messages");
        }
        owned = true;
        if (apply_template) {
            q35_api_request_free(&r);
            json_t *j = json_pack("{s:s}", "prompt", text);
            free(text);
            return q35_http_send_json(c, 200, j);
        }
    } else if (r.n_prompts != 1) {
        q35_api_request_free(&r);
        return q35_http_send_error(c, 400, "/tokenize takes one prompt", "prompt");
    } else {
        text = r.prompts[0].text;
    }
    json_t *tokens = json_array(), *strs = want_strs ? json_array() : NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    q35_status ts = Q35_OK;
    if (text) ts = q35_tokenize(srv->tok, text, strlen(text), 1, &ids, &n, &err);
    else { /* token ids pass through */
        n = (size_t)r.prompts[0].n_ids;
        ids = malloc(sizeof *ids * (n ? n : 1));
        if (ids) memcpy(ids, r.prompts[0].ids, sizeof *ids * n);
        else ts = Q35_ERR_NOMEM;
    }
    if (!ts && r.n_images) { /* the images' tokens, counted as a chat request counts them */
        int ist = q35_api_images_load(&r, &srv->images, srv->limits.max_model_len, msg, sizeof msg, param, sizeof param);
        if (!ist) ist = q35_api_images_expand(&r, q35_image_pad_id(srv->tok), &ids, &n, NULL, msg, sizeof msg);
        if (ist) {
            free(ids);
            if (owned) free(text);
            q35_api_request_free(&r);
            json_decref(tokens);
            json_decref(strs);
            return q35_http_send_error(c, (unsigned)ist, msg, param);
        }
    }
    if (owned) free(text);
    q35_api_request_free(&r);
    if (ts) { json_decref(tokens); json_decref(strs); return q35_http_send_error(c, 400, err.msg, "prompt"); }
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(tokens, pieces ? json_pack("{s:i, s:o}", "id", ids[i], "piece", q35_json_token(srv->tok, ids[i]))
                                             : json_integer(ids[i]));
        if (strs) json_array_append_new(strs, q35_json_token(srv->tok, ids[i]));
    }
    free(ids);
    if (llama) {
        json_decref(strs);
        return q35_http_send_json(c, 200, json_pack("{s:o}", "tokens", tokens));
    }
    json_t *j = json_pack("{s:I, s:i, s:o}", "count", (json_int_t)n, "max_model_len", srv->limits.max_model_len, "tokens", tokens);
    if (strs) json_object_set_new(j, "token_strs", strs);
    return q35_http_send_json(c, 200, j);
}

typedef struct route { const char *path, *method; int id; bool auth; } route;
enum { R_COMPLETIONS, R_CHAT, R_MODELS, R_HEALTH, R_METRICS, R_TOKENIZE, R_DETOKENIZE, R_VERSION, R_MODEL, R_LLAMA_COMPLETION,
       R_PROPS, R_SLOTS, R_APPLY_TEMPLATE };
static const route routes[] = {
    {"/v1/completions", "POST", R_COMPLETIONS, true},
    {"/v1/chat/completions", "POST", R_CHAT, true},
    {"/v1/models", "GET", R_MODELS, true},
    {"/v1/models/", "GET", R_MODEL, true}, /* a prefix: /v1/models/{id} */
    {"/completion", "POST", R_LLAMA_COMPLETION, true},
    {"/props", "GET", R_PROPS, true},
    {"/slots", "GET", R_SLOTS, true},
    {"/apply-template", "POST", R_APPLY_TEMPLATE, true},
    {"/health", "GET", R_HEALTH, false},
    {"/metrics", "GET", R_METRICS, false},
    {"/tokenize", "POST", R_TOKENIZE, true},
    {"/detokenize", "POST", R_DETOKENIZE, true},
    {"/version", "GET", R_VERSION, false},
};


static json_t *model_json(const q35_server *srv) {
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:n, s:i, s:[]}", "id", srv->cfg.served_name, "object", "model", "created",
                     (json_int_t)time(NULL), "owned_by", "qwen35", "root", srv->cfg.model_path, "parent", "max_model_len",
                     srv->limits.max_model_len, "permission");
}

/* A CORS preflight: 204 with what may be sent from an allowed origin, 403 for another one. */
static enum MHD_Result preflight(struct MHD_Connection *c) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin && !q35_http_allowed_origin(c)) return q35_http_send_error(c, 403, "Disallowed CORS origin (--allowed-origins)", NULL);
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    const char *hdrs = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    MHD_add_response_header(r, "Allow", "GET, POST, OPTIONS");
    if (origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", hdrs ? hdrs : "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    q35_http_headers(c, r, 204);
    enum MHD_Result ret = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result q35_route(q35_server *srv, struct MHD_Connection *c, const char *url, const char *method,
                          const q35_http_body *b) {
    if (!strcmp(method, "OPTIONS")) return preflight(c);
    const route *rt = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (!strcmp(url, routes[i].path) || (routes[i].id == R_MODEL && !strncmp(url, routes[i].path, strlen(routes[i].path))))
            rt = &routes[i];
    if (!rt) {
        char msg[300];
        snprintf(msg, sizeof msg, "no route %.200s", url);
        return q35_http_send_error(c, 404, msg, NULL);
    }
    if (rt->auth && srv->cfg.api_key &&
        !q35_bearer_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"), srv->cfg.api_key))
        return q35_http_send_error(c, 401, "Invalid or missing API key: send 'Authorization: Bearer <key>'", NULL);
    if (strcmp(method, rt->method) && !(rt->id != R_COMPLETIONS && rt->id != R_CHAT && !strcmp(method, "HEAD") && !strcmp(rt->method, "GET"))) {
        char msg[200];
        snprintf(msg, sizeof msg, "method %.20s is not allowed on %s; use %s", method, rt->path, rt->method);
        char *s = q35_api_error_json(405, msg, NULL);
        struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(r, "Content-Type", "application/json");
        MHD_add_response_header(r, "Allow", rt->method);
        q35_http_headers(c, r, 405);
        enum MHD_Result ret = MHD_queue_response(c, 405, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (!atomic_load(&srv->ready) && rt->id != R_VERSION)
        return q35_http_send_error(c, 503, "Loading model", NULL);
    switch (rt->id) {
    case R_HEALTH: /* draining: a load balancer takes this replica out of its pool */
        if (atomic_load(&srv->draining)) return q35_http_send_json(c, 503, json_pack("{s:s}", "status", "draining"));
        return q35_http_send_json(c, 200, json_pack("{s:s}", "status", "ok"));
    case R_VERSION: return q35_http_send_json(c, 200, json_pack("{s:s}", "version", Q35_VERSION));
    case R_MODELS: return q35_http_send_json(c, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_json(srv)));
    case R_MODEL: {
        const char *id = url + strlen(rt->path);
        if (!strcmp(id, srv->cfg.served_name)) return q35_http_send_json(c, 200, model_json(srv));
        char msg[300];
        snprintf(msg, sizeof msg, "The model `%.200s` does not exist.", id);
        return q35_http_send_error(c, 404, msg, "model");
    }
    case R_LLAMA_COMPLETION: return handle_generate(srv, c, b, Q35_API_COMPLETION, true);
    case R_PROPS: return q35_http_send_json(c, 200, q35_llama_props(srv));
    case R_SLOTS: return q35_http_send_json(c, 200, q35_llama_slots(srv));
    case R_APPLY_TEMPLATE: return handle_tokenize(srv, c, b, false, true);
    case R_METRICS: {
        size_t n;
        q35_sched_stats st;
        q35_sched_get_stats(srv->sched, &st);
        q35_conn_stats cs;
        q35_conns_stats(&srv->conns, &cs);
        char *t = q35_metrics_text(&srv->metrics, &st, &cs, srv->cfg.served_name, &n);
        return q35_http_send(c, 200, "text/plain; version=0.0.4; charset=utf-8", t, n);
    }
    case R_TOKENIZE: return handle_tokenize(srv, c, b, false, false);
    case R_DETOKENIZE: return handle_tokenize(srv, c, b, true, false);
    case R_COMPLETIONS: return handle_generate(srv, c, b, Q35_API_COMPLETION, false);
    case R_CHAT: return handle_generate(srv, c, b, Q35_API_CHAT, false);
    }
    return MHD_NO;
}
