/* tensors.h: the tensors of the Qwen3.5 model, named once.
 *
 * One table (tensors.c) lists every tensor the engine reads: its name (or
 * the part after a layer's prefix), which part of the model holds it, its
 * shape in terms of the config, whether the matmul kernels read it (a
 * matrix, any dtype) or the forward pass reads it element by element (a
 * vector, an element format), its dtype in a Hugging Face checkpoint, and
 * its slot in q35_weights. Binding a checkpoint (weights.c), planning a
 * weight cache (prepare.c: the synthetic caches and `qwen35 info`) and the
 * dtype policy (policy.c) all walk this table. */
#ifndef Q35_MODEL_TENSORS_H
#define Q35_MODEL_TENSORS_H

#include "model/model.h"

typedef enum q35_tensor_part {
    Q35_PART_MODEL, /* once: embedding, final norm, lm_head */
    Q35_PART_LAYER, /* every decoder layer, the MTP layer included: norms and MLP */
    Q35_PART_ATTN,  /* full-attention layers and the MTP layer */
    Q35_PART_GDN,   /* Gated DeltaNet layers */
    Q35_PART_MTP,   /* once, in the MTP head (its layer is LAYER + ATTN under mtp.layers.0.) */
    Q35_PART_VISION, /* once, in the vision tower: patch embedding, position table, merger */
    Q35_PART_VBLOCK, /* every block of the vision tower (model.visual.blocks.N.) */
} q35_tensor_part;

/* What the dtype policy tells apart. */
typedef enum q35_tensor_role {
    Q35_ROLE_OTHER,
    Q35_ROLE_PROJECTION, /* the large matrices every token streams through */
    Q35_ROLE_EMBED,
    Q35_ROLE_HEAD,
} q35_tensor_role;

typedef struct q35_tensor_def {
    const char *name;   /* full name (MODEL, MTP) or the part after "….layers.N." */
    uint8_t part;       /* q35_tensor_part */
    uint8_t role;       /* q35_tensor_role */
    uint8_t matrix;     /* 1: read by the matmul kernels (any dtype); 0: element by element */
    uint8_t untied;     /* present only when tie_word_embeddings is 0 */
    uint8_t ndim;
    uint8_t dims[5];    /* Q35_DIM_* of tensors.c */
    q35_dtype hf_dtype; /* its dtype in a Hugging Face checkpoint */
    size_t slot;        /* offset of its q35_tensor in q35_weights (MODEL), q35_mtp_weights (MTP),
                           q35_layer_weights (layer parts), q35_vision_weights (VISION) or
                           q35_vision_block (VBLOCK) */
} q35_tensor_def;

extern const q35_tensor_def q35_tensor_defs[];
extern const int q35_n_tensor_defs;

/* One tensor of the model a config describes. */
typedef struct q35_model_tensor {
    const q35_tensor_def *def;
    char name[128];
    int ndim;
    int64_t shape[5];
    q35_tensor *slot; /* in the q35_weights given to the walk; NULL without one */
} q35_model_tensor;

/* The role the table gives the tensor called `name` (Q35_ROLE_OTHER for a
 * name it does not hold). */
q35_tensor_role q35_tensor_role_of(const char *name);

enum { Q35_TENSORS_TEXT = 1, Q35_TENSORS_MTP = 2, Q35_TENSORS_VISION = 4 };

typedef q35_status (*q35_model_tensor_fn)(void *ctx, const q35_model_tensor *t, q35_error *err);

/* Calls fn for each tensor of the model c describes, in binding order: with
 * Q35_TENSORS_TEXT the text model (embedding, final norm, lm_head unless
 * tied, then each layer), with Q35_TENSORS_MTP the MTP head, with
 * Q35_TENSORS_VISION the vision tower (c->vision must be present). w (or NULL)
 * gives each tensor its slot. Stops at fn's first error and returns it. */
q35_status q35_model_tensors_each(const q35_config *c, unsigned which, q35_weights *w, q35_model_tensor_fn fn,
                                  void *ctx, q35_error *err);

#endif
