/* tensors.c: the Qwen3.5 tensor table (tensors.h) and its walk. */
#include "model/tensors.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* Dimensions, by the names of model.h. */
enum {
    Q35_DIM_1, Q35_DIM_H, Q35_DIM_2H, Q35_DIM_I, Q35_DIM_V, Q35_DIM_HD,
    Q35_DIM_QG,   /* NH * HD * 2: queries and their gates */
    Q35_DIM_NHHD, /* NH * HD */
    Q35_DIM_KV,   /* NKV * HD */
    Q35_DIM_CD, Q35_DIM_HVDV, Q35_DIM_HV, Q35_DIM_DV, Q35_DIM_CK,
    /* the vision tower (model.h's q35_vision_config) */
    Q35_DIM_VH, Q35_DIM_3VH, Q35_DIM_VI, Q35_DIM_VM, Q35_DIM_VO, Q35_DIM_NPOS, Q35_DIM_C, Q35_DIM_TP, Q35_DIM_PS,
};

static int64_t dim_value(const q35_config *c, int d) {
    switch (d) {
    case Q35_DIM_H: return c->hidden_size;
    case Q35_DIM_2H: return 2 * (int64_t)c->hidden_size;
    case Q35_DIM_I: return c->intermediate_size;
    case Q35_DIM_V: return c->vocab_size;
    case Q35_DIM_HD: return c->head_dim;
    case Q35_DIM_QG: return (int64_t)c->n_head * c->head_dim * 2;
    case Q35_DIM_NHHD: return (int64_t)c->n_head * c->head_dim;
    case Q35_DIM_KV: return (int64_t)c->n_head_kv * c->head_dim;
    case Q35_DIM_CD: return q35_conv_dim(c);
    case Q35_DIM_HVDV: return (int64_t)c->lin_n_head_v * c->lin_head_v_dim;
    case Q35_DIM_HV: return c->lin_n_head_v;
    case Q35_DIM_DV: return c->lin_head_v_dim;
    case Q35_DIM_CK: return c->lin_conv_kernel;
    case Q35_DIM_VH: return c->vision.hidden_size;
    case Q35_DIM_3VH: return 3 * (int64_t)c->vision.hidden_size;
    case Q35_DIM_VI: return c->vision.intermediate_size;
    case Q35_DIM_VM: return (int64_t)c->vision.hidden_size * c->vision.merge_size * c->vision.merge_size;
    case Q35_DIM_VO: return c->vision.out_hidden_size;
    case Q35_DIM_NPOS: return c->vision.num_position_embeddings;
    case Q35_DIM_C: return c->vision.in_channels;
    case Q35_DIM_TP: return c->vision.temporal_patch_size;
    case Q35_DIM_PS: return c->vision.patch_size;
    default: return 1;
    }
}

#define W_(f) offsetof(q35_weights, f)
#define L_(f) offsetof(q35_layer_weights, f)
#define M_(f) offsetof(q35_mtp_weights, f)
#define V_(f) offsetof(q35_vision_weights, f)
#define B_(f) offsetof(q35_vision_block, f)
#define MAT(name, part, role, d0, d1, slot) {name, part, role, 1, 0, 2, {Q35_DIM_##d0, Q35_DIM_##d1}, Q35_DT_BF16, slot}
#define VEC(name, part, d0, dt, slot) {name, part, Q35_ROLE_OTHER, 0, 0, 1, {Q35_DIM_##d0}, Q35_DT_##dt, slot}
/* the vision tower's nn.Linear (weight and bias) and nn.LayerNorm (weight and bias, width VH) */
#define LINEAR(name, part, d0, d1, wslot, bslot) \
    MAT(name ".weight", part, Q35_ROLE_OTHER, d0, d1, wslot), VEC(name ".bias", part, d0, BF16, bslot)
#define LNORM(name, part, wslot, bslot) VEC(name ".weight", part, VH, BF16, wslot), VEC(name ".bias", part, VH, BF16, bslot)

