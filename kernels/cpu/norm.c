/* CPU reference for RMSNorm and LayerNorm, forward and backward (fp32 or fp64 per real.h).
 * Statistics are accumulated in double for both precisions (in vector lanes: a fixed order, not
 * the threads'); OpenMP over rows, and over column blocks for the weight/bias gradients (so no
 * reduction across threads is needed). */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

#define PAR_ROWS _Pragma("omp parallel for schedule(static) if (N * D > 32768)")
/* The weight/bias gradients: blocks of COLS columns a thread, each summed over the rows in order
 * (row by row in vector lanes: contiguous loads, not a column's stride-D walk). */
#define COLS 64
#define PAR_COLS _Pragma("omp parallel for schedule(static) if (N * D > 32768)")

void K(rmsnorm_forward_cpu)(real *y, real *rstd, const real *x, const real *w, int64_t N, int64_t D,
                            double eps) {
    PAR_ROWS for (int64_t r = 0; r < N; r++) {
        const real *xr = x + r * D;
        real *yr = y + r * D;
        double ss = 0;
        _Pragma("omp simd reduction(+ : ss)")
        for (int64_t j = 0; j < D; j++) ss += (double)xr[j] * (double)xr[j];
        real rs = (real)(1.0 / sqrt(ss / (double)D + eps));
        rstd[r] = rs;
        if (w)
            for (int64_t j = 0; j < D; j++) yr[j] = xr[j] * rs * w[j];
        else
            for (int64_t j = 0; j < D; j++) yr[j] = xr[j] * rs;
    }
}

/* y = x r w with r = (mean x^2 + eps)^-1/2:  dx = r (g - xhat * mean(g . xhat)), g = dy * w,
 * xhat = x r;  dw = sum_rows dy * xhat. */
void K(rmsnorm_backward_cpu)(real *dx, real *dw, const real *dy, const real *x, const real *w,
                             const real *rstd, int64_t N, int64_t D) {
    if (dx) {
        PAR_ROWS for (int64_t r = 0; r < N; r++) {
            const real *xr = x + r * D, *gr = dy + r * D;
            real *dr = dx + r * D;
            double rs = rstd[r], dot = 0;
            _Pragma("omp simd reduction(+ : dot)")
            for (int64_t j = 0; j < D; j++) dot += (double)gr[j] * (w ? (double)w[j] : 1.0) * xr[j] * rs;
            double c = dot / (double)D;
            _Pragma("omp simd")
            for (int64_t j = 0; j < D; j++) {
                double g = (double)gr[j] * (w ? (double)w[j] : 1.0);
                dr[j] = (real)(rs * (g - (double)xr[j] * rs * c));
            }
        }
    }
    if (dw) {
        PAR_COLS for (int64_t j0 = 0; j0 < D; j0 += COLS) {
            int64_t n = D - j0 < COLS ? D - j0 : COLS;
            double s[COLS] = {0};
            for (int64_t r = 0; r < N; r++) {
                const real *gr = dy + r * D + j0, *xr = x + r * D + j0;
                double rs = rstd[r];
                _Pragma("omp simd")
                for (int64_t j = 0; j < n; j++) s[j] += (double)gr[j] * xr[j] * rs;
            }
            for (int64_t j = 0; j < n; j++) dw[j0 + j] = (real)s[j];
        }
    }
}

void K(layernorm_forward_cpu)(real *y, real *mean, real *rstd, const real *x, const real *w,
                              const real *b, int64_t N, int64_t D, double eps) {
    PAR_ROWS for (int64_t r = 0; r < N; r++) {
        const real *xr = x + r * D;
        real *yr = y + r * D;
        double s = 0, v = 0;
        _Pragma("omp simd reduction(+ : s)")
        for (int64_t j = 0; j < D; j++) s += xr[j];
        double m = s / (double)D;
        _Pragma("omp simd reduction(+ : v)")
        for (int64_t j = 0; j < D; j++) v += ((double)xr[j] - m) * ((double)xr[j] - m);
        double rs = 1.0 / sqrt(v / (double)D + eps);
        mean[r] = (real)m;
        rstd[r] = (real)rs;
        _Pragma("omp simd")
        for (int64_t j = 0; j < D; j++) {
            double h = ((double)xr[j] - m) * rs;
            yr[j] = (real)(h * (w ? (double)w[j] : 1.0) + (b ? (double)b[j] : 0.0));
        }
    }
}

/* xhat = (x - mean) r, g = dy * w:  dx = r (g - mean(g) - xhat * mean(g . xhat));
 * dw = sum_rows dy * xhat, db = sum_rows dy. */
void K(layernorm_backward_cpu)(real *dx, real *dw, real *db, const real *dy, const real *x,
                               const real *w, const real *mean, const real *rstd, int64_t N,
                               int64_t D) {
    if (dx) {
        PAR_ROWS for (int64_t r = 0; r < N; r++) {
            const real *xr = x + r * D, *gr = dy + r * D;
            real *dr = dx + r * D;
            double m = mean[r], rs = rstd[r], sg = 0, sgx = 0;
            _Pragma("omp simd reduction(+ : sg, sgx)")
            for (int64_t j = 0; j < D; j++) {
                double g = (double)gr[j] * (w ? (double)w[j] : 1.0);
                sg += g;
                sgx += g * ((double)xr[j] - m) * rs;
            }
            sg /= (double)D;
            sgx /= (double)D;
            _Pragma("omp simd")
            for (int64_t j = 0; j < D; j++) {
                double g = (double)gr[j] * (w ? (double)w[j] : 1.0);
                dr[j] = (real)(rs * (g - sg - ((double)xr[j] - m) * rs * sgx));
            }
        }
    }
    if (dw || db) {
        PAR_COLS for (int64_t j0 = 0; j0 < D; j0 += COLS) {
            int64_t n = D - j0 < COLS ? D - j0 : COLS;
            double sw[COLS] = {0}, sb[COLS] = {0};
            for (int64_t r = 0; r < N; r++) {
                const real *gr = dy + r * D + j0, *xr = x + r * D + j0;
                double m = mean[r], rs = rstd[r];
                _Pragma("omp simd")
                for (int64_t j = 0; j < n; j++) {
                    double g = gr[j];
                    sw[j] += g * ((double)xr[j] - m) * rs;
                    sb[j] += g;
                }
            }
            for (int64_t j = 0; j < n; j++) {
                if (dw) dw[j0 + j] = (real)sw[j];
                if (db) db[j0 + j] = (real)sb[j];
            }
        }
    }
}

void K(scale_cols_cpu)(real *y, const real *w, int64_t N, int64_t D) {
    PAR_ROWS for (int64_t r = 0; r < N; r++)
        for (int64_t j = 0; j < D; j++) y[r * D + j] *= w[j];
}
