/* weights.c: bind checkpoint tensors to the model's weight slots.
 *
 * Every tensor the forward pass reads is looked up by its checkpoint name and
 * checked for shape and dtype here, once, so that the token loop never meets
 * a surprise. model.visual.* is ignored; mtp.* is bound when present. */
#include "model/model.h"
#include "formats/safetensors.h"

#include <stdio.h>

/* Vectors (norms, gates, conv taps) are read element by element and stay
 * in a float format; matrices go through the kernels, which also take the
 * block formats of a weight cache. */
enum {
    ANY_FLOAT = (1 << Q35_DT_F32) | (1 << Q35_DT_F16) | (1 << Q35_DT_BF16),
    ANY_MATRIX = ANY_FLOAT | (1 << Q35_DT_BFP8) | (1 << Q35_DT_BFP4),
};

static void shape_str(char *buf, size_t n, const int64_t *shape, int nd) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < nd && o < n; i++) o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static q35_status bind(const q35_checkpoint *ck, const char *name, int nd, const int64_t *shape, unsigned dtypes,
                       q35_tensor *out, q35_error *err) {
    const q35_st_entry *e = q35_checkpoint_find(ck, name);
    if (!e) return q35_fail(err, Q35_ERR_FORMAT, "%s: missing tensor '%s'", ck->dir, name);
    if (!e->supported || !(dtypes & (1u << e->tensor.dtype)))
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, which is not supported here", e->file,
                        name, e->dtype_name);
    int ok = e->tensor.ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = e->tensor.shape[i] == shape[i];
    if (!ok) {
        char want[96], got[96];
        shape_str(want, sizeof want, shape, nd);
        shape_str(got, sizeof got, e->tensor.shape, e->tensor.ndim);
        return q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", e->file, name, got, want);
    }
    *out = e->tensor;
    return Q35_OK;
}

#define BIND1(name, d0, slot) \
    do { int64_t s_[1] = {d0}; if ((st = bind(ck, name, 1, s_, ANY_FLOAT, slot, err))) return st; } while (0)
#define BIND2(name, d0, d1, slot) \
    do { int64_t s_[2] = {d0, d1}; if ((st = bind(ck, name, 2, s_, ANY_MATRIX, slot, err))) return st; } while (0)

static q35_status bind_attention(const q35_checkpoint *ck, const q35_config *c, const char *p, q35_layer_weights *l,
                                 q35_error *err) {
    q35_status st;
    char n[256];
    int64_t H = c->hidden_size, HD = c->head_dim;
    snprintf(n, sizeof n, "%sself_attn.q_proj.weight", p); BIND2(n, c->n_head * HD * 2, H, &l->q_proj);
    snprintf(n, sizeof n, "%sself_attn.k_proj.weight", p); BIND2(n, c->n_head_kv * HD, H, &l->k_proj);
    snprintf(n, sizeof n, "%sself_attn.v_proj.weight", p); BIND2(n, c->n_head_kv * HD, H, &l->v_proj);
    snprintf(n, sizeof n, "%sself_attn.o_proj.weight", p); BIND2(n, H, c->n_head * HD, &l->o_proj);
    snprintf(n, sizeof n, "%sself_attn.q_norm.weight", p); BIND1(n, HD, &l->q_norm);
    snprintf(n, sizeof n, "%sself_attn.k_norm.weight", p); BIND1(n, HD, &l->k_norm);
    return Q35_OK;
}

static q35_status bind_common(const q35_checkpoint *ck, const q35_config *c, const char *p, q35_layer_weights *l,
                              q35_error *err) {
    q35_status st;
    char n[256];
    int64_t H = c->hidden_size, I = c->intermediate_size;
    snprintf(n, sizeof n, "%sinput_layernorm.weight", p); BIND1(n, H, &l->input_norm);
    snprintf(n, sizeof n, "%spost_attention_layernorm.weight", p); BIND1(n, H, &l->post_norm);
    snprintf(n, sizeof n, "%smlp.gate_proj.weight", p); BIND2(n, I, H, &l->gate_proj);
    snprintf(n, sizeof n, "%smlp.up_proj.weight", p); BIND2(n, I, H, &l->up_proj);
    snprintf(n, sizeof n, "%smlp.down_proj.weight", p); BIND2(n, H, I, &l->down_proj);
    return Q35_OK;
}

