/* CPU reference for embedding lookup (row gather) and its backward (deterministic scatter-add
 * into a dense weight gradient). fp32 or fp64 per real.h; OpenMP. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

#include <string.h>

void K(embedding_forward_cpu)(real *out, const real *w, const int64_t *ids, int64_t n, int64_t d) {
#pragma omp parallel for schedule(static) if (n * d > 65536)
    for (int64_t i = 0; i < n; i++) memcpy(out + i * d, w + ids[i] * d, (size_t)d * sizeof(real));
}

void K(embedding_backward_cpu)(real *gw, const real *g, const int64_t *ids, int64_t n, int64_t d) {
    /* Column chunks of 64 elements (whole cache lines) are owned by one thread each; within a
     * chunk the ids are visited in order, so repeated ids always sum in the same order. */
    int64_t nchunk = (d + 63) / 64;
#pragma omp parallel for schedule(static) if (n * d > 65536)
    for (int64_t ch = 0; ch < nchunk; ch++) {
        int64_t j0 = ch * 64, j1 = j0 + 64 < d ? j0 + 64 : d;
        for (int64_t i = 0; i < n; i++) {
            real *dst = gw + ids[i] * d;
            const real *src = g + i * d;
            for (int64_t j = j0; j < j1; j++) dst[j] += src[j];
        }
    }
}
