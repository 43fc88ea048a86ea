/* mm.c: images in a prompt (qwen35.h "Images"): the vision tower through
 * the backend (encode_images), the expansion of each <|image_pad|> to the
 * image's rows, and the evaluation of a prompt holding images.
 *
 * Positions, as transformers' Qwen3_5Model.get_rope_index computes them
 * (merge MS, an image of grid (t, h, w) gives t * (h/MS) * (w/MS) rows):
 *   text row:   (p, p, p), then p += 1
 *   image rows: (p + ti, p + hi, p + wi) for ti < t, hi < h/MS, wi < w/MS
 *               in that order (row-major), then p += max(h, w) / MS
 * where p starts at the session's position + its rope_delta, and the
 * session's rope_delta becomes p - (its position after the rows): the
 * offset every later text row (decode, drafts) adds to its cache position,
 * as transformers' rope_deltas does during generation. A row's KV cache slot
 * stays its sequence index; only the rotation uses these positions. */
#include "core/session.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>

struct q35_image_embeds {
    const q35_engine *engine;
    int32_t grid_thw[3];
    int32_t n_tokens, width;
    uint64_t hash;
    float *rows; /* (n_tokens, width) */
};

void q35_image_embeds_free(q35_image_embeds *im) {
    if (!im) return;
    free(im->rows);
    free(im);
}
int32_t q35_image_embeds_tokens(const q35_image_embeds *im) { return im->n_tokens; }
uint64_t q35_image_embeds_hash(const q35_image_embeds *im) { return im->hash; }
int32_t q35_engine_image_token(const q35_engine *e) { return e->cfg.vision.present ? e->cfg.image_token_id : -1; }
int32_t q35_session_rope_delta(const q35_session *s) { return s->rope_delta; }

/* FNV-1a over bytes, continuing from h */
static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static q35_status check_vision(const q35_engine *e, q35_error *err) {
    if (!e->cfg.vision.present || !e->w.vision.present)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "the model has no vision tower (no vision_config or no model.visual.* "
                        "weights): it takes no images");
    if (e->cfg.image_token_id < 0)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "the model's config.json has no image_token_id inside its vocabulary");
    return Q35_OK;
}