static q35_status bind_gdn(const q35_checkpoint *ck, const q35_config *c, const char *p, q35_layer_weights *l,
                           q35_error *err) {
    q35_status st;
    char n[256];
    int64_t H = c->hidden_size, HV = c->lin_n_head_v, DV = c->lin_head_v_dim, CD = q35_conv_dim(c);
    snprintf(n, sizeof n, "%slinear_attn.in_proj_qkv.weight", p); BIND2(n, CD, H, &l->in_proj_qkv);
    snprintf(n, sizeof n, "%slinear_attn.in_proj_z.weight", p); BIND2(n, HV * DV, H, &l->in_proj_z);
    snprintf(n, sizeof n, "%slinear_attn.in_proj_b.weight", p); BIND2(n, HV, H, &l->in_proj_b);
    snprintf(n, sizeof n, "%slinear_attn.in_proj_a.weight", p); BIND2(n, HV, H, &l->in_proj_a);
    snprintf(n, sizeof n, "%slinear_attn.conv1d.weight", p);
    {
        int64_t s[3] = {CD, 1, c->lin_conv_kernel};
        if ((st = bind(ck, n, 3, s, ANY_FLOAT, &l->conv1d, err))) return st;
    }
    snprintf(n, sizeof n, "%slinear_attn.A_log", p); BIND1(n, HV, &l->A_log);
    snprintf(n, sizeof n, "%slinear_attn.dt_bias", p); BIND1(n, HV, &l->dt_bias);
    snprintf(n, sizeof n, "%slinear_attn.norm.weight", p); BIND1(n, DV, &l->gdn_norm);
    snprintf(n, sizeof n, "%slinear_attn.out_proj.weight", p); BIND2(n, H, HV * DV, &l->out_proj);
    return Q35_OK;
}

q35_status q35_weights_bind(const q35_checkpoint *ck, const q35_config *c, q35_weights *w, q35_error *err) {
    q35_status st;
    memset(w, 0, sizeof *w);
    int64_t H = c->hidden_size, V = c->vocab_size;
    BIND2("model.language_model.embed_tokens.weight", V, H, &w->embed);
    BIND1("model.language_model.norm.weight", H, &w->final_norm);
    if (c->tie_word_embeddings) {
        w->lm_head = w->embed;
    } else {
        BIND2("lm_head.weight", V, H, &w->lm_head);
    }
    for (int32_t i = 0; i < c->n_layer; i++) {
        char p[64];
        snprintf(p, sizeof p, "model.language_model.layers.%d.", i);
        q35_layer_weights *l = &w->layers[i];
        if ((st = bind_common(ck, c, p, l, err))) return st;
        st = c->layer_is_full[i] ? bind_attention(ck, c, p, l, err) : bind_gdn(ck, c, p, l, err);
        if (st) return st;
    }
    /* The MTP head is optional; when the checkpoint has any mtp.* tensor it must be complete. */
    if (q35_checkpoint_find(ck, "mtp.fc.weight") || q35_checkpoint_find(ck, "mtp.norm.weight")) {
        q35_mtp_weights *m = &w->mtp;
        BIND1("mtp.pre_fc_norm_embedding.weight", H, &m->pre_fc_norm_embedding);
        BIND1("mtp.pre_fc_norm_hidden.weight", H, &m->pre_fc_norm_hidden);
        BIND2("mtp.fc.weight", H, 2 * H, &m->fc);
        BIND1("mtp.norm.weight", H, &m->norm);
        if ((st = bind_common(ck, c, "mtp.layers.0.", &m->layer, err))) return st;
        if ((st = bind_attention(ck, c, "mtp.layers.0.", &m->layer, err))) return st;
        m->present = 1;
    }
    return Q35_OK;
}
