/* weights.c: bind the tensors of a checkpoint or weight cache to the model's
 * weight slots.
 *
 * Every tensor the forward pass reads (the table of tensors.c) is looked up
 * by its name and checked for shape and dtype here, once, so that
 * the token loop never meets a surprise. mtp.* is bound when present, and
 * so is model.visual.* when the config has a vision_config (all of it, or
 * none: a source without the tower, such as a cache made before prepare
 * stored it, leaves it unbound). */
#include "model/tensors.h"
#include "formats/safetensors.h"

#include <stdio.h>

static void shape_str(char *buf, size_t n, const int64_t *shape, int nd) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < nd && o < n; i++) o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Vectors (norms, gates, conv taps) are read element by element and stay
 * in an element format; matrices go through the kernels, which also take
 * the block formats of a weight cache. */
static q35_status bind(void *ctx, const q35_model_tensor *t, q35_error *err) {
    const q35_checkpoint *src = ctx;
    const char *name = t->name;
    const q35_st_entry *e = q35_checkpoint_find(src, name);
    if (!e) return q35_fail(err, Q35_ERR_FORMAT, "%s: missing tensor '%s'", src->dir, name);
    if (!e->supported || (!t->def->matrix && q35_dtype_is_block(e->tensor.dtype)))
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, which is not supported here", e->file,
                        name, e->dtype_name);
    int ok = e->tensor.ndim == t->ndim;
    for (int i = 0; ok && i < t->ndim; i++) ok = e->tensor.shape[i] == t->shape[i];
    if (!ok) {
        char want[96], got[96];
        shape_str(want, sizeof want, t->shape, t->ndim);
        shape_str(got, sizeof got, e->tensor.shape, e->tensor.ndim);
        return q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", e->file, name, got, want);
    }
    *t->slot = e->tensor;
    return Q35_OK;
}

q35_status q35_weights_bind(const q35_checkpoint *src, const q35_config *c, q35_weights *w, q35_error *err) {
    memset(w, 0, sizeof *w);
    q35_status st = q35_model_tensors_each(c, Q35_TENSORS_TEXT, w, bind, (void *)src, err);
    if (st) return st;
    if (c->tie_word_embeddings) w->lm_head = w->embed;
    /* The MTP head is optional; when the source has any mtp.* tensor it must be complete. */
    if (q35_checkpoint_find(src, "mtp.fc.weight") || q35_checkpoint_find(src, "mtp.norm.weight")) {
        if ((st = q35_model_tensors_each(c, Q35_TENSORS_MTP, w, bind, (void *)src, err))) return st;
        w->mtp.present = 1;
    }
    if (c->vision.present && q35_checkpoint_find(src, "model.visual.patch_embed.proj.weight"))
        return q35_vision_weights_bind(src, c, w, err);
    return Q35_OK;
}

q35_status q35_vision_weights_bind(const q35_checkpoint *src, const q35_config *c, q35_weights *w, q35_error *err) {
    memset(&w->vision, 0, sizeof w->vision);
    q35_status st = q35_model_tensors_each(c, Q35_TENSORS_VISION, w, bind, (void *)src, err);
    if (st) {
        memset(&w->vision, 0, sizeof w->vision);
        return st;
    }
    w->vision.present = 1;
    return Q35_OK;
}