q35_status q35_engine_encode_images(q35_engine *e, const q35_image_pixels *px, int32_t n, q35_image_embeds **out,
                                    q35_error *err) {
    if (n <= 0 || !px || !out) return q35_fail(err, Q35_ERR_ARG, "no images to encode");
    for (int32_t i = 0; i < n; i++) out[i] = NULL;
    q35_status st = check_vision(e, err);
    if (st) return st;
    const q35_vision_config *vc = &e->cfg.vision;
    const int64_t pd = (int64_t)vc->in_channels * vc->temporal_patch_size * vc->patch_size * vc->patch_size;
    const int32_t m = vc->merge_size, H = e->cfg.hidden_size;
    int32_t(*grid)[3] = calloc((size_t)n, sizeof *grid);
    if (!grid) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    int64_t rows = 0, toks = 0;
    for (int32_t i = 0; i < n && !st; i++) {
        const q35_image_pixels *p = &px[i];
        const int32_t *g = p->grid_thw;
        if (p->patch_dim != pd)
            st = q35_fail(err, Q35_ERR_ARG, "image %d: patch_dim %lld is not the vision tower's %lld (C %d x temporal "
                          "patch %d x patch %d^2)", i, (long long)p->patch_dim, (long long)pd, vc->in_channels,
                          vc->temporal_patch_size, vc->patch_size);
        else if (g[0] < 1 || g[1] < m || g[2] < m || g[1] % m || g[2] % m || g[1] > 4096 || g[2] > 4096 || g[0] > 64 ||
                 (int64_t)g[0] * g[1] * g[2] != p->n_patches || !p->pixel_values)
            st = q35_fail(err, Q35_ERR_ARG, "image %d: grid (%d, %d, %d) with %lld patches is not a grid of whole "
                          "%dx%d merge blocks", i, g[0], g[1], g[2], (long long)p->n_patches, m, m);
        else {
            memcpy(grid[i], g, sizeof grid[i]);
            rows += p->n_patches;
            toks += p->n_patches / ((int64_t)m * m);
        }
    }
    if (!st && toks > (int64_t)e->cfg.max_position_embeddings)
        st = q35_fail(err, Q35_ERR_CONTEXT, "%lld image tokens are more than the model's %d positions", (long long)toks,
                      e->cfg.max_position_embeddings);
    float *pv = NULL, *emb = NULL;
    if (!st) {
        pv = n == 1 ? px[0].pixel_values : malloc(sizeof(float) * (size_t)(rows * pd));
        emb = malloc(sizeof(float) * (size_t)(toks * H));
        if (!pv || !emb) st = q35_fail(err, Q35_ERR_NOMEM, "out of memory for %lld image patches", (long long)rows);
    }
    if (!st && n > 1)
        for (int64_t i = 0, r = 0; i < n; r += px[i].n_patches, i++)
            memcpy(pv + r * pd, px[i].pixel_values, sizeof(float) * (size_t)(px[i].n_patches * pd));
    q35_backend *b = e->backend;
    if (!st) st = b->ops->encode_images ? b->ops->encode_images(b, pv, n, (const int32_t(*)[3])grid, emb, err)
                                        : q35_fail(err, Q35_ERR_UNSUPPORTED, "the %s backend does not support image input",
                                                   b->ops->name);
    int64_t t0 = 0;
    for (int32_t i = 0; i < n && !st; i++) {
        q35_image_embeds *im = calloc(1, sizeof *im);
        int32_t k = (int32_t)(px[i].n_patches / ((int64_t)m * m));
        if (im) im->rows = malloc(sizeof(float) * (size_t)k * H);
        if (!im || !im->rows) {
            q35_image_embeds_free(im);
            st = q35_fail(err, Q35_ERR_NOMEM, "out of memory");
            break;
        }
        im->engine = e;
        memcpy(im->grid_thw, grid[i], sizeof im->grid_thw);
        im->n_tokens = k;
        im->width = H;
        memcpy(im->rows, emb + t0 * H, sizeof(float) * (size_t)k * H);
        im->hash = fnv1a(fnv1a(0xcbf29ce484222325ull, grid[i], sizeof grid[i]), px[i].pixel_values,
                         sizeof(float) * (size_t)(px[i].n_patches * pd));
        t0 += k;
        out[i] = im;
    }
    if (st)
        for (int32_t i = 0; i < n; i++) q35_image_embeds_free(out[i]), out[i] = NULL;
    if (n > 1) free(pv);
    free(emb);
    free(grid);
    return st;
}

q35_status q35_engine_expand_images(const q35_engine *e, const int32_t *ids, int32_t n, q35_image_embeds *const *images,
                                    int32_t n_images, int32_t **out, int32_t *n_out, q35_error *err) {
    *out = NULL;
    *n_out = 0;
    if (n < 0 || (n && !ids) || n_images < 0 || (n_images && !images))
        return q35_fail(err, Q35_ERR_ARG, "expand_images: bad arguments");
    const int32_t pad = e->cfg.image_token_id;
    int32_t n_pad = 0;
    for (int32_t i = 0; i < n; i++) n_pad += pad >= 0 && ids[i] == pad;
    if (n_images && check_vision(e, err)) return err ? err->status : Q35_ERR_UNSUPPORTED;
    if (n_pad != n_images)
        return q35_fail(err, Q35_ERR_ARG, "the prompt has %d <|image_pad|> tokens but %d images were given", n_pad,
                        n_images);
    int64_t total = n - n_pad;
    for (int32_t k = 0; k < n_images; k++) {
        if (!images[k] || images[k]->engine != e) return q35_fail(err, Q35_ERR_ARG, "image %d was encoded by another engine", k);
        total += images[k]->n_tokens;
    }
    if (total > e->cfg.max_position_embeddings)
        return q35_fail(err, Q35_ERR_CONTEXT, "the prompt with its images is %lld tokens, more than the model's %d "
                        "positions", (long long)total, e->cfg.max_position_embeddings);
    int32_t *o = malloc(sizeof(int32_t) * (size_t)(total ? total : 1));
    if (!o) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    int32_t j = 0, k = 0;
    for (int32_t i = 0; i < n; i++) {
        if (pad >= 0 && ids[i] == pad)
            for (int32_t r = images[k++]->n_tokens; r > 0; r--) o[j++] = pad;
        else
            o[j++] = ids[i];
    }
    *out = o;
    *n_out = j;
    return Q35_OK;
}

