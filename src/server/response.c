/* response.c: the JSON of the generation endpoints (response.h): a whole
 * text_completion or chat.completion body from a finished task's events, and
 * the pieces the streaming side (stream.c) builds its chunks from: chunk
 * envelopes, logprobs, usage, finish and stop reasons, chat deltas. Chat text
 * goes through the output parser into content, reasoning and tool calls. */
#include "server/response.h"
#include "server/decoder.h"
#include "base/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A JSON string of text that may not be valid UTF-8 (a token's bytes):
 * as is when valid, else vLLM's "bytes:\\xNN..." form. */
json_t *q35_json_text(const char *s, size_t n) {
    if (q35_utf8_valid(s, n)) return json_stringn(s, n);
    char *b = malloc(6 + 4 * n + 1);
    if (!b) return json_string("");
    size_t k = (size_t)sprintf(b, "bytes:");
    for (size_t i = 0; i < n; i++) k += (size_t)sprintf(b + k, "\\x%02x", (unsigned char)s[i]);
    json_t *j = json_stringn(b, k);
    free(b);
    return j;
}

static json_t *token_bytes_json(const q35_tokenizer *tok, int32_t id) {
    json_t *a = json_array();
    size_t n = 0;
    const char *b = tok ? q35_token_bytes(tok, id, &n) : NULL;
    for (size_t i = 0; b && i < n; i++) json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}


const char *q35_finish_name(int f) {
    switch (f) {
    case Q35_FIN_STOP: return "stop";
    case Q35_FIN_LENGTH: return "length";
    case Q35_FIN_ABORT: return "abort";
    default: return "error";
    }
}

/* A token as logprobs show it: its text, or "token_id:N" without a tokenizer. */
json_t *q35_json_token(const q35_tokenizer *tok, int32_t id) {
    size_t n = 0;
    const char *t = tok ? q35_token_bytes(tok, id, &n) : NULL;
    if (t) return q35_json_text(t, n);
    char b[32];
    snprintf(b, sizeof b, "token_id:%d", (int)id);
    return json_string(b);
}

json_t *q35_usage_json(const q35_task *r) {
    long long p = 0, g = 0;
    for (int32_t i = 0; i < r->api.n_prompts; i++) p += r->prompt_len[i];
    for (int32_t i = 0; i < r->n_choices; i++) g += r->completion_tokens[i];
    return json_pack("{s:I, s:I, s:I, s:{s:i}}", "prompt_tokens", p, "completion_tokens", g, "total_tokens", p + g,
                     "prompt_tokens_details", "cached_tokens", r->cached_tokens);
}

/* A completions top_logprobs entry as vLLM builds it: the chosen token
 * first, then the k most likely (a token already there is not repeated). */
static json_t *top_dict(const q35_tokenizer *tok, int32_t token, float lp, const int32_t *ids, const float *lps, int k) {
    json_t *top = json_object(), *key = q35_json_token(tok, token);
    json_object_set_new(top, json_string_value(key), json_real(lp < -9999.0f ? -9999.0 : lp));
    json_decref(key);
    for (int i = 0; i < k; i++) {
        key = q35_json_token(tok, ids[i]);
        if (!json_object_get(top, json_string_value(key)))
            json_object_set_new(top, json_string_value(key), json_real(lps[i] < -9999.0f ? -9999.0 : lps[i]));
        json_decref(key);
    }
    return top;
}

/* Legacy completions logprobs of one event, appended into lp's arrays. */
void q35_completion_logprobs_add(const q35_tokenizer *tok, json_t *lp, const q35_event *e, size_t offset) {
    json_array_append_new(json_object_get(lp, "tokens"), q35_json_token(tok, e->token));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(e->logprob));
    json_array_append_new(json_object_get(lp, "top_logprobs"), top_dict(tok, e->token, e->logprob, e->top_ids, e->top_lp, e->n_top));
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)offset));
}

static size_t token_text_len(const q35_tokenizer *tok, int32_t id) {
    json_t *t = q35_json_token(tok, id);
    size_t n = json_string_length(t);
    json_decref(t);
    return n;
}

size_t q35_prompt_logprobs_add(const q35_tokenizer *tok, json_t *lp, const q35_task *r, int32_t p) {
    const q35_prompt_lp *l = &r->prompt_lp[p];
    const int32_t *ids = r->prompt_ids[p];
    int k = r->api.logprobs < l->k ? r->api.logprobs : l->k;
    size_t off = 0;
    for (int32_t i = 0; i < l->n; i++) {
        json_array_append_new(json_object_get(lp, "tokens"), q35_json_token(tok, ids[i]));
        json_array_append_new(json_object_get(lp, "token_logprobs"),
                              i ? json_real(l->logprob[i] < -9999.0f ? -9999.0 : l->logprob[i]) : json_null());
        json_array_append_new(json_object_get(lp, "top_logprobs"),
                              i ? top_dict(tok, ids[i], l->logprob[i], l->top_ids + (size_t)i * (size_t)l->k,
                                           l->top_lp + (size_t)i * (size_t)l->k, k)
                                : json_null());
        json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)off));
        off += token_text_len(tok, ids[i]);
    }
    return off;
}

