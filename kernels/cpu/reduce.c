/* CPU reference for row reductions (sum with pairwise-blocked accumulation, max with argmax).
 * The ops layer permutes reduced dims to the end so every reduction is over contiguous rows. */
#include <string.h>

#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

/* Sums n values in blocks so fp32 error grows like sqrt(n/block) rather than n. */
static real sum_blocked(const real *x, int64_t n) {
    double total = 0;
    for (int64_t s = 0; s < n; s += 256) {
        int64_t e = s + 256 < n ? s + 256 : n;
        real acc = 0;
        for (int64_t i = s; i < e; i++) acc += x[i];
        total += acc;
    }
    return (real)total;
}

void K(reduce_sum_rows_cpu)(real *out, const real *x, int64_t outer, int64_t r) {
    if (outer == 1) { /* one long row: parallelise inside it */
        int nt = 1;
#ifdef _OPENMP
        nt = r > 65536 ? 64 : 1;
#endif
        double parts[64] = {0};
        int64_t chunk = (r + nt - 1) / nt;
#pragma omp parallel for if (nt > 1)
        for (int t = 0; t < nt; t++) {
            int64_t s = t * chunk, e = s + chunk < r ? s + chunk : r;
            if (s < e) parts[t] = sum_blocked(x + s, e - s);
        }
        double total = 0;
        for (int t = 0; t < nt; t++) total += parts[t];
        out[0] = (real)total;
        return;
    }
#pragma omp parallel for schedule(static) if (outer * r > 32768)
    for (int64_t o = 0; o < outer; o++) out[o] = sum_blocked(x + o * r, r);
}

void K(reduce_max_rows_cpu)(real *out, int64_t *idx, const real *x, int64_t outer, int64_t r) {
#pragma omp parallel for schedule(static) if (outer * r > 32768)
    for (int64_t o = 0; o < outer; o++) {
        const real *row = x + o * r;
        real m = row[0];
        int64_t mi = 0;
        for (int64_t i = 1; i < r && m == m; i++) /* a NaN wins and stops the scan, like torch */
            if (row[i] > m || row[i] != row[i]) {
                m = row[i];
                mi = i;
            }
        out[o] = m;
        if (idx) idx[o] = mi;
    }
}

void K(reduce_max_rows_backward_cpu)(real *gx, const real *g, const int64_t *idx, int64_t outer, int64_t r) {
    memset(gx, 0, (size_t)(outer * r) * sizeof(real));
    for (int64_t o = 0; o < outer; o++) gx[o * r + idx[o]] = g[o];
}