/* The rows' positions (pos3, 3 per row), input embeddings (embed, NULL for
 * a text row) and history ids; *p_end: the next text position. Checks that
 * the runs of image_pad match the images. */
static q35_status lay_out(const q35_engine *e, int32_t p, const int32_t *ids, int32_t n, q35_image_embeds *const *images,
                          int32_t n_images, int32_t *pos3, const float **embed, int32_t *hist, int32_t *p_end,
                          q35_error *err) {
    const int32_t pad = e->cfg.image_token_id, m = e->cfg.vision.merge_size;
    int32_t k = 0;
    for (int32_t i = 0; i < n;) {
        if (ids[i] != pad) {
            if (pos3) pos3[3 * i] = pos3[3 * i + 1] = pos3[3 * i + 2] = p;
            if (embed) embed[i] = NULL;
            p++;
            hist[i] = ids[i];
            i++;
            continue;
        }
        int32_t run = 0;
        while (i + run < n && ids[i + run] == pad) run++;
        if (k == n_images)
            return q35_fail(err, Q35_ERR_ARG, "the prompt has more image_pad runs than the %d images given", n_images);
        const q35_image_embeds *im = images[k];
        if (!im || im->engine != e) return q35_fail(err, Q35_ERR_ARG, "image %d was encoded by another engine", k);
        if (run != im->n_tokens)
            return q35_fail(err, Q35_ERR_ARG, "image %d: the prompt holds %d image_pad tokens for it but the image has "
                            "%d (expand the prompt with q35_engine_expand_images)", k, run, im->n_tokens);
        const int32_t gt = im->grid_thw[0], gh = im->grid_thw[1] / m, gw = im->grid_thw[2] / m;
        const int32_t tag = -1 - (int32_t)(im->hash & 0x3fffffff);
        int32_t r = 0;
        for (int32_t ti = 0; ti < gt; ti++)
            for (int32_t hi = 0; hi < gh; hi++)
                for (int32_t wi = 0; wi < gw; wi++, r++) {
                    if (pos3) {
                        int32_t *q = pos3 + (size_t)3 * (i + r);
                        q[0] = p + ti, q[1] = p + hi, q[2] = p + wi;
                    }
                    if (embed) embed[i + r] = im->rows + (size_t)r * im->width;
                    hist[i + r] = tag;
                }
        p += gh > gw ? gh : gw;
        i += run;
        k++;
    }
    if (k != n_images)
        return q35_fail(err, Q35_ERR_ARG, "the prompt has image_pad runs for %d of the %d images given", k, n_images);
    *p_end = p;
    return Q35_OK;
}

