/* Matrix products on CUDA through cuBLASLt, as kernels: a plan (matmul descriptor, layouts,
 * algorithm) for one zr_gemm_desc, run with a handle and a workspace the caller owns; the k = 0
 * product; the bias helpers (fill_rows, sum_cols). Row-major, the transposition flags and leading
 * dimensions of kernels/cpu/matmul.h. bf16/f16 inputs accumulate in f32, f32 stays exact f32 (no
 * TF32), f64 is f64. No state here: the handle, the workspace, the plan cache and the autotuning
 * are runtime/cuda/blas_plan.c, which also has the public gemm_cuda / linear_*_cuda. Every call
 * returns 0, or -1 with zr_error set naming the shapes. */
#ifndef ZR_CUDA_MATMUL_H
#define ZR_CUDA_MATMUL_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "../base/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The general form: `batch` products C_i = alpha op(A_i) op(B_i) + beta C_i (+ bias), with
 * A_i = a + i * stride_a elements (stride 0 broadcasts one matrix to every batch item), etc.
 * bias: NULL or (n) in c_dtype, added to every row of every C_i (cuBLASLt's bias epilogue, so
 * Linear's bias costs no extra pass). a and b share ab_dtype; c_dtype may differ (e.g. bf16
 * inputs with an f32 output).
 * epilogue ZR_GEMM_EPI_GELU_AUX (one product, batch 1; bf16/f16/f32): C = gelu_tanh(product + bias)
 * and aux (m rows of ld_aux elements, c_dtype; ld_aux a multiple of 8) = product + bias, the GELU's
 * input kept for backward (cuBLASLt's GELU_AUX(_BIAS) epilogue, the tanh approximation).
 * epilogue ZR_GEMM_EPI_DGELU (batch 1; bias NULL; beta 0): C = product ⊙ gelu_tanh'(aux), aux (m rows of
 * ld_aux, c_dtype) the GELU's input saved by GELU_AUX (cuBLASLt's DGELU). No bias-gradient epilogue:
 * DGELU_BGRAD and BGRADB measured slower than the product plus sum_cols at GPT-2's shapes on an H200
 * (tests/bench/RESULTS.md). */
enum { ZR_GEMM_EPI_NONE = 0, ZR_GEMM_EPI_GELU_AUX = 1, ZR_GEMM_EPI_DGELU = 2 };
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
    int epilogue; /* ZR_GEMM_EPI_* (0: none; the bias alone needs none) */
    void *aux;
    int64_t ld_aux;
} zr_gemm_desc;

/* A plan: cuBLASLt's A is our B and its B our A (column-major views of row-major data). */
typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo; /* chosen by the caller (heuristic, autotuning) */
} zr_gemm_plan;
/* Creates the descriptor (with the bias or GELU epilogue as g asks) and the three layouts for g's
 * shape, dtypes and flags; algo is left zero. On error nothing is left to destroy. dev only
 * names the device in messages. */
int gemm_plan_init_cuda(zr_gemm_plan *p, const zr_gemm_desc *g, int dev);
void gemm_plan_destroy_cuda(zr_gemm_plan *p);
/* Runs p for g's pointers (bias and aux pointers set per call) with handle h and workspace ws (ws_bytes,
 * no more than the plan's algorithm was chosen for). */
int gemm_plan_run_cuda(cublasLtHandle_t h, zr_gemm_plan *p, const zr_gemm_desc *g, void *ws,
                       size_t ws_bytes, int dev, cudaStream_t stream);
/* The k == 0 product: C = beta * C (+ bias), no cuBLASLt. */
int gemm_k0_cuda(const zr_gemm_desc *g, cudaStream_t stream);
/* Sets zr_error for a failed cuBLASLt call (status: a cublasStatus_t) naming g's shapes; -1. */
int gemm_lt_error_cuda(int status, const char *what, const zr_gemm_desc *g, int dev);

/* y (rows, cols) contiguous: every row = bias (cols). */
int fill_rows_cuda(void *y, const void *bias, int64_t rows, int64_t cols, zr_dtype dt,
                   cudaStream_t stream);
/* out (cols) = sum over rows of x (rows, cols) contiguous (the bias gradient); f64 accumulation,
 * deterministic. Many rows take two passes through f64 partials in `workspace`, of
 * sum_cols_workspace_size(rows, cols) bytes (0: none needed, workspace may be NULL). */
size_t sum_cols_workspace_size(int64_t rows, int64_t cols);
int sum_cols_cuda(void *out, const void *x, int64_t rows, int64_t cols, zr_dtype dt, void *workspace,
                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
