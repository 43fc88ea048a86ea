/* server.h: the OpenAI-compatible HTTP server as a library (README.md in
 * this folder says how it is split). `qwen35 serve` (tools/serve.c) parses
 * its command line into a q35_server_config and calls q35_server_run. */
#ifndef Q35_SERVER_SERVER_H
#define Q35_SERVER_SERVER_H

#include <stddef.h>
#include <stdint.h>

typedef struct q35_server_config {
    const char *model_path;
    const char *host;          /* numeric IPv4 or IPv6 address */
    int port;                  /* 0: a free one */
    const char *api_key;       /* NULL: none required */
    const char *served_name;
    int32_t max_model_len;     /* 0: default */
    int parallel;
    int max_queue;             /* waiting requests before 429 */
    size_t max_body;
    double timeout_s;          /* idle connection limit */
    double request_timeout_s;  /* a whole request head and body, however it trickles */
    double write_timeout_s;    /* a stream whose client reads nothing for this long is cancelled */
    double drain_timeout_s;    /* after SIGTERM: how long running and queued requests may finish */
    int max_conns_per_client;  /* open connections from one address, 0: no limit */
    int backlog;               /* the listening socket's backlog (listen(2); the kernel caps it at somaxconn) */
    int threads;
    int weights;               /* q35_weights_mode: --mmap / --no-mmap */
    int kv_cache;              /* q35_kv_cache: --kv-cache */
    long long cache_bytes;     /* prefix cache budget in bytes, -1: the default */
    int32_t prefill_chunk;
    long spec_k;               /* MTP draft tokens per step, -1: the default */
    const char *draft_vocab;   /* token ids the draft head keeps, or NULL */
    const char *chat_template_fallback; /* an unknown chat template renders as: "qwen3.5-9b" | "qwen3.5-0.8b"; NULL: refused */
    const char *default_chat_template_kwargs; /* JSON object: chat_template_kwargs a request leaves out, or NULL */
    const char *allowed_origins; /* CORS: comma-separated origins, or "*"; NULL: none */
    const char *allowed_media_domains;    /* hosts image URLs may be fetched from (commas/spaces); NULL: none */
    const char *allowed_local_media_path; /* the directory file:// images may be read from; NULL: none */
    const char *limit_mm_per_prompt;      /* JSON {"image": N}; NULL: Q35_DEFAULT_MAX_IMAGES */
    long long max_image_pixels;           /* a decoded image's declared size limit; 0: Pillow's */
    double media_fetch_timeout_s;         /* one image URL's fetch, redirects included */
    int log_debug;             /* --log-level debug: also what each request's body had that was ignored */
} q35_server_config;

/* The defaults of every option (those of `qwen35 serve --help`). */
void q35_server_config_init(q35_server_config *cfg);

/* Listens, loads the model on a thread of its own (/health answers 503
 * until it is ready), serves until SIGINT or SIGTERM, then drains (new
 * requests and /health get 503, running and queued ones finish within
 * drain_timeout_s, the rest end with an error; a second signal exits at
 * once) and shuts down: the process's exit status (1: cannot listen or
 * load, 2: a bad setting). It blocks both signals in the calling thread and
 * ignores SIGPIPE. */
int q35_server_run(const q35_server_config *cfg);

#endif
