/* backend.c: the backends of this build, chosen by name (backend.h). */
#include "backend/backend.h"
#include "base/util.h"

#include <stdlib.h>

typedef q35_status (*open_fn)(const q35_config *c, const q35_weights *w, int32_t n_threads, q35_backend **out,
                              q35_error *err);

static const struct {
    const char *name;
    open_fn open;
} backends[] = {
    {"cpu", q35_backend_cpu_open},
    {"ref", q35_backend_ref_open},
};

q35_status q35_backend_open(const char *name, const q35_config *c, const q35_weights *w, int32_t n_threads,
                            q35_backend **out, q35_error *err) {
    *out = NULL;
    const char *from = "backend name";
    if (!name) {
        name = getenv("Q35_BACKEND");
        from = "Q35_BACKEND";
    }
    if (!name || !*name) name = "cpu";
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (!strcmp(name, backends[i].name)) return backends[i].open(c, w, n_threads, out, err);
    return q35_fail(err, Q35_ERR_ARG, "%s '%s' is not a backend of this build (there are: cpu, ref)", from, name);
}
