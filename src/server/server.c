/* server.c: start-up and shutdown (server.h). q35_server_run listens first,
 * then loads the model on a thread of its own (so /health answers 503 and a
 * signal ends the process even in the middle of a long load): the engine,
 * the tokenizer when the directory has one, the context length that fits in
 * memory, generation_config.json's end tokens and sampling defaults, and
 * the scheduler. The calling thread waits for SIGINT or SIGTERM, then
 * drains: new requests and /health get 503 while the requests already
 * running or queued finish, for up to --drain-timeout (a second signal
 * exits at once); then it stops the scheduler (what is left ends with an
 * error), lets open streams send their last event, and stops the daemon.
 * Everything lives in one q35_server on its stack. */
#include "server/context.h"
#include "server/http.h"
#include "media/image.h"
#include "base/util.h"

#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void q35_server_config_init(q35_server_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8000;
    c->served_name = "Qwen/Qwen3.5-9B";
    c->parallel = 4;
    c->max_queue = 64;
    c->max_body = 8u << 20;
    c->timeout_s = 60;
    c->request_timeout_s = 30;
    c->write_timeout_s = 60;
    c->drain_timeout_s = 30;
    c->max_conns_per_client = 16;
    c->backlog = 4096;
    c->cache_bytes = -1;
    c->prefill_chunk = 512;
    c->spec_k = -1;
    c->media_fetch_timeout_s = Q35_MEDIA_DEFAULT_TIMEOUT_S;
}

/* Image input: --limit-mm-per-prompt, the media policy, the model's image
 * processor; whether the model has a vision tower. The exit status (0: fine). */
static int media_setup(q35_server *srv, bool *vision, int32_t *max_images) {
    const q35_server_config *C = &srv->cfg;
    char msg[1200];
    *max_images = Q35_DEFAULT_MAX_IMAGES;
    if (C->limit_mm_per_prompt && q35_parse_mm_limit(C->limit_mm_per_prompt, max_images, msg, sizeof msg)) {
        fprintf(stderr, "qwen35 serve: %s\n", msg);
        return 2;
    }
    if (C->allowed_local_media_path && *C->allowed_local_media_path && !q35_is_dir(C->allowed_local_media_path)) {
        fprintf(stderr, "qwen35 serve: --allowed-local-media-path %s does not exist or is not a directory\n",
                C->allowed_local_media_path);
        return 2;
    }
    if (q35_media_global_init()) {
        fprintf(stderr, "qwen35 serve: libcurl cannot start, so image URLs cannot be fetched\n");
        return 1;
    }
    q35_media_policy mp = {.allowed_domains = C->allowed_media_domains, .allowed_local_path = C->allowed_local_media_path,
                           .timeout_s = C->media_fetch_timeout_s, .max_redirects = -1};
    int64_t max_pixels = C->max_image_pixels > 0 ? C->max_image_pixels : Q35_IMAGE_DEFAULT_MAX_PIXELS;
    if (q35_image_loader_init(&srv->images, C->model_path, &mp, max_pixels, vision, msg, sizeof msg)) {
        fprintf(stderr, "qwen35 serve: %s\n", msg);
        return 1;
    }
    if (*vision && !q35_engine_info(srv->engine)->has_vision) { /* a vision_config, no tower weights */
        fprintf(stderr, "qwen35 serve: image input is off: config.json has a vision_config, but %s holds no vision "
                        "tower (model.visual.* weights)\n", C->model_path);
        *vision = false;
    }
    int32_t pad = q35_image_pad_id(srv->tok), image_id = q35_engine_image_token(srv->engine);
    if (*vision && (pad < 0 || pad != image_id)) { /* the prompt's placeholder must be the id the engine places images at */
        fprintf(stderr, "qwen35 serve: image input is off: config.json's image_token_id (%d) is not the tokenizer's "
                        "<|image_pad|> (%d)\n", image_id, pad);
        *vision = false;
    }
    if (*vision)
        fprintf(stderr, "qwen35 serve: image input: up to %d per prompt, at most %lld decoded pixels each; URLs from %s; "
                        "files from %s\n", *max_images, (long long)max_pixels, C->allowed_media_domains && *C->allowed_media_domains ? C->allowed_media_domains : "no domain",
                C->allowed_local_media_path && *C->allowed_local_media_path ? C->allowed_local_media_path : "nowhere");
    return 0;
}


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