/* One prompt_logprobs entry (vLLM's): {"id": {logprob, rank, decoded_token}}. */
static void plp_entry(const q35_tokenizer *tok, json_t *o, int32_t id, float lp, int32_t rank) {
    char key[16];
    snprintf(key, sizeof key, "%d", (int)id);
    if (json_object_get(o, key)) return;
    json_object_set_new(o, key, json_pack("{s:f, s:i, s:o}", "logprob", lp < -9999.0f ? -9999.0 : (double)lp, "rank", rank,
                                          "decoded_token", q35_json_token(tok, id)));
}

json_t *q35_prompt_logprobs_json(const q35_tokenizer *tok, const q35_task *r, int32_t p) {
    const q35_prompt_lp *l = &r->prompt_lp[p];
    json_t *a = json_array();
    json_array_append_new(a, json_null());
    for (int32_t i = 1; i < l->n; i++) {
        json_t *o = json_object();
        plp_entry(tok, o, r->prompt_ids[p][i], l->logprob[i], l->rank[i]);
        for (int32_t j = 0; j < l->k; j++)
            plp_entry(tok, o, l->top_ids[(size_t)i * (size_t)l->k + (size_t)j], l->top_lp[(size_t)i * (size_t)l->k + (size_t)j], j + 1);
        json_array_append_new(a, o);
    }
    return a;
}

json_t *q35_chat_logprob_entry(const q35_tokenizer *tok, const q35_event *e) {
    json_t *top = json_array();
    for (int i = 0; i < e->n_top; i++)
        json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", q35_json_token(tok, e->top_ids[i]), "logprob",
                                             (double)e->top_lp[i], "bytes", token_bytes_json(tok, e->top_ids[i])));
    return json_pack("{s:o, s:f, s:o, s:o}", "token", q35_json_token(tok, e->token), "logprob", (double)e->logprob, "bytes",
                     token_bytes_json(tok, e->token), "top_logprobs", top);
}

json_t *q35_stop_reason_json(const q35_event *e) {
    if (e->stop_str) return json_string(e->stop_str);
    if (e->stop_id >= 0) return json_integer(e->stop_id);
    return json_null();
}

char *q35_echo_text(const q35_tokenizer *tok, const q35_task *r, int32_t prompt_index) {
    q35_api_prompt *p = &r->api.prompts[prompt_index];
    if (p->text) return strdup(p->text);
    const int32_t *ids = r->prompt_ids[prompt_index];
    int32_t n_ids = r->prompt_len[prompt_index];
    q35_text_decoder *dec = tok ? q35_text_decoder_new(tok) : NULL;
    size_t cap = (size_t)n_ids * 14 + 1, n = 0;
    char *s = malloc(cap);
    for (int32_t i = 0; s && i <= n_ids; i++) {
        size_t k = 0;
        const char *piece = NULL;
        char b[16];
        if (dec) piece = i < n_ids ? q35_text_decoder_feed(dec, ids[i], &k) : q35_text_decoder_flush(dec, &k);
        else if (i < n_ids) k = (size_t)snprintf(b, sizeof b, "<%d>", (int)ids[i]), piece = b;
        if (n + k + 1 > cap) {
            char *ns = realloc(s, cap = 2 * (n + k + 1));
            if (!ns) { free(s); s = NULL; break; }
            s = ns;
        }
        if (k) memcpy(s + n, piece, k);
        n += k;
        s[n] = 0;
    }
    q35_text_decoder_free(dec);
    return s;
}

/* ---- chat output: reasoning, content and tool calls ---- */

static json_t *tool_call_id(void) {
    char b[40];
    snprintf(b, sizeof b, "call_%08x%08x%08x", arc4random(), arc4random(), arc4random());
    return json_string(b);
}

