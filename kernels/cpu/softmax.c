/* CPU reference for softmax / log_softmax along any dim (cross-entropy, which fuses its own
 * logsumexp, is cross_entropy.c). fp32 or fp64 per real.h; OpenMP over rows. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

/* One softmax "row": r elements at stride s. */
static void row_forward(real *y, const real *x, int64_t r, int64_t s, int is_log) {
    real mx = -REAL_MAX;
    for (int64_t j = 0; j < r; j++)
        if (x[j * s] > mx) mx = x[j * s];
    if (mx == -REAL_MAX) mx = 0; /* all -inf (or empty): avoid inf - inf */
    real sum = 0;
    if (is_log) {
        for (int64_t j = 0; j < r; j++) sum += R_EXP(x[j * s] - mx);
        real lse = mx + R_LOG(sum);
        for (int64_t j = 0; j < r; j++) y[j * s] = x[j * s] - lse;
    } else {
        for (int64_t j = 0; j < r; j++) {
            real e = R_EXP(x[j * s] - mx);
            y[j * s] = e;
            sum += e;
        }
        real inv = (real)1 / sum;
        for (int64_t j = 0; j < r; j++) y[j * s] *= inv;
    }
}

static void row_backward(real *gx, const real *gy, const real *y, int64_t r, int64_t s, int is_log) {
    real dot = 0;
    if (is_log) {
        for (int64_t j = 0; j < r; j++) dot += gy[j * s];
        for (int64_t j = 0; j < r; j++) gx[j * s] = gy[j * s] - R_EXP(y[j * s]) * dot;
    } else {
        for (int64_t j = 0; j < r; j++) dot += gy[j * s] * y[j * s];
        for (int64_t j = 0; j < r; j++) gx[j * s] = y[j * s] * (gy[j * s] - dot);
    }
}

void K(softmax_forward_cpu)(real *y, const real *x, int64_t outer, int64_t r, int64_t inner, int is_log) {
    int64_t rows = outer * inner;
#pragma omp parallel for schedule(static) if (rows * r > 32768)
    for (int64_t q = 0; q < rows; q++) {
        int64_t base = (q / inner) * r * inner + q % inner;
        row_forward(y + base, x + base, r, inner, is_log);
    }
}

void K(softmax_backward_cpu)(real *gx, const real *gy, const real *y, int64_t outer, int64_t r,
                             int64_t inner, int is_log) {
    int64_t rows = outer * inner;
#pragma omp parallel for schedule(static) if (rows * r > 32768)
    for (int64_t q = 0; q < rows; q++) {
        int64_t base = (q / inner) * r * inner + q % inner;
        row_backward(gx + base, gy + base, y + base, r, inner, is_log);
    }
}
