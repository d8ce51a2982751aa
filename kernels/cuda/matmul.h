/* Matrix products on CUDA through cuBLASLt: twins of kernels/cpu/matmul.h (row-major, the same
 * transposition flags and leading dimensions), plus a strided-batched form with a bias epilogue
 * and a separate output dtype. bf16/f16 inputs accumulate in f32, f32 stays exact f32 (no TF32),
 * f64 is f64. The cuBLASLt handle, a 32 MiB workspace (from the caching allocator) and the
 * matmul descriptors with their chosen algorithm are kept per device and per shape, so a repeated
 * shape costs one cache lookup. Calls for one device must come from one stream at a time (the
 * workspace is shared). Every call returns 0, or -1 with zr_error set naming the shapes.
 * The current device must be the one that holds the pointers (zr_cuda_stream(dev) sets it). */
#ifndef ZR_CUDA_MATMUL_H
#define ZR_CUDA_MATMUL_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "../base/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* C (m,n) = alpha * op(A) · op(B) + beta * C, all row-major, a/b/c of dtype dt (see gemm_cpu:
 * ta == 0: A is (m,k) with row stride lda; ta != 0: A is (k,m) read transposed; likewise B).
 * beta == 0 overwrites C without reading it. */
int gemm_cuda(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const void *a,
              int64_t lda, const void *b, int64_t ldb, double beta, void *c, int64_t ldc,
              zr_dtype dt, cudaStream_t stream);

/* The general form: `batch` products C_i = alpha op(A_i) op(B_i) + beta C_i (+ bias), with
 * A_i = a + i * stride_a elements (stride 0 broadcasts one matrix to every batch item), etc.
 * bias: NULL or (n) in c_dtype, added to every row of every C_i (cuBLASLt's bias epilogue, so
 * Linear's bias costs no extra pass). a and b share ab_dtype; c_dtype may differ (e.g. bf16
 * inputs with an f32 output). */
typedef struct {
    int ta, tb;
    int64_t m, n, k;
    const void *a;
    int64_t lda, stride_a;
    const void *b;
    int64_t ldb, stride_b;
    void *c;
    int64_t ldc, stride_c;
    int64_t batch;
    const void *bias;
    double alpha, beta;
    zr_dtype ab_dtype, c_dtype;
} zr_gemm_desc;
int gemm_ex_cuda(const zr_gemm_desc *g, cudaStream_t stream);

/* y (rows, cols) contiguous: every row = bias (cols). */
int fill_rows_cuda(void *y, const void *bias, int64_t rows, int64_t cols, zr_dtype dt,
                   cudaStream_t stream);
/* out (cols) = sum over rows of x (rows, cols) contiguous (the bias gradient); f64 accumulation,
 * deterministic. */
int sum_cols_cuda(void *out, const void *x, int64_t rows, int64_t cols, zr_dtype dt,
                  cudaStream_t stream);

/* nn.Linear on contiguous tensors of one dtype: y (rows, out) = x (rows, in) · wᵀ (+ bias (out),
 * through the epilogue: no separate pass). w is (out, in) row-major as stored. */
int linear_forward_cuda(void *y, const void *x, const void *w, const void *bias, int64_t rows,
                        int64_t in, int64_t out, zr_dtype dt, cudaStream_t stream);
/* Its backward: dx (rows, in) = g (rows, out) · w; dw (out, in) = gᵀ · x, added into dw when
 * accumulate != 0 (beta = 1) else overwritten; db (out) = column sums of g. NULL skips one. */
int linear_backward_cuda(void *dx, void *dw, void *db, const void *g, const void *x, const void *w,
                         int64_t rows, int64_t in, int64_t out, int accumulate, zr_dtype dt,
                         cudaStream_t stream);

/* Drops the cached descriptors and workspaces (tests; before cudaDeviceReset). */
void zr_matmul_cuda_release(void);

#ifdef __cplusplus
}
#endif

#endif
