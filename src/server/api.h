/* api.h: the OpenAI-compatible protocol logic of `qwen35 serve`, kept free of
 * sockets and threads so that unit tests and the fuzzer can drive it.
 *
 *   q35_api_parse       request body (JSON) -> a validated q35_api_request,
 *                       or an HTTP status, a message and the offending field
 *   q35_stop_matcher    holds back generated text that could still grow into
 *                       a stop string, so no part of one ever reaches a client
 *   q35_api_error_json  the {"error": {...}} body
 *   q35_sse_*           server-sent event framing
 *   q35_hist            Prometheus histograms, and the text exposition
 *   q35_json_prefix     recognises the start of a JSON object, for
 *                       response_format json_object
 *   q35_secret_equal    constant-time comparison of API keys
 *
 * The server (tools/serve.c) owns the HTTP side and the scheduler; it calls
 * these with the bytes it received and sends what they produce. */
#ifndef Q35_API_H
#define Q35_API_H

#include "qwen35.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- requests ----------------------------------------------------------- */

typedef enum { Q35_API_COMPLETION = 0, Q35_API_CHAT = 1 } q35_api_kind;

/* What the server allows; filled from its command line. */
typedef struct q35_api_limits {
    const char *served_model_name;
    int32_t max_model_len;     /* prompt + max_tokens must fit */
    int32_t vocab_size;        /* token ids must be below this */
    int32_t max_n;             /* choices per request */
    int32_t max_logprobs;      /* top logprobs per token */
    int64_t max_total_tokens;  /* n x max_tokens (generated tokens per request) */
    int32_t max_stop;          /* stop strings */
    int32_t max_stop_len;      /* bytes per stop string */
    int32_t max_prompts;       /* prompts in one completion request */
    /* sampling for fields a request leaves out (the model's
     * generation_config, as vLLM does); NULL: temperature 1, no cuts */
    const q35_sampler_params *defaults;
} q35_api_limits;

/* One prompt of a completion request: token ids, or text to tokenize. */
typedef struct q35_api_prompt {
    int32_t *ids;              /* NULL when text */
    int32_t n_ids;
    char *text;                /* NULL when ids; NUL-terminated UTF-8 */
} q35_api_prompt;

typedef struct q35_api_request {
    q35_api_kind kind;
    q35_api_prompt *prompts;   /* completions: at least one */
    int32_t n_prompts;
    json_t *messages;          /* chat: validated messages array (owned reference) */
    json_t *tools;             /* chat: tools array or NULL (owned reference) */
    char *tool_choice;         /* "none" | "auto" | "required" | a function name; NULL when absent */
    bool tool_choice_named;    /* tool_choice names one function */
    int enable_thinking;       /* -1 not given, else 0/1 */
    int32_t max_tokens;        /* -1: up to the context */
    q35_sampler_params sampling;
    bool has_seed;
    char **stop;               /* NUL-terminated UTF-8 strings */
    int32_t n_stop;
    int32_t *stop_token_ids;
    int32_t n_stop_token_ids;
    int32_t n;                 /* choices per prompt */
    int32_t logprobs;          /* -1: none; else the number of top logprobs (0 allowed) */
    bool echo, ignore_eos, stream, include_usage, json_object;
    bool return_token_ids;
    bool cache_prompt;         /* false: neither read nor fill the prefix cache */
    char *cache_salt;          /* prefix cache partition, NULL for the shared one */
    int32_t min_tokens;
    bool add_special_tokens;
} q35_api_request;

/* Parses and validates a request body. On success returns 0 and fills req
 * (free it with q35_api_request_free). Otherwise returns the HTTP status
 * (400, or 404 for an unknown model), writes a message and names the
 * offending field in param (empty when none). Every field the server does
 * not implement is rejected by name; nothing is silently ignored. The
 * context-length check needs the prompt's length, so it is separate:
 * q35_api_check_length. */
int q35_api_parse(const char *body, size_t len, q35_api_kind kind, const q35_api_limits *lim,
                  q35_api_request *req, char *msg, size_t msg_size, char *param, size_t param_size);
void q35_api_request_free(q35_api_request *req);

/* Resolves max_tokens for a prompt of n_prompt tokens (a request without one
 * gets the rest of the context, and completions get 16, as vLLM) and checks
 * that prompt + max_tokens fits max_model_len. 0 or 400 with vLLM's message. */