/* --draft-vocab FILE into the engine's draft head; 0 or -1 (reported). */
static int set_draft_vocab(q35_engine *e, const char *path) {
    q35_error err = {0};
    if (!q35_engine_set_draft_vocab_file(e, path, &err)) return 0;
    fprintf(stderr, "qwen35 serve: --draft-vocab: %s\n", err.msg);
    return -1;
}

/* The model's chat template by its hash (q35_chat_identify), and the
 * server-wide chat_template_kwargs; the exit status (0: fine). */
static int chat_setup(q35_server *srv) {
    const q35_server_config *C = &srv->cfg;
    static const struct { const char *name; int variant; } fallbacks[] = {
        {"qwen3.5-9b", Q35_CHAT_QWEN35_9B}, {"qwen3.5-0.8b", Q35_CHAT_QWEN35_SMALL}};
    int fallback = -1;
    for (size_t i = 0; C->chat_template_fallback && i < sizeof fallbacks / sizeof *fallbacks; i++)
        if (!strcmp(C->chat_template_fallback, fallbacks[i].name)) fallback = fallbacks[i].variant;
    if (C->chat_template_fallback && fallback < 0) {
        fprintf(stderr, "qwen35 serve: --chat-template-fallback '%s' is not one of qwen3.5-9b, qwen3.5-0.8b\n", C->chat_template_fallback);
        return 2;
    }
    if (C->default_chat_template_kwargs) {
        json_error_t je;
        json_t *kw = json_loads(C->default_chat_template_kwargs, 0, &je);
        const char *k;
        json_t *v;
        int bad = !json_is_object(kw);
        json_object_foreach(kw, k, v) {
            if (strcmp(k, "enable_thinking") || !(json_is_boolean(v) || json_is_null(v))) bad = 1;
            else srv->default_thinking = json_is_true(v) ? 1 : json_is_false(v) ? -1 : 0;
        }
        json_decref(kw);
        if (bad) {
            fprintf(stderr, "qwen35 serve: --default-chat-template-kwargs must be a JSON object such as "
                            "{\"enable_thinking\": false} (enable_thinking is the one key)\n");
            return 2;
        }
    }
    int v;
    char path[1024], hex[65];
    q35_error err = {0};
    if (q35_chat_identify(C->model_path, &v, path, sizeof path, hex, &err)) {
        fprintf(stderr, "qwen35 serve: %s\n", err.msg);
        return 1;
    }
    static const char *const names[] = {"Qwen3.5-0.8B's", "Qwen3.5-9B's", "the demo model's"};
    if (v == -1 && fallback < 0) {
        fprintf(stderr, "qwen35 serve: unknown chat template %s (SHA-256 %s); pass --chat-template-fallback qwen3.5-9b "
                        "(or qwen3.5-0.8b) to render it as that model's\n", path, hex);
        return 2;
    }
    srv->chat_variant = v >= 0 ? v : fallback >= 0 ? fallback : Q35_CHAT_QWEN35_9B;
    fprintf(stderr, "qwen35 serve: chat template: %s (%s)\n", names[srv->chat_variant],
            v >= 0 ? path : v == -1 ? "an unknown one, by --chat-template-fallback" : "the model directory has none");
    return 0;
}

