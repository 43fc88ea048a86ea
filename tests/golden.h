/* golden.h: loading the transformers goldens under tests/data/golden
 * (format described in tests/data/README.md). */
#ifndef Q35_TEST_GOLDEN_H
#define Q35_TEST_GOLDEN_H

#include <stddef.h>
#include <stdint.h>

typedef struct golden {
    char model_dir[1024];
    int32_t vocab_size;
    int32_t n_prompt, n_greedy;
    int32_t *prompt_ids, *greedy_ids;
    float *prompt_logits; /* (n_prompt, vocab) */
    float *greedy_logits; /* (n_greedy, vocab) */
} golden;

/* Loads tests/data/golden/NAME.json and its logits; 0 on success. */
int golden_load(const char *name, golden *g);
void golden_free(golden *g);

/* golden_load, then the engine of its model directory (NULL, the test
 * failed, when either cannot be loaded). */
struct q35_engine;
struct q35_engine *golden_engine(const char *name, golden *g);

/* max |a - b| / max |b| over n values: the tolerance measure of the tests. */
double rel_max_diff(const float *a, const float *b, size_t n);

extern const char *const golden_models[];
extern const int golden_n_models;

#endif
