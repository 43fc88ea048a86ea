/* draft_vocab.c: the reduced-vocabulary draft head (qwen35.h,
 * q35_engine_set_draft_vocab) and the draft vocabulary file format.
 *
 * The head is a copy of the chosen rows of lm_head in lm_head's own dtype
 * (bfp rows moved block by block, exactly), ascending by token id, so a
 * subset row's draft logit is bit for bit the full head's and argmax ties
 * still pick the lower id. */
#include "core/session.h"
#include "formats/bfp.h"
#include "formats/dtype.h"
#include "base/util.h"

#include <errno.h>
#include <stdlib.h>

void q35_spec_free_draft_head(q35_engine *e) {
    free(e->draft_ids);
    free(e->draft_head_data);
    e->draft_ids = NULL;
    e->draft_head_data = NULL;
    e->n_draft = 0;
}

static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

q35_status q35_engine_set_draft_vocab(q35_engine *e, const int32_t *ids, int32_t n, q35_error *err) {
    const q35_tensor *head = &e->w.lm_head;
    const int32_t V = e->cfg.vocab_size, H = e->cfg.hidden_size;
    if (n < 0 || n > V || (n > 0 && !ids))
        return q35_fail(err, Q35_ERR_ARG, "a draft vocabulary holds 1..%d token ids (got %d)", V, n);
    if (n > 0 && !e->w.mtp.present)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "the model has no MTP head (mtp.* tensors), so it has no draft head to reduce");
    int64_t full_bytes = (int64_t)head->nbytes, old_bytes = e->n_draft ? (int64_t)e->draft_head.nbytes : full_bytes;
    q35_backend *be = e->backend;
    if (n == 0) {
        q35_spec_free_draft_head(e);
        e->info.mtp_bytes_per_draft += full_bytes - old_bytes;
        return be->ops->set_draft_head(be, NULL, err);
    }
    int32_t *sorted = malloc(sizeof *sorted * (size_t)n);
    if (!sorted) return q35_fail(err, Q35_ERR_NOMEM, "out of memory for a draft vocabulary of %d ids", n);
    memcpy(sorted, ids, sizeof *sorted * (size_t)n);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_id); /* ascending: argmax ties pick the lower token id, as q35_argmax */
    for (int32_t i = 0; i < n; i++) {
        if (sorted[i] < 0 || sorted[i] >= V) {
            int32_t bad = sorted[i];
            free(sorted);
            return q35_fail(err, Q35_ERR_ARG, "draft vocabulary: token id %d is outside the vocabulary [0, %d)", bad, V);
        }
        if (i && sorted[i] == sorted[i - 1]) {
            int32_t bad = sorted[i];
            free(sorted);
            return q35_fail(err, Q35_ERR_ARG, "draft vocabulary: token id %d is listed twice", bad);
        }
    }
    size_t bytes = q35_dtype_bytes(head->dtype, n, H);
    size_t alloc = (bytes + 63) / 64 * 64; /* the kernels' 64-byte alignment */
    uint8_t *data = aligned_alloc(64, alloc);
    if (!data) {
        free(sorted);
        return q35_fail(err, Q35_ERR_NOMEM, "out of memory for a draft head of %d rows (%zu bytes)", n, bytes);
    }
    if (q35_dtype_is_block(head->dtype)) q35_bfp_clear(head->dtype, data, n, H); /* padding rows: exponent 0, code 0 */
    else memset(data, 0, bytes);
    memset(data + bytes, 0, alloc - bytes); /* the alignment's tail */
    for (int32_t i = 0; i < n; i++) q35_dtype_copy_row(head->dtype, data, i, head->data, sorted[i], H);
    q35_spec_free_draft_head(e);
    e->n_draft = n;
    e->draft_ids = sorted;
    e->draft_head_data = data;
    e->draft_head = *head;
    e->draft_head.name = "lm_head.weight (draft vocabulary rows)";
    e->draft_head.shape[0] = n;
    e->draft_head.data = data;
    e->draft_head.nbytes = bytes;
    q35_status st = be->ops->set_draft_head(be, &e->draft_head, err);
    if (st) { /* the backend could not take it: back to the whole lm_head */
        q35_spec_free_draft_head(e);
        e->info.mtp_bytes_per_draft += full_bytes - old_bytes;
        be->ops->set_draft_head(be, NULL, NULL);
        return st;
    }
    e->info.mtp_bytes_per_draft += (int64_t)bytes - old_bytes;
    return Q35_OK;
}

