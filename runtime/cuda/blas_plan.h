/* Matrix products on CUDA tensors' memory: twins of kernels/cpu/matmul.h through cuBLASLt. This
 * is the state the GEMM kernels (kernels/cuda/matmul.h) do not keep: per device a cuBLASLt handle
 * and a 32 MiB workspace (from the caching allocator), and per shape a plan with its chosen
 * algorithm (autotuned for large shapes), so a repeated shape costs one cache lookup. Calls for one
 * device must come from one stream at a time (the workspace is shared). Every call returns 0, or
 * -1 with zr_error set naming the shapes. The current device must be the one that holds the
 * pointers (zr_cuda_stream(dev) sets it). CUDA builds only. */
#ifndef ZR_CUDA_BLAS_PLAN_H
#define ZR_CUDA_BLAS_PLAN_H

#include "kernels/cuda/matmul.h"

/* C (m,n) = alpha * op(A) · op(B) + beta * C, all row-major, a/b/c of dtype dt (see gemm_cpu:
 * ta == 0: A is (m,k) with row stride lda; ta != 0: A is (k,m) read transposed; likewise B).
 * beta == 0 overwrites C without reading it. */
int gemm_cuda(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const void *a,
              int64_t lda, const void *b, int64_t ldb, double beta, void *c, int64_t ldc,
              zr_dtype dt, cudaStream_t stream);
/* The general form (zr_gemm_desc: batched, bias epilogue, separate output dtype). */
int gemm_ex_cuda(const zr_gemm_desc *g, cudaStream_t stream);

/* nn.Linear on contiguous tensors of one dtype: y (rows, out) = x (rows, in) · wᵀ (+ bias (out),
 * through the epilogue: no separate pass). w is (out, in) row-major as stored. */
int linear_forward_cuda(void *y, const void *x, const void *w, const void *bias, int64_t rows,
                        int64_t in, int64_t out, zr_dtype dt, cudaStream_t stream);
/* The product through the GELU epilogue (zr_linear_gelu): pre (rows, out) = x · wt (+ bias) and
 * y (rows, out) = gelu_tanh(pre), one pass. wt is wᵀ (in, out) read as gemm_cuda's B: stored
 * (in, out) with row stride ldwt when wt_trans == 0, (out, in) when wt_trans != 0. in >= 1, out a
 * multiple of 8 (cuBLASLt's aux leading dimension), dt bf16, f16 or f32. */
int linear_gelu_forward_cuda(void *y, void *pre, const void *x, const void *wt, int wt_trans,
                             int64_t ldwt, const void *bias, int64_t rows, int64_t in, int64_t out,
                             zr_dtype dt, cudaStream_t stream);
/* The MLP's hidden gradient through the dGELU epilogue (zr_mlp_gelu's backward): dpre (rows, in) =
 * (g (rows, out) · w) ⊙ gelu_tanh'(pre), pre (rows, in) the GELU's input that
 * linear_gelu_forward_cuda kept. w is the next linear's weight (out, in) read as gemm_cuda's B:
 * stored (out, in) with row stride ldw when w_trans == 0, (in, out) when w_trans != 0. out >= 1,
 * in a multiple of 8, dt bf16, f16 or f32. */
int linear_dgelu_cuda(void *dpre, const void *g, const void *w, int w_trans, int64_t ldw,
                      const void *pre, int64_t rows, int64_t in, int64_t out, zr_dtype dt,
                      cudaStream_t stream);
/* linear_forward_cuda's backward: dx (rows, in) = g (rows, out) · w; dw (out, in) = gᵀ · x, added into dw when
 * accumulate != 0 (beta = 1) else overwritten; db (out) = column sums of g. NULL skips one. */
int linear_backward_cuda(void *dx, void *dw, void *db, const void *g, const void *x, const void *w,
                         int64_t rows, int64_t in, int64_t out, int accumulate, zr_dtype dt,
                         cudaStream_t stream);
/* db (cols) = column sums of g (rows, cols) (sum_cols_cuda with its workspace from the caching
 * allocator). */
int linear_bias_grad_cuda(void *db, const void *g, int64_t rows, int64_t cols, zr_dtype dt,
                          cudaStream_t stream);

/* Drops the cached plans and workspaces (tests; before cudaDeviceReset). */
void zr_matmul_cuda_release(void);

#endif
