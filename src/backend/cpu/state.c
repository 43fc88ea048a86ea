/* state.c: a sequence's state in host memory, the per-row states that let
 * a speculative verify pass be rewound, and snapshots (see cpu.h).
 *
 * Layout: every GDN layer's conv state (CD, CK-1) and recurrent state
 * (HV, DK, DV) sit in one block, so a rewind or a snapshot copies one range;
 * each full-attention layer has its own K and V caches (NKV, n_ctx, row),
 * head by head (attention.h; a row is HD floats, or in an 8-bit cache
 * q35_kv_q8_row_bytes(HD) bytes), in zeroed memory so that only the positions
 * used cost memory, on huge pages from 2 MiB (q35_alloc_zeroed: fewer TLB
 * misses over long contexts). A snapshot holds positions [0, pos) of each
 * head packed, so it restores into a state of any n_ctx >= pos. */
#include "backend/cpu/cpu.h"
#include "base/util.h"

#include <stdlib.h>

struct q35_bsnap {
    int32_t pos, n_kept;
    float *state;   /* copy of state_block */
    uint8_t *kv;    /* per full layer: K rows 0..pos-1, then V rows 0..pos-1 */
    uint8_t *mtp_kv; /* the MTP layer's K then V rows 0..pos-1, or NULL */
    float *kept;    /* (n_kept, H) */
};

/* bytes of one position's rows in one cache (every KV head) */
static size_t kv_pos_bytes(const q35_bstate *s) { return (size_t)s->b->c->n_head_kv * s->kv_row_bytes; }

/* positions [0, pos) of cache (every head, n_ctx rows apart) to or from packed (NKV, pos, row) */
static void kv_pack(uint8_t *dst, const uint8_t *cache, const q35_bstate *s, int32_t pos) {
    const size_t n = (size_t)pos * s->kv_row_bytes;
    for (int32_t h = 0; h < s->b->c->n_head_kv; h++)
        memcpy(dst + h * n, cache + h * (size_t)s->n_ctx * s->kv_row_bytes, n);
}

static void kv_unpack(uint8_t *cache, const uint8_t *src, const q35_bstate *s, int32_t pos) {
    const size_t n = (size_t)pos * s->kv_row_bytes;
    for (int32_t h = 0; h < s->b->c->n_head_kv; h++)
        memcpy(cache + h * (size_t)s->n_ctx * s->kv_row_bytes, src + h * n, n);
}

q35_status q35_host_state_new(q35_backend *base, int32_t n_ctx, q35_bstate **out, q35_error *err) {
    q35_host_backend *b = (q35_host_backend *)base;
    const q35_config *c = b->c;
    *out = NULL;
    q35_status st = q35_host_scratch_fit(b, n_ctx, err);
    if (st) return st;
    q35_bstate *s = calloc(1, sizeof *s);
    if (!s) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    s->b = b;
    s->n_ctx = n_ctx;
    s->kv_q8 = b->kv_cache == Q35_KV_Q8;
    s->kv_row_bytes = q35_kv_row_bytes(s->kv_q8, c->head_dim);
    size_t conv = (size_t)q35_conv_dim(c) * (size_t)(c->lin_conv_kernel - 1);
    size_t ssm = (size_t)c->lin_n_head_v * (size_t)c->lin_head_k_dim * (size_t)c->lin_head_v_dim;
    size_t kv = (size_t)n_ctx * kv_pos_bytes(s);
    s->state_floats = (size_t)(c->n_layer - c->n_layer_full) * (conv + ssm);
    /* 64-byte aligned and rounded as a speculation slot is (set_spec), since the two trade places on a rewind */
    const size_t block_bytes = (s->state_floats * sizeof(float) + 63) & ~(size_t)63;
    s->state_block = aligned_alloc(64, block_bytes ? block_bytes : 64);
    if (s->state_block) memset(s->state_block, 0, block_bytes ? block_bytes : 64);
    int ok = s->state_block != NULL;
    float *p = s->state_block;
    for (int32_t i = 0; ok && i < c->n_layer; i++) {
        if (c->layer_is_full[i]) {
            s->k_cache[i] = q35_alloc_zeroed(kv);
            s->v_cache[i] = q35_alloc_zeroed(kv);
            ok = s->k_cache[i] && s->v_cache[i];
        } else {
            s->conv_state[i] = p; p += conv;
            s->ssm_state[i] = p; p += ssm;
        }
    }
    if (!ok) {
        q35_host_state_free(s);
        return q35_fail(err, Q35_ERR_NOMEM, "out of memory creating a session of %d positions", n_ctx);
    }
    *out = s;
    return Q35_OK;
}