/* One parser delta as a chat.completion.chunk delta object. */
json_t *q35_delta_json(const q35_delta *d) {
    json_t *t = q35_json_text(d->text, d->len);
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
static json_t *chat_message(const q35_task *r, const char *text, size_t len, int *n_tools) {
    q35_output_parser *p = NULL;
    q35_error err;
    const q35_delta *d;
    size_t nd;
    *n_tools = 0;
    if (q35_output_parser_new(r->tools_json, r->think, &p, &err) || q35_output_parser_feed(p, text, len, &d, &nd, &err) ||
        q35_output_parser_finish(p, &d, &nd, &err)) {
        q35_output_parser_free(p);
        return json_pack("{s:s, s:o, s:n, s:[]}", "role", "assistant", "content", q35_json_text(text, len), "reasoning_content", "tool_calls");
    }
    size_t n_content, n_reasoning; /* the text may hold NUL bytes, as streamed */
    const char *content = q35_output_parser_content(p, &n_content), *reasoning = q35_output_parser_reasoning(p, &n_reasoning);
    char *calls = q35_output_parser_tool_calls_json(p);
    json_t *tc = calls ? json_loads(calls, 0, NULL) : NULL;
    free(calls);
    if (!json_is_array(tc)) { json_decref(tc); tc = json_array(); }
    for (size_t i = 0; i < json_array_size(tc); i++) json_object_set_new(json_array_get(tc, i), "id", tool_call_id());
    *n_tools = (int)json_array_size(tc);
    json_t *m = json_pack("{s:s, s:o, s:o}", "role", "assistant", "content",
                          n_content || !*n_tools ? q35_json_text(content, n_content) : json_null(), "tool_calls", tc);
    json_t *rc = n_reasoning ? q35_json_text(reasoning, n_reasoning) : json_null();
    json_object_set(m, "reasoning_content", rc);
    json_object_set_new(m, "reasoning", rc);
    q35_output_parser_free(p);
    return m;
}

json_t *q35_full_response(const q35_tokenizer *tok, const char *model, const q35_task *r) {
    bool chat = r->api.kind == Q35_API_CHAT;
    json_t *choices = json_array();
    for (int32_t c = 0; c < r->n_choices; c++) {
        char *text = NULL;
        size_t len = 0, cap = 0;
        if (r->api.echo) {
            char *e = q35_echo_text(tok, r, c / r->api.n);
            if (e) { len = strlen(e); cap = len + 1; text = e; }
        }
        json_t *lp = NULL, *ids = json_array();
        if (r->api.logprobs >= 0)
            lp = chat ? json_pack("{s:[]}", "content")
                      : json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
        if (lp && !chat && r->api.echo && r->prompt_lp) q35_prompt_logprobs_add(tok, lp, r, c / r->api.n);
        const q35_event *last = NULL;
        for (size_t i = 0; i < r->n_ev; i++) {
            const q35_event *e = &r->ev[i];
            if (e->choice != c) continue;
            if (e->finish) last = e;
            if (r->api.echo_only) continue; /* the prompt alone is answered */
            if (e->token >= 0) {
                json_array_append_new(ids, json_integer(e->token));
                if (lp && chat) json_array_append_new(json_object_get(lp, "content"), q35_chat_logprob_entry(tok, e));
                else if (lp) q35_completion_logprobs_add(tok, lp, e, len);
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
        }
        int fin = last ? last->finish : Q35_FIN_ERROR;
        json_t *ch;
        if (chat) {
            int n_tools;
            json_t *msg = chat_message(r, text ? text : "", len, &n_tools);
            ch = json_pack("{s:i, s:o, s:o, s:s, s:o}", "index", c, "message", msg, "logprobs", lp ? lp : json_null(),
                           "finish_reason", n_tools && fin == Q35_FIN_STOP ? "tool_calls" : q35_finish_name(fin),
                           "stop_reason", last ? q35_stop_reason_json(last) : json_null());
        } else {
            ch = json_pack("{s:i, s:o, s:o, s:s, s:o}", "index", c, "text", q35_json_text(text ? text : "", len), "logprobs",
                           lp ? lp : json_null(), "finish_reason", q35_finish_name(fin), "stop_reason",
                           last ? q35_stop_reason_json(last) : json_null());
        }
        free(text);
        if (!chat && r->prompt_lp) json_object_set_new(ch, "prompt_logprobs", q35_prompt_logprobs_json(tok, r, c / r->api.n));
        if (r->api.return_token_ids) json_object_set_new(ch, "token_ids", ids);
        else json_decref(ids);
        json_array_append_new(choices, ch);
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:n}", "id", r->id, "object", chat ? "chat.completion" : "text_completion",
                     "created", (json_int_t)r->created, "model", model, "choices", choices, "usage", q35_usage_json(r),
                     "system_fingerprint");
}

json_t *q35_chunk_base(const char *model, const q35_task *r, json_t *choices) {
    bool chat = r->api.kind == Q35_API_CHAT;
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", r->id, "object", chat ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)r->created, "model", model, "choices", choices);
}
