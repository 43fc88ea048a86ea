/* request.c: request bodies of /v1/completions and /v1/chat/completions
 * (request.h). JSON bytes come in; a validated q35_api_request, or an HTTP
 * status with a message and the offending field, goes out. Also the error
 * body every refused request gets. Nothing here does I/O. */
#include "server/request.h"

#include "base/utf8.h"
#include "server/images.h"
#include "text/schema.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ---------------------------------------------------------------- */

const char *q35_api_error_type(int status) {
    switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 403: return "PermissionDeniedError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowedError";
    case 413: return "RequestTooLargeError";
    case 429: return "RateLimitError";
    case 501: return "NotImplementedError";
    case 503: return "ServiceUnavailableError";
    default: return status >= 500 ? "InternalServerError" : "BadRequestError";
    }
}

char *q35_api_error_json(int status, const char *message, const char *param) {
    json_t *e = json_pack("{s:{s:s, s:s, s:o, s:i}}", "error", "message", message ? message : "",
                          "type", q35_api_error_type(status), "param",
                          param && *param ? json_string(param) : json_null(), "code", status);
    if (!e) return NULL;
    char *s = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    return s;
}

/* ---- request parsing -------------------------------------------------------- */

typedef struct {
    char *msg;
    size_t msg_size;
    char *param;
    size_t param_size;
} perr;

static int fail(perr *e, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(perr *e, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, e->msg_size, fmt, ap);
    va_end(ap);
    snprintf(e->param, e->param_size, "%s", param ? param : "");
    return status;
}

