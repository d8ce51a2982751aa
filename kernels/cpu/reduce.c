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

/* Each row's max and its first index, as torch's max(dim): the first of equal maxima, and a NaN
 * wins (the first one). By chunks of MAX_CHUNK in vector lanes (each chunk's max and whether it holds
 * a NaN), then the first index of the max inside the first chunk that has it. */
#define MAX_CHUNK 64
static int64_t row_argmax(const real *row, int64_t r) {
    int64_t bc = 0;
    real best = 0;
    for (int64_t c0 = 0; c0 < r; c0 += MAX_CHUNK) {
        int64_t n = r - c0 < MAX_CHUNK ? r - c0 : MAX_CHUNK;
        const real *p = row + c0;
        real m = p[0];
        int nan = 0;
        _Pragma("omp simd reduction(max : m) reduction(| : nan)")
        for (int64_t j = 0; j < n; j++) {
            m = p[j] > m ? p[j] : m;
            nan |= p[j] != p[j];
        }
        if (nan)
            for (int64_t j = 0;; j++)
                if (p[j] != p[j]) return c0 + j;
        if (c0 == 0 || m > best) best = m, bc = c0;
    }
    for (int64_t j = bc;; j++)
        if (row[j] == best) return j;
}

/* (r > 0: the op refuses an empty dim) */
void K(reduce_max_rows_cpu)(real *out, int64_t *idx, const real *x, int64_t outer, int64_t r) {
#pragma omp parallel for schedule(static) if (outer * r > 32768)
    for (int64_t o = 0; o < outer; o++) {
        const real *row = x + o * r;
        int64_t mi = row_argmax(row, r);
        out[o] = row[mi];
        if (idx) idx[o] = mi;
    }
}

void K(reduce_max_rows_backward_cpu)(real *gx, const real *g, const int64_t *idx, int64_t outer, int64_t r) {
    memset(gx, 0, (size_t)(outer * r) * sizeof(real));
    for (int64_t o = 0; o < outer; o++) gx[o * r + idx[o]] = g[o];
}