/* Within each part, in binding order. */
const q35_tensor_def q35_tensor_defs[] = {
    MAT("model.language_model.embed_tokens.weight", Q35_PART_MODEL, Q35_ROLE_EMBED, V, H, W_(embed)),
    VEC("model.language_model.norm.weight", Q35_PART_MODEL, H, BF16, W_(final_norm)),
    {"lm_head.weight", Q35_PART_MODEL, Q35_ROLE_HEAD, 1, 1, 2, {Q35_DIM_V, Q35_DIM_H}, Q35_DT_BF16, W_(lm_head)},

    VEC("input_layernorm.weight", Q35_PART_LAYER, H, BF16, L_(input_norm)),
    VEC("post_attention_layernorm.weight", Q35_PART_LAYER, H, BF16, L_(post_norm)),
    MAT("mlp.gate_proj.weight", Q35_PART_LAYER, Q35_ROLE_PROJECTION, I, H, L_(gate_proj)),
    MAT("mlp.up_proj.weight", Q35_PART_LAYER, Q35_ROLE_PROJECTION, I, H, L_(up_proj)),
    MAT("mlp.down_proj.weight", Q35_PART_LAYER, Q35_ROLE_PROJECTION, H, I, L_(down_proj)),

    MAT("self_attn.q_proj.weight", Q35_PART_ATTN, Q35_ROLE_PROJECTION, QG, H, L_(q_proj)),
    MAT("self_attn.k_proj.weight", Q35_PART_ATTN, Q35_ROLE_PROJECTION, KV, H, L_(k_proj)),
    MAT("self_attn.v_proj.weight", Q35_PART_ATTN, Q35_ROLE_PROJECTION, KV, H, L_(v_proj)),
    MAT("self_attn.o_proj.weight", Q35_PART_ATTN, Q35_ROLE_PROJECTION, H, NHHD, L_(o_proj)),
    VEC("self_attn.q_norm.weight", Q35_PART_ATTN, HD, BF16, L_(q_norm)),
    VEC("self_attn.k_norm.weight", Q35_PART_ATTN, HD, BF16, L_(k_norm)),

    MAT("linear_attn.in_proj_qkv.weight", Q35_PART_GDN, Q35_ROLE_PROJECTION, CD, H, L_(in_proj_qkv)),
    MAT("linear_attn.in_proj_z.weight", Q35_PART_GDN, Q35_ROLE_PROJECTION, HVDV, H, L_(in_proj_z)),
    MAT("linear_attn.in_proj_b.weight", Q35_PART_GDN, Q35_ROLE_OTHER, HV, H, L_(in_proj_b)),
    MAT("linear_attn.in_proj_a.weight", Q35_PART_GDN, Q35_ROLE_OTHER, HV, H, L_(in_proj_a)),
    {"linear_attn.conv1d.weight", Q35_PART_GDN, Q35_ROLE_OTHER, 0, 0, 3, {Q35_DIM_CD, Q35_DIM_1, Q35_DIM_CK, 0, 0},
     Q35_DT_BF16, L_(conv1d)},
    VEC("linear_attn.A_log", Q35_PART_GDN, HV, F32, L_(A_log)),
    VEC("linear_attn.dt_bias", Q35_PART_GDN, HV, BF16, L_(dt_bias)),
    VEC("linear_attn.norm.weight", Q35_PART_GDN, DV, F32, L_(gdn_norm)),
    MAT("linear_attn.out_proj.weight", Q35_PART_GDN, Q35_ROLE_PROJECTION, H, HVDV, L_(out_proj)),

    VEC("mtp.pre_fc_norm_embedding.weight", Q35_PART_MTP, H, BF16, M_(pre_fc_norm_embedding)),
    VEC("mtp.pre_fc_norm_hidden.weight", Q35_PART_MTP, H, BF16, M_(pre_fc_norm_hidden)),
    MAT("mtp.fc.weight", Q35_PART_MTP, Q35_ROLE_PROJECTION, H, 2H, M_(fc)),
    VEC("mtp.norm.weight", Q35_PART_MTP, H, BF16, M_(norm)),

    /* The Conv3d of the patch embedding is a matrix over flattened patches (c, t, y, x). */
    {"model.visual.patch_embed.proj.weight", Q35_PART_VISION, Q35_ROLE_OTHER, 1, 0, 5,
     {Q35_DIM_VH, Q35_DIM_C, Q35_DIM_TP, Q35_DIM_PS, Q35_DIM_PS}, Q35_DT_BF16, V_(patch_w)},
    VEC("model.visual.patch_embed.proj.bias", Q35_PART_VISION, VH, BF16, V_(patch_b)),
    {"model.visual.pos_embed.weight", Q35_PART_VISION, Q35_ROLE_OTHER, 0, 0, 2, {Q35_DIM_NPOS, Q35_DIM_VH},
     Q35_DT_BF16, V_(pos_embed)},
    LNORM("model.visual.merger.norm", Q35_PART_VISION, V_(merger_norm_w), V_(merger_norm_b)),
    LINEAR("model.visual.merger.linear_fc1", Q35_PART_VISION, VM, VM, V_(merger_fc1_w), V_(merger_fc1_b)),
    LINEAR("model.visual.merger.linear_fc2", Q35_PART_VISION, VO, VM, V_(merger_fc2_w), V_(merger_fc2_b)),

    LNORM("norm1", Q35_PART_VBLOCK, B_(norm1_w), B_(norm1_b)),
    LINEAR("attn.qkv", Q35_PART_VBLOCK, 3VH, VH, B_(qkv_w), B_(qkv_b)),
    LINEAR("attn.proj", Q35_PART_VBLOCK, VH, VH, B_(proj_w), B_(proj_b)),
    LNORM("norm2", Q35_PART_VBLOCK, B_(norm2_w), B_(norm2_b)),
    LINEAR("mlp.linear_fc1", Q35_PART_VBLOCK, VI, VH, B_(fc1_w), B_(fc1_b)),
    LINEAR("mlp.linear_fc2", Q35_PART_VBLOCK, VH, VI, B_(fc2_w), B_(fc2_b)),
};
const int q35_n_tensor_defs = (int)(sizeof q35_tensor_defs / sizeof q35_tensor_defs[0]);

