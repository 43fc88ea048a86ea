/* helpers.h: file and loading helpers shared by the tests. */
#ifndef Q35_TEST_HELPERS_H
#define Q35_TEST_HELPERS_H

#include "qwen35.h"

#include <stddef.h>
#include <stdint.h>

/* A whole file into a malloc'd buffer (NULL on failure). */
char *test_slurp(const char *path, size_t *len);
/* Writes a whole file; 0 on success. */
int test_spit(const char *path, const void *data, size_t len);
/* Loads an engine from dir and frees it again; the status and err say how it went. */
q35_status test_try_load(const char *dir, q35_error *err);

/* A draft oracle (a session's draft hook): the reference continuation seq
 * of the tokens at positions base.., wrong at about a third of the
 * positions (a fixed hash), so that steps see full acceptance, partial
 * acceptance and rejection. */
typedef struct { const int32_t *seq; int32_t base, n; } oracle;
int32_t oracle_hook(void *ctx, int32_t pos, int32_t proposed);

/* A generation of session s that begins with token `last` (not yet
 * evaluated: its first step evaluates it), greedy when sm is NULL, EOS
 * ignored, no length limit; NULL on failure (reported). */
q35_generation *test_gen_after(q35_session *s, q35_sampler *sm, int32_t last);
/* One step of g: its new tokens into out (room for Q35_SPEC_K_MAX+1) and
 * their count, or -1 on failure (reported). */
int32_t test_gen_step(q35_generation *g, int32_t *out);

/* Greedy generation (EOS ignored) of n tokens into out from the prompt's
 * last logits row, through q35_generation (speculative when the session is;
 * its steps are not cut at n, so the last one may run past it unseen):
 * returns n, or -1 on failure (reported). */
int32_t test_greedy_tokens(q35_session *s, const float *logits, int32_t n, int32_t *out);

/* Two sessions of n_ctx positions on e, *spec speculating with k draft
 * slots and *plain not, both fed tokens[0, n) in one eval: 0, or -1 with
 * both NULL (reported). */
int test_twin_sessions(q35_engine *e, int32_t n_ctx, int32_t k, const int32_t *tokens, int32_t n,
                       q35_session **spec, q35_session **plain);

#endif
