/* profile.c: see profile.h. */
#include "backend/profile.h"

#include <stdlib.h>
#include <string.h>

#define PROF_ROWS 1024
#define PROF_SHAPES 64

struct q35_prof {
    struct {
        int32_t rows;
        char what[64];
        int64_t calls;
        double bytes, seconds;
    } row[PROF_ROWS];
    int32_t n;
    struct { int32_t rows; int64_t passes; } shape[PROF_SHAPES];
    int32_t n_shapes;
    int64_t dropped; /* adds that found the table full */
};

q35_prof *q35_prof_new(void) { return calloc(1, sizeof(q35_prof)); }

q35_prof *q35_prof_open(void) {
    const char *v = getenv("Q35_PROFILE");
    return v && *v && strcmp(v, "0") ? q35_prof_new() : NULL;
}

void q35_prof_add(q35_prof *p, int32_t rows, const char *what, double bytes, double seconds) {
    if (!p) return;
    if (!what) {
        for (int32_t i = 0; i < p->n_shapes; i++)
            if (p->shape[i].rows == rows) { p->shape[i].passes++; return; }
        if (p->n_shapes < PROF_SHAPES) p->shape[p->n_shapes].rows = rows, p->shape[p->n_shapes++].passes = 1;
        else p->dropped++;
        return;
    }
    for (int32_t i = 0; i < p->n; i++)
        if (p->row[i].rows == rows && !strcmp(p->row[i].what, what)) {
            p->row[i].calls++, p->row[i].bytes += bytes, p->row[i].seconds += seconds;
            return;
        }
    if (p->n == PROF_ROWS) { p->dropped++; return; }
    p->row[p->n].rows = rows;
    snprintf(p->row[p->n].what, sizeof p->row[p->n].what, "%s", what);
    p->row[p->n].calls = 1, p->row[p->n].bytes = bytes, p->row[p->n].seconds = seconds;
    p->n++;
}

void q35_prof_role(const char *name, char *out, size_t size) {
    const char *at = name ? strstr(name, "layers.") : NULL, *blocks = name ? strstr(name, "blocks.") : NULL;
    if (!at && !blocks) {
        snprintf(out, size, "%s", name ? name : "?");
    } else {
        const char *rest = at ? at + 7 : blocks + 7;
        while (*rest >= '0' && *rest <= '9') rest++;
        if (*rest == '.') rest++;
        snprintf(out, size, "%s%s", !strncmp(name, "mtp.", 4) ? "mtp." : strstr(name, "visual.") ? "visual." : "", rest);
    }
    size_t n = strlen(out);
    if (n > 7 && !strcmp(out + n - 7, ".weight")) out[n - 7] = 0;
}

void q35_prof_close(q35_prof *p, FILE *f) {
    if (!p) return;
    for (int32_t s = 0; s < p->n_shapes; s++) {
        const int32_t rows = p->shape[s].rows;
        const double passes = (double)p->shape[s].passes;
        double pass_s = 0;
        for (int32_t i = 0; i < p->n; i++)
            if (p->row[i].rows == rows && !strcmp(p->row[i].what, "pass")) pass_s = p->row[i].seconds;
        fprintf(f, "profile: %s of %d %s, %lld runs, %.1f us per run\n",
                rows >= Q35_PROF_VISION ? "vision tower" : rows >= Q35_PROF_MTP ? "MTP head" : "passes",
                rows >= Q35_PROF_VISION ? rows - Q35_PROF_VISION : rows >= Q35_PROF_MTP ? rows - Q35_PROF_MTP : rows,
                rows >= Q35_PROF_VISION ? "images" : "rows", (long long)p->shape[s].passes, 1e6 * pass_s / passes);
        for (int32_t i = 0; i < p->n; i++) {
            if (p->row[i].rows != rows || !strcmp(p->row[i].what, "pass")) continue;
            fprintf(f, "  %-48s %6.1f calls %10.1f us %5.1f%%", p->row[i].what, p->row[i].calls / passes,
                    1e6 * p->row[i].seconds / passes, pass_s > 0 ? 100.0 * p->row[i].seconds / pass_s : 0.0);
            if (p->row[i].bytes > 0 && p->row[i].seconds > 0)
                fprintf(f, " %7.1f GB/s", p->row[i].bytes / p->row[i].seconds / 1e9);
            fputc('\n', f);
        }
    }
    if (p->dropped) fprintf(f, "profile: %lld entries did not fit its table and are left out\n", (long long)p->dropped);
    free(p);
}