int q35_api_check_length(const q35_api_request *req, int32_t n_prompt, const q35_api_limits *lim,
                         int32_t *max_tokens, char *msg, size_t msg_size);

/* Parses a JSON array of token ids (each 0 <= id < vocab_size). 0 or -1. */
int q35_api_parse_ids(json_t *arr, int32_t vocab_size, int32_t **ids, int32_t *n);

/* {"error": {"message", "type", "param", "code"}}; param may be NULL or "".
 * Returns a malloc'd NUL-terminated string. */
char *q35_api_error_json(int http_status, const char *message, const char *param);
const char *q35_api_error_type(int http_status);

/* ---- stop strings --------------------------------------------------------- */

/* Text goes in piece by piece; q35_stop_feed returns how many bytes of the
 * held text may be released now (a prefix of q35_stop_text). A suffix that
 * is a prefix of some stop string stays held. When a stop string is found,
 * *matched is its index and the releasable text ends where it starts; the
 * matcher then refuses more text. q35_stop_finish releases the rest. */
typedef struct q35_stop_matcher {
    char **stop;
    int32_t n_stop;
    char *buf;
    size_t len, cap;
    int32_t matched;           /* -1 until a stop string is found */
} q35_stop_matcher;

void q35_stop_init(q35_stop_matcher *m, char **stop, int32_t n_stop);
void q35_stop_free(q35_stop_matcher *m);
/* Returns bytes now releasable from the front of the held text, or -1 on
 * allocation failure. Call q35_stop_consume(m, n) after copying them out. */
long q35_stop_feed(q35_stop_matcher *m, const char *text, size_t len);
size_t q35_stop_finish(q35_stop_matcher *m); /* all held text is releasable (no match) */
const char *q35_stop_text(const q35_stop_matcher *m);
void q35_stop_consume(q35_stop_matcher *m, size_t n);

/* ---- server-sent events ---------------------------------------------------- */

/* "data: <compact JSON>\n\n" appended to *buf (growing it); 0 or -1. */
int q35_sse_append_json(char **buf, size_t *len, size_t *cap, const json_t *event);
int q35_sse_append_raw(char **buf, size_t *len, size_t *cap, const char *data);

/* ---- metrics ------------------------------------------------------------- */

#define Q35_HIST_MAX_BUCKETS 24
typedef struct q35_hist {
    int n_buckets;
    double le[Q35_HIST_MAX_BUCKETS];   /* upper bounds, increasing; +Inf is implicit */
    uint64_t count[Q35_HIST_MAX_BUCKETS];
    uint64_t total;
    double sum;
} q35_hist;

void q35_hist_init(q35_hist *h, const double *bounds, int n);
void q35_hist_observe(q35_hist *h, double v);
/* Appends the Prometheus text of a histogram (HELP, TYPE, cumulative
 * _bucket lines, _sum, _count) with the given label set, e.g.
 * model_name="x". Returns 0 or -1. */
int q35_prom_hist(char **buf, size_t *len, size_t *cap, const char *name, const char *help, const char *labels,
                  const q35_hist *h);
/* One counter or gauge sample with HELP and TYPE lines. */
int q35_prom_value(char **buf, size_t *len, size_t *cap, const char *name, const char *type, const char *help,
                   const char *labels, double value);

/* ---- response_format json_object ------------------------------------------ */

/* Recognises prefixes of one JSON object, byte by byte (json_prefix.c). The
 * state is a small plain struct: copy it to try a token's bytes. */
#define Q35_JSON_MAX_DEPTH 32
#define Q35_JSON_MAX_WS 8      /* whitespace bytes in a row outside strings */
typedef struct q35_json_prefix {
    char stack[Q35_JSON_MAX_DEPTH]; /* '{' or '[' per open container */
    int depth, mode, aux, lit, ws_run;
    bool in_key, after_open;
} q35_json_prefix;

void q35_json_prefix_init(q35_json_prefix *p);
/* false when the bytes cannot continue a valid object (p is then undefined) */
bool q35_json_prefix_feed(q35_json_prefix *p, const char *s, size_t n);
bool q35_json_prefix_complete(const q35_json_prefix *p);

/* ---- auth ------------------------------------------------------------------ */

/* Compares two secrets in time independent of where they differ and of
 * their lengths (both are hashed with SHA-256 first). */
bool q35_secret_equal(const char *a, size_t a_len, const char *b, size_t b_len);
/* Checks an Authorization header value against the key: "Bearer KEY". */
bool q35_bearer_ok(const char *header, const char *key);

#endif
