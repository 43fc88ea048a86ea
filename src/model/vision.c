/* vision.c: the vision_config of a Qwen3.5 config.json into
 * q35_vision_config.
 *
 * transformers' Qwen3_5VisionConfig defaults stand in for absent fields (as
 * they do when transformers loads the file); every value the tower's shapes
 * depend on is checked: heads divide the width, the head dimension splits
 * into the four rotary quarters (h and w, cos and sin halves), the position
 * table is a square. */
#include "model/model.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

static q35_status vint(json_t *vc, const char *key, int32_t dflt, int32_t lo, int32_t hi, int32_t *out,
                       const char *label, q35_error *err) {
    json_t *v = json_object_get(vc, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return Q35_OK;
    }
    if (!json_is_integer(v)) return q35_fail(err, Q35_ERR_FORMAT, "%s: vision_config.%s must be an integer", label, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: vision_config.%s = %lld is outside [%d, %d]", label, key,
                        (long long)x, lo, hi);
    *out = (int32_t)x;
    return Q35_OK;
}

q35_status q35_vision_config_parse(json_t *vc, const char *label, q35_vision_config *v, q35_error *err) {
    memset(v, 0, sizeof *v);
    if (!json_is_object(vc)) return q35_fail(err, Q35_ERR_FORMAT, "%s: vision_config is not an object", label);
    q35_status st;
#define VINT(key, dflt, lo, hi, field) \
    if ((st = vint(vc, key, dflt, lo, hi, &v->field, label, err))) return st
    VINT("depth", 27, 1, Q35_MAX_VISION_BLOCKS, depth);
    VINT("hidden_size", 1152, 1, 1 << 16, hidden_size);
    VINT("intermediate_size", 4304, 1, 1 << 18, intermediate_size);
    VINT("num_heads", 16, 1, 1024, n_head);
    VINT("in_channels", 3, 3, 3, in_channels);
    VINT("patch_size", 16, 1, 256, patch_size);
    VINT("temporal_patch_size", 2, 1, 16, temporal_patch_size);
    VINT("spatial_merge_size", 2, 1, 16, merge_size);
    VINT("out_hidden_size", 3584, 1, 1 << 16, out_hidden_size);
    VINT("num_position_embeddings", 2304, 1, 1 << 20, num_position_embeddings);
#undef VINT
    const char *act = json_string_value(json_object_get(vc, "hidden_act"));
    if (act && strcmp(act, "gelu_pytorch_tanh"))
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: vision_config.hidden_act '%s' is not supported "
                        "(only gelu_pytorch_tanh)", label, act);
    if (v->hidden_size % v->n_head)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: vision hidden_size %d is not a multiple of num_heads %d", label,
                        v->hidden_size, v->n_head);
    v->head_dim = v->hidden_size / v->n_head;
    if (v->head_dim % 4)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: vision head_dim %d is not a multiple of 4 (2D rotary)", label,
                        v->head_dim);
    v->grid_per_side = (int32_t)sqrt((double)v->num_position_embeddings); /* int(n ** 0.5), as transformers */
    if (v->grid_per_side * v->grid_per_side != v->num_position_embeddings)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: vision num_position_embeddings %d is not a square", label,
                        v->num_position_embeddings);
    v->rope_theta = 10000.0f;
    json_t *rp = json_object_get(vc, "rope_parameters");
    if (json_is_object(rp)) {
        const char *rt = json_string_value(json_object_get(rp, "rope_type"));
        if (rt && strcmp(rt, "axial"))
            return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: vision rope_type '%s' is not supported (only axial)", label, rt);
        json_t *theta = json_object_get(rp, "rope_theta");
        if (theta && !json_is_number(theta))
            return q35_fail(err, Q35_ERR_FORMAT, "%s: vision rope_theta must be a number", label);
        if (theta) v->rope_theta = (float)json_number_value(theta);
    }
    if (!(v->rope_theta > 0)) return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: vision rope_theta must be > 0", label);
    v->present = 1;
    return Q35_OK;
}
