// cuBLASLt matrix products (see matmul.h). Row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B^T) op(A^T): cuBLASLt's "A" is our B and its "B" is our A, with no data
// movement. A plan (descriptor, layouts, algorithm) is built and run here; the handle, the
// workspace and the cache of plans per shape belong to the caller (runtime/cuda/blas_plan.c).
#include <cublasLt.h>
#include <string.h>

#include "common.cuh"
#include "matmul.h"

using namespace zrk;

namespace {

cudaDataType_t cuda_type(zr_dtype t) {
    switch (t) {
    case ZR_BF16: return CUDA_R_16BF;
    case ZR_F16: return CUDA_R_16F;
    case ZR_F64: return CUDA_R_64F;
    default: return CUDA_R_32F;
    }
}

#define LT(expr, what)                                                                            \
    do {                                                                                          \
        cublasStatus_t s_ = (expr);                                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS) return gemm_lt_error_cuda(s_, what, g, dev);              \
    } while (0)

int layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
           int64_t stride, const zr_gemm_desc *g, int dev) {
    LT(cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld), "layout");
    if (batch > 1) {
        int32_t b = (int32_t)batch;
        LT(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b), "layout batch");
        LT(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
           "layout stride");
    }
    return 0;
}

// C (batch of (m, n) with row stride ldc) = beta * C (+ bias): the k == 0 product.
template <typename T>
__global__ void scale_bias_kernel(T *c, const T *bias, int64_t m, int64_t n, int64_t ldc, int64_t sc, int64_t batch,
                                  double beta) {
    typedef typename acc<T>::type A;
    int64_t total = batch * m * n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t col = i % n, row = (i / n) % m, b = i / (n * m);
        T *p = c + b * sc + row * ldc + col;
        A v = beta == 0 ? (A)0 : (A)beta * to_acc(*p);
        if (bias) v += to_acc(bias[col]);
        *p = from_acc<T>(v);
    }
}
template <typename T> int scale_bias(const zr_gemm_desc *g, cudaStream_t s) {
    scale_bias_kernel<T><<<grid_for(g->batch * g->m * g->n, 256), 256, 0, s>>>(
        (T *)g->c, (const T *)g->bias, g->m, g->n, g->ldc, g->stride_c, g->batch, g->beta);
    return launch_check("matmul (cuda, k = 0)");
}

template <typename T> __global__ void fill_rows_kernel(T *y, const T *bias, int64_t rows, int64_t cols) {
    int64_t n = rows * cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = bias[i % cols];
}
template <typename T> int fill_rows(void *y, const void *bias, int64_t rows, int64_t cols, cudaStream_t s) {
    fill_rows_kernel<T><<<grid_for(rows * cols, 256), 256, 0, s>>>((T *)y, (const T *)bias, rows, cols);
    return launch_check("fill_rows (cuda)");
}

// Block (32, 8): 32 columns per block, 8 row lanes; f64 partials reduced in shared memory: row y of
// threads adds rows y, y + 8, ... in order, then the eight sums in y order (the same bits every
// run). X is T, or double for the chunked path's partials.
template <typename T, typename X = T>
__global__ void sum_cols_kernel(T *out, const X *__restrict__ x, int64_t rows, int64_t cols) {
    __shared__ double part[8][33];
    int64_t col = (int64_t)blockIdx.x * 32 + threadIdx.x;
    double s = 0;
    if (col < cols)
        for (int64_t r = threadIdx.y; r < rows; r += 8) s += (double)to_acc(x[r * cols + col]);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        double t = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) t += part[k][threadIdx.x];
        out[col] = from_acc<T>((typename acc<T>::type)t);
    }
}
/* Long column sums (the bias gradient of a (B*T, out) activation): rows are cut into chunks, one
 * grid row of blocks per chunk, each writing an f64 partial per column; a second pass adds the
 * partials in chunk order, so the result stays deterministic while every SM has work. Each thread
 * reads V consecutive columns with one 16-byte load when the rows allow (V = 1 otherwise). */
template <typename T, int V>
__global__ void sum_cols_partial_kernel(double *part, const T *__restrict__ x, int64_t rows, int64_t cols,
                                        int64_t rows_per) {
    __shared__ double sh[8][32 * V + 1];
    const int64_t col = ((int64_t)blockIdx.x * 32 + threadIdx.x) * V;
    const int64_t r0 = (int64_t)blockIdx.y * rows_per, r1 = r0 + rows_per < rows ? r0 + rows_per : rows;
    double s[V];
#pragma unroll
    for (int k = 0; k < V; k++) s[k] = 0;
    if (col < cols)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
            const pack<T, V> p = *reinterpret_cast<const pack<T, V> *>(x + r * cols + col);
#pragma unroll
            for (int k = 0; k < V; k++) s[k] += (double)to_acc(p.v[k]);
        }