void q35_host_state_free(q35_bstate *s) {
    if (!s) return;
    size_t kv_bytes = (size_t)s->n_ctx * kv_pos_bytes(s);
    for (int32_t i = 0; i < Q35_MAX_LAYERS; i++) {
        q35_free_zeroed(s->k_cache[i], kv_bytes);
        q35_free_zeroed(s->v_cache[i], kv_bytes);
    }
    free(s->state_block);
    free(s->row_states);
    q35_free_zeroed(s->mtp_k_cache, kv_bytes);
    q35_free_zeroed(s->mtp_v_cache, kv_bytes);
    free(s->kept); free(s->draft_hidden);
    free(s);
}

void q35_host_state_clear(q35_bstate *s) {
    memset(s->state_block, 0, s->state_floats * sizeof(float)); /* KV rows past the position are never read */
}

/* values in [-0.5, 0.5) from a xorshift stream */
static void fill_random(float *p, size_t n, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        p[i] = (float)(*rng >> 40) * (1.0f / 16777216.0f) - 0.5f;
    }
}

void q35_host_state_fill(q35_bstate *s, int32_t pos, uint64_t seed) {
    const q35_config *c = s->b->c;
    uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 1;
    const size_t HD = (size_t)c->head_dim, head = (size_t)s->n_ctx * s->kv_row_bytes;
    fill_random(s->state_block, s->state_floats, &rng);
    float row[1024];
    for (int32_t i = 0; i <= c->n_layer; i++) {
        uint8_t *kv[2] = {i < c->n_layer ? (c->layer_is_full[i] ? s->k_cache[i] : NULL) : s->mtp_k_cache,
                          i < c->n_layer ? (c->layer_is_full[i] ? s->v_cache[i] : NULL) : s->mtp_v_cache};
        for (int32_t h = 0; kv[0] && h < c->n_head_kv; h++)
            for (int j = 0; j < 2; j++) {
                uint8_t *base = kv[j] + h * head;
                if (!s->kv_q8) { fill_random((float *)base, (size_t)pos * HD, &rng); continue; }
                for (int32_t p = 0; p < pos; p++) { /* HD <= 1024 (config.c) */
                    fill_random(row, HD, &rng);
                    q35_kv_q8_quantize(base + (size_t)p * s->kv_row_bytes, row, (int32_t)HD);
                }
            }
    }
}

q35_status q35_host_state_set_spec(q35_bstate *s, int32_t k, q35_error *err) {
    const q35_config *c = s->b->c;
    if (k == 0) return Q35_OK; /* the buffers stay for a later k */
    size_t H = (size_t)c->hidden_size, kv = (size_t)s->n_ctx * kv_pos_bytes(s);
    int ok = 1;
#define ALLOC(ptr, n) do { if (!(ptr)) { (ptr) = calloc((n), sizeof(float)); ok = ok && (ptr); } } while (0)
    if (!s->mtp_k_cache) ok = ok && (s->mtp_k_cache = q35_alloc_zeroed(kv));
    if (!s->mtp_v_cache) ok = ok && (s->mtp_v_cache = q35_alloc_zeroed(kv));
    ALLOC(s->kept, (Q35_SPEC_MAX + 1) * H);
    ALLOC(s->draft_hidden, H);
#undef ALLOC
    if (ok && k != s->spec_k) {
        /* 64-byte aligned, so the GDN update streams the copies past the
         * cache; touched now, so the first verify takes no page faults */
        size_t bytes = ((size_t)k * s->state_floats * sizeof(float) + 63) & ~(size_t)63;
        float *nc = aligned_alloc(64, bytes ? bytes : 64);
        if (nc) { free(s->row_states); s->row_states = nc; memset(nc, 0, bytes ? bytes : 64); s->spec_k = k; } else ok = 0;
    }
    if (!ok) return q35_fail(err, Q35_ERR_NOMEM, "out of memory for speculative decoding buffers (k = %d)", k);
    return Q35_OK;
}

