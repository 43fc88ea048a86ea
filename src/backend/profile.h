/* profile.h: where a backend's passes go: a table of timed parts by pass
 * shape, shared by the host backends (Q35_PROFILE=1) and the CUDA backend
 * (Q35_CUDA_PROFILE=1, whose times are device events).
 *
 * Host backends (Q35_PROFILE=1).
 *
 * With the variable set when the backend opens, every matmul hand-off (by
 * matrix role: the tensor's name without its layer number), the norms, the
 * Gated DeltaNet recurrence and the attention core, and each whole layer
 * and pass are timed on the calling thread, by the pass's row count. When
 * the backend closes, a table goes to stderr: calls and microseconds per
 * pass, each matrix's GB/s (its bytes over its time), and each part's share
 * of the pass. The matmuls' times include their hand-off to the pool and
 * the wait for its slowest worker, which is what a step pays. */
#ifndef Q35_BACKEND_PROFILE_H
#define Q35_BACKEND_PROFILE_H

#include <stdint.h>
#include <stdio.h>

typedef struct q35_prof q35_prof;

/* A profile if Q35_PROFILE is set (and not "0"), else NULL. */
q35_prof *q35_prof_open(void);
/* An empty profile (NULL when out of memory). */
q35_prof *q35_prof_new(void);
#define Q35_PROF_MTP 100000    /* rows + this: the MTP head's runs */
#define Q35_PROF_VISION 200000 /* images + this: the vision tower's */

/* Adds one timed call of `what` (copied, up to 63 characters) to the rows'
 * table; bytes: what it read (matrices), or 0. what == NULL with rows:
 * counts a pass of that many rows. */
void q35_prof_add(q35_prof *p, int32_t rows, const char *what, double bytes, double seconds);
/* A matrix's role: its name without the layer or block prefix
 * ("mlp.down_proj"; the MTP layer's keep "mtp.", the vision tower's
 * "visual."), into out. */
void q35_prof_role(const char *tensor_name, char *out, size_t size);
/* Writes the table (nothing if no pass was timed); frees p. */
void q35_prof_close(q35_prof *p, FILE *f);

#endif
