/* attention.h: Qwen3.5's gated full attention with a KV cache.
 *
 * The cache of one layer holds k_cache and v_cache, each (n_ctx, NKV, HD)
 * fp32, where row p is the key/value of position p (after q/k norm and RoPE
 * for keys). The same code serves the MTP layer with its own cache. */
#ifndef Q35_ATTENTION_H
#define Q35_ATTENTION_H

#include "model.h"
#include "threadpool.h"

size_t q35_attention_scratch_floats(const q35_config *c, int32_t n_tok, int32_t n_ctx);

/* out (n_tok, H) = gated attention of xn (n_tok, H) at positions pos0 .. pos0+n_tok-1;
 * writes those positions' keys and values into the cache first. */
void q35_attention_forward(const q35_config *c, const q35_layer_weights *l, float *k_cache, float *v_cache,
                           int32_t pos0, const float *xn, float *out, int32_t n_tok, float *scratch, q35_pool *pool);

/* RMSNorm with the (1 + w) weight convention, in place over n values. */
void q35_rmsnorm1p(float *x, const q35_tensor *w, int32_t n, float eps);
/* dst = rmsnorm1p(src) */
void q35_rmsnorm1p_to(float *dst, const float *src, const q35_tensor *w, int32_t n, float eps);

#endif