/* With one slot (spec_k 1, one-token MTP) the slot becomes the state and the
 * old state the next pass's slot: two pointers trade places, and every conv
 * and ssm pointer moves with its block, instead of a copy of every GDN
 * layer's state (48 MiB at the 9B) on each rejected draft. */
void q35_host_state_rewind(q35_bstate *s, int32_t n_keep) {
    if (s->spec_k == 1) {
        float *old = s->state_block, *now = s->row_states;
        for (int32_t i = 0; i < Q35_MAX_LAYERS; i++) {
            if (s->conv_state[i]) s->conv_state[i] = now + (s->conv_state[i] - old);
            if (s->ssm_state[i]) s->ssm_state[i] = now + (s->ssm_state[i] - old);
        }
        s->state_block = now;
        s->row_states = old;
        return;
    }
    memcpy(s->state_block, s->row_states + (size_t)(n_keep - 1) * s->state_floats, s->state_floats * sizeof(float));
}

q35_status q35_host_snapshot_take(const q35_bstate *s, int32_t pos, int32_t n_kept, int mtp, q35_bsnap **out,
                                  size_t *bytes, q35_error *err) {
    *out = NULL;
    const q35_config *c = s->b->c;
    size_t rows = (size_t)pos * kv_pos_bytes(s), H = (size_t)c->hidden_size;
    size_t kv_bytes = (size_t)c->n_layer_full * 2 * rows;
    q35_bsnap *snap = calloc(1, sizeof *snap);
    if (!snap) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    snap->pos = pos;
    snap->state = malloc((s->state_floats ? s->state_floats : 1) * sizeof(float));
    snap->kv = malloc(kv_bytes ? kv_bytes : 1);
    int ok = snap->state && snap->kv;
    if (ok && mtp) {
        snap->mtp_kv = malloc(rows ? 2 * rows : 1);
        snap->kept = malloc((n_kept ? (size_t)n_kept * H : 1) * sizeof(float));
        ok = snap->mtp_kv && snap->kept;
    }
    if (!ok) {
        q35_host_snapshot_free(snap);
        return q35_fail(err, Q35_ERR_NOMEM, "out of memory for a snapshot of %d positions", pos);
    }
    memcpy(snap->state, s->state_block, s->state_floats * sizeof(float));
    uint8_t *p = snap->kv;
    for (int32_t i = 0; i < c->n_layer; i++) {
        if (!c->layer_is_full[i]) continue;
        kv_pack(p, s->k_cache[i], s, pos); p += rows;
        kv_pack(p, s->v_cache[i], s, pos); p += rows;
    }
    *bytes = s->state_floats * sizeof(float) + kv_bytes;
    if (mtp) {
        snap->n_kept = n_kept;
        kv_pack(snap->mtp_kv, s->mtp_k_cache, s, pos);
        kv_pack(snap->mtp_kv + rows, s->mtp_v_cache, s, pos);
        memcpy(snap->kept, s->kept, (size_t)n_kept * H * sizeof(float));
        *bytes += 2 * rows + (size_t)n_kept * H * sizeof(float);
    }
    *out = snap;
    return Q35_OK;
}

void q35_host_snapshot_restore(q35_bstate *s, const q35_bsnap *snap) {
    const q35_config *c = s->b->c;
    memcpy(s->state_block, snap->state, s->state_floats * sizeof(float));
    size_t rows = (size_t)snap->pos * kv_pos_bytes(s);
    const uint8_t *p = snap->kv;
    for (int32_t i = 0; i < c->n_layer; i++) {
        if (!c->layer_is_full[i]) continue;
        kv_unpack(s->k_cache[i], p, s, snap->pos); p += rows;
        kv_unpack(s->v_cache[i], p, s, snap->pos); p += rows;
    }
    if (snap->mtp_kv && s->mtp_k_cache) {
        kv_unpack(s->mtp_k_cache, snap->mtp_kv, s, snap->pos);
        kv_unpack(s->mtp_v_cache, snap->mtp_kv + rows, s, snap->pos);
        memcpy(s->kept, snap->kept, (size_t)snap->n_kept * (size_t)c->hidden_size * sizeof(float));
    }
}

void q35_host_snapshot_free(q35_bsnap *snap) {
    if (!snap) return;
    free(snap->state);
    free(snap->kv);
    free(snap->mtp_kv);
    free(snap->kept);
    free(snap);
}
