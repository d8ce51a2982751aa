/* matmul kernels: declarations over real/K(), see kernels.h. Row-major GEMM with transposition
 * flags (OpenBLAS when built with ZR_HAVE_OPENBLAS, else a blocked C kernel), plus the small
 * row/column helpers linear needs. */

/* C (m,n) = alpha * op(A) · op(B) + beta * C, all row-major.
 * op(A) is (m,k): when ta == 0, A is an (m,k) matrix with row stride lda (lda >= max(1,k));
 * when ta != 0, A is a (k,m) matrix with row stride lda (lda >= max(1,m)) read transposed.
 * Likewise op(B) is (k,n) from a (k,n) (tb == 0, ldb >= n) or an (n,k) (tb != 0, ldb >= k) matrix.
 * ldc >= max(1,n). beta == 0 overwrites C without reading it. */
void K(gemm_cpu)(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const real *a,
                 int64_t lda, const real *b, int64_t ldb, double beta, real *c, int64_t ldc);
/* y (rows, cols) contiguous: every row = bias (cols). */
void K(fill_rows_cpu)(real *y, const real *bias, int64_t rows, int64_t cols);
/* out (cols) = sum over rows of x (rows, cols) contiguous (the bias gradient); deterministic. */
void K(sum_cols_cpu)(real *out, const real *x, int64_t rows, int64_t cols);