int32_t q35_engine_draft_vocab(const q35_engine *e) { return e->n_draft ? e->n_draft : e->cfg.vocab_size; }

q35_status q35_draft_vocab_parse(const char *data, size_t size, const char *name, int32_t vocab_size, int32_t **ids_out,
                                 int32_t *n_out, q35_error *err) {
    *ids_out = NULL;
    *n_out = 0;
    if (vocab_size <= 0) return q35_fail(err, Q35_ERR_ARG, "%s: vocabulary size %d", name, vocab_size);
    if (memchr(data, 0, size)) return q35_fail(err, Q35_ERR_FORMAT, "%s: not a text file of token ids (it holds a NUL byte)", name);
    char *text = malloc(size + 1); /* NUL-terminated for strtoll */
    int32_t *ids = malloc(sizeof *ids * (size_t)vocab_size);
    uint8_t *seen = calloc((size_t)vocab_size, 1);
    int32_t n = 0;
    long line = 1;
    q35_status st = Q35_OK;
    if (!text || !ids || !seen) { st = q35_fail(err, Q35_ERR_NOMEM, "out of memory reading %s", name); goto done; }
    memcpy(text, data, size);
    text[size] = 0;
    for (const char *p = text; *p;) {
        if (*p == '\n') { line++; p++; continue; }
        if (*p == ' ' || *p == '\t' || *p == '\r' || *p == ',') { p++; continue; }
        if (*p == '#') { while (*p && *p != '\n') p++; continue; }
        char *end = (char *)p;
        errno = 0;
        long long v = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : 0;
        if (end == p || (*end && !strchr(" \t\r\n,#", *end))) {
            st = q35_fail(err, Q35_ERR_FORMAT, "%s:%ld: expected a token id, found '%.12s'", name, line, p);
            goto done;
        }
        if (errno || v >= vocab_size) {
            st = q35_fail(err, Q35_ERR_FORMAT, "%s:%ld: token id %.*s is outside the vocabulary [0, %d)", name, line,
                          (int)(end - p < 24 ? end - p : 24), p, vocab_size);
            goto done;
        }
        if (seen[v]) {
            st = q35_fail(err, Q35_ERR_FORMAT, "%s:%ld: token id %lld is listed twice", name, line, v);
            goto done;
        }
        seen[v] = 1;
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (!n) st = q35_fail(err, Q35_ERR_FORMAT, "%s: no token ids", name);
done:
    free(text);
    free(seen);
    if (st) { free(ids); return st; }
    *ids_out = ids;
    *n_out = n;
    return Q35_OK;
}

q35_status q35_draft_vocab_load(const char *path, int32_t vocab_size, int32_t **ids, int32_t *n, q35_error *err) {
    *ids = NULL;
    *n = 0;
    char *text;
    size_t size;
    q35_status st = q35_read_file(path, &text, &size, err);
    if (st) return st;
    st = q35_draft_vocab_parse(text, size, path, vocab_size, ids, n, err);
    free(text);
    return st;
}

q35_status q35_engine_set_draft_vocab_file(q35_engine *e, const char *path, q35_error *err) {
    int32_t *ids = NULL, n = 0;
    q35_status st = q35_draft_vocab_load(path, e->cfg.vocab_size, &ids, &n, err);
    if (!st) st = q35_engine_set_draft_vocab(e, ids, n, err);
    free(ids);
    return st;
}
