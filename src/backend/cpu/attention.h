/* attention.h: Qwen3.5's gated full attention with a KV cache.
 *
 * The cache of one layer holds k_cache and v_cache, each (NKV, n_ctx, HD):
 * head h's rows one after another, head_stride bytes apart, row p the
 * key/value of position p (after q/k norm and RoPE for keys), HD fp32 or,
 * in an 8-bit cache (Q35_KV_Q8), q35_kv_q8_row_bytes(HD) bytes of scales
 * and int8 codes (kernels.h). A KV head's attention so reads one sequential stream (with rows
 * (n_ctx, NKV, HD) it read a 1 KiB slice of every 4 KiB row at the 9B,
 * which the hardware prefetcher does not follow). The same code serves the
 * MTP layer with its own cache. */
#ifndef Q35_ATTENTION_H
#define Q35_ATTENTION_H

#include "backend/cpu/compute.h"
#include "model/model.h"

/* One sequence's rows within a batch, at cache positions pos0.., and its
 * cache. The rotary position of row t is pos0 + t + rope_delta, or the
 * three axes pos3[3t..3t+2] (multimodal rotary, model.h mrope_section)
 * when pos3 is given. */
typedef struct q35_attn_seg {
    int32_t row0, n_rows, pos0;
    void *k_cache, *v_cache;
    size_t head_stride; /* bytes from one KV head's rows to the next's */
    int q8;             /* 1: 8-bit rows */
    int32_t rope_delta;
    const int32_t *pos3; /* (n_rows, 3) or NULL */
} q35_attn_seg;

/* Scratch floats for n_tok rows, caches of up to n_ctx positions, n_workers threads. */
size_t q35_attention_scratch_floats(const q35_config *c, int32_t n_tok, int32_t n_ctx, int32_t n_workers);

/* out (n_tok, H) = gated attention of xn (n_tok, H); each sequence's rows
 * first write their keys and values into its cache. (row, head) pairs are
 * spread over the pool. */
void q35_attention_forward(const q35_host *h, const q35_config *c, const q35_layer_weights *l, const q35_attn_seg *segs,
                           int32_t n_segs, const float *xn, float *out, int32_t n_tok, int32_t n_ctx, float *scratch);

#endif
