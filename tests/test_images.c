/* tests/test_images.c: a chat request's images on the server's side
 * (src/server/images.c) and the prefix cache's image keys
 * (src/server/prefix_cache.c): the content-part forms taken, every refusal
 * naming its part, the loader against the media layer's own decoder and
 * processor on the test images, the placeholder expansion with its spans,
 * and a cached state found only for the same images at the same places. */
#include "test.h"

#include "base/utf8.h"
#include "base/util.h"
#include "golden.h"
#include "media/image.h"
#include "server/images.h"
#include "server/prefix_cache.h"
#include "server/request.h"

#include <openssl/sha.h>

static const q35_api_limits vlim = {.served_model_name = "m", .max_model_len = 4096, .vocab_size = 50, .max_n = 4,
                                    .max_logprobs = 5, .max_total_tokens = 20000, .max_stop = 4, .max_stop_len = 16,
                                    .max_prompts = 4, .vision = true, .max_images = 3};

static int parse_chat(const char *body, const q35_api_limits *lim, q35_api_request *r, char *msg, char *param) {
    return q35_api_parse(body, strlen(body), Q35_API_CHAT, lim, r, msg, 1024, param, 128);
}

TEST(images, parts_in_each_accepted_form_are_kept_in_order_with_their_place) {
    const char *body =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":["
        "{\"type\":\"text\",\"text\":\"a\"},"
        "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AA==\",\"detail\":\"low\"}},"
        "{\"type\":\"image_url\",\"image_url\":\"http://h/x.png\"},"
        "{\"image_url\":{\"url\":\"file:///a/b.png\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"data:;base64,AA\"}]}]}";
    q35_api_request r;
    char msg[1024], param[128];
    q35_api_limits lim = vlim;
    lim.max_images = 4;
    REQUIRE_MSG(parse_chat(body, &lim, &r, msg, param) == 0, "%s", msg);
    REQUIRE(r.n_images == 4);
    static const char *const urls[] = {"data:image/png;base64,AA==", "http://h/x.png", "file:///a/b.png", "data:;base64,AA"};
    static const int where[][2] = {{1, 1}, {1, 2}, {1, 3}, {2, 0}};
    for (int k = 0; k < 4; k++) {
        CHECK_STR_EQ(r.images[k].url, urls[k]);
        CHECK_EQ_INT(r.images[k].message, where[k][0]);
        CHECK_EQ_INT(r.images[k].part, where[k][1]);
    }
    q35_api_request_free(&r);
    /* the HF form */
    REQUIRE(parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"image\":\"data:;base64,AA\"}]}]}",
                       &vlim, &r, msg, param) == 0);
    CHECK_EQ_INT(r.n_images, 1);
    CHECK_STR_EQ(r.images[0].field, "image");
    q35_api_request_free(&r);
}

