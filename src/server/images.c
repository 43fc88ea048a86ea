/* images.c: a chat request's images (images.h): the content parts checked
 * at parse time, then loaded (src/media/source.c), hashed, decoded and
 * preprocessed before the request is queued, then their placeholders
 * expanded in the prompt with their spans recorded for the prefix cache.
 * Nothing here touches the engine: what it leaves in the request (patch
 * rows, grids, spans) is what the engine's image input reads. */
#include "server/images.h"

#include "base/util.h"
#include "server/prefix_cache.h"
#include "server/request.h"

#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool q35_api_is_image_part(json_t *part) {
    const char *type = json_string_value(json_object_get(part, "type"));
    /* the template's test, and the image types, so that an image part missing its URL is named as one */
    return json_object_get(part, "image_url") || json_object_get(part, "image") ||
           (type && (!strcmp(type, "image") || !strcmp(type, "image_url") || !strcmp(type, "input_image")));
}

int q35_api_image_part(json_t *part, size_t i, size_t j, const q35_api_limits *lim, q35_api_request *r, char *msg,
                       size_t msg_size, char *param, size_t param_size) {
    const char *type = json_string_value(json_object_get(part, "type"));
    json_t *tv = json_object_get(part, "type");
    bool image_form = type && !strcmp(type, "image");
    const char *field = image_form ? "image" : "image_url";
    snprintf(param, param_size, "messages[%zu].content[%zu].%s", i, j, field);
    if (tv && !json_is_null(tv) && (!type || (strcmp(type, "image_url") && strcmp(type, "input_image") && !image_form))) {
        snprintf(msg, msg_size, "messages[%zu].content[%zu]: a part of type '%.40s' cannot carry an image (type image_url)", i,
                 j, type ? type : "?");
        return 400;
    }
    if (!lim->vision) {
        snprintf(msg, msg_size, "%s: this model has no vision tower, so it takes no image input", param);
        return 400;
    }
    if (r->n_images >= lim->max_images) {
        snprintf(msg, msg_size, "%s: at most %d image(s) may be provided in one prompt (--limit-mm-per-prompt)", param,
                 lim->max_images);
        return 400;
    }
    json_t *v = json_object_get(part, field);
    if (!v || json_is_null(v)) {
        snprintf(msg, msg_size, "%s is required", param);
        return 400;
    }
    json_t *url = v;
    if (json_is_object(v) && !image_form) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            if (strcmp(k, "url") && strcmp(k, "detail")) {
                snprintf(msg, msg_size, "%s.%.40s is not supported (url, detail)", param, k);
                return 400;
            }
        }
        json_t *d = json_object_get(v, "detail"); /* accepted and ignored, as vLLM */
        if (d && !json_is_string(d) && !json_is_null(d)) {
            snprintf(msg, msg_size, "%s.detail must be a string", param);
            return 400;
        }
        url = json_object_get(v, "url");
    }
    if (!json_is_string(url) || !json_string_length(url) || memchr(json_string_value(url), 0, json_string_length(url))) {
        snprintf(msg, msg_size, "%s%s must be a non-empty string (a data:, http(s) or file URL)", param,
                 json_is_object(v) ? ".url" : "");
        return 400;
    }
    if (r->n_images == r->cap_images) {
        int32_t nc = r->cap_images ? 2 * r->cap_images : 4;
        q35_api_image *ni = realloc(r->images, sizeof *ni * (size_t)nc);
        if (!ni) { snprintf(msg, msg_size, "out of memory"); return 500; }
        r->images = ni;
        r->cap_images = nc;
    }
    q35_api_image *im = &r->images[r->n_images];
    memset(im, 0, sizeof *im);
    im->message = (int32_t)i;
    im->part = (int32_t)j;
    im->field = field;
    if (!(im->url = strdup(json_string_value(url)))) { snprintf(msg, msg_size, "out of memory"); return 500; }
    r->n_images++;
    param[0] = 0;
    return 0;
}

static int load_one(q35_api_image *im, const q35_image_loader *L, q35_error *err) {
    uint8_t *bytes;
    size_t n;
    q35_status st = q35_media_load_url(&L->policy, im->url, &bytes, &n, err);
    if (st) return st;
    SHA256(bytes, n, im->sha256);
    st = q35_image_process(L->proc, bytes, n, &im->pixels, err);
    free(bytes);
    if (st) return st;
    im->n_tokens = q35_image_processor_tokens(L->proc, &im->pixels);
    return Q35_OK;
}

int q35_api_images_load(q35_api_request *r, const q35_image_loader *L, int32_t max_model_len, char *msg,
                        size_t msg_size, char *param, size_t param_size) {
    int64_t total = 0;
    for (int32_t k = 0; k < r->n_images; k++) {
        q35_api_image *im = &r->images[k];
        snprintf(param, param_size, "messages[%d].content[%d].%s", im->message, im->part, im->field);
        q35_error err = {0};
        q35_status st = load_one(im, L, &err);
        if (st) {
            snprintf(msg, msg_size, "%s: %s", param, st == Q35_ERR_NOMEM ? "out of memory" : err.msg);
            return st == Q35_ERR_NOMEM ? 500 : 400;
        }
        total += im->n_tokens;
        if (total >= max_model_len) {
            snprintf(msg, msg_size, "%s: the images up to this one take %lld tokens, and this model's maximum context length "
                     "is %d tokens", param, (long long)total, max_model_len);
            return 400;
        }
    }
    param[0] = 0;
    return 0;
}

