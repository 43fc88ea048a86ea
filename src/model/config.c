/* config.c: read a Qwen3.5 config.json into q35_config.
 *
 * The real checkpoint wraps the language model's fields in "text_config";
 * older or text-only files put them at the top level. Every value the
 * forward pass depends on is read explicitly and checked; nothing is derived
 * that the file states (head_dim is never hidden/heads). */
#include "model/model.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static json_t *lookup(json_t *tc, json_t *top, const char *key) {
    json_t *v = json_object_get(tc, key);
    if (!v && top && top != tc) v = json_object_get(top, key);
    return v;
}

static q35_status get_int(json_t *tc, json_t *top, const char *key, int required, int32_t dflt, int32_t lo, int32_t hi,
                          int32_t *out, const char *label, q35_error *err) {
    json_t *v = lookup(tc, top, key);
    if (!v || json_is_null(v)) {
        if (required) return q35_fail(err, Q35_ERR_FORMAT, "%s: missing '%s'", label, key);
        *out = dflt;
        return Q35_OK;
    }
    if (!json_is_integer(v)) return q35_fail(err, Q35_ERR_FORMAT, "%s: '%s' must be an integer", label, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: '%s' = %lld is outside the supported range [%d, %d]", label, key,
                        (long long)x, lo, hi);
    *out = (int32_t)x;
    return Q35_OK;
}

static q35_status get_num(json_t *v, const char *key, float dflt, float *out, const char *label, q35_error *err) {
    if (!v || json_is_null(v)) { *out = dflt; return Q35_OK; }
    if (!json_is_number(v)) return q35_fail(err, Q35_ERR_FORMAT, "%s: '%s' must be a number", label, key);
    *out = (float)json_number_value(v);
    return Q35_OK;
}

static q35_status parse_text_config(json_t *top, json_t *tc, const char *label, q35_config *c, q35_error *err) {
    q35_status st;
    const char *mt = json_string_value(json_object_get(tc, "model_type"));
    if (mt && strcmp(mt, "qwen3_5_text") && strcmp(mt, "qwen3_5"))
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: model_type '%s' is not Qwen3.5 (qwen3_5_text)", label, mt);
#define INT(key, req, dflt, lo, hi, field) \
    if ((st = get_int(tc, NULL, key, req, dflt, lo, hi, &c->field, label, err))) return st
    INT("vocab_size", 1, 0, 1, 1 << 24, vocab_size);
    INT("hidden_size", 1, 0, 1, 1 << 16, hidden_size);
    INT("intermediate_size", 1, 0, 1, 1 << 18, intermediate_size);
    INT("num_hidden_layers", 1, 0, 1, Q35_MAX_LAYERS, n_layer);
    INT("num_attention_heads", 1, 0, 1, 1024, n_head);
    INT("num_key_value_heads", 1, 0, 1, 1024, n_head_kv);
    INT("head_dim", 1, 0, 2, 1024, head_dim);
    INT("linear_num_key_heads", 1, 0, 1, 1024, lin_n_head_k);
    INT("linear_num_value_heads", 1, 0, 1, 1024, lin_n_head_v);
    INT("linear_key_head_dim", 1, 0, 1, 1024, lin_head_k_dim);
    INT("linear_value_head_dim", 1, 0, 1, 1024, lin_head_v_dim);
    INT("linear_conv_kernel_dim", 1, 0, 1, 16, lin_conv_kernel);
    INT("max_position_embeddings", 0, 262144, 1, 1 << 24, max_position_embeddings);
    INT("mtp_num_hidden_layers", 0, 0, 0, 16, mtp_num_hidden_layers);
#undef INT
    if (c->n_head % c->n_head_kv)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                        label, c->n_head, c->n_head_kv);
    if (c->lin_n_head_v % c->lin_n_head_k)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d",
                        label, c->lin_n_head_v, c->lin_n_head_k);

    json_t *eps = json_object_get(tc, "rms_norm_eps");
    if ((st = get_num(eps, "rms_norm_eps", 1e-6f, &c->rms_norm_eps, label, err))) return st;

    /* transformers 5 keeps rope_theta and partial_rotary_factor in rope_parameters;
     * older files put them at text_config level. */
    json_t *rp = json_object_get(tc, "rope_parameters");
    if (!rp) rp = json_object_get(tc, "rope_scaling");
    json_t *theta = json_object_get(tc, "rope_theta");
    if (!theta && json_is_object(rp)) theta = json_object_get(rp, "rope_theta");
    /* transformers' defaults when absent: theta 10000, rotary fraction 0.25 */
    if ((st = get_num(theta, "rope_theta", 10000.0f, &c->rope_theta, label, err))) return st;
    json_t *prf = json_is_object(rp) ? json_object_get(rp, "partial_rotary_factor") : NULL;
    if (!prf) prf = json_object_get(tc, "partial_rotary_factor");
    if ((st = get_num(prf, "partial_rotary_factor", 0.25f, &c->partial_rotary_factor, label, err))) return st;
    c->mrope_section[0] = 11, c->mrope_section[1] = 11, c->mrope_section[2] = 10;
    json_t *ms = json_is_object(rp) ? json_object_get(rp, "mrope_section") : NULL;
    if (ms && !json_is_null(ms)) {
        if (!json_is_array(ms) || json_array_size(ms) != 3)
            return q35_fail(err, Q35_ERR_FORMAT, "%s: rope_parameters.mrope_section must be an array of 3 integers", label);
        for (int i = 0; i < 3; i++) {
            json_t *v = json_array_get(ms, (size_t)i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 4096)
                return q35_fail(err, Q35_ERR_FORMAT, "%s: rope_parameters.mrope_section[%d] must be an integer in [0, 4096]",
                                label, i);
            c->mrope_section[i] = (int32_t)json_integer_value(v);
        }
    }
    if (json_is_object(rp)) {
        const char *rt = json_string_value(json_object_get(rp, "rope_type"));
        if (!rt) rt = json_string_value(json_object_get(rp, "type"));
        if (rt && strcmp(rt, "default") && strcmp(rt, "mrope"))
            return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: rope_type '%s' is not supported (only default)", label, rt);
    }
    if (!(c->rope_theta > 0) || !(c->partial_rotary_factor > 0) || c->partial_rotary_factor > 1)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: rope_theta %g / partial_rotary_factor %g out of range", label,
                        c->rope_theta, c->partial_rotary_factor);
    c->rotary_dim = (int32_t)(c->head_dim * c->partial_rotary_factor); /* int() truncation, as transformers */
    if (c->rotary_dim < 2 || c->rotary_dim % 2)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: rotary dimension %d (head_dim %d x %g) must be even and >= 2", label,
                        c->rotary_dim, c->head_dim, c->partial_rotary_factor);

    const char *act = json_string_value(json_object_get(tc, "hidden_act"));
    if (act && strcmp(act, "silu"))
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (only silu)", label, act);
    if (json_is_true(json_object_get(tc, "attention_bias")))
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: attention_bias = true is not supported", label);
    json_t *gate = json_object_get(tc, "attn_output_gate");
    if (gate && json_is_false(gate))
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: attn_output_gate = false is not supported", label);

    /* Tied if either level says so (the wrapper and text_config agree in real files). */
    json_t *tie = json_object_get(tc, "tie_word_embeddings");
    if (!tie && top) tie = json_object_get(top, "tie_word_embeddings");
    c->tie_word_embeddings = tie ? json_is_true(tie) : 0;

    json_t *eos = json_object_get(tc, "eos_token_id");
    if (!eos && top) eos = json_object_get(top, "eos_token_id");
    if (json_is_array(eos)) eos = json_array_get(eos, 0);
    c->eos_token_id = json_is_integer(eos) ? (int32_t)json_integer_value(eos) : -1;

    json_t *lt = json_object_get(tc, "layer_types");
    c->n_layer_full = 0;
    if (lt) {
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)c->n_layer)
            return q35_fail(err, Q35_ERR_FORMAT, "%s: layer_types must list exactly num_hidden_layers (%d) entries", label,
                            c->n_layer);
        for (int32_t i = 0; i < c->n_layer; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (s && !strcmp(s, "full_attention")) c->layer_is_full[i] = 1;
            else if (s && !strcmp(s, "linear_attention")) c->layer_is_full[i] = 0;
            else return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: layer_types[%d] = '%s' is not supported", label, i, s ? s : "?");
        }
    } else {
        int32_t interval = 4;
        if ((st = get_int(tc, NULL, "full_attention_interval", 0, 4, 1, Q35_MAX_LAYERS, &interval, label, err))) return st;
        for (int32_t i = 0; i < c->n_layer; i++) c->layer_is_full[i] = ((i + 1) % interval) == 0;
    }
    for (int32_t i = 0; i < c->n_layer; i++) c->n_layer_full += c->layer_is_full[i];
    return Q35_OK;
}