TEST(images, bad_parts_are_refused_with_400_naming_the_part) {
    static const struct { const char *content, *param, *msg; } bad[] = {
        {"[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image_url\"}]", "messages[0].content[1].image_url",
         "messages[0].content[1].image_url is required"},
        {"[{\"type\":\"image_url\",\"image_url\":{\"url\":3}}]", "messages[0].content[0].image_url",
         "image_url.url must be a non-empty string"},
        {"[{\"type\":\"image_url\",\"image_url\":{\"url\":\"\"}}]", "messages[0].content[0].image_url", "non-empty"},
        {"[{\"type\":\"image_url\",\"image_url\":{}}]", "messages[0].content[0].image_url", "url must be a non-empty string"},
        {"[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:,\",\"uuid\":\"x\"}}]", "messages[0].content[0].image_url",
         "image_url.uuid is not supported"},
        {"[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:,\",\"detail\":1}}]", "messages[0].content[0].image_url",
         "detail must be a string"},
        {"[{\"type\":\"text\",\"text\":\"a\",\"image_url\":\"data:,\"}]", "messages[0].content[0].image_url",
         "a part of type 'text' cannot carry an image"},
        {"[{\"type\":\"image_url\",\"image_url\":\"a\"},{\"type\":\"image_url\",\"image_url\":\"b\"},"
         "{\"type\":\"image_url\",\"image_url\":\"c\"},{\"type\":\"image_url\",\"image_url\":\"d\"}]",
         "messages[0].content[3].image_url", "at most 3 image(s) may be provided in one prompt"},
        {"[{\"type\":\"video_url\",\"video_url\":{\"url\":\"x\"}}]", "messages", "video input is not supported"},
        {"[{\"type\":\"video\",\"video\":\"x\"}]", "messages", "video input is not supported"},
        {"[{\"type\":\"audio\"}]", "messages", "content type 'audio' is not supported (text, image_url)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char body[1024], msg[1024], param[128];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":%s}]}", bad[i].content);
        q35_api_request r;
        CHECK_EQ_INT(parse_chat(body, &vlim, &r, msg, param), 400);
        CHECK_MSG(strstr(msg, bad[i].msg), "%s: got '%s'", bad[i].content, msg);
        CHECK_STR_EQ(param, bad[i].param);
    }
    /* a model without a vision tower */
    q35_api_limits text_only = vlim;
    text_only.vision = false;
    char msg[1024], param[128];
    q35_api_request r;
    CHECK_EQ_INT(parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                            "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AA==\"}}]}]}",
                            &text_only, &r, msg, param), 400);
    CHECK_STR_EQ(msg, "messages[0].content[1].image_url: this model has no vision tower, so it takes no image input");
    CHECK_STR_EQ(param, "messages[0].content[1].image_url");
}

/* The test image's bytes as a data: URL. */
static char *data_url_of(const char *rel, const char *type, uint8_t **bytes, size_t *n) {
    char *raw;
    q35_error err;
    if (q35_read_file(q35_test_path(rel), &raw, n, &err)) return NULL;
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t head = strlen(type) + 13;
    char *u = malloc(head + *n / 3 * 4 + 8), *p = u + sprintf(u, "data:%s;base64,", type);
    const uint8_t *d = (const uint8_t *)raw;
    size_t i = 0;
    for (; i + 3 <= *n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (uint32_t)d[i + 1] << 8 | d[i + 2];
        *p++ = A[v >> 18]; *p++ = A[v >> 12 & 63]; *p++ = A[v >> 6 & 63]; *p++ = A[v & 63];
    }
    if (*n - i == 1) { *p++ = A[d[i] >> 2]; *p++ = A[(d[i] & 3) << 4]; }
    if (*n - i == 2) { *p++ = A[d[i] >> 2]; *p++ = A[(d[i] & 3) << 4 | d[i + 1] >> 4]; *p++ = A[(d[i + 1] & 15) << 2]; }
    *p = 0;
    *bytes = (uint8_t *)raw;
    return u;
}

/* The tiny VL model's processor (patch 4, merge 2, 256..1024 pixels). */
static void small_loader(q35_image_loader *L) {
    memset(L, 0, sizeof *L);
    q35_error err;
    if (q35_image_processor_load(q35_test_path("models/vl-a"), &L->proc, &err))
        q35_test_fail(__FILE__, __LINE__, "%s", err.msg);
}

/* A request with one image part per url. */
static int request_with(const char *const *urls, int n, q35_api_request *r) {
    q35_buf b = {0};
    q35_buf_puts(&b, "{\"messages\":[{\"role\":\"user\",\"content\":[");
    for (int k = 0; k < n; k++) q35_buf_printf(&b, "%s{\"type\":\"image_url\",\"image_url\":{\"url\":\"%s\"}}", k ? "," : "", urls[k]);
    q35_buf_puts(&b, "]}]}");
    char msg[1024], param[128];
    q35_api_limits lim = vlim;
    lim.max_images = 8;
    int rc = parse_chat(b.data, &lim, r, msg, param);
    q35_buf_free(&b);
    if (rc) q35_test_fail(__FILE__, __LINE__, "%s", msg);
    return rc;
}