int q35_api_images_expand(const q35_api_request *r, int32_t pad_id, int32_t **ids, size_t *n, q35_image_span **spans_out,
                          char *msg, size_t msg_size) {
    bool record = spans_out != NULL;
    if (record) *spans_out = NULL;
    if (!r->n_images) return 0;
    size_t pads = 0, extra = 0;
    for (size_t i = 0; i < *n; i++) pads += (*ids)[i] == pad_id;
    if (pads != (size_t)r->n_images) {
        snprintf(msg, msg_size, "the rendered prompt has %zu image placeholders (<|image_pad|>) for %d images; text parts must "
                 "not write <|image_pad|> themselves", pads, r->n_images);
        return 400;
    }
    for (int32_t k = 0; k < r->n_images; k++) extra += (size_t)r->images[k].n_tokens - 1;
    if (*n + extra > INT32_MAX / 2) { snprintf(msg, msg_size, "the prompt is too long"); return 400; }
    int32_t *out = malloc(sizeof *out * (*n + extra));
    q35_image_span *spans = record ? calloc((size_t)r->n_images, sizeof *spans) : NULL;
    if (!out || (record && !spans)) {
        free(out);
        free(spans);
        snprintf(msg, msg_size, "out of memory");
        return 500;
    }
    size_t m = 0;
    int32_t k = 0;
    for (size_t i = 0; i < *n; i++) {
        if ((*ids)[i] != pad_id) { out[m++] = (*ids)[i]; continue; }
        const q35_api_image *im = &r->images[k];
        if (spans) {
            spans[k].pos = (int32_t)m;
            spans[k].len = im->n_tokens;
            memcpy(spans[k].sha256, im->sha256, sizeof spans[k].sha256);
        }
        for (int32_t t = 0; t < im->n_tokens; t++) out[m++] = pad_id;
        k++;
    }
    free(*ids);
    *ids = out;
    *n = m;
    if (record) *spans_out = spans;
    return 0;
}

int32_t q35_image_pad_id(const q35_tokenizer *tok) {
    static const char pad[] = "<|image_pad|>";
    return tok ? q35_token_id(tok, pad, sizeof pad - 1) : -1;
}

void q35_api_images_free(q35_api_request *r) {
    for (int32_t k = 0; k < r->n_images; k++) {
        free(r->images[k].url);
        q35_image_pixels_free(&r->images[k].pixels);
    }
    free(r->images);
    free(r->spans);
    r->images = NULL;
    r->spans = NULL;
    r->n_images = r->cap_images = r->n_spans = 0;
}

/* ---- start-up ----------------------------------------------------------- */

static int read_json(const char *dir, const char *name, json_t **out, char *msg, size_t msg_size) {
    *out = NULL;
    char *path = q35_path_join(dir, name);
    if (!path) { snprintf(msg, msg_size, "out of memory"); return -1; }
    if (!q35_file_exists(path)) { free(path); return 0; }
    json_error_t je;
    *out = json_load_file(path, 0, &je);
    if (!*out) snprintf(msg, msg_size, "%s: %s (line %d)", path, je.text, je.line);
    free(path);
    return *out ? 0 : -1;
}

int q35_image_loader_init(q35_image_loader *L, const char *model_dir, const q35_media_policy *policy, int64_t max_pixels,
                          bool *vision, char *msg, size_t msg_size) {
    memset(L, 0, sizeof *L);
    L->policy = *policy;
    *vision = false;
    json_t *cfg;
    if (read_json(model_dir, "config.json", &cfg, msg, msg_size)) return -1;
    *vision = json_is_object(json_object_get(cfg, "vision_config"));
    json_decref(cfg);
    if (!*vision) return 0;
    q35_error err = {0};
    if (q35_image_processor_load(model_dir, &L->proc, &err)) {
        snprintf(msg, msg_size, "%s", err.msg);
        return -1;
    }
    q35_image_processor_set_max_pixels(L->proc, max_pixels);
    return 0;
}

void q35_image_loader_free(q35_image_loader *L) {
    q35_image_processor_free(L->proc);
    L->proc = NULL;
}

int q35_parse_mm_limit(const char *text, int32_t *max_images, char *msg, size_t msg_size) {
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    int rc = 0;
    if (!json_is_object(j)) {
        snprintf(msg, msg_size, "--limit-mm-per-prompt must be a JSON object such as '{\"image\": 4}'");
        json_decref(j);
        return -1;
    }
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        if (strcmp(k, "image") && strcmp(k, "video") && strcmp(k, "audio")) {
            snprintf(msg, msg_size, "--limit-mm-per-prompt: unknown modality '%.40s' (image, video, audio)", k);
            rc = -1;
            break;
        }
        json_t *c = json_is_object(v) ? json_object_get(v, "count") : v;
        if (!json_is_integer(c) || json_integer_value(c) < 0 || json_integer_value(c) > 100000) {
            snprintf(msg, msg_size, "--limit-mm-per-prompt: '%.40s' must be a count from 0 to 100000 (or {\"count\": N})", k);
            rc = -1;
            break;
        }
        if (!strcmp(k, "image")) *max_images = (int32_t)json_integer_value(c);
    }
    json_decref(j);
    return rc;
}