int q35_api_parse_ids(json_t *arr, int32_t vocab_size, int32_t **ids, int32_t *n) {
    *ids = NULL;
    *n = 0;
    if (!json_is_array(arr)) return -1;
    size_t m = json_array_size(arr);
    if (m > INT32_MAX / 2) return -1;
    int32_t *v = malloc(sizeof *v * (m ? m : 1));
    if (!v) return -1;
    for (size_t i = 0; i < m; i++) {
        json_t *x = json_array_get(arr, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab_size) {
            free(v);
            return -1;
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    *ids = v;
    *n = (int32_t)m;
    return 0;
}

static bool is_num(json_t *v) { return json_is_integer(v) || json_is_real(v); }

/* A number field in [lo, hi]; absent or null keeps *out. */
static int get_num(json_t *root, const char *key, double lo, double hi, float *out, perr *e) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!is_num(v)) return fail(e, 400, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return fail(e, 400, key, "'%s' must be between %g and %g, got %g", key, lo, hi, x);
    *out = (float)x;
    return 0;
}

static int get_int(json_t *root, const char *key, long long lo, long long hi, long long *out, perr *e) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return fail(e, 400, key, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return fail(e, 400, key, "'%s' must be between %lld and %lld, got %lld", key, lo, hi, x);
    *out = x;
    return 0;
}

static int get_bool(json_t *root, const char *key, bool *out, perr *e) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return fail(e, 400, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

static const char *const common_fields[] = {
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "stop_token_ids", "n", "logprobs", "ignore_eos", "min_tokens", "stream",
    "stream_options", "user", "return_token_ids", "cache_prompt", "cache_salt", "add_special_tokens",
    "response_format", "logit_bias", NULL};
static const char *const completion_fields[] = {"prompt", "echo", "suffix", "best_of", "prompt_logprobs", NULL};
static const char *const chat_fields[] = {"messages", "max_completion_tokens", "top_logprobs", "chat_template_kwargs",
                                          "tools", "tool_choice", "parallel_tool_calls", "continue_final_message",
                                          "add_generation_prompt", NULL};

static bool in_list(const char *k, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(k, *list)) return true;
    return false;
}

/* response_format json_schema: {"name", "schema", "strict", "description"} */
static int parse_json_schema(json_t *js, q35_api_request *r, perr *e) {
    static const char P[] = "response_format.json_schema";
    if (!json_is_object(js)) return fail(e, 400, "response_format", "'%s' must be an object with a 'schema'", P);
    const char *k;
    json_t *v;
    json_object_foreach(js, k, v) {
        if (strcmp(k, "name") && strcmp(k, "schema") && strcmp(k, "strict") && strcmp(k, "description"))
            return fail(e, 400, P, "%s.%s is not supported", P, k);
    }
    json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
    if (name && !json_is_string(name) && !json_is_null(name)) return fail(e, 400, "response_format.json_schema.name", "%s.name must be a string", P);
    if (strict && !json_is_boolean(strict) && !json_is_null(strict))
        return fail(e, 400, "response_format.json_schema.strict", "%s.strict must be a boolean", P);
    json_t *schema = json_object_get(js, "schema");
    if (!schema || json_is_null(schema)) return fail(e, 400, "response_format.json_schema.schema", "%s.schema is required", P);
    char where[200], msg[256], param[260];
    if (q35_schema_compile(schema, &r->schema, where, sizeof where, msg, sizeof msg)) {
        snprintf(param, sizeof param, "%s.schema%s", P, where);
        return fail(e, 400, param, "%s: %s", param, msg);
    }
    return 0;
}

static int parse_prompts(json_t *p, const q35_api_limits *lim, q35_api_request *r, perr *e) {
    /* string | [string...] | [int...] | [[int...]...] */
    json_t *items[1] = {p};
    json_t *list = NULL;
    size_t m = 1;
    if (json_is_array(p) && json_array_size(p) > 0 && !json_is_integer(json_array_get(p, 0))) {
        list = p;
        m = json_array_size(p);
    }
    if (!json_is_string(p) && !json_is_array(p)) return fail(e, 400, "prompt", "'prompt' must be a string, a list of strings, or token ids");
    if (json_is_array(p) && json_array_size(p) == 0) return fail(e, 400, "prompt", "'prompt' must not be empty");
    if (m > (size_t)lim->max_prompts) return fail(e, 400, "prompt", "at most %d prompts per request, got %zu", lim->max_prompts, m);
    r->prompts = calloc(m, sizeof *r->prompts);
    if (!r->prompts) return fail(e, 500, NULL, "out of memory");
    r->n_prompts = (int32_t)m;
    for (size_t i = 0; i < m; i++) {
        json_t *x = list ? json_array_get(list, i) : items[0];
        q35_api_prompt *q = &r->prompts[i];
        if (json_is_string(x)) {
            size_t n = json_string_length(x);
            if (!n) return fail(e, 400, "prompt", "'prompt' must not be empty");
            if (memchr(json_string_value(x), 0, n)) return fail(e, 400, "prompt", "'prompt' must not contain NUL characters");
            q->text = strdup(json_string_value(x));
            if (!q->text) return fail(e, 500, NULL, "out of memory");
        } else if (json_is_array(x)) {
            if (json_array_size(x) == 0) return fail(e, 400, "prompt", "'prompt' must not be empty");
            if (q35_api_parse_ids(x, lim->vocab_size, &q->ids, &q->n_ids))
                return fail(e, 400, "prompt", "token ids in 'prompt' must be integers from 0 to %d", lim->vocab_size - 1);
        } else {
            return fail(e, 400, "prompt", "'prompt' items must be strings or lists of token ids");
        }
    }
    return 0;
}

static int parse_content(json_t *c, int i, const q35_api_limits *lim, q35_api_request *r, perr *e) {
    if (json_is_string(c) || json_is_null(c)) return 0;
    if (!json_is_array(c)) return fail(e, 400, "messages", "messages[%d].content must be a string or a list of content parts", i);
    for (size_t j = 0; j < json_array_size(c); j++) {
        json_t *part = json_array_get(c, j);
        const char *type = json_string_value(json_object_get(part, "type"));
        /* whatever the template renders as an image is one (images.c) */
        int rc;
        if (json_is_object(part) && q35_api_is_image_part(part)) {
            if ((rc = q35_api_image_part(part, (size_t)i, j, lim, r, e->msg, e->msg_size, e->param, e->param_size))) return rc;
            continue;
        }
        if (!json_is_object(part) || !type)
            return fail(e, 400, "messages", "messages[%d].content[%zu] must be an object with a 'type'", i, j);
        if (json_object_get(part, "video") || !strcmp(type, "video") || !strcmp(type, "video_url"))
            return fail(e, 400, "messages", "messages[%d].content[%zu]: video input is not supported", i, j);
        if (strcmp(type, "text"))
            return fail(e, 400, "messages", "messages[%d].content[%zu]: content type '%s' is not supported (text, image_url)", i, j, type);
        if (!json_is_string(json_object_get(part, "text")))
            return fail(e, 400, "messages", "messages[%d].content[%zu].text must be a string", i, j);
    }
    return 0;
}

static int parse_messages(json_t *m, const q35_api_limits *lim, q35_api_request *r, perr *e) {
    if (!json_is_array(m) || json_array_size(m) == 0) return fail(e, 400, "messages", "'messages' must be a non-empty list");
    for (size_t i = 0; i < json_array_size(m); i++) {
        json_t *msg = json_array_get(m, i);
        if (!json_is_object(msg)) return fail(e, 400, "messages", "messages[%zu] must be an object", i);
        const char *role = json_string_value(json_object_get(msg, "role"));
        if (!role) return fail(e, 400, "messages", "messages[%zu].role must be a string", i);
        if (strcmp(role, "system") && strcmp(role, "developer") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool"))
            return fail(e, 400, "messages", "messages[%zu].role '%s' is not one of system, developer, user, assistant, tool", i, role);
        if (!strcmp(role, "developer")) { /* OpenAI's newer name for system */
            json_object_set_new(msg, "role", json_string("system"));
            role = "system";
        }
        json_t *content = json_object_get(msg, "content");
        int rc = parse_content(content, (int)i, lim, r, e);
        if (rc) return rc;
        if (!content && strcmp(role, "assistant"))
            return fail(e, 400, "messages", "messages[%zu].content is required for role '%s'", i, role);
        json_t *tc = json_object_get(msg, "tool_calls");
        if (tc && !json_is_null(tc)) {
            if (!json_is_array(tc)) return fail(e, 400, "messages", "messages[%zu].tool_calls must be a list", i);
            for (size_t j = 0; j < json_array_size(tc); j++) {
                json_t *f = json_object_get(json_array_get(tc, j), "function");
                json_t *args = json_object_get(f, "arguments");
                if (!json_is_string(json_object_get(f, "name")) || (args && !json_is_string(args) && !json_is_object(args)))
                    return fail(e, 400, "messages", "messages[%zu].tool_calls[%zu] needs function.name and string arguments", i, j);
            }
        }
        const char *k;
        json_t *v;
        json_object_foreach(msg, k, v) {
            if (strcmp(k, "role") && strcmp(k, "content") && strcmp(k, "name") && strcmp(k, "tool_calls") &&
                strcmp(k, "tool_call_id") && strcmp(k, "reasoning_content") && strcmp(k, "reasoning"))
                return fail(e, 400, "messages", "messages[%zu]: field '%s' is not supported", i, k);
            if ((!strcmp(k, "name") || !strcmp(k, "tool_call_id") || !strcmp(k, "reasoning_content") || !strcmp(k, "reasoning")) &&
                !json_is_string(v) && !json_is_null(v))
                return fail(e, 400, "messages", "messages[%zu].%s must be a string", i, k);
        }
    }
    r->messages = json_incref(m);
    return 0;
}

static int parse_tools(json_t *root, q35_api_request *r, perr *e) {
    json_t *tools = json_object_get(root, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return fail(e, 400, "tools", "'tools' must be a list");
        for (size_t i = 0; i < json_array_size(tools); i++) {
            json_t *t = json_array_get(tools, i);
            const char *type = json_string_value(json_object_get(t, "type"));
            json_t *f = json_object_get(t, "function");
            if (!type || strcmp(type, "function")) return fail(e, 400, "tools", "tools[%zu].type must be 'function'", i);
            const char *name = json_string_value(json_object_get(f, "name"));
            if (!json_is_object(f) || !name || !*name) return fail(e, 400, "tools", "tools[%zu].function.name must be a non-empty string", i);
            json_t *params = json_object_get(f, "parameters");
            if (params && !json_is_object(params) && !json_is_null(params))
                return fail(e, 400, "tools", "tools[%zu].function.parameters must be a JSON Schema object", i);
        }
        if (json_array_size(tools)) r->tools = json_incref(tools);
    }
    json_t *tc = json_object_get(root, "tool_choice");
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (strcmp(s, "none") && strcmp(s, "auto") && strcmp(s, "required"))
                return fail(e, 400, "tool_choice", "'tool_choice' must be none, auto, required or a named function");
            r->tool_choice = strdup(s);
        } else {
            const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
            if (!json_is_object(tc) || !name) return fail(e, 400, "tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
            r->tool_choice = strdup(name);
            r->tool_choice_named = true;
        }
        if (!r->tool_choice) return fail(e, 500, NULL, "out of memory");
        if (strcmp(r->tool_choice, "none") && !r->tools && (r->tool_choice_named || strcmp(r->tool_choice, "auto")))
            return fail(e, 400, "tool_choice", "'tool_choice' %s needs 'tools'", r->tool_choice);
        if (r->tool_choice_named) {
            bool found = false;
            for (size_t i = 0; r->tools && i < json_array_size(r->tools); i++)
                found |= !strcmp(json_string_value(json_object_get(json_object_get(json_array_get(r->tools, i), "function"), "name")), r->tool_choice);
            if (!found) return fail(e, 400, "tool_choice", "tool_choice names function '%s', which is not in 'tools'", r->tool_choice);
        }
    }
    json_t *ptc = json_object_get(root, "parallel_tool_calls");
    if (ptc && !json_is_boolean(ptc) && !json_is_null(ptc)) return fail(e, 400, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    return 0;
}

/* logit_bias: {"token id": bias in [-100, 100]}, added to the logits before sampling. */
static int parse_logit_bias(json_t *lb, const q35_api_limits *lim, q35_api_request *r, perr *e) {
    if (!lb || json_is_null(lb)) return 0;
    if (!json_is_object(lb)) return fail(e, 400, "logit_bias", "'logit_bias' must be an object of token id: bias");
    size_t m = json_object_size(lb);
    if (m > (size_t)lim->vocab_size) return fail(e, 400, "logit_bias", "'logit_bias' has more entries than the vocabulary");
    r->bias_ids = malloc(sizeof *r->bias_ids * (m ? m : 1));
    r->bias = malloc(sizeof *r->bias * (m ? m : 1));
    if (!r->bias_ids || !r->bias) return fail(e, 500, NULL, "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(lb, k, v) {
        char *end;
        errno = 0;
        long id = strtol(k, &end, 10);
        if (!*k || *end || errno || id < 0 || id >= lim->vocab_size)
            return fail(e, 400, "logit_bias", "logit_bias key '%.40s' is not a token id from 0 to %d", k, lim->vocab_size - 1);
        double b = is_num(v) ? json_number_value(v) : NAN;
        if (!(b >= -100 && b <= 100)) return fail(e, 400, "logit_bias", "logit_bias[%ld] must be a number from -100 to 100", id);
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias[r->n_bias++] = (float)b;
    }
    return 0;
}

/* continue_final_message / add_generation_prompt (chat), as vLLM: a final
 * assistant message is continued when either asks for it. */
static int parse_prefill(json_t *root, q35_api_request *r, perr *e) {
    bool cont = false, agp = true;
    int rc;
    if ((rc = get_bool(root, "continue_final_message", &cont, e)) || (rc = get_bool(root, "add_generation_prompt", &agp, e))) return rc;
    json_t *agp_v = json_object_get(root, "add_generation_prompt");
    if (cont && agp && agp_v && !json_is_null(agp_v))
        return fail(e, 400, "continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true");
    json_t *last = json_array_get(r->messages, json_array_size(r->messages) - 1);
    bool assistant_last = !strcmp(json_string_value(json_object_get(last, "role")), "assistant");
    if (cont && !assistant_last)
        return fail(e, 400, "continue_final_message", "'continue_final_message' needs a final assistant message to continue");
    r->continue_final = assistant_last && (cont || !agp);
    r->add_generation_prompt = agp && !cont;
    return 0;
}

static int parse_fields(json_t *root, q35_api_kind kind, const q35_api_limits *lim, q35_api_request *r, perr *e) {
    const char *k;
    json_t *v;
    q35_buf ignored = {0};
    json_object_foreach(root, k, v) {
        if (!in_list(k, common_fields) && !in_list(k, kind == Q35_API_CHAT ? chat_fields : completion_fields))
            q35_buf_printf(&ignored, "%s%.64s", ignored.len ? ", " : "", k);
    }
    r->ignored = ignored.len ? q35_buf_take(&ignored, NULL) : NULL;
    q35_buf_free(&ignored);
    int rc;
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return fail(e, 400, "model", "'model' must be a string");
        if (strcmp(json_string_value(model), lim->served_model_name))
            return fail(e, 404, "model", "The model `%.200s` does not exist.", json_string_value(model));
    }
    if (kind == Q35_API_COMPLETION) {
        json_t *p = json_object_get(root, "prompt");
        if (!p || json_is_null(p)) return fail(e, 400, "prompt", "'prompt' is required");
        if ((rc = parse_prompts(p, lim, r, e))) return rc;
    } else {
        json_t *m = json_object_get(root, "messages");
        if (!m) return fail(e, 400, "messages", "'messages' is required");
        if ((rc = parse_messages(m, lim, r, e))) return rc;
        if ((rc = parse_tools(root, r, e))) return rc;
        if ((rc = parse_prefill(root, r, e))) return rc;
        json_t *ctk = json_object_get(root, "chat_template_kwargs");
        if (ctk && !json_is_null(ctk)) {
            if (!json_is_object(ctk)) return fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
            json_object_foreach(ctk, k, v) {
                if (strcmp(k, "enable_thinking")) return fail(e, 400, "chat_template_kwargs", "chat_template_kwargs.%s is not supported (only enable_thinking)", k);
                if (json_is_null(v)) continue; /* not given */
                if (!json_is_boolean(v)) return fail(e, 400, "chat_template_kwargs", "chat_template_kwargs.enable_thinking must be a boolean");
                r->enable_thinking = json_is_true(v);
            }
        }
    }

    long long x = -1;
    /* with both, max_completion_tokens wins (as vLLM) */
    /* completions: 0 with echo scores the prompt alone (vLLM's echo without generation), checked below */
    if ((rc = get_int(root, "max_tokens", kind == Q35_API_COMPLETION ? 0 : 1, INT32_MAX, &x, e))) return rc;
    if ((rc = get_int(root, "max_completion_tokens", 1, INT32_MAX, &x, e))) return rc;
    r->max_tokens = (int32_t)x;
    if ((rc = parse_logit_bias(json_object_get(root, "logit_bias"), lim, r, e))) return rc;

    q35_sampler_params *sp = &r->sampling;
    if ((rc = get_num(root, "temperature", 0, 100, &sp->temperature, e))) return rc;
    if ((rc = get_num(root, "top_p", 1e-9, 1, &sp->top_p, e))) return rc;
    if ((rc = get_num(root, "min_p", 0, 1, &sp->min_p, e))) return rc;
    if ((rc = get_num(root, "presence_penalty", -2, 2, &sp->presence_penalty, e))) return rc;
    if ((rc = get_num(root, "frequency_penalty", -2, 2, &sp->frequency_penalty, e))) return rc;
    if ((rc = get_num(root, "repetition_penalty", 1e-6, 100, &sp->repetition_penalty, e))) return rc;
    x = sp->top_k;
    if ((rc = get_int(root, "top_k", -1, INT32_MAX, &x, e))) return rc;
    sp->top_k = x < 0 ? 0 : (int32_t)x;
    json_t *seed = json_object_get(root, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) return fail(e, 400, "seed", "'seed' must be an integer");
        sp->seed = (uint64_t)json_integer_value(seed);
        r->has_seed = true;
    }

    json_t *stop = json_object_get(root, "stop");
    if (stop && !json_is_null(stop)) {
        size_t m = json_is_string(stop) ? 1 : json_is_array(stop) ? json_array_size(stop) : 0;
        if (!json_is_string(stop) && !json_is_array(stop)) return fail(e, 400, "stop", "'stop' must be a string or a list of strings");
        if (m > (size_t)lim->max_stop) return fail(e, 400, "stop", "at most %d stop strings, got %zu", lim->max_stop, m);
        r->stop = calloc(m ? m : 1, sizeof *r->stop);
        if (!r->stop) return fail(e, 500, NULL, "out of memory");
        for (size_t i = 0; i < m; i++) {
            json_t *s = json_is_string(stop) ? stop : json_array_get(stop, i);
            if (!json_is_string(s)) return fail(e, 400, "stop", "'stop' must be a string or a list of strings");
            size_t n = json_string_length(s);
            if (!n || n > (size_t)lim->max_stop_len || memchr(json_string_value(s), 0, n))
                return fail(e, 400, "stop", "stop strings must be 1 to %d bytes without NUL", lim->max_stop_len);
            r->stop[r->n_stop++] = strdup(json_string_value(s));
            if (!r->stop[r->n_stop - 1]) return fail(e, 500, NULL, "out of memory");
        }
    }
    json_t *sti = json_object_get(root, "stop_token_ids");
    if (sti && !json_is_null(sti)) {
        if (!json_is_array(sti) || json_array_size(sti) > 64 ||
            q35_api_parse_ids(sti, lim->vocab_size, &r->stop_token_ids, &r->n_stop_token_ids))
            return fail(e, 400, "stop_token_ids", "'stop_token_ids' must be a list of at most 64 token ids below %d", lim->vocab_size);
    }

    x = 1;
    if ((rc = get_int(root, "n", 1, lim->max_n, &x, e))) return rc;
    r->n = (int32_t)x;

    json_t *lp = json_object_get(root, "logprobs");
    if (kind == Q35_API_COMPLETION) {
        x = -1;
        if ((rc = get_int(root, "logprobs", 0, lim->max_logprobs, &x, e))) return rc;
        r->logprobs = (int32_t)x;
        if ((rc = get_bool(root, "echo", &r->echo, e))) return rc;
        if (r->max_tokens == 0 && !r->echo) return fail(e, 400, "max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo')");
        if (r->max_tokens == 0) { r->echo_only = true; r->max_tokens = 1; } /* one token is generated, none shown */
        x = r->echo ? r->logprobs : -1; /* vLLM: echo with logprobs returns the prompt's too */
        if ((rc = get_int(root, "prompt_logprobs", 0, lim->max_logprobs, &x, e))) return rc;
        r->prompt_logprobs = (int32_t)x;
        json_t *suffix = json_object_get(root, "suffix");
        if (suffix && !json_is_null(suffix)) return fail(e, 400, "suffix", "'suffix' is not supported");
        x = 1;
        if ((rc = get_int(root, "best_of", 1, 1, &x, e))) return fail(e, rc, "best_of", "'best_of' must be 1 (or n)");
    } else {
        bool want = false;
        if (lp && !json_is_null(lp) && !json_is_boolean(lp)) return fail(e, 400, "logprobs", "'logprobs' must be a boolean");
        want = json_is_true(lp);
        x = 0;
        json_t *tl = json_object_get(root, "top_logprobs");
        if ((rc = get_int(root, "top_logprobs", 0, lim->max_logprobs, &x, e))) return rc;
        if (tl && !json_is_null(tl) && !want) return fail(e, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        r->logprobs = want ? (int32_t)x : -1;
    }

    if ((rc = get_bool(root, "ignore_eos", &r->ignore_eos, e))) return rc;
    if ((rc = get_bool(root, "return_token_ids", &r->return_token_ids, e))) return rc;
    if ((rc = get_bool(root, "cache_prompt", &r->cache_prompt, e))) return rc;
    if ((rc = get_bool(root, "add_special_tokens", &r->add_special_tokens, e))) return rc;
    json_t *salt = json_object_get(root, "cache_salt");
    if (salt && !json_is_null(salt)) {
        if (!json_is_string(salt) || json_string_length(salt) > 256) return fail(e, 400, "cache_salt", "'cache_salt' must be a string of at most 256 bytes");
        r->cache_salt = strdup(json_string_value(salt));
    }
    x = 0;
    if ((rc = get_int(root, "min_tokens", 0, INT32_MAX, &x, e))) return rc;
    r->min_tokens = (int32_t)x;
    if (r->max_tokens > 0 && r->min_tokens > r->max_tokens)
        return fail(e, 400, "min_tokens", "'min_tokens' (%d) must not exceed max_tokens (%d)", r->min_tokens, r->max_tokens);

    if ((rc = get_bool(root, "stream", &r->stream, e))) return rc;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!r->stream) return fail(e, 400, "stream_options", "'stream_options' is only allowed with 'stream': true");
        if (!json_is_object(so)) return fail(e, 400, "stream_options", "'stream_options' must be an object");
        json_object_foreach(so, k, v) {
            if (strcmp(k, "include_usage")) return fail(e, 400, "stream_options", "stream_options.%s is not supported", k);
        }
        if ((rc = get_bool(so, "include_usage", &r->include_usage, e))) return fail(e, rc, "stream_options", "stream_options.include_usage must be a boolean");
    }
    json_t *rf = json_object_get(root, "response_format");
    if (rf && !json_is_null(rf)) {
        const char *type = json_string_value(json_object_get(rf, "type"));
        if (!json_is_object(rf) || !type) return fail(e, 400, "response_format", "'response_format' must be an object with a 'type'");
        if (!strcmp(type, "json_object")) r->json_object = true;
        else if (!strcmp(type, "json_schema")) {
            if ((rc = parse_json_schema(json_object_get(rf, "json_schema"), r, e))) return rc;
        } else if (strcmp(type, "text"))
            return fail(e, 400, "response_format", "response_format type '%s' is not supported (text, json_object or json_schema)", type);
    }
    if (r->tool_choice && r->tools && (r->tool_choice_named || !strcmp(r->tool_choice, "required"))) {
        /* the output is held to one tool call (sched.c masks it like a json_schema) */
        if (r->schema || r->json_object)
            return fail(e, 400, "tool_choice", "tool_choice '%s' together with response_format json_object or json_schema is not supported", r->tool_choice);
        char where[200], msg[256], param[260];
        if (q35_schema_compile_tool_call(r->tools, r->tool_choice_named ? r->tool_choice : NULL, &r->schema, where, sizeof where,
                                         msg, sizeof msg)) {
            snprintf(param, sizeof param, "tools%s", where);
            return fail(e, 400, param, "%s: %s", param, msg);
        }
    }
    json_t *user = json_object_get(root, "user");
    if (user && !json_is_string(user) && !json_is_null(user)) return fail(e, 400, "user", "'user' must be a string");

    if (r->max_tokens > 0 && (int64_t)r->n * r->n_prompts * r->max_tokens > lim->max_total_tokens)
        return fail(e, 400, "n", "n x max_tokens = %lld generated tokens is over this server's limit of %lld per request",
                    (long long)r->n * r->n_prompts * r->max_tokens, (long long)lim->max_total_tokens);
    return 0;
}