TEST(images, load_hashes_the_bytes_and_gives_the_processors_patches) {
    uint8_t *b1, *b2;
    size_t n1, n2;
    char *u1 = data_url_of("images/rgb_37x53.jpg", "image/jpeg", &b1, &n1), *u2 = data_url_of("images/tall_9x700.png", "image/png", &b2, &n2);
    REQUIRE(u1 && u2);
    const char *urls[] = {u1, u2};
    q35_api_request r;
    REQUIRE(request_with(urls, 2, &r) == 0);
    q35_image_loader L;
    small_loader(&L);
    char msg[1024], param[128];
    REQUIRE_MSG(q35_api_images_load(&r, &L, 4096, msg, sizeof msg, param, sizeof param) == 0, "%s", msg);
    const uint8_t *bytes[] = {b1, b2};
    const size_t lens[] = {n1, n2};
    for (int k = 0; k < 2; k++) {
        uint8_t want[32];
        SHA256(bytes[k], lens[k], want);
        CHECK(!memcmp(r.images[k].sha256, want, 32));
        /* the same as the model's processor on the file's bytes */
        q35_image_pixels vi;
        q35_error err;
        REQUIRE(q35_image_process(L.proc, bytes[k], lens[k], &vi, &err) == Q35_OK);
        const q35_image_pixels *got = &r.images[k].pixels;
        CHECK(!memcmp(got->grid_thw, vi.grid_thw, sizeof vi.grid_thw));
        CHECK(got->n_patches == vi.n_patches && got->patch_dim == vi.patch_dim && vi.patch_dim == 3 * 2 * 4 * 4);
        CHECK(!memcmp(got->pixel_values, vi.pixel_values, sizeof(float) * (size_t)(vi.n_patches * vi.patch_dim)));
        CHECK_EQ_INT(r.images[k].n_tokens, vi.n_patches / 4);
        q35_image_pixels_free(&vi);
    }
    /* the images alone past the context are refused at the image that passes it */
    q35_api_request r2;
    REQUIRE(request_with(urls, 2, &r2) == 0);
    int32_t limit = r.images[0].n_tokens + 1;
    CHECK_EQ_INT(q35_api_images_load(&r2, &L, limit, msg, sizeof msg, param, sizeof param), 400);
    CHECK_STR_EQ(param, "messages[0].content[1].image_url");
    CHECK(strstr(msg, "maximum context length is"));
    q35_api_request_free(&r2);
    q35_api_request_free(&r);
    q35_image_loader_free(&L);
    free(u1); free(u2); free(b1); free(b2);
}

TEST(images, load_refusals_name_the_part_and_the_cause) {
    uint8_t *jpg, *bomb;
    size_t n_jpg, n_bomb;
    char *ok = data_url_of("images/rgb_37x53.jpg", "image/jpeg", &jpg, &n_jpg);
    char *bomb_url = data_url_of("images/bomb_60000x60000.png", "image/png", &bomb, &n_bomb);
    REQUIRE(ok && bomb_url);
    /* the first half of the JPEG: truncated */
    char *half = strdup(ok);
    size_t head = strlen("data:image/jpeg;base64,");
    half[head + (strlen(half) - head) / 2 / 4 * 4] = 0;
    static const char bmp[] = "data:image/bmp;base64,Qk0eAAAAAAAAABoAAAAMAAAAAQABAAEAGAAAAP8A";
    const struct { const char *url, *msg; } cases[] = {
        {"data:image/png;base64,iVBOR$", "bad base64 in the data: URL"},
        {bmp, "unsupported format (not JPEG, PNG, WebP or GIF)"},
        {half, "JPEG"},
        {bomb_url, "over"},
        {"http://example.com/a.png", "not allowed on this server"},
        {"file:///etc/passwd", "cannot load local files without --allowed-local-media-path"},
        {"ftp://example.com/a.png", "must be an http(s), data or file URL"},
    };
    q35_image_loader L;
    small_loader(&L);
    q35_image_processor_set_max_pixels(L.proc, 1 << 24);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *urls[] = {ok, cases[i].url};
        q35_api_request r;
        REQUIRE(request_with(urls, 2, &r) == 0);
        char msg[1024], param[128];
        CHECK_EQ_INT(q35_api_images_load(&r, &L, 4096, msg, sizeof msg, param, sizeof param), 400);
        CHECK_STR_EQ(param, "messages[0].content[1].image_url");
        CHECK_MSG(!strncmp(msg, "messages[0].content[1].image_url: ", 34) && strstr(msg, cases[i].msg), "case %zu: got '%s'", i, msg);
        q35_api_request_free(&r);
    }
    q35_image_loader_free(&L);
    free(ok); free(bomb_url); free(half); free(jpg); free(bomb);
}