q35_status q35_session_eval_images(q35_session *s, const int32_t *ids, int32_t n, q35_image_embeds *const *images,
                                   int32_t n_images, float *logits, int flags, q35_error *err) {
    q35_engine *e = s->engine;
    const q35_config *c = &e->cfg;
    if (n <= 0 || !ids) return q35_fail(err, Q35_ERR_ARG, "no tokens to evaluate");
    if (flags & Q35_EVAL_REWINDABLE) return q35_fail(err, Q35_ERR_ARG, "an eval with images cannot be rewindable");
    if (n_images < 0 || (n_images && !images)) return q35_fail(err, Q35_ERR_ARG, "bad image list");
    q35_status st = n_images ? check_vision(e, err) : Q35_OK;
    if (st) return st;
    if (n > s->n_ctx - s->pos)
        return q35_fail(err, Q35_ERR_CONTEXT, "%d tokens (images included) do not fit: position %d of a %d-token context",
                        n, s->pos, s->n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return q35_fail(err, Q35_ERR_ARG, "token id %d at index %d is outside the vocabulary [0, %d)", ids[i], i,
                            c->vocab_size);
    int32_t *pos3 = malloc(sizeof(int32_t) * 3 * (size_t)n), *hist = malloc(sizeof(int32_t) * (size_t)n);
    const float **embed = malloc(sizeof(float *) * (size_t)n);
    int32_t p_end = 0;
    if (!pos3 || !hist || !embed) st = q35_fail(err, Q35_ERR_NOMEM, "out of memory for a %d-token prompt", n);
    if (!st) st = lay_out(e, s->pos + s->rope_delta, ids, n, images, n_images, pos3, embed, hist, &p_end, err);
    if (!st) {
        st = q35_eval_rows(s, ids, n, logits, flags, pos3, (const float *const *)embed, hist, err);
        if (!st) s->rope_delta = p_end - s->pos;
        else q35_session_reset(s); /* the pass itself failed (a device fault) */
    }
    free(pos3), free(hist), free(embed);
    return st;
}

q35_status q35_engine_tag_images(const q35_engine *e, const int32_t *ids, int32_t n, q35_image_embeds *const *images,
                                 int32_t n_images, int32_t *out, q35_error *err) {
    if (n <= 0 || !ids || !out || n_images < 0 || (n_images && !images))
        return q35_fail(err, Q35_ERR_ARG, "tag_images: bad arguments");
    q35_status st = n_images ? check_vision(e, err) : Q35_OK;
    int32_t p_end = 0;
    return st ? st : lay_out(e, 0, ids, n, images, n_images, NULL, NULL, out, &p_end, err);
}

/* Is a[0..m) a proper, non-empty prefix of b[0..n)? */
static int proper_prefix(const int32_t *a, int32_t m, const int32_t *b, int32_t n) {
    return a && m > 0 && m < n && !memcmp(a, b, sizeof(int32_t) * (size_t)m);
}

q35_status q35_session_sync_images(q35_session *s, const int32_t *ids, int32_t n, q35_image_embeds *const *images,
                                   int32_t n_images, const q35_snapshot *snap, float *logits, int32_t *n_reused,
                                   q35_error *err) {
    if (n_reused) *n_reused = 0;
    if (n <= 0 || !ids) return q35_fail(err, Q35_ERR_ARG, "no prompt tokens to evaluate");
    if (n > s->n_ctx)
        return q35_fail(err, Q35_ERR_CONTEXT, "a prompt of %d tokens (images included) does not fit a %d-token context", n,
                        s->n_ctx);
    int32_t *tagged = malloc(sizeof(int32_t) * (size_t)n);
    if (!tagged) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    q35_status st = q35_engine_tag_images(s->engine, ids, n, images, n_images, tagged, err);
    int32_t n_own = 0, n_snap = 0, keep = 0;
    const int32_t *own = q35_session_tokens(s, &n_own), *snap_ids = snap ? q35_snapshot_tokens(snap, &n_snap) : NULL;
    int use_own = !st && proper_prefix(own, n_own, tagged, n);
    int use_snap = !st && proper_prefix(snap_ids, n_snap, tagged, n) && (!use_own || n_snap > n_own);
    keep = use_snap ? n_snap : use_own ? n_own : 0;
    if (keep && tagged[keep] < 0 && tagged[keep - 1] == tagged[keep]) keep = 0, use_snap = 0; /* inside an image */
    if (!st && use_snap) st = q35_snapshot_restore(s, snap, err);
    else if (!st && !keep) q35_session_reset(s);
    /* the images whose rows are all before keep are in the state already */
    int32_t k_done = 0;
    for (int32_t i = 0; !st && i < keep; i++)
        if (tagged[i] < 0 && (i == 0 || tagged[i - 1] != tagged[i])) k_done++;
    if (!st) st = q35_session_eval_images(s, ids + keep, n - keep, images + k_done, n_images - k_done, logits, 0, err);
    if (!st && n_reused) *n_reused = keep;
    free(tagged);
    return st;
}
