/* model.h: the Qwen3.5 hybrid model inside the engine: its configuration,
 * its weights (views into mapped files) and the per-sequence state.
 *
 * Shapes use these names (Qwen3.5-9B values in brackets):
 *   H  hidden_size [4096]          I   intermediate_size [12288]
 *   V  vocab_size [248320]         L   n_layer [32]
 *   NH n_head [16]   NKV n_head_kv [4]   HD head_dim [256]   RD rotary_dim [64]
 *   HK lin_n_head_k [16]  HV lin_n_head_v [32]  DK lin_head_k_dim [128]  DV lin_head_v_dim [128]
 *   CK conv kernel [4]   CD conv_dim = 2*HK*DK + HV*DV [8192] */
#ifndef Q35_MODEL_H
#define Q35_MODEL_H

#include "qwen35.h"
#include "formats/tensor.h"
#include "base/util.h"

#define Q35_MAX_LAYERS 256
#define Q35_MAX_VISION_BLOCKS 64

/* The vision tower (vision_config). Shapes use (9B values in brackets):
 *   VH hidden_size [1152]   VI intermediate_size [4304]   VNH n_head [16]
 *   VHD head_dim = VH / VNH [72]   PS patch [16]  TP temporal patch [2]
 *   MS spatial merge [2]   VP patch_dim = C * TP * PS * PS [1536]
 *   VM merged = VH * MS * MS [4608]   VO out_hidden_size [4096]
 *   NPOS num_position_embeddings [2304] = side * side */
typedef struct q35_vision_config {
    int32_t present; /* config.json has a vision_config */
    int32_t depth, hidden_size, intermediate_size, n_head, head_dim;
    int32_t in_channels, patch_size, temporal_patch_size, merge_size, out_hidden_size;
    int32_t num_position_embeddings, grid_per_side;
    float rope_theta;
} q35_vision_config;

typedef struct q35_config {
    int32_t vocab_size, hidden_size, intermediate_size, n_layer;
    int32_t n_head, n_head_kv, head_dim, rotary_dim;
    int32_t lin_n_head_k, lin_n_head_v, lin_head_k_dim, lin_head_v_dim, lin_conv_kernel;
    float rms_norm_eps;
    float rope_theta;
    float partial_rotary_factor;
    int32_t tie_word_embeddings;
    int32_t max_position_embeddings;
    int32_t mtp_num_hidden_layers;
    int32_t eos_token_id;                 /* -1 if none */
    uint8_t layer_is_full[Q35_MAX_LAYERS]; /* 1: gated full attention, 0: Gated DeltaNet */
    int32_t n_layer_full;
    /* Multimodal rotary (rope_parameters.mrope_section, transformers'
     * default [11, 11, 10]): rotary frequency i (of RD/2) turns with the
     * height position when i % 3 == 1 and i < 3 * section[1], the width one
     * when i % 3 == 2 and i < 3 * section[2], else the temporal one (the
     * interleaved layout transformers' Qwen3.5 always uses). */
    int32_t mrope_section[3];
    int32_t image_token_id, vision_start_token_id, vision_end_token_id; /* config.json, -1 if none */
    q35_vision_config vision;
} q35_config;

/* Parses config.json text (the multimodal wrapper or a bare text config).
 * `label` names the file in errors. */
q35_status q35_config_parse(const char *json_text, size_t len, const char *label, q35_config *cfg, q35_error *err);
q35_status q35_config_load(const char *path, q35_config *cfg, q35_error *err);
/* vision.c: a vision_config object (a json_t) into v (vision.present = 1). */
struct json_t;
q35_status q35_vision_config_parse(struct json_t *vc, const char *label, q35_vision_config *v, q35_error *err);

static inline int32_t q35_conv_dim(const q35_config *c) {
    return 2 * c->lin_n_head_k * c->lin_head_k_dim + c->lin_n_head_v * c->lin_head_v_dim;
}