TEST(images, expansion_widens_each_placeholder_and_records_the_spans) {
    q35_api_request r = {0};
    q35_api_image im[2] = {{.n_tokens = 3}, {.n_tokens = 2}};
    memset(im[0].sha256, 0xaa, 32);
    memset(im[1].sha256, 0xbb, 32);
    r.images = im;
    r.n_images = 2;
    enum { P = 9 };
    int32_t *ids = malloc(5 * sizeof *ids);
    memcpy(ids, (int32_t[]){1, P, 2, P, 3}, 5 * sizeof *ids);
    size_t n = 5;
    q35_image_span *spans;
    char msg[256];
    REQUIRE(q35_api_images_expand(&r, P, &ids, &n, &spans, msg, sizeof msg) == 0);
    static const int32_t want[] = {1, P, P, P, 2, P, P, 3};
    CHECK_EQ_INT(n, 8);
    CHECK(!memcmp(ids, want, sizeof want));
    CHECK(spans[0].pos == 1 && spans[0].len == 3 && spans[0].sha256[5] == 0xaa);
    CHECK(spans[1].pos == 5 && spans[1].len == 2 && spans[1].sha256[31] == 0xbb);
    free(spans);
    /* one placeholder too many (text that writes <|image_pad|>) */
    CHECK_EQ_INT(q35_api_images_expand(&r, P, &ids, &n, NULL, msg, sizeof msg), 400);
    CHECK(strstr(msg, "has 5 image placeholders (<|image_pad|>) for 2 images"));
    free(ids);
}

TEST(prefix_cache, image_spans_agree_only_for_the_same_images_at_the_same_places) {
    q35_image_span a[2] = {{.pos = 4, .len = 3}, {.pos = 10, .len = 2}};
    memset(a[0].sha256, 1, 32);
    memset(a[1].sha256, 2, 32);
    q35_image_span b[2];
    memcpy(b, a, sizeof a);
    CHECK(q35_image_spans_agree(a, 2, b, 2, 20));
    b[1].sha256[7] ^= 1; /* the second image differs */
    CHECK(!q35_image_spans_agree(a, 2, b, 2, 20));
    CHECK(!q35_image_spans_agree(a, 2, b, 2, 11)); /* a state inside it */
    CHECK(q35_image_spans_agree(a, 2, b, 2, 10));  /* the state before it is shared */
    CHECK(q35_image_spans_agree(a, 2, NULL, 0, 4));
    CHECK(!q35_image_spans_agree(a, 2, NULL, 0, 5));
    memcpy(b, a, sizeof a);
    b[0].pos = 5; /* the same image elsewhere */
    CHECK(!q35_image_spans_agree(a, 2, b, 2, 20));
    CHECK_EQ_INT(q35_image_spans_before(a, 2, 4), 0);
    CHECK_EQ_INT(q35_image_spans_before(a, 2, 5), 1);
    CHECK_EQ_INT(q35_image_spans_before(a, 2, 99), 2);
}

/* A session's history holds image rows as the engine's tags, a prompt as
 * pads: agreeing images' rows are not compared, every other id is. */