int q35_api_parse(const char *body, size_t len, q35_api_kind kind, const q35_api_limits *lim, q35_api_request *r,
                  char *msg, size_t msg_size, char *param, size_t param_size) {
    perr e = {msg, msg_size, param, param_size};
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->enable_thinking = -1;
    r->max_tokens = -1;
    r->logprobs = -1;
    r->prompt_logprobs = -1;
    r->n = 1;
    r->cache_prompt = true;
    r->add_special_tokens = kind == Q35_API_COMPLETION;
    r->add_generation_prompt = true;
    r->sampling = (q35_sampler_params){.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
    if (lim->defaults) {
        r->sampling = *lim->defaults;
        r->sampling.seed = 0;
    }
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return fail(&e, 400, NULL, "malformed JSON body: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    int rc = json_is_object(root) ? parse_fields(root, kind, lim, r, &e) : fail(&e, 400, NULL, "the request body must be a JSON object");
    json_decref(root);
    if (rc) q35_api_request_free(r);
    return rc;
}

void q35_api_request_free(q35_api_request *r) {
    for (int32_t i = 0; r->prompts && i < r->n_prompts; i++) { free(r->prompts[i].ids); free(r->prompts[i].text); }
    free(r->prompts);
    json_decref(r->messages);
    json_decref(r->tools);
    free(r->tool_choice);
    for (int32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_token_ids);
    free(r->cache_salt);
    free(r->bias_ids);
    free(r->bias);
    free(r->ignored);
    q35_schema_free(r->schema);
    q35_api_images_free(r);
    memset(r, 0, sizeof *r);
}

int q35_api_check_length(const q35_api_request *r, int32_t n_prompt, const q35_api_limits *lim, int32_t *max_tokens,
                         char *msg, size_t msg_size) {
    int64_t mt = r->max_tokens > 0 ? r->max_tokens : r->kind == Q35_API_COMPLETION ? 16 : (int64_t)lim->max_model_len - n_prompt;
    if (r->max_tokens <= 0 && r->kind == Q35_API_COMPLETION && n_prompt + mt > lim->max_model_len)
        mt = (int64_t)lim->max_model_len - n_prompt; /* the default shrinks to fit, as vLLM's does */
    if (n_prompt >= lim->max_model_len || mt < 1 || (int64_t)n_prompt + mt > lim->max_model_len) {
        snprintf(msg, msg_size,
                 "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in the "
                 "messages, %lld in the completion). Please reduce the length of the messages or completion.",
                 lim->max_model_len, (long long)n_prompt + (mt > 0 ? mt : 1), n_prompt, (long long)(mt > 0 ? mt : 1));
        return 400;
    }
    if (r->min_tokens > mt) {
        snprintf(msg, msg_size, "'min_tokens' (%d) is more than the %lld tokens that fit", r->min_tokens, (long long)mt);
        return 400;
    }
    *max_tokens = (int32_t)mt;
    return 0;
}