#pragma unroll
    for (int k = 0; k < V; k++) sh[threadIdx.y][threadIdx.x * V + k] = s[k];
    __syncthreads();
    for (int c = threadIdx.y * 32 + threadIdx.x; c < 32 * V; c += 256) {
        const int64_t gc = (int64_t)blockIdx.x * 32 * V + c;
        if (gc >= cols) continue;
        double t = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) t += sh[k][c];
        part[(int64_t)blockIdx.y * cols + gc] = t;
    }
}
const int64_t SUM_COLS_ROWS = 512; /* rows per chunk of the two-pass path */
int64_t sum_cols_chunks(int64_t rows) {
    int64_t chunks = (rows + SUM_COLS_ROWS - 1) / SUM_COLS_ROWS;
    return chunks <= 1 || chunks > 65535 ? 0 : chunks;
}
template <typename T>
int sum_cols(void *out, const void *x, int64_t rows, int64_t cols, void *workspace, cudaStream_t s) {
    int64_t blocks = (cols + 31) / 32;
    if (blocks > 0x7fffffff) return zr_error("sum_cols (cuda): too many columns");
    const int64_t rows_per = SUM_COLS_ROWS, chunks = sum_cols_chunks(rows);
    if (!chunks) {
        sum_cols_kernel<T><<<(unsigned)blocks, dim3(32, 8), 0, s>>>((T *)out, (const T *)x, rows, cols);
        return launch_check("sum_cols (cuda)");
    }
    double *part = (double *)workspace;
    if (!part) return zr_error("sum_cols (cuda): %lld rows need a workspace of sum_cols_workspace_size bytes",
                               (long long)rows);
    const int V = vec_of<T>::n;
    if (cols % V == 0 && aligned16(x))
        sum_cols_partial_kernel<T, V><<<dim3((unsigned)((cols / V + 31) / 32), (unsigned)chunks), dim3(32, 8), 0, s>>>(
            part, (const T *)x, rows, cols, rows_per);
    else
        sum_cols_partial_kernel<T, 1><<<dim3((unsigned)blocks, (unsigned)chunks), dim3(32, 8), 0, s>>>(
            part, (const T *)x, rows, cols, rows_per);
    int rc = launch_check("sum_cols (cuda)");
    if (!rc) {
        sum_cols_kernel<T, double><<<(unsigned)blocks, dim3(32, 8), 0, s>>>((T *)out, part, chunks, cols);
        rc = launch_check("sum_cols (cuda)");
    }
    return rc;
}

}  // namespace

extern "C" int gemm_lt_error_cuda(int status, const char *what, const zr_gemm_desc *g, int dev) {
    cublasStatus_t s = (cublasStatus_t)status;
    return zr_error("matmul (cuda) on cuda:%d: %s failed: %s (%s); m=%lld n=%lld k=%lld ta=%d tb=%d "
                    "lda=%lld ldb=%lld ldc=%lld batch=%lld %s x %s -> %s",
                    dev, what, cublasLtGetStatusString(s), cublasLtGetStatusName(s), (long long)g->m,
                    (long long)g->n, (long long)g->k, g->ta, g->tb, (long long)g->lda, (long long)g->ldb,
                    (long long)g->ldc, (long long)g->batch, zr_dtype_name(g->ab_dtype),
                    zr_dtype_name(g->ab_dtype), zr_dtype_name(g->c_dtype));
}

extern "C" void gemm_plan_destroy_cuda(zr_gemm_plan *e) {
    if (e->op) cublasLtMatmulDescDestroy(e->op);
    if (e->la) cublasLtMatrixLayoutDestroy(e->la);
    if (e->lb) cublasLtMatrixLayoutDestroy(e->lb);
    if (e->lc) cublasLtMatrixLayoutDestroy(e->lc);
    e->op = NULL, e->la = e->lb = e->lc = NULL;
}