q35_status q35_config_parse(const char *text, size_t len, const char *label, q35_config *cfg, q35_error *err) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root) return q35_fail(err, Q35_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", label, jerr.text, jerr.line);
    q35_status st = Q35_OK;
    if (!json_is_object(root)) {
        st = q35_fail(err, Q35_ERR_FORMAT, "%s: not a JSON object", label);
    } else {
        json_t *tc = json_object_get(root, "text_config");
        const char *mt = json_string_value(json_object_get(root, "model_type"));
        if (tc && !json_is_object(tc)) st = q35_fail(err, Q35_ERR_FORMAT, "%s: text_config is not an object", label);
        else if (!tc && mt && strcmp(mt, "qwen3_5_text") && strcmp(mt, "qwen3_5"))
            st = q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: model_type '%s' is not Qwen3.5", label, mt);
        else if (tc && mt && strcmp(mt, "qwen3_5"))
            st = q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: model_type '%s' is not Qwen3.5 (qwen3_5)", label, mt);
        else st = parse_text_config(tc ? root : NULL, tc ? tc : root, label, cfg, err);
        const char *ids[3] = {"image_token_id", "vision_start_token_id", "vision_end_token_id"};
        int32_t *dst[3] = {&cfg->image_token_id, &cfg->vision_start_token_id, &cfg->vision_end_token_id};
        for (int i = 0; i < 3; i++) {
            json_t *v = json_object_get(root, ids[i]);
            *dst[i] = json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < cfg->vocab_size
                          ? (int32_t)json_integer_value(v) : -1;
        }
        json_t *vc = json_object_get(root, "vision_config");
        if (!st && vc && !json_is_null(vc)) st = q35_vision_config_parse(vc, label, &cfg->vision, err);
    }
    json_decref(root);
    return st;
}

q35_status q35_config_load(const char *path, q35_config *cfg, q35_error *err) {
    char *text = NULL;
    size_t len = 0;
    q35_status st = q35_read_file(path, &text, &len, err);
    if (st) return st;
    st = q35_config_parse(text, len, path, cfg, err);
    free(text);
    return st;
}