typedef struct q35_layer_weights {
    q35_tensor input_norm;    /* (H) 1+w */
    q35_tensor post_norm;     /* (H) 1+w */
    q35_tensor gate_proj;     /* (I, H) */
    q35_tensor up_proj;       /* (I, H) */
    q35_tensor down_proj;     /* (H, I) */
    /* Gated DeltaNet layers */
    q35_tensor in_proj_qkv;   /* (CD, H) rows: q (HK*DK) | k (HK*DK) | v (HV*DV) */
    q35_tensor in_proj_z;     /* (HV*DV, H) */
    q35_tensor in_proj_b;     /* (HV, H) */
    q35_tensor in_proj_a;     /* (HV, H) */
    q35_tensor conv1d;        /* (CD, 1, CK) taps oldest -> newest */
    q35_tensor A_log;         /* (HV) usually F32 */
    q35_tensor dt_bias;       /* (HV) */
    q35_tensor gdn_norm;      /* (DV) plain multiplier, usually F32 */
    q35_tensor out_proj;      /* (H, HV*DV) */
    /* full attention layers (and the MTP layer) */
    q35_tensor q_proj;        /* (NH*HD*2, H) per head: HD query rows then HD gate rows */
    q35_tensor k_proj;        /* (NKV*HD, H) */
    q35_tensor v_proj;        /* (NKV*HD, H) */
    q35_tensor o_proj;        /* (H, NH*HD) */
    q35_tensor q_norm;        /* (HD) 1+w */
    q35_tensor k_norm;        /* (HD) 1+w */
} q35_layer_weights;

typedef struct q35_mtp_weights {
    int32_t present;
    q35_tensor pre_fc_norm_embedding; /* (H) 1+w */
    q35_tensor pre_fc_norm_hidden;    /* (H) 1+w */
    q35_tensor fc;                    /* (H, 2H) columns: [embedding | hidden] */
    q35_layer_weights layer;          /* one full-attention decoder layer */
    q35_tensor norm;                  /* (H) 1+w */
} q35_mtp_weights;

typedef struct q35_vision_block {
    q35_tensor norm1_w, norm1_b; /* (VH) LayerNorm */
    q35_tensor qkv_w;            /* (3*VH, VH) rows: q (VNH*VHD) | k | v */
    q35_tensor qkv_b;            /* (3*VH) */
    q35_tensor proj_w, proj_b;   /* (VH, VH), (VH) */
    q35_tensor norm2_w, norm2_b; /* (VH) LayerNorm */
    q35_tensor fc1_w, fc1_b;     /* (VI, VH), (VI) */
    q35_tensor fc2_w, fc2_b;     /* (VH, VI), (VH) */
} q35_vision_block;

typedef struct q35_vision_weights {
    int32_t present;
    q35_tensor patch_w;              /* (VH, C, TP, PS, PS): the Conv3d, stride = kernel */
    q35_tensor patch_b;              /* (VH) */
    q35_tensor pos_embed;            /* (NPOS, VH) learned table, side x side, row-major */
    q35_vision_block blocks[Q35_MAX_VISION_BLOCKS];
    q35_tensor merger_norm_w, merger_norm_b; /* (VH) LayerNorm, per patch before the merge */
    q35_tensor merger_fc1_w, merger_fc1_b;   /* (VM, VM), (VM) */
    q35_tensor merger_fc2_w, merger_fc2_b;   /* (VO, VM), (VO) */
} q35_vision_weights;

typedef struct q35_weights {
    q35_tensor embed;          /* (V, H) */
    q35_tensor final_norm;     /* (H) 1+w */
    q35_tensor lm_head;        /* (V, H); the embedding when tied */
    q35_layer_weights layers[Q35_MAX_LAYERS];
    q35_mtp_weights mtp;
    q35_vision_weights vision;
} q35_weights;

struct q35_checkpoint;
/* Binds and checks every tensor the text model (and MTP, if present) needs,
 * from an open checkpoint or weight cache; and the vision tower when the
 * config describes one and the source holds model.visual.* (a weight cache
 * does not: prepare leaves the tower out). */
q35_status q35_weights_bind(const struct q35_checkpoint *src, const q35_config *cfg, q35_weights *w, q35_error *err);
/* The vision tower alone (w->vision), every tensor required. */
q35_status q35_vision_weights_bind(const struct q35_checkpoint *src, const q35_config *cfg, q35_weights *w,
                                   q35_error *err);

#endif
