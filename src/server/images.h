/* images.h: the images of a chat request (images.c), from the content
 * parts of its messages to what the engine reads: each part's URL resolved
 * to bytes under the server's media policy (src/media/source.h), the bytes'
 * SHA-256, the bytes through the model's image processor (qwen35.h's
 * q35_image_process: decoded and preprocessed) into patch rows and a grid,
 * and the number of merged patches, which is how many <|image_pad|> tokens
 * stand for it in the prompt. The scheduler encodes the pixels with the
 * vision tower (sched_images.c).
 *
 * Three steps, at three moments of a request:
 *   1. q35_api_image_part, from the request parser (request.c, no I/O):
 *      the part's shape, the per-prompt limit, a model without a tower;
 *   2. q35_api_images_load, from the route before anything is queued: the
 *      I/O, decoding and preprocessing; every refusal names the part;
 *   3. q35_api_images_expand, from the prompt (prompt.c): the template's one
 *      <|image_pad|> per image becomes n_tokens of them, and the images'
 *      spans in the prompt (position, length, hash) are recorded for the
 *      prefix cache's keys (prefix_cache.h). */
#ifndef Q35_SERVER_IMAGES_H
#define Q35_SERVER_IMAGES_H

#include "media/source.h"
#include "qwen35.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct q35_api_request;
struct q35_api_limits;
struct q35_image_span;

/* One image of a request. */
typedef struct q35_api_image {
    int32_t message, part;     /* messages[message].content[part] */
    char *url;                 /* the part's URL (owned) */
    const char *field;         /* "image_url" or "image": the part's key, for messages */
    uint8_t sha256[32];        /* of the bytes as they came (before decoding) */
    q35_image_pixels pixels;   /* pixel_values (n_patches, patch_dim) and image_grid_thw */
    int32_t n_tokens;          /* merged patches: grid_t * grid_h * grid_w / merge^2 */
} q35_api_image;

/* Where the server's images come from and how they are processed. */
typedef struct q35_image_loader {
    q35_media_policy policy;
    q35_image_processor *proc; /* the model's (owned), its decoder limited to --max-image-pixels */
} q35_image_loader;

/* The default of --limit-mm-per-prompt's image count. */
#define Q35_DEFAULT_MAX_IMAGES 16

/* Whether a content part is one the chat template renders as an image
 * (a key "image" or "image_url", or type "image"), so that every image
 * placeholder has an image behind it. */
bool q35_api_is_image_part(json_t *part);

/* Step 1: messages[i].content[j], an image part, checked and appended to
 * r's images (the forms: {"type": "image_url", "image_url": {"url", "detail"}}
 * or with image_url a bare string, {"type": "input_image", "image_url": URL},
 * {"type": "image", "image": URL}, and these without "type"). 0, or an HTTP
 * status with msg and param (the part, e.g. "messages[1].content[2].image_url"). */
int q35_api_image_part(json_t *part, size_t i, size_t j, const struct q35_api_limits *lim, struct q35_api_request *r,
                       char *msg, size_t msg_size, char *param, size_t param_size);

/* Step 2: every image of r loaded, hashed, decoded and preprocessed, in
 * order; stops at the first failure (400 naming the part; 500 out of
 * memory) or when the images alone reach max_model_len tokens (400). */
int q35_api_images_load(struct q35_api_request *r, const q35_image_loader *L, int32_t max_model_len, char *msg,
                        size_t msg_size, char *param, size_t param_size);

/* Step 3: *ids (n of them, malloc'd) with each pad_id token replaced by
 * its image's n_tokens of them, in order; spans (may be NULL) receives the
 * images' places in the result (r->n_images of them, malloc'd). A prompt
 * whose placeholders do not number r's images is 400 (text that writes
 * "<|image_pad|>" itself). No images: ids stay as they are. 0 or an HTTP
 * status with msg. */
int q35_api_images_expand(const struct q35_api_request *r, int32_t pad_id, int32_t **ids, size_t *n,
                          struct q35_image_span **spans, char *msg, size_t msg_size);

/* The id of <|image_pad|> (the template's one placeholder per image), or -1. */
int32_t q35_image_pad_id(const q35_tokenizer *tok);

/* Frees r's images and spans (q35_api_request_free calls it). */
void q35_api_images_free(struct q35_api_request *r);

/* The loader for a model directory: the operator's policy and limits, and
 * the model's image processor (q35_image_processor_load) when config.json
 * has a vision tower (*vision), NULL otherwise. 0, or -1 with msg. */
int q35_image_loader_init(q35_image_loader *L, const char *model_dir, const q35_media_policy *policy,
                          int64_t max_pixels, bool *vision, char *msg, size_t msg_size);
void q35_image_loader_free(q35_image_loader *L);

/* --limit-mm-per-prompt's JSON ({"image": N}, or {"image": {"count": N}}
 * as vLLM's newer form; "video" and "audio" counts are accepted, as vLLM
 * command lines carry them, and have no effect: such parts are refused)
 * into *max_images. 0, or -1 with msg. */
int q35_parse_mm_limit(const char *json, int32_t *max_images, char *msg, size_t msg_size);

#endif
