/* serve.c: `qwen35 serve`, the OpenAI-compatible HTTP server. The command
 * line becomes a q35_server_config; the server itself is the library under
 * src/server/ (its README.md says how it is split). */
#include "cli.h"
#include "server/server.h"
#include "qwen35.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    "  --timeout S              idle connection limit (default 60)\n"
    "  --request-timeout S      a whole request head and body, however slowly it arrives (default 30)\n"
    "  --write-timeout S        a stream whose client reads nothing for S is cancelled (default 60)\n"
    "  --drain-timeout S        after SIGTERM/SIGINT, time for running and queued requests (default 30)\n"
    "  --max-conns-per-client N open connections from one address (default 16; 0: no limit)\n"
    "  --backlog N              the listening socket's backlog (default 4096)\n"
    "  --prefix-cache-bytes N   prefix cache budget, a number with an optional K, M or G suffix\n"
    "                           (default min(4 GiB, a quarter of MemAvailable at start-up); 0: off)\n"
    "  --prefix-cache-mb N      the same in MiB\n"
    "  --prefill-chunk N        prompt tokens per scheduler step (default 512)\n"
    "  --spec-k K               MTP draft tokens per step (default 1 with an MTP head; 0: off)\n"
    "  --draft-vocab FILE       draft only over these token ids (one per line, as written by\n"
    "                           `qwen35 draft-vocab`): a cheaper draft head, the same output\n"
    "  --chat-template-fallback NAME  render an unknown chat template as qwen3.5-9b's or\n"
    "                           qwen3.5-0.8b's (default: refuse to start with it)\n"
    "  --default-chat-template-kwargs JSON  chat_template_kwargs for requests that leave them\n"
    "                           out, e.g. '{\"enable_thinking\": false}'\n"
    "  --allowed-origins LIST   CORS: origins (comma-separated, or '*') browsers may call from\n"
    "                           (default: none)\n"
    "  --limit-mm-per-prompt JSON  images per prompt, e.g. '{\"image\": 4}' (default 16)\n"
    "  --allowed-media-domains HOST...  image URLs (http, https) may be fetched from these hosts\n"
    "                           (exact names, comma- or space-separated; default: none, URLs refused)\n"
    "  --allowed-local-media-path DIR  file:// image URLs may be read from inside DIR (default: none)\n"
    "  --max-image-pixels N     the largest declared image size decoded (default 178956970, Pillow's)\n"
    "  --media-fetch-timeout S  one image URL's fetch, redirects included (default 5)\n"
    "  --log-level LEVEL        info (default) or debug (also the request fields that were ignored)\n"
    "  -t, --threads N          engine threads (default: one per core)\n"
    "  --kv-cache f32|q8        the sessions' attention keys and values: f32 (default, exact) or\n"
    "                           8 bits with a scale per 32 (llama.cpp's -ctk q8_0 -ctv q8_0),\n"
    "                           3.6x less memory and reading per position\n"
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

/* A byte count: digits with an optional K, M or G (binary) suffix. */
static int parse_bytes(const char *v, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || x < 0) return -1;
    int shift = 0;
    if (*end == 'K' || *end == 'k') shift = 10;
    else if (*end == 'M' || *end == 'm') shift = 20;
    else if (*end == 'G' || *end == 'g') shift = 30;
    if (shift) end++;
    if (*end || x > (1LL << 44) >> shift) return -1;
    *out = x << shift;
    return 0;
}

int cmd_serve(int argc, char **argv) {
    q35_server_config C;
    q35_server_config_init(&C);
    char keybuf[4096];
    char domains[4096];
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
        else if (!strcmp(k, "--kv-cache")) bad = (C.kv_cache = q35_kv_cache_parse(v)) < 0;
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
        else if (!strcmp(k, "--request-timeout")) { bad = parse_long(v, 1, 86400, &x); C.request_timeout_s = (double)x; }
        else if (!strcmp(k, "--write-timeout")) { bad = parse_long(v, 1, 86400, &x); C.write_timeout_s = (double)x; }
        else if (!strcmp(k, "--drain-timeout")) { bad = parse_long(v, 0, 86400, &x); C.drain_timeout_s = (double)x; }
        else if (!strcmp(k, "--max-conns-per-client")) { bad = parse_long(v, 0, 100000, &x); C.max_conns_per_client = (int)x; }
        else if (!strcmp(k, "--backlog")) { bad = parse_long(v, 1, 65535, &x); C.backlog = (int)x; }
        else if (!strcmp(k, "--prefix-cache-bytes")) bad = parse_bytes(v, &C.cache_bytes);
        else if (!strcmp(k, "--prefix-cache-mb")) { bad = parse_long(v, 0, 1L << 24, &x); C.cache_bytes = (long long)x << 20; }
        else if (!strcmp(k, "--prefill-chunk")) { bad = parse_long(v, 1, 1 << 20, &x); C.prefill_chunk = (int32_t)x; }
        else if (!strcmp(k, "--spec-k")) { bad = parse_long(v, 0, Q35_SPEC_K_MAX, &C.spec_k); }
        else if (!strcmp(k, "--draft-vocab")) C.draft_vocab = v;
        else if (!strcmp(k, "--chat-template-fallback")) C.chat_template_fallback = v;
        else if (!strcmp(k, "--allowed-origins")) C.allowed_origins = v;
        else if (!strcmp(k, "--allowed-media-domains")) {
            /* vLLM's form too: the hosts as separate arguments, up to the next option */
            size_t len = 0;
            domains[0] = 0;
            for (; i + 1 < argc && (argv[i + 1] == v || argv[i + 1][0] != '-'); i++) {
                size_t m = strlen(argv[i + 1]);
                if (len + m + 2 > sizeof domains) { bad = 1; break; }
                if (len) domains[len++] = ',';
                memcpy(domains + len, argv[i + 1], m + 1);
                len += m;
            }
            C.allowed_media_domains = domains;
            i--; /* the loop's i++ steps past the last host */
        }
        else if (!strcmp(k, "--allowed-local-media-path")) C.allowed_local_media_path = v;
        else if (!strcmp(k, "--limit-mm-per-prompt")) C.limit_mm_per_prompt = v;
        else if (!strcmp(k, "--max-image-pixels")) bad = parse_bytes(v, &C.max_image_pixels) || C.max_image_pixels < 1;
        else if (!strcmp(k, "--media-fetch-timeout")) { bad = parse_long(v, 1, 3600, &x); C.media_fetch_timeout_s = (double)x; }
        else if (!strcmp(k, "--log-level")) { bad = strcmp(v, "info") && strcmp(v, "debug") ? -1 : 0; C.log_debug = !strcmp(v, "debug"); }
        else if (!strcmp(k, "--default-chat-template-kwargs")) C.default_chat_template_kwargs = v;
        else if (!strcmp(k, "-t") || !strcmp(k, "--threads")) { bad = parse_long(v, 0, 1024, &x); C.threads = (int)x; }
        else { fprintf(stderr, "qwen35 serve: unknown option '%s'\n%s", k, serve_usage); return 2; }
        if (bad) { fprintf(stderr, "qwen35 serve: bad value '%s' for %s\n", v, k); return 2; }
        i++;
    }
    if (C.api_key && !*C.api_key) { fprintf(stderr, "qwen35 serve: the API key is empty\n"); return 2; }
    char *default_model = NULL;
    if (!C.model_path) C.model_path = default_model = cli_default_model(); /* the embedded demo model */
    int rc = q35_server_run(&C);
    free(default_model);
    return rc;
}