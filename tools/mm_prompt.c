/* mm_prompt.c: image prompts for the programs (cli.h cli_mm_prompt): a chat
 * request's image parts or --image files, through the public image API
 * (qwen35.h "Images"): bytes -> q35_image_process -> one
 * q35_engine_encode_images call -> q35_engine_expand_images. */
#include "cli.h"
#include "qwen35.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_mm_prompt_free(cli_mm_prompt *p) {
    for (int32_t i = 0; i < p->n_images; i++) q35_image_embeds_free(p->images[i]);
    free(p->images);
    free(p->ids);
    memset(p, 0, sizeof *p);
}

/* "data:[mime][;base64],PAYLOAD" -> bytes (malloc'd) */
static char *data_url(const char *url, size_t *len, const char *prog) {
    const char *comma = strchr(url, ',');
    if (!comma || !strstr(url, ";base64") || strstr(url, ";base64") > comma) {
        fprintf(stderr, "%s: a data: URL must be base64 (data:image/...;base64,...)\n", prog);
        return NULL;
    }
    const char *b64 = comma + 1;
    size_t n = strlen(b64);
    if (n == 0 || n % 4 || n > ((size_t)1 << 30)) {
        fprintf(stderr, "%s: the data: URL's base64 payload is empty or not a multiple of 4 characters\n", prog);
        return NULL;
    }
    unsigned char *out = malloc(n / 4 * 3 + 1);
    int got = out ? EVP_DecodeBlock(out, (const unsigned char *)b64, (int)n) : -1;
    if (got < 0) {
        fprintf(stderr, "%s: the data: URL's payload is not valid base64\n", prog);
        free(out);
        return NULL;
    }
    size_t pad = (b64[n - 1] == '=') + (b64[n - 2] == '=');
    *len = (size_t)got - pad;
    return (char *)out;
}

/* An image source's bytes: a data: URL, file://PATH, or a path (relative
 * paths against base_dir when it is given). */
static char *source_bytes(const char *src, const char *base_dir, size_t *len, const char *prog) {
    if (!strncmp(src, "data:", 5)) return data_url(src, len, prog);
    if (!strncmp(src, "http://", 7) || !strncmp(src, "https://", 8)) {
        fprintf(stderr, "%s: image URL '%.80s' is not fetched here: give a data: URL or a file path\n", prog, src);
        return NULL;
    }
    if (!strncmp(src, "file://", 7)) src += 7;
    char path[4096];
    if (src[0] != '/' && base_dir && *base_dir) snprintf(path, sizeof path, "%s/%s", base_dir, src);
    else snprintf(path, sizeof path, "%s", src);
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n = -1;
    if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) && (buf = malloc((size_t)n + 1)) &&
        fread(buf, 1, (size_t)n, f) == (size_t)n) {
        fclose(f);
        *len = (size_t)n;
        return buf;
    }
    fprintf(stderr, "%s: cannot read image '%s'\n", prog, path);
    if (f) fclose(f);
    free(buf);
    return NULL;
}

int cli_mm_encode(q35_engine *e, const char *model_dir, const char *const *sources, int32_t n_sources,
                  const char *base_dir, cli_mm_prompt *out, const char *prog) {
    memset(out, 0, sizeof *out);
    q35_error err = {0};
    q35_image_processor *proc = NULL;
    q35_image_pixels *px = calloc((size_t)(n_sources ? n_sources : 1), sizeof *px);
    out->images = calloc((size_t)(n_sources ? n_sources : 1), sizeof *out->images);
    int rc = px && out->images ? 0 : -1;
    if (rc) fprintf(stderr, "%s: out of memory\n", prog);
    if (!rc && n_sources && q35_image_processor_load(model_dir, &proc, &err)) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        rc = -1;
    }
    int32_t n_px = 0;
    for (int32_t i = 0; !rc && i < n_sources; i++) {
        size_t len = 0;
        char *bytes = source_bytes(sources[i], base_dir, &len, prog);
        if (!bytes) rc = -1;
        else if (q35_image_process(proc, bytes, len, &px[n_px], &err)) {
            fprintf(stderr, "%s: image %d: %s\n", prog, i + 1, err.msg);
            rc = -1;
        } else n_px++;
        free(bytes);
    }
    if (!rc && n_sources && q35_engine_encode_images(e, px, n_sources, out->images, &err)) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        rc = -1;
    }
    if (!rc) out->n_images = n_sources;
    for (int32_t i = 0; i < n_px; i++) q35_image_pixels_free(&px[i]);
    free(px);
    q35_image_processor_free(proc);
    if (rc) cli_mm_prompt_free(out);
    return rc;
}

int cli_mm_prompt_build(q35_engine *e, const char *model_dir, const q35_tokenizer *tok, const char *text,
                        const char *const *sources, int32_t n_sources, const char *base_dir, cli_mm_prompt *out,
                        const char *prog) {
    q35_error err = {0};
    int32_t *raw = NULL;
    size_t n_raw = 0;
    memset(out, 0, sizeof *out);
    if (q35_tokenize(tok, text, strlen(text), 1, &raw, &n_raw, &err)) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        return -1;
    }
    int rc = cli_mm_encode(e, model_dir, sources, n_sources, base_dir, out, prog);
    if (!rc && q35_engine_expand_images(e, raw, (int32_t)n_raw, out->images, out->n_images, &out->ids, &out->n, &err)) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        cli_mm_prompt_free(out);
        rc = -1;
    }
    free(raw);
    return rc;
}

/* The image sources of a request's messages, in the order the template
 * renders them (messages, then parts). */
static int32_t collect_sources(json_t *messages, const char **sources, int32_t cap) {
    int32_t n = 0;
    size_t i, j;
    json_t *m, *part;
    json_array_foreach(messages, i, m) {
        json_t *content = json_object_get(m, "content");
        if (!json_is_array(content)) continue;
        json_array_foreach(content, j, part) {
            const char *type = json_string_value(json_object_get(part, "type"));
            if (!type || (strcmp(type, "image_url") && strcmp(type, "image"))) continue;
            json_t *iu = json_object_get(part, "image_url");
            const char *url = json_is_string(iu) ? json_string_value(iu) : json_string_value(json_object_get(iu, "url"));
            if (!url) url = json_string_value(json_object_get(part, "image"));
            if (n < cap) sources[n] = url;
            n++;
        }
    }
    return n;
}

int cli_mm_prompt_from_request(q35_engine *e, const char *model_dir, const char *req_path, cli_mm_prompt *out,
                               const char *prog) {
    memset(out, 0, sizeof *out);
    char *text = cli_render_chat(req_path, cli_chat_variant(model_dir, prog), prog);
    if (!text) return -1;
    json_t *req = json_load_file(req_path, 0, NULL);
    json_t *messages = json_is_array(req) ? req : json_object_get(req, "messages");
    const char *sources[256];
    int32_t n = collect_sources(messages, sources, 256);
    int rc = 0;
    if (n > 256) {
        fprintf(stderr, "%s: %s: %d images; at most 256\n", prog, req_path, n);
        rc = -1;
    }
    for (int32_t i = 0; !rc && i < n; i++)
        if (!sources[i]) {
            fprintf(stderr, "%s: %s: image part %d has no image_url.url\n", prog, req_path, i + 1);
            rc = -1;
        }
    char base[4096];
    snprintf(base, sizeof base, "%s", req_path);
    char *slash = strrchr(base, '/');
    if (slash) *slash = 0;
    else strcpy(base, ".");
    q35_tokenizer *tok = NULL;
    q35_error err = {0};
    if (!rc && q35_tokenizer_load(model_dir, &tok, &err)) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        rc = -1;
    }
    if (!rc) rc = cli_mm_prompt_build(e, model_dir, tok, text, sources, n, base, out, prog);
    q35_tokenizer_free(tok);
    json_decref(req);
    free(text);
    return rc;
}