/* Loads the model and starts the scheduler; the exit status (0: ready). */
static int load_and_start(q35_server *srv) {
    const q35_server_config *C = &srv->cfg;
    q35_error err = {0};
    q35_engine_params ep = {.n_threads = C->threads, .weights = C->weights, .kv_cache = C->kv_cache};
    if (q35_engine_load(C->model_path, &ep, &srv->engine, &err)) {
        fprintf(stderr, "qwen35 serve: %s\n", err.msg);
        return 1;
    }
    const q35_model_info *info = srv->info = q35_engine_info(srv->engine);
    char *tj = q35_path_join(C->model_path, "tokenizer.json"), *vj = q35_path_join(C->model_path, "vocab.json");
    bool has_tok_files = (tj && q35_file_exists(tj)) || (vj && q35_file_exists(vj));
    free(tj);
    free(vj);
    if (has_tok_files && q35_tokenizer_load(C->model_path, &srv->tok, &err)) {
        fprintf(stderr, "qwen35 serve: %s\n", err.msg);
        return 1;
    }
    int rc = chat_setup(srv);
    if (rc) return rc;
    bool vision;
    int32_t max_images;
    if ((rc = media_setup(srv, &vision, &max_images))) return rc;
    size_t per_pos = bytes_per_position(srv->engine), avail = mem_available();
    int32_t model_max = info->max_position > 0 ? info->max_position : 262144;
    int32_t len = model_max < 262144 ? model_max : 262144;
    const char *why = model_max < 262144 ? "the model's maximum" : "the default";
    if (per_pos && avail) {
        /* every slot holds a whole context; leave half the free memory for the rest */
        size_t cap = avail / 2 / per_pos / (size_t)C->parallel;
        if (cap < (size_t)len) { len = (int32_t)(cap > 16 ? cap : 16); why = "capped by free memory"; }
    }
    if (C->max_model_len) {
        if (C->max_model_len > model_max) {
            fprintf(stderr, "qwen35 serve: --max-model-len %d is over the model's maximum of %d\n", C->max_model_len, model_max);
            return 2;
        }
        if (C->max_model_len > len) fprintf(stderr, "qwen35 serve: warning: --max-model-len %d may not fit in memory (%d would)\n", C->max_model_len, len);
        len = C->max_model_len;
        why = "--max-model-len";
    }
    srv->cache_bytes = C->cache_bytes >= 0 ? (size_t)C->cache_bytes : (avail / 4 < (4096ul << 20) ? avail / 4 : (4096ul << 20));
    srv->spec_k = C->spec_k >= 0 ? (int32_t)C->spec_k : info->has_mtp ? 1 : 0;
    if (srv->spec_k > 0 && !info->has_mtp) {
        fprintf(stderr, "qwen35 serve: --spec-k needs an MTP head, which %s lacks\n", C->model_path);
        return 2;
    }
    if (C->draft_vocab && set_draft_vocab(srv->engine, C->draft_vocab)) return 2;
    /* the engine's EOS ids (q35_engine_eos_ids) end every generation; a chat turn also ends with
     * <|im_end|> whatever the model directory lists */
    int32_t eos[2];
    int n_eos = 0;
    static const char *const ends[] = {"<|im_end|>", "<|endoftext|>"};
    for (int i = 0; srv->tok && i < 2; i++) {
        int32_t id = q35_token_id(srv->tok, ends[i], strlen(ends[i]));
        if (id >= 0 && id < info->vocab_size) eos[n_eos++] = id;
    }
    srv->limits = (q35_api_limits){.served_model_name = C->served_name, .max_model_len = len, .vocab_size = info->vocab_size,
                                   .max_n = 16, .max_logprobs = 20, .max_total_tokens = 8 * (int64_t)len, .max_stop = 16,
                                   .max_stop_len = 256, .max_prompts = 64, .vision = vision, .max_images = max_images};
    q35_sampler_params *gd = &srv->gen_defaults;
    if (read_sampling_defaults(C->model_path, gd)) {
        srv->limits.defaults = gd;
        fprintf(stderr, "qwen35 serve: sampling defaults from generation_config.json: temperature %g, top_k %d, top_p %g, "
                        "min_p %g, repetition_penalty %g\n", gd->temperature, gd->top_k, gd->top_p, gd->min_p,
                gd->repetition_penalty);
    }
    q35_sched_config sc = {.engine = srv->engine, .tok = srv->tok, .metrics = &srv->metrics, .n_ctx = len,
                           .parallel = C->parallel, .max_queue = C->max_queue, .cache_bytes = srv->cache_bytes,
                           .prefill_chunk = C->prefill_chunk, .spec_k = srv->spec_k, .eos = eos, .n_eos = n_eos};
    char msg[1200];
    if (q35_sched_start(&sc, &srv->sched, msg, sizeof msg)) {
        fprintf(stderr, "qwen35 serve: %s\n", msg);
        return 1;
    }
    fprintf(stderr, "qwen35 serve: model %s as '%s'; max_model_len %d (%s; %zu bytes per position, KV cache %s); "
                    "parallel %d; prefix cache %zu MiB; speculation k=%d, draft head %d of %d rows; tokenizer: %s\n",
            C->model_path, C->served_name, len, why, per_pos, q35_kv_cache_name(info->kv_cache), C->parallel,
            srv->cache_bytes >> 20, srv->spec_k,
            q35_engine_draft_vocab(srv->engine), info->vocab_size, srv->tok ? "yes" : "none (token ids only)");
    atomic_store(&srv->ready, 1);
    fprintf(stderr, "qwen35 serve: ready\n");
    return 0;
}

