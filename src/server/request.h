/* request.h: request bodies of the OpenAI-compatible endpoints, parsed and validated
 * into a q35_api_request (request.c), and the error body of a refused request.
 * Free of sockets and threads, so that unit tests and the fuzzer drive it. */
#ifndef Q35_SERVER_REQUEST_H
#define Q35_SERVER_REQUEST_H

#include "qwen35.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
    bool vision;               /* the model has a vision tower: image parts are taken */
    int32_t max_images;        /* images in one prompt (--limit-mm-per-prompt) */
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
    int32_t prompt_logprobs;   /* completions: -1: none; else top logprobs per prompt token (echo with logprobs implies it, as vLLM) */
    bool echo, ignore_eos, stream, include_usage, json_object;
    bool echo_only;            /* completions: max_tokens 0 with echo: the prompt alone is answered (max_tokens is 1 inside) */
    struct q35_schema *schema; /* response_format json_schema, compiled; NULL: none */
    bool return_token_ids;
    bool cache_prompt;         /* false: neither read nor fill the prefix cache */
    char *cache_salt;          /* prefix cache partition, NULL for the shared one */
    int32_t min_tokens;
    bool add_special_tokens;
    bool continue_final;       /* chat: the prompt continues the final assistant message (assistant prefill) */
    bool add_generation_prompt;/* chat: false renders no generation prompt */
    int32_t *bias_ids;         /* logit_bias: token ids and what is added to their logits */
    float *bias;
    int32_t n_bias;
    char *ignored;             /* the top-level fields not known here, comma-separated, or NULL */
    struct q35_api_image *images; /* chat: the image parts in order (images.h), loaded by q35_api_images_load */
    int32_t n_images, cap_images;
    struct q35_image_span *spans; /* the images' places in the tokenized prompt (prefix cache keys), or NULL */
    int32_t n_spans;
} q35_api_request;

/* Parses and validates a request body. On success returns 0 and fills req
 * (free it with q35_api_request_free). Otherwise returns the HTTP status
 * (400, or 404 for an unknown model), writes a message and names the
 * offending field in param (empty when none). Top-level fields it does not
 * know are ignored, as vLLM does, and listed in req->ignored; null stands
 * for a field not given. The
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

#endif
