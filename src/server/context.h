/* context.h: the server's one context, which every HTTP-side part (http.c,
 * routes.c, stream.c, server.c) is handed; there is no file-level state.
 * The scheduler does not see it: it gets what it needs in its own config. */
#ifndef Q35_SERVER_CONTEXT_H
#define Q35_SERVER_CONTEXT_H

#include "server/conn.h"
#include "server/images.h"
#include "server/listen.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/sched.h"
#include "server/server.h"
#include "qwen35.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct q35_server {
    q35_server_config cfg;
    q35_engine *engine;
    const q35_model_info *info;
    q35_tokenizer *tok;        /* NULL: the model directory has none (token ids only) */
    q35_api_limits limits;
    q35_image_loader images;   /* where a chat's images come from and how they are processed */
    q35_sampler_params gen_defaults; /* generation_config.json's, when limits.defaults points here */
    int chat_variant;          /* the model's chat template, a q35_chat_variant */
    int default_thinking;      /* --default-chat-template-kwargs' enable_thinking: 1, -1 (false) or 0 (none) */
    size_t cache_bytes;        /* the prefix cache budget, resolved */
    int32_t spec_k;            /* draft tokens per step, resolved */
    q35_sched *sched;
    q35_metrics metrics;
    q35_conns conns;           /* open connections, their deadlines, the watchdog */
    q35_listener listener;     /* the listening socket and its accept thread */
    atomic_int ready;          /* the model is loaded and the scheduler runs */
    atomic_int draining;       /* a signal came: new requests and /health get 503, running ones finish */
    atomic_int stopping;       /* shutting down: refusals are 503 */
    atomic_int live_streams;   /* streaming responses the HTTP library still holds */
    atomic_int load_status;    /* the loader's exit status, -1 while it runs */
    atomic_ullong req_counter; /* request ids and seeds */
    pthread_t main_thread;     /* the one that waits for signals */
} q35_server;

#endif
