/* output_parser.c: generated text -> OpenAI reasoning_content, content and
 * tool_calls, incrementally (q35_output_parser), following vLLM's "qwen3"
 * reasoning parser and "qwen3_coder" tool parser.
 *
 * Text arrives in arbitrary pieces and is appended to `pending`; a state
 * machine consumes it as far as it can be sure of, holding back any tail
 * that could still become a tag ("</thi" might be "</think>").
 *
 *   REASONING  until </think>, or until an unpaired <tool_call> (which ends
 *              reasoning implicitly and is left for CONTENT to handle)
 *   CONTENT    until <tool_call> (or a bare <function=, vLLM's fallback)
 *   TOOL       a <tool_call> block: <function=NAME> then <parameter=KEY>
 *              VALUE </parameter> ... </function> </tool_call>. The name is
 *              emitted once known, then each parameter as soon as it is
 *              complete, as the next piece of the arguments JSON, so the
 *              pieces concatenate to json.dumps(arguments, ensure_ascii=False).
 *   AFTER_TOOL text after a tool call: dropped, as vLLM does, until the next
 *              <tool_call>.
 *
 * Parameter values are typed by the tool's JSON schema the way vLLM's
 * _convert_param_value does (null, integer, number, boolean, object/array,
 * else a Python-literal guess). A block that never names a function is
 * handed back as plain content. */
#include "text/pyjson.h"
#include "text/schema.h"
#include "base/util.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <strings.h>

typedef enum { ST_REASONING, ST_CONTENT, ST_TOOL, ST_AFTER_TOOL } parse_state;

typedef struct tool_call {
    char *name;
    q35_buf args;   /* the arguments JSON emitted so far */
    int n_params;
    bool closed;
} tool_call;

typedef struct delta_rec { q35_delta_kind kind; int32_t index; size_t off, len; } delta_rec;

struct q35_output_parser {
    json_t *tools;            /* the request's tools array, or NULL: no tool parsing */
    parse_state state;
    bool at_start;            /* nothing consumed yet */
    q35_buf pending;          /* received, not yet consumed */
    q35_buf content, reasoning;
    tool_call *calls;
    int n_calls;
    q35_buf call_raw;         /* the current tool block's text after <tool_call> */
    size_t call_pos;          /* how far call_raw has been parsed */
    bool call_has_name, call_in_function;
    /* deltas of the current call */
    q35_buf delta_text;
    delta_rec *recs;
    q35_delta *deltas;
    size_t n_recs, cap_recs;
    bool oom;
};

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";
static const char TOOL_OPEN[] = "<tool_call>", TOOL_CLOSE[] = "</tool_call>";
static const char FUNC_OPEN[] = "<function=", FUNC_CLOSE[] = "</function>";
static const char PARAM_OPEN[] = "<parameter=", PARAM_CLOSE[] = "</parameter>";

static void add_delta(q35_output_parser *p, q35_delta_kind kind, int32_t index, const char *s, size_t n) {
    if (n == 0 && kind != Q35_DELTA_TOOL_NAME) return;
    if (kind == Q35_DELTA_CONTENT) q35_buf_append(&p->content, s, n);
    if (kind == Q35_DELTA_REASONING) q35_buf_append(&p->reasoning, s, n);
    delta_rec *last = p->n_recs ? &p->recs[p->n_recs - 1] : NULL;
    size_t off = p->delta_text.len;
    q35_buf_append(&p->delta_text, s, n);
    /* Runs of the same kind (not names) become one delta. */
    if (last && last->kind == kind && last->index == index && kind != Q35_DELTA_TOOL_NAME && last->off + last->len == off) {
        last->len += n;
        return;
    }
    if (p->n_recs == p->cap_recs) {
        size_t cap = p->cap_recs ? 2 * p->cap_recs : 16;
        delta_rec *r = realloc(p->recs, sizeof *r * cap);
        q35_delta *d = realloc(p->deltas, sizeof *d * cap);
        if (r) p->recs = r;
        if (d) p->deltas = d;
        if (!r || !d) { p->oom = true; return; }
        p->cap_recs = cap;
    }
    p->recs[p->n_recs++] = (delta_rec){kind, index, off, n};
}

