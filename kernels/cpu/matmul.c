/* CPU GEMM with transposition flags: OpenBLAS cblas_{s,d}gemm when built with ZR_HAVE_OPENBLAS,
 * otherwise (or for sizes beyond BLAS's 32-bit ints) a cache-blocked C kernel with OpenMP.
 * Also the bias helpers of linear. fp32 or fp64 per real.h; no allocation. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

#include <limits.h>
#include <string.h>

#ifdef ZR_HAVE_OPENBLAS
#include <cblas.h>
#endif

/* Blocked fallback. Tiles of op(A) (MB x KB) and op(B) (KB x NB) are packed into contiguous
 * stack buffers (which also absorbs the transposition), and each thread owns whole C tiles, so
 * no two threads write the same element. Stack per thread: MB*KB + KB*NB + MB*NB reals
 * (96 KiB f32, 192 KiB f64). */
enum { MB = 32, NB = 128, KB = 128 };

static void gemm_blocked(int ta, int tb, int64_t m, int64_t n, int64_t k, real alpha,
                         const real *a, int64_t lda, const real *b, int64_t ldb, real beta, real *c,
                         int64_t ldc) {
    int64_t mt = (m + MB - 1) / MB, nt = (n + NB - 1) / NB;
#pragma omp parallel for schedule(dynamic) if (m * n * k > 32768)
    for (int64_t t = 0; t < mt * nt; t++) {
        int64_t i0 = (t / nt) * MB, j0 = (t % nt) * NB;
        int64_t mb = m - i0 < MB ? m - i0 : MB, nb = n - j0 < NB ? n - j0 : NB;
        real ap[MB * KB], bp[KB * NB], acc[MB * NB];
        for (int64_t i = 0; i < mb * NB; i++) acc[i] = 0;
        for (int64_t k0 = 0; k0 < k; k0 += KB) {
            int64_t kb = k - k0 < KB ? k - k0 : KB;
            for (int64_t i = 0; i < mb; i++) /* ap[i][kk] = op(A)(i0+i, k0+kk) */
                for (int64_t kk = 0; kk < kb; kk++)
                    ap[i * KB + kk] = ta ? a[(k0 + kk) * lda + i0 + i] : a[(i0 + i) * lda + k0 + kk];
            for (int64_t kk = 0; kk < kb; kk++) /* bp[kk][j] = op(B)(k0+kk, j0+j) */
                for (int64_t j = 0; j < nb; j++)
                    bp[kk * NB + j] = tb ? b[(j0 + j) * ldb + k0 + kk] : b[(k0 + kk) * ldb + j0 + j];
            for (int64_t i = 0; i < mb; i++) {
                real *ci = acc + i * NB;
                for (int64_t kk = 0; kk < kb; kk++) {
                    real av = ap[i * KB + kk];
                    const real *bk = bp + kk * NB;
                    for (int64_t j = 0; j < nb; j++) ci[j] += av * bk[j];
                }
            }
        }
        for (int64_t i = 0; i < mb; i++) {
            real *cr = c + (i0 + i) * ldc + j0;
            const real *ar = acc + i * NB;
            if (beta == 0)
                for (int64_t j = 0; j < nb; j++) cr[j] = alpha * ar[j];
            else
                for (int64_t j = 0; j < nb; j++) cr[j] = alpha * ar[j] + beta * cr[j];
        }
    }
}

void K(gemm_cpu)(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const real *a,
                 int64_t lda, const real *b, int64_t ldb, double beta, real *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) { /* C = beta * C */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0 ? 0 : (real)beta * c[i * ldc + j];
        return;
    }
#ifdef ZR_HAVE_OPENBLAS
    if (m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
        ldc <= INT_MAX) {
        zr_blas_core(); /* (once: OpenBLAS's kernels for this CPU) */
#ifdef ZR_REAL_F64
        cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
#else
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (int)m, (int)n, (int)k, (float)alpha, a, (int)lda, b, (int)ldb, (float)beta, c,
                    (int)ldc);
#endif
        return;
    }
#endif
    gemm_blocked(ta, tb, m, n, k, (real)alpha, a, lda, b, ldb, (real)beta, c, ldc);
}

void K(fill_rows_cpu)(real *y, const real *bias, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (int64_t i = 0; i < rows; i++) memcpy(y + i * cols, bias, (size_t)cols * sizeof(real));
}

void K(sum_cols_cpu)(real *out, const real *x, int64_t rows, int64_t cols) {
    /* Threads own column ranges (multiples of 16 elements: no false sharing) and add the rows in
     * order, so the sum does not depend on the thread count. */
    int64_t nchunk = (cols + 255) / 256;
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (int64_t ch = 0; ch < nchunk; ch++) {
        int64_t j0 = ch * 256, j1 = j0 + 256 < cols ? j0 + 256 : cols;
        for (int64_t j = j0; j < j1; j++) out[j] = 0;
        for (int64_t i = 0; i < rows; i++) {
            const real *xr = x + i * cols;
            for (int64_t j = j0; j < j1; j++) out[j] += xr[j];
        }
    }
}