TEST(prefix_cache, a_history_agrees_with_a_prompt_across_its_images_only) {
    enum { P = 9 };
    const int32_t prompt[] = {1, 2, P, P, P, 3, P, P, 4, 5};
    int32_t held[] = {1, 2, -7, -7, -7, 3, -8, -8, 4, 5};
    q35_image_span sp[2] = {{.pos = 2, .len = 3}, {.pos = 6, .len = 2}};
    memset(sp[0].sha256, 1, 32);
    memset(sp[1].sha256, 2, 32);
    CHECK(q35_prefix_agrees(held, 10, sp, 2, prompt, sp, 2));
    CHECK(q35_prefix_agrees(held, 6, sp, 1, prompt, sp, 2)); /* before the second image: only the first is held */
    CHECK(q35_prefix_agrees(prompt, 10, sp, 2, prompt, sp, 2));
    held[5] = 33; /* text between the images differs */
    CHECK(!q35_prefix_agrees(held, 10, sp, 2, prompt, sp, 2));
    CHECK(q35_prefix_agrees(held, 5, sp, 1, prompt, sp, 2));
    held[5] = 3;
    held[9] = 6; /* the tail differs */
    CHECK(!q35_prefix_agrees(held, 10, sp, 2, prompt, sp, 2));
    CHECK(q35_prefix_agrees(held, 9, sp, 2, prompt, sp, 2));
    q35_image_span other[2];
    memcpy(other, sp, sizeof sp);
    other[1].sha256[0] ^= 1; /* the second image is another */
    CHECK(!q35_prefix_agrees(held, 9, other, 2, prompt, sp, 2));
    CHECK(q35_prefix_agrees(held, 6, other, 2, prompt, sp, 2));
    CHECK(!q35_prefix_agrees(held, 9, NULL, 0, prompt, sp, 2)); /* a text history never stands for images */
}

TEST(prefix_cache, a_state_after_an_image_is_found_only_for_the_same_image) {
    golden g;
    q35_engine *e = golden_engine("tiny-c", &g);
    REQUIRE(e);
    q35_session *s;
    q35_error err;
    REQUIRE(q35_session_new(e, 256, &s, &err) == Q35_OK);
    enum { N = 12 };
    REQUIRE(g.n_prompt > N);
    REQUIRE(q35_session_eval(s, g.prompt_ids, N, NULL, 0, &err) == Q35_OK);
    q35_image_span img = {.pos = 3, .len = 4}, other = img, later = {.pos = N + 2, .len = 2};
    memset(img.sha256, 0x11, 32);
    memset(other.sha256, 0x22, 32);
    memset(later.sha256, 0x33, 32);
    q35_prefix_cache c;
    q35_prefix_cache_init(&c, 64u << 20);
    q35_prefix_cache_store(&c, s, g.prompt_ids, N, &img, 1, 0);
    CHECK(q35_prefix_cache_find(&c, g.prompt_ids, g.n_prompt, &img, 1, 0) != NULL);
    CHECK(q35_prefix_cache_find(&c, g.prompt_ids, g.n_prompt, &other, 1, 0) == NULL);
    CHECK(q35_prefix_cache_find(&c, g.prompt_ids, g.n_prompt, NULL, 0, 0) == NULL);
    /* a state before any image serves prompts whose images come after it */
    q35_session_reset(s);
    REQUIRE(q35_session_eval(s, g.prompt_ids, N, NULL, 0, &err) == Q35_OK);
    q35_image_span both[2] = {img, later};
    q35_prefix_cache_store(&c, s, g.prompt_ids, N, &later, 1, 0); /* starts after N: not part of the key */
    CHECK(q35_prefix_cache_find(&c, g.prompt_ids, g.n_prompt, &later, 1, 0) != NULL);
    CHECK(q35_prefix_cache_find(&c, g.prompt_ids, g.n_prompt, both, 2, 0) != NULL); /* the one with img */
    q35_prefix_cache_usage_t u;
    q35_prefix_cache_usage(&c, &u);
    CHECK_EQ_INT(u.entries, 2);
    CHECK_EQ_INT(u.hits, 3);
    CHECK_EQ_INT(u.misses, 2);
    q35_prefix_cache_free(&c);
    q35_session_free(s);
    q35_engine_free(e);
    golden_free(&g);
}