static const char *find(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

/* Length of the longest tail of s that is a proper prefix of one of the tags:
 * that much must wait for more text. */
static size_t partial_tail(const char *s, size_t n, const char *const *tags, int n_tags) {
    size_t best = 0;
    for (int t = 0; t < n_tags; t++) {
        size_t k = strlen(tags[t]);
        for (size_t m = k - 1; m > best; m--)
            if (m <= n && !memcmp(s + n - m, tags[t], m)) { best = m; break; }
    }
    return best;
}

static void consume(q35_output_parser *p, size_t n) {
    memmove(p->pending.data, p->pending.data + n, p->pending.len - n);
    p->pending.len -= n;
    p->pending.data[p->pending.len] = 0;
    if (n) p->at_start = false;
}

/* ---- parameter typing (vLLM's _convert_param_value) ---- */

static const json_t *param_schema(const q35_output_parser *p, const char *func, const char *param, bool *any_schema) {
    *any_schema = false;
    size_t i;
    json_t *tool;
    json_array_foreach(p->tools, i, tool) {
        json_t *fn = json_object_get(tool, "function");
        json_t *name = json_object_get(fn, "name");
        if (!json_is_string(name) || strcmp(json_string_value(name), func)) continue;
        if (!json_is_string(json_object_get(tool, "type")) || strcmp(json_string_value(json_object_get(tool, "type")), "function"))
            continue;
        json_t *params = json_object_get(fn, "parameters");
        if (!json_is_object(params)) return NULL;
        json_t *props = json_object_get(params, "properties");
        *any_schema = json_is_object(props ? props : params) && json_object_size(props ? props : params) > 0;
        /* a $ref into the parameters ($defs) is read by its target's type */
        return q35_schema_resolve(params, json_object_get(props ? props : params, param));
    }
    return NULL;
}

/* Python's int(): optional spaces and sign, digits with single underscores. */
static bool parse_py_int(const char *s, long long *out) {
    char digits[64];
    size_t k = 0;
    while (isspace((unsigned char)*s)) s++;
    if (*s == '+' || *s == '-') digits[k++] = *s++;
    if (!isdigit((unsigned char)*s)) return false;
    for (; *s && !isspace((unsigned char)*s); s++) {
        if (*s == '_' && isdigit((unsigned char)s[1]) && isdigit((unsigned char)s[-1])) continue;
        if (!isdigit((unsigned char)*s) || k >= sizeof digits - 1) return false;
        digits[k++] = *s;
    }
    while (isspace((unsigned char)*s)) s++;
    if (*s) return false;
    digits[k] = 0;
    errno = 0;
    *out = strtoll(digits, NULL, 10);
    return errno == 0; /* beyond 64 bits: kept as text */
}

/* Python's float() for finite values. */
static bool parse_py_float(const char *s, double *out) {
    char buf[128];
    size_t k = 0;
    for (const char *q = s; *q; q++) {
        if (*q == '_') continue;
        if (k >= sizeof buf - 1) return false;
        buf[k++] = *q;
    }
    buf[k] = 0;
    char *end;
    const char *b = buf;
    while (isspace((unsigned char)*b)) b++;
    if (!*b || (!isdigit((unsigned char)*b) && *b != '.' && *b != '-' && *b != '+')) return false; /* no inf/nan/hex */
    if ((b[0] == '0' && (b[1] == 'x' || b[1] == 'X'))) return false;
    *out = strtod(b, &end);
    while (isspace((unsigned char)*end)) end++;
    return *end == 0 && end != b && isfinite(*out);
}

static json_t *python_literal(const char *v) {
    long long i;
    double d;
    if (parse_py_int(v, &i)) return json_integer(i);
    if (parse_py_float(v, &d)) return json_real(d);
    if (!strcmp(v, "True")) return json_true();
    if (!strcmp(v, "False")) return json_false();
    if (!strcmp(v, "None")) return json_null();
    json_t *j = json_loads(v, JSON_DECODE_ANY, NULL); /* lists and dicts written as JSON */
    if (j && (json_is_array(j) || json_is_object(j) || json_is_string(j))) return j;
    json_decref(j);
    return NULL;
}

static json_t *convert_param(const q35_output_parser *p, const char *func, const char *name, const char *v) {
    if (!strcasecmp(v, "null")) return json_null();
    bool any_schema;
    const json_t *cfg = param_schema(p, func, name, &any_schema);
    if (!cfg) return json_string(v);
    char type[64] = "string";
    json_t *t = json_object_get(cfg, "type");
    if (json_is_object(cfg) && t) {
        if (json_is_string(t)) {
            const char *s = json_string_value(t);
            while (isspace((unsigned char)*s)) s++;
            size_t k = 0;
            for (; *s && k < sizeof type - 1; s++) type[k++] = (char)tolower((unsigned char)*s);
            while (k && isspace((unsigned char)type[k - 1])) k--;
            type[k] = 0;
        } else snprintf(type, sizeof type, "[list]"); /* str() of a list matches no named type */
    }
    static const char *const stringy[] = {"string", "str", "text", "varchar", "char", "enum"};
    for (int i = 0; i < 6; i++)
        if (!strcmp(type, stringy[i])) return json_string(v);
    if (!strncmp(type, "int", 3) || !strncmp(type, "uint", 4) || !strncmp(type, "long", 4) || !strncmp(type, "short", 5) ||
        !strncmp(type, "unsigned", 8)) {
        long long i;
        return parse_py_int(v, &i) ? json_integer(i) : json_string(v);
    }
    if (!strncmp(type, "num", 3) || !strncmp(type, "float", 5)) {
        double d;
        if (!parse_py_float(v, &d)) return json_string(v);
        if (d == trunc(d) && fabs(d) < 9.2e18) return json_integer((json_int_t)d);
        return json_real(d);
    }
    if (!strcmp(type, "boolean") || !strcmp(type, "bool") || !strcmp(type, "binary")) {
        char low[8];
        size_t k = 0;
        for (; v[k] && k < 6; k++) low[k] = (char)tolower((unsigned char)v[k]);
        low[k] = 0;
        return json_boolean(!v[k] && !strcmp(low, "true"));
    }
    if (!strcmp(type, "object") || !strcmp(type, "array") || !strcmp(type, "arr") || !strncmp(type, "dict", 4) ||
        !strncmp(type, "list", 4)) {
        json_t *j = json_loads(v, JSON_DECODE_ANY, NULL);
        if (j) return j;
    }
    json_t *lit = python_literal(v);
    return lit ? lit : json_string(v);
}

/* ---- tool blocks ---- */

static tool_call *current_call(q35_output_parser *p) { return &p->calls[p->n_calls - 1]; }

static void close_arguments(q35_output_parser *p) {
    tool_call *c = current_call(p);
    if (c->closed) return;
    const char *s = c->n_params ? "}" : "{}";
    q35_buf_puts(&c->args, s);
    add_delta(p, Q35_DELTA_TOOL_ARGS, p->n_calls - 1, s, strlen(s));
    c->closed = true;
}

static void emit_param(q35_output_parser *p, const char *name, size_t name_len, const char *v, size_t vn) {
    tool_call *c = current_call(p);
    if (vn && v[0] == '\n') { v++; vn--; }
    if (vn && v[vn - 1] == '\n') vn--;
    /* The parameter is complete, so bytes that are not UTF-8 never will be. */
    size_t key_len;
    char *key = q35_utf8_repair(name, name_len, &key_len), *val = q35_utf8_repair(v, vn, NULL);
    json_t *j = key && val ? convert_param(p, c->name, key, val) : NULL;
    q35_buf piece = {0};
    q35_buf_puts(&piece, c->n_params ? ", " : "{");
    json_t *k = key ? json_stringn(key, key_len) : NULL;
    if (k) q35_py_json_dumps(k, &piece);
    q35_buf_puts(&piece, ": ");
    if (j) q35_py_json_dumps(j, &piece);
    if (!j || !k || piece.oom) p->oom = true;
    else {
        q35_buf_append(&c->args, piece.data, piece.len);
        add_delta(p, Q35_DELTA_TOOL_ARGS, p->n_calls - 1, piece.data, piece.len);
        c->n_params++;
    }
    json_decref(j);
    json_decref(k);
    q35_buf_free(&piece);
    free(key);
    free(val);
}

/* A tool block that turned out malformed goes back to the content. */
static void block_to_content(q35_output_parser *p, size_t upto) {
    add_delta(p, Q35_DELTA_CONTENT, 0, TOOL_OPEN, strlen(TOOL_OPEN));
    add_delta(p, Q35_DELTA_CONTENT, 0, p->call_raw.data, upto);
}

static void end_block(q35_output_parser *p) {
    p->call_raw.len = 0;
    p->call_pos = 0;
    p->call_has_name = p->call_in_function = false;
    p->state = p->n_calls ? ST_AFTER_TOOL : ST_CONTENT;
}

/* Puts text that followed a tool block back in front of the pending text. */
static void requeue(q35_output_parser *p, const char *s, size_t n) {
    q35_buf b = {0};
    q35_buf_append(&b, s, n);
    q35_buf_append(&b, p->pending.data ? p->pending.data : "", p->pending.len);
    q35_buf_free(&p->pending);
    p->pending = b;
}

/* Parses call_raw from call_pos as far as it is complete. */
static void parse_block(q35_output_parser *p, bool final) {
    for (;;) {
        const char *s = p->call_raw.data ? p->call_raw.data : "";
        size_t n = p->call_raw.len, pos = p->call_pos;
        if (!p->call_has_name) {
            const char *close = find(s, n, TOOL_CLOSE), *fn = find(s, n, FUNC_OPEN);
            const char *gt = fn ? memchr(fn, '>', (size_t)(s + n - fn)) : NULL;
            if (fn && gt && (!close || fn < close) && gt > fn + strlen(FUNC_OPEN) &&
                !memchr(fn, '\n', (size_t)(gt - fn))) {
                tool_call *calls = realloc(p->calls, sizeof *calls * (size_t)(p->n_calls + 1));
                if (!calls) { p->oom = true; return; }
                p->calls = calls;
                const char *name = fn + strlen(FUNC_OPEN);
                size_t name_len;
                calls[p->n_calls++] = (tool_call){.name = q35_utf8_repair(name, (size_t)(gt - name), &name_len)};
                if (!current_call(p)->name) { p->oom = true; return; }
                add_delta(p, Q35_DELTA_TOOL_NAME, p->n_calls - 1, current_call(p)->name, name_len);
                p->call_has_name = p->call_in_function = true;
                p->call_pos = (size_t)(gt + 1 - s);
                continue;
            }
            if (close || final || (fn && gt)) { /* no usable <function=NAME>: plain text after all */
                size_t upto = close && !final ? (size_t)(close - s) + strlen(TOOL_CLOSE) : n;
                block_to_content(p, upto);
                requeue(p, s + upto, n - upto);
                end_block(p);
                return;
            }
            return; /* wait for more */
        }
        if (p->call_in_function) {
            const char *param = find(s + pos, n - pos, PARAM_OPEN);
            const char *fclose = find(s + pos, n - pos, FUNC_CLOSE), *tclose = find(s + pos, n - pos, TOOL_CLOSE);
            const char *end = fclose && (!tclose || fclose < tclose) ? fclose : tclose;
            if (param && (!end || param < end)) {
                const char *name = param + strlen(PARAM_OPEN);
                const char *gt = memchr(name, '>', (size_t)(s + n - name));
                if (!gt) { if (final) { p->call_pos = n; continue; } return; }
                const char *v = gt + 1;
                /* The value ends at </parameter>, or where the next parameter
                 * or the function's end begins (vLLM's regex). */
                const char *ends[3] = {find(v, (size_t)(s + n - v), PARAM_CLOSE), find(v, (size_t)(s + n - v), PARAM_OPEN),
                                       find(v, (size_t)(s + n - v), FUNC_CLOSE)};
                const char *ve = NULL;
                for (int i = 0; i < 3; i++)
                    if (ends[i] && (!ve || ends[i] < ve)) ve = ends[i];
                const char *tc = find(v, (size_t)(s + n - v), TOOL_CLOSE);
                if (tc && (!ve || tc < ve)) ve = tc;
                if (!ve && !final) {
                    /* Holding the whole value: the closing tag may still be split. */
                    return;
                }
                if (!ve) ve = s + n;
                emit_param(p, name, (size_t)(gt - name), v, (size_t)(ve - v));
                p->call_pos = (size_t)(ve - s) + (ve == ends[0] ? strlen(PARAM_CLOSE) : 0);
                continue;
            }
            if (end) {
                close_arguments(p);
                p->call_in_function = false;
                p->call_pos = (size_t)(end - s) + (end == fclose ? strlen(FUNC_CLOSE) : 0);
                continue;
            }
            if (final) { close_arguments(p); p->call_in_function = false; p->call_pos = n; continue; }
            return;
        }
        /* After </function>: wait for </tool_call>; anything else is dropped. */
        const char *tclose = find(s + pos, n - pos, TOOL_CLOSE);
        if (tclose || final) {
            size_t after = tclose ? (size_t)(tclose - s) + strlen(TOOL_CLOSE) : n;
            requeue(p, s + after, n - after);
            end_block(p);
        }
        return;
    }
}

/* ---- the state machine ---- */

static void run(q35_output_parser *p, bool final) {
    static const char *const reasoning_tags[] = {THINK_CLOSE, TOOL_OPEN};
    static const char *const content_tags[] = {TOOL_OPEN, FUNC_OPEN};
    for (int guard = 0; guard < 1000000 && !p->oom; guard++) {
        const char *s = p->pending.data ? p->pending.data : "";
        size_t n = p->pending.len;
        if (p->state == ST_TOOL) {
            q35_buf_append(&p->call_raw, s, n);
            consume(p, n);
            parse_block(p, final);
            if (p->state == ST_TOOL || p->pending.len == 0) return;
            continue;
        }
        /* A leading <think> opens reasoning (or is dropped inside it). */
        if (p->at_start && p->state != ST_AFTER_TOOL) {
            size_t k = strlen(THINK_OPEN);
            if (n < k && !memcmp(s, THINK_OPEN, n) && !final) return;
            if (n >= k && !memcmp(s, THINK_OPEN, k)) {
                p->state = ST_REASONING;
                consume(p, k);
                continue;
            }
        }
        bool tools = p->tools != NULL;
        if (p->state == ST_REASONING) {
            const char *close = find(s, n, THINK_CLOSE), *tool = find(s, n, TOOL_OPEN);
            if (tool && (!close || tool < close)) {
                add_delta(p, Q35_DELTA_REASONING, 0, s, (size_t)(tool - s));
                consume(p, (size_t)(tool - s));
                p->state = ST_CONTENT;
                continue;
            }
            if (close) {
                add_delta(p, Q35_DELTA_REASONING, 0, s, (size_t)(close - s));
                consume(p, (size_t)(close - s) + strlen(THINK_CLOSE));
                p->state = ST_CONTENT;
                continue;
            }
            size_t hold = final ? 0 : partial_tail(s, n, reasoning_tags, 2);
            add_delta(p, Q35_DELTA_REASONING, 0, s, n - hold);
            consume(p, n - hold);
            return;
        }
        const char *open = NULL;
        size_t tag_len = 0;
        if (tools) {
            const char *tc = find(s, n, TOOL_OPEN), *fn = find(s, n, FUNC_OPEN);
            if (tc && (!fn || tc <= fn)) { open = tc; tag_len = strlen(TOOL_OPEN); }
            else if (fn) { open = fn; tag_len = 0; } /* a bare <function= is a call too (vLLM's fallback) */
        }
        if (open) {
            if (p->state == ST_CONTENT) add_delta(p, Q35_DELTA_CONTENT, 0, s, (size_t)(open - s));
            consume(p, (size_t)(open - s) + tag_len);
            p->state = ST_TOOL;
            continue;
        }
        size_t hold = final || !tools ? 0 : partial_tail(s, n, content_tags, 2);
        if (p->state == ST_CONTENT) add_delta(p, Q35_DELTA_CONTENT, 0, s, n - hold);
        consume(p, n - hold);
        return;
    }
}

static q35_status finish_call(q35_output_parser *p, const q35_delta **deltas, size_t *n, q35_error *err) {
    if (p->oom) {
        *deltas = NULL;
        *n = 0;
        return q35_fail(err, Q35_ERR_NOMEM, "output parser: out of memory");
    }
    for (size_t i = 0; i < p->n_recs; i++)
        p->deltas[i] = (q35_delta){p->recs[i].kind, p->recs[i].index, p->delta_text.data + p->recs[i].off, p->recs[i].len};
    *deltas = p->deltas;
    *n = p->n_recs;
    return Q35_OK;
}

static void begin_call(q35_output_parser *p) {
    p->n_recs = 0;
    p->delta_text.len = 0;
}

q35_status q35_output_parser_new(const char *tools_json, int in_reasoning, q35_output_parser **out, q35_error *err) {
    *out = NULL;
    q35_output_parser *p = calloc(1, sizeof *p);
    if (!p) return q35_fail(err, Q35_ERR_NOMEM, "output parser: out of memory");
    if (tools_json) {
        json_error_t je;
        p->tools = json_loads(tools_json, JSON_DECODE_ANY, &je);
        if (!json_is_array(p->tools)) {
            json_decref(p->tools);
            free(p);
            return q35_fail(err, Q35_ERR_ARG, "output parser: tools are not a JSON array");
        }
    }
    p->state = in_reasoning ? ST_REASONING : ST_CONTENT;
    p->at_start = true;
    q35_buf_append(&p->content, "", 0);
    q35_buf_append(&p->reasoning, "", 0);
    q35_buf_append(&p->pending, "", 0);
    *out = p;
    return Q35_OK;
}

void q35_output_parser_free(q35_output_parser *p) {
    if (!p) return;
    json_decref(p->tools);
    q35_buf_free(&p->pending);
    q35_buf_free(&p->content);
    q35_buf_free(&p->reasoning);
    q35_buf_free(&p->call_raw);
    q35_buf_free(&p->delta_text);
    for (int i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        q35_buf_free(&p->calls[i].args);
    }
    free(p->calls);
    free(p->recs);
    free(p->deltas);
    free(p);
}

q35_status q35_output_parser_feed(q35_output_parser *p, const char *text, size_t len, const q35_delta **deltas,
                                  size_t *n_deltas, q35_error *err) {
    begin_call(p);
    q35_buf_append(&p->pending, text, len);
    run(p, false);
    return finish_call(p, deltas, n_deltas, err);
}

q35_status q35_output_parser_finish(q35_output_parser *p, const q35_delta **deltas, size_t *n_deltas, q35_error *err) {
    begin_call(p);
    run(p, true);
    return finish_call(p, deltas, n_deltas, err);
}

const char *q35_output_parser_content(const q35_output_parser *p, size_t *len) {
    if (len) *len = p->content.data ? p->content.len : 0;
    return p->content.data ? p->content.data : "";
}

const char *q35_output_parser_reasoning(const q35_output_parser *p, size_t *len) {
    if (len) *len = p->reasoning.data ? p->reasoning.len : 0;
    return p->reasoning.data ? p->reasoning.data : "";
}

char *q35_output_parser_tool_calls_json(const q35_output_parser *p) {
    if (p->n_calls == 0) return NULL;
    json_t *arr = json_array();
    for (int i = 0; i < p->n_calls; i++) {
        const tool_call *c = &p->calls[i];
        /* An unfinished call (output cut off) still gets valid JSON. */
        q35_buf args = {0};
        q35_buf_append(&args, c->args.data ? c->args.data : "", c->args.len);
        if (!c->closed) q35_buf_puts(&args, c->n_params ? "}" : "{}");
        json_array_append_new(arr, json_pack("{s:s, s:{s:s, s:s%}}", "type", "function", "function", "name", c->name,
                                             "arguments", args.data ? args.data : "", args.len));
        q35_buf_free(&args);
    }
    char *s = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    return s;
}