extern "C" int gemm_plan_init_cuda(zr_gemm_plan *e, const zr_gemm_desc *g, int dev) {
    memset(e, 0, sizeof *e);
    int f64 = g->ab_dtype == ZR_F64;
    cublasComputeType_t ct = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
    cudaDataType_t st = f64 ? CUDA_R_64F : CUDA_R_32F, abt = cuda_type(g->ab_dtype), ctp = cuda_type(g->c_dtype);
    LT(cublasLtMatmulDescCreate(&e->op, ct, st), "descriptor");
    cublasOperation_t opa = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    int r = 0;
#define TRY(x)                                                                                    \
    if ((r = (x)) != 0) {                                                                         \
        gemm_plan_destroy_cuda(e);                                                                \
        return r;                                                                                 \
    }
    cublasStatus_t s;
    if ((s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa)) ||
        (s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb))) {
        gemm_plan_destroy_cuda(e);
        return gemm_lt_error_cuda(s, "descriptor", g, dev);
    }
    if (g->bias || g->epilogue) {
        if (g->epilogue != ZR_GEMM_EPI_NONE && g->epilogue != ZR_GEMM_EPI_GELU_AUX && g->epilogue != ZR_GEMM_EPI_DGELU) {
            gemm_plan_destroy_cuda(e);
            return zr_error("matmul (cuda): epilogue %d unknown (ZR_GEMM_EPI_NONE, _GELU_AUX or _DGELU)", g->epilogue);
        }
        if (g->epilogue == ZR_GEMM_EPI_DGELU && (g->bias || g->batch > 1 || g->beta != 0)) {
            gemm_plan_destroy_cuda(e);
            return zr_error("matmul (cuda): the dGELU epilogue takes one product, no bias and beta 0");
        }
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        if (g->epilogue == ZR_GEMM_EPI_GELU_AUX) ep = g->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        if (g->epilogue == ZR_GEMM_EPI_DGELU) ep = CUBLASLT_EPILOGUE_DGELU;
        cudaDataType_t bt = ctp;
        s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep);
        if (!s && g->bias) s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
        // the aux pointer is set here too: the algorithm search reads its alignment
        if (!s && g->epilogue)
            s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g->ld_aux, sizeof g->ld_aux);
        if (!s && g->epilogue)
            s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux, sizeof g->aux);
        if (s) {
            gemm_plan_destroy_cuda(e);
            return gemm_lt_error_cuda(s, g->epilogue ? "gelu epilogue" : "bias epilogue", g, dev);
        }
    }
    // cuBLASLt's A = our B, its B = our A, its C = our C (all column-major views).
    e->la = e->lb = e->lc = NULL;
    TRY(layout(&e->la, abt, g->tb ? g->k : g->n, g->tb ? g->n : g->k, g->ldb, g->batch, g->stride_b, g, dev));
    TRY(layout(&e->lb, abt, g->ta ? g->m : g->k, g->ta ? g->k : g->m, g->lda, g->batch, g->stride_a, g, dev));
    TRY(layout(&e->lc, ctp, g->n, g->m, g->ldc, g->batch, g->stride_c, g, dev));
    return 0;
#undef TRY
}

extern "C" int gemm_k0_cuda(const zr_gemm_desc *g, cudaStream_t stream) {
    if (g->epilogue) return zr_error("matmul (cuda): k = 0 has no GELU or dGELU epilogue; run the product and gelu apart");
    if (g->ab_dtype != g->c_dtype && g->bias) return zr_error("matmul (cuda): k = 0 with a bias needs one dtype");
    ZRK_DISPATCH_FLOAT(g->c_dtype, "matmul (cuda)", scale_bias, g, stream)
}

extern "C" int gemm_plan_run_cuda(cublasLtHandle_t h, zr_gemm_plan *e, const zr_gemm_desc *g, void *ws,
                                  size_t ws_bytes, int dev, cudaStream_t stream) {
    if (g->bias) {
        cublasStatus_t s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                                          sizeof g->bias);
        if (s) return gemm_lt_error_cuda(s, "bias pointer", g, dev);
    }
    if (g->epilogue) {
        cublasStatus_t s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                                          sizeof g->aux);
        if (s) return gemm_lt_error_cuda(s, "aux pointer", g, dev);
    }
    float af = (float)g->alpha, bf = (float)g->beta;
    const void *alpha = &af, *beta = &bf;
    if (g->ab_dtype == ZR_F64) alpha = &g->alpha, beta = &g->beta;
    cublasStatus_t s = cublasLtMatmul(h, e->op, alpha, g->b, e->la, g->a, e->lb, beta, g->c, e->lc, g->c, e->lc,
                                      &e->algo, ws, ws_bytes, stream);
    if (s != CUBLAS_STATUS_SUCCESS) return gemm_lt_error_cuda(s, "cublasLtMatmul", g, dev);
    return launch_check("matmul (cuda)");
}

extern "C" int fill_rows_cuda(void *y, const void *bias, int64_t rows, int64_t cols, zr_dtype dt, cudaStream_t stream) {
    if (rows * cols <= 0) return 0;
    ZRK_DISPATCH_FLOAT(dt, "fill_rows (cuda)", fill_rows, y, bias, rows, cols, stream)
}

extern "C" size_t sum_cols_workspace_size(int64_t rows, int64_t cols) {
    return cols > 0 ? (size_t)(sum_cols_chunks(rows) * cols) * sizeof(double) : 0;
}

extern "C" int sum_cols_cuda(void *out, const void *x, int64_t rows, int64_t cols, zr_dtype dt, void *workspace,
                             cudaStream_t stream) {
    if (cols <= 0) return 0;
    ZRK_DISPATCH_FLOAT(dt, "sum_cols (cuda)", sum_cols, out, x, rows, cols, workspace, stream)
}
