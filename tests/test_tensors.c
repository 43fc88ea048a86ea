/* Tests of src/model/tensors.c: the walk over the tensor table names each
 * tensor once and gives each its own weight slot, in the right layer. */
#include "model/prepare.h"
#include "model/tensors.h"
#include "test.h"

#include <stdlib.h>

typedef struct {
    const q35_weights *w;
    int n, n_mtp, bad_slot;
    int per_layer[64];
    char names[600][128];
    const q35_tensor *slots[600];
} walk_log;

static q35_status record(void *ctx, const q35_model_tensor *t, q35_error *err) {
    walk_log *l = ctx;
    if (l->n >= 600) return q35_fail(err, Q35_ERR_ARG, "too many tensors");
    snprintf(l->names[l->n], sizeof l->names[0], "%s", t->name);
    l->slots[l->n++] = t->slot;
    int layer = -1;
    if (sscanf(t->name, "model.language_model.layers.%d.", &layer) == 1 && layer >= 0 && layer < 64) {
        l->per_layer[layer]++;
        const char *lo = (const char *)&l->w->layers[layer], *p = (const char *)t->slot;
        if (p < lo || p + sizeof *t->slot > lo + sizeof l->w->layers[layer]) l->bad_slot++;
    } else if (!strncmp(t->name, "mtp.", 4)) {
        l->n_mtp++;
        const char *lo = (const char *)&l->w->mtp, *p = (const char *)t->slot;
        if (p < lo || p + sizeof *t->slot > lo + sizeof l->w->mtp) l->bad_slot++;
    }
    return Q35_OK;
}

TEST(tensors, walk_names_each_tensor_once_with_its_own_slot) {
    char *json = q35_config_json_9b();
    q35_config c;
    q35_error err = {0};
    REQUIRE(json && q35_config_parse(json, strlen(json), "9b", &c, &err) == Q35_OK);
    q35_weights *w = calloc(1, sizeof *w);
    walk_log *l = calloc(1, sizeof *l);
    REQUIRE(w && l);
    l->w = w;
    REQUIRE_MSG(q35_model_tensors_each(&c, Q35_TENSORS_TEXT | Q35_TENSORS_MTP, w, record, l, &err) == Q35_OK, "%s",
                err.msg);
    CHECK_EQ_INT(l->n, 427 + 15);
    CHECK_EQ_INT(l->n_mtp, 15);
    CHECK_EQ_INT(l->bad_slot, 0);
    for (int i = 0; i < c.n_layer; i++) CHECK_EQ_INT(l->per_layer[i], c.layer_is_full[i] ? 11 : 14);
    int dup_name = 0, dup_slot = 0;
    for (int i = 0; i < l->n; i++)
        for (int j = 0; j < i; j++) {
            dup_name += !strcmp(l->names[i], l->names[j]);
            dup_slot += l->slots[i] == l->slots[j];
        }
    CHECK_EQ_INT(dup_name, 0);
    CHECK_EQ_INT(dup_slot, 0);
    CHECK_STR_EQ(l->names[0], "model.language_model.embed_tokens.weight");
    CHECK(l->slots[0] == &w->embed);
    free(l);
    free(w);
    free(json);
}
