/* ref.c: the scalar reference backend. The host backend's blocks (cpu.h)
 * over the reference kernels (kernels/ref.c: plain loops, double sums) on
 * one thread: no instruction-set paths, no pool. It is the oracle a fast
 * backend is compared against through the same seam, and the proof that
 * everything above the seam (sessions, speculation, snapshots, the server)
 * needs nothing but backend.h: the whole test suite runs against it with
 * Q35_BACKEND=ref. */
#include "backend/cpu/cpu.h"

q35_status q35_backend_ref_open(const q35_config *c, const q35_weights *w, int32_t n_threads, q35_backend **out,
                                q35_error *err) {
    (void)n_threads; /* always one */
    const q35_kernels *chosen = NULL;
    /* Q35_KERNELS is checked as everywhere (a misspelt name is an error), but
     * this backend computes with the reference kernels whatever it names */
    q35_status st = q35_kernels_init(&chosen, err);
    if (st) return st;
    return q35_host_backend_open("ref", &q35_kernels_ref, 1, c, w, out, err);
}