static void *loader_main(void *arg) {
    q35_server *srv = arg;
    int rc = load_and_start(srv);
    atomic_store(&srv->load_status, rc);
    if (rc) pthread_kill(srv->main_thread, SIGTERM); /* wake the main thread's sigwait */
    return NULL;
}

/* Frees what the loader made (the scheduler first: it uses the engine). */
static void server_free(q35_server *srv) {
    q35_sched_free(srv->sched);
    q35_engine_free(srv->engine);
    q35_tokenizer_free(srv->tok);
    q35_image_loader_free(&srv->images);
    q35_metrics_destroy(&srv->metrics);
    q35_conns_destroy(&srv->conns);
}

/* Waits until no request is being answered or --drain-timeout passed; a
 * second signal exits at once. */
static void drain(q35_server *srv, const sigset_t *set) {
    double t_end = q35_now_seconds() + srv->cfg.drain_timeout_s;
    while (q35_conns_answering(&srv->conns) > 0) {
        double left = t_end - q35_now_seconds();
        if (left <= 0) {
            fprintf(stderr, "qwen35 serve: --drain-timeout passed with %d requests unanswered: ending them\n",
                    q35_conns_answering(&srv->conns));
            return;
        }
        struct timespec ts = {0, 50 * 1000000L};
        int sig = sigtimedwait(set, NULL, &ts);
        if (sig > 0) {
            fprintf(stderr, "qwen35 serve: signal %d while draining, exiting at once\n", sig);
            _exit(1);
        }
    }
}

int q35_server_run(const q35_server_config *cfg) {
    q35_server srv;
    memset(&srv, 0, sizeof srv);
    srv.cfg = *cfg;
    atomic_init(&srv.load_status, -1);
    q35_metrics_init(&srv.metrics);

    /* signals go to the main thread only, which waits for them below */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* every connection takes two descriptors (the library's and the watchdog's), refused ones linger:
     * the soft limit (often 1024) goes up to the hard one */
    struct rlimit nofile;
    if (!getrlimit(RLIMIT_NOFILE, &nofile) && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    int rc = 0;
    struct MHD_Daemon *d = q35_http_start(&srv, &rc);
    if (!d) {
        q35_metrics_destroy(&srv.metrics);
        q35_conns_destroy(&srv.conns);
        return rc;
    }
    fprintf(stderr, "qwen35 serve: listening on http://%s:%d (loading %s)%s\n", cfg->host, q35_http_port(&srv),
            cfg->model_path, cfg->api_key ? "" : "; no API key: every local client may use it");

    srv.main_thread = pthread_self();
    pthread_t loader;
    if (pthread_create(&loader, NULL, loader_main, &srv)) {
        fprintf(stderr, "qwen35 serve: cannot start the loader thread\n");
        q35_http_stop(&srv, d);
        q35_metrics_destroy(&srv.metrics);
        q35_conns_destroy(&srv.conns);
        return 1;
    }
    int sig;
    sigwait(&set, &sig);
    /* ready is set before the loader's status: a signal just after "ready"
     * is a shutdown, not an interrupted load */
    if (atomic_load(&srv.load_status) < 0 && !atomic_load(&srv.ready)) {
        fprintf(stderr, "qwen35 serve: signal %d while loading the model, exiting\n", sig);
        _exit(1);
    }
    pthread_join(loader, NULL);
    rc = atomic_load(&srv.load_status);
    if (rc) {
        q35_http_stop(&srv, d);
        server_free(&srv);
        return rc;
    }
    fprintf(stderr, "qwen35 serve: signal %d: draining (%d requests being answered; --drain-timeout %g s)\n", sig,
            q35_conns_answering(&srv.conns), cfg->drain_timeout_s);
    atomic_store(&srv.draining, 1);
    drain(&srv, &set);
    fprintf(stderr, "qwen35 serve: shutting down\n");
    atomic_store(&srv.stopping, 1);
    q35_sched_stop(srv.sched);
    /* every open stream now has its error to send: let their readers write
     * the error event and [DONE] before the daemon closes the connections
     * (bounded, for clients that stopped reading) */
    for (int i = 0; i < 300 && atomic_load(&srv.live_streams) > 0; i++) usleep(10000);
    q35_http_stop(&srv, d);
    server_free(&srv);
    return 0;
}