/* Calls fn for every def of `part`, named prefix + name, slots in base. */
static q35_status each_of_part(const q35_config *c, int part, const char *prefix, void *base, q35_model_tensor_fn fn,
                               void *ctx, q35_error *err) {
    for (int i = 0; i < q35_n_tensor_defs; i++) {
        const q35_tensor_def *d = &q35_tensor_defs[i];
        if (d->part != part || (d->untied && c->tie_word_embeddings)) continue;
        q35_model_tensor t = {.def = d, .ndim = d->ndim};
        snprintf(t.name, sizeof t.name, "%s%s", prefix, d->name);
        for (int k = 0; k < d->ndim; k++) t.shape[k] = dim_value(c, d->dims[k]);
        t.slot = base ? (q35_tensor *)((char *)base + d->slot) : NULL;
        q35_status st = fn(ctx, &t, err);
        if (st) return st;
    }
    return Q35_OK;
}

/* A decoder layer: the parts every layer has, then its mixer's. */
static q35_status each_of_layer(const q35_config *c, int full, const char *prefix, q35_layer_weights *l,
                                q35_model_tensor_fn fn, void *ctx, q35_error *err) {
    q35_status st = each_of_part(c, Q35_PART_LAYER, prefix, l, fn, ctx, err);
    return st ? st : each_of_part(c, full ? Q35_PART_ATTN : Q35_PART_GDN, prefix, l, fn, ctx, err);
}

q35_status q35_model_tensors_each(const q35_config *c, unsigned which, q35_weights *w, q35_model_tensor_fn fn,
                                  void *ctx, q35_error *err) {
    q35_status st = Q35_OK;
    if (which & Q35_TENSORS_TEXT) {
        st = each_of_part(c, Q35_PART_MODEL, "", w, fn, ctx, err);
        for (int32_t i = 0; !st && i < c->n_layer; i++) {
            char p[64];
            snprintf(p, sizeof p, "model.language_model.layers.%d.", i);
            st = each_of_layer(c, c->layer_is_full[i], p, w ? &w->layers[i] : NULL, fn, ctx, err);
        }
    }
    if (!st && (which & Q35_TENSORS_MTP)) {
        st = each_of_part(c, Q35_PART_MTP, "", w ? &w->mtp : NULL, fn, ctx, err);
        if (!st) st = each_of_layer(c, 1, "mtp.layers.0.", w ? &w->mtp.layer : NULL, fn, ctx, err);
    }
    if (!st && (which & Q35_TENSORS_VISION)) {
        if (!c->vision.present) return q35_fail(err, Q35_ERR_ARG, "the config has no vision tower");
        st = each_of_part(c, Q35_PART_VISION, "", w ? &w->vision : NULL, fn, ctx, err);
        for (int32_t i = 0; !st && i < c->vision.depth; i++) {
            char p[64];
            snprintf(p, sizeof p, "model.visual.blocks.%d.", i);
            st = each_of_part(c, Q35_PART_VBLOCK, p, w ? &w->vision.blocks[i] : NULL, fn, ctx, err);
        }
    }
    return st;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* The tensors held once match by their whole name, a layer tensor by its
 * ending, whatever the prefix. */
q35_tensor_role q35_tensor_role_of(const char *name) {
    for (int i = 0; i < q35_n_tensor_defs; i++) {
        const q35_tensor_def *d = &q35_tensor_defs[i];
        int once = d->part == Q35_PART_MODEL || d->part == Q35_PART_MTP || d->part == Q35_PART_VISION;
        if (d->part == Q35_PART_VBLOCK && strncmp(name, "model.visual.blocks.", 20)) continue;
        if (once ? !strcmp(name, d->name) : ends_with(name, d->name)) return (q35_tensor_role)d->role;
    }
    return Q35_ROLE_OTHER;
}
