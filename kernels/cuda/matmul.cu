// cuBLASLt matrix products (see matmul.h). Row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B^T) op(A^T): cuBLASLt's "A" is our B and its "B" is our A, with no data
// movement. Descriptors, layouts and the heuristic's algorithm are cached per (device, shape,
// dtypes, flags, pointer alignment) in a small hash table; the bias pointer is set per call.
#include <cublasLt.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "matmul.h"

extern "C" {
#include "../../runtime/cuda/device.h" /* the caching allocator for the workspace (moves to runtime next) */
}

using namespace zrk;

namespace {

const size_t WORKSPACE = (size_t)32 << 20;
const int MAX_DEV = 16;
const int CACHE = 512, PROBE = 8;

struct dev_ctx {
    int ready;
    cublasLtHandle_t h;
    void *ws;
};

struct key {
    int dev, ta, tb, abdt, cdt, has_bias, al_a, al_b, al_c;
    int64_t m, n, k, lda, ldb, ldc, sa, sb, sc, batch;
};

struct entry {
    int used;
    key k;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

dev_ctx ctxs[MAX_DEV];
entry cache[CACHE];
pthread_mutex_t mtx = PTHREAD_MUTEX_INITIALIZER;

zr_device cuda_dev(int i) {
    zr_device d;
    d.type = ZR_CUDA;
    d.index = (int8_t)i;
    return d;
}

int align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && (a % al)) al >>= 1;
    return al;
}

cudaDataType_t cuda_type(zr_dtype t) {
    switch (t) {
    case ZR_BF16: return CUDA_R_16BF;
    case ZR_F16: return CUDA_R_16F;
    case ZR_F64: return CUDA_R_64F;
    default: return CUDA_R_32F;
    }
}

uint64_t hash_key(const key &k) {
    const unsigned char *p = (const unsigned char *)&k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

void destroy_entry(entry *e) {
    if (!e->used) return;
    if (e->op) cublasLtMatmulDescDestroy(e->op);
    if (e->la) cublasLtMatrixLayoutDestroy(e->la);
    if (e->lb) cublasLtMatrixLayoutDestroy(e->lb);
    if (e->lc) cublasLtMatrixLayoutDestroy(e->lc);
    e->op = NULL, e->la = e->lb = e->lc = NULL;
    e->used = 0;
}

int lt_fail(cublasStatus_t s, const char *what, const zr_gemm_desc *g, int dev) {
    return zr_error("matmul (cuda) on cuda:%d: %s failed: %s (%s); m=%lld n=%lld k=%lld ta=%d tb=%d "
                    "lda=%lld ldb=%lld ldc=%lld batch=%lld %s x %s -> %s",
                    dev, what, cublasLtGetStatusString(s), cublasLtGetStatusName(s), (long long)g->m,
                    (long long)g->n, (long long)g->k, g->ta, g->tb, (long long)g->lda, (long long)g->ldb,
                    (long long)g->ldc, (long long)g->batch, zr_dtype_name(g->ab_dtype),
                    zr_dtype_name(g->ab_dtype), zr_dtype_name(g->c_dtype));
}

#define LT(expr, what)                                                                            \
    do {                                                                                          \
        cublasStatus_t s_ = (expr);                                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS) return lt_fail(s_, what, g, dev);                         \
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

// Autotuning (on unless ZRUN_GEMM_AUTOTUNE=0): the first time a shape of at least 1 GFLOP is
// seen, the heuristic's top candidates run on the real operands into a scratch output and the
// fastest is kept (cuBLASLt's first choice is often not the fastest for skinny shapes).
const int TUNE_ALGOS = 8;
bool autotune_on() {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("ZRUN_GEMM_AUTOTUNE");
        on = !(e && strcmp(e, "0") == 0);
    }
    return on;
}

// Median-free quick timing: one warm-up, then the best of 3 (ms); < 0 when the algorithm fails.
float time_algo(dev_ctx *c, entry *e, const cublasLtMatmulAlgo_t *algo, const zr_gemm_desc *g, void *cs,
                cudaStream_t stream) {
    float af = (float)g->alpha, bf = (float)g->beta, best = -1;
    cudaEvent_t t0, t1;
    if (cudaEventCreate(&t0) != cudaSuccess) return -1;
    if (cudaEventCreate(&t1) != cudaSuccess) {
        cudaEventDestroy(t0);
        return -1;
    }
    for (int r = 0; r < 4; r++) {
        cudaEventRecord(t0, stream);
        cublasStatus_t s = cublasLtMatmul(c->h, e->op, &af, g->b, e->la, g->a, e->lb, &bf, cs, e->lc, cs, e->lc, algo,
                                          c->ws, WORKSPACE, stream);
        cudaEventRecord(t1, stream);
        float ms = -1;
        if (s != CUBLAS_STATUS_SUCCESS || cudaEventSynchronize(t1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, t0, t1) != cudaSuccess) {
            best = -1;
            break;
        }
        if (r > 0 && (best < 0 || ms < best)) best = ms;
    }
    cudaGetLastError(); /* a failed candidate must not leave an error behind */
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    return best;
}

// Picks the fastest of the candidates for e (lock held); keeps e->algo when anything fails.
void autotune(dev_ctx *c, entry *e, const cublasLtMatmulHeuristicResult_t *res, int nres, const zr_gemm_desc *g,
              int dev, cudaStream_t stream) {
    size_t es = g->c_dtype == ZR_F64 ? 8 : g->c_dtype == ZR_F32 ? 4 : 2;
    size_t n = g->batch > 1 ? (size_t)(g->stride_c * (g->batch - 1) + g->ldc * g->m) : (size_t)(g->ldc * g->m);
    void *cs = zr_cuda_malloc(cuda_dev(dev), n * es, stream);
    if (!cs) {
        zr_clear_error(); /* no scratch: the heuristic's first choice stays */
        return;
    }
    if (g->bias) cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias);
    float best = -1;
    for (int i = 0; i < nres; i++) {
        float ms = time_algo(c, e, &res[i].algo, g, cs, stream);
        if (ms >= 0 && (best < 0 || ms < best)) {
            best = ms;
            e->algo = res[i].algo;
        }
    }
    zr_cuda_free(cuda_dev(dev), cs);
}

// Builds descriptors and picks an algorithm for k (lock held). Returns 0 and fills e.
int build(entry *e, const key &k, const zr_gemm_desc *g, dev_ctx *c, int dev, cudaStream_t stream) {
    memset(e, 0, sizeof *e);
    int f64 = g->ab_dtype == ZR_F64;
    cublasComputeType_t ct = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
    cudaDataType_t st = f64 ? CUDA_R_64F : CUDA_R_32F, abt = cuda_type(g->ab_dtype), ctp = cuda_type(g->c_dtype);
    LT(cublasLtMatmulDescCreate(&e->op, ct, st), "descriptor");
    e->used = 1; /* from here destroy_entry cleans up what exists */
    cublasOperation_t opa = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    int r = 0;
#define TRY(x)                                                                                    \
    if ((r = (x)) != 0) {                                                                         \
        destroy_entry(e);                                                                         \
        return r;                                                                                 \
    }
    cublasStatus_t s;
    if ((s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa)) ||
        (s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb))) {
        destroy_entry(e);
        return lt_fail(s, "descriptor", g, dev);
    }
    if (g->bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = ctp;
        if ((s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep)) ||
            (s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt))) {
            destroy_entry(e);
            return lt_fail(s, "bias epilogue", g, dev);
        }
    }
    // cuBLASLt's A = our B, its B = our A, its C = our C (all column-major views).
    e->la = e->lb = e->lc = NULL;
    TRY(layout(&e->la, abt, g->tb ? g->k : g->n, g->tb ? g->n : g->k, g->ldb, g->batch, g->stride_b, g, dev));
    TRY(layout(&e->lb, abt, g->ta ? g->m : g->k, g->ta ? g->k : g->m, g->lda, g->batch, g->stride_a, g, dev));
    TRY(layout(&e->lc, ctp, g->n, g->m, g->ldc, g->batch, g->stride_c, g, dev));
    cublasLtMatmulPreference_t pref;
    if ((s = cublasLtMatmulPreferenceCreate(&pref))) {
        destroy_entry(e);
        return lt_fail(s, "preference", g, dev);
    }
    uint64_t wsb = WORKSPACE;
    uint32_t aa = (uint32_t)k.al_b, ab = (uint32_t)k.al_a, ac = (uint32_t)k.al_c;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac);
    cublasLtMatmulHeuristicResult_t res[TUNE_ALGOS];
    int nres = 0;
    double flops = 2.0 * (double)g->m * (double)g->n * (double)g->k * (double)g->batch;
    int want = autotune_on() && flops >= 1e9 ? TUNE_ALGOS : 1;
    s = cublasLtMatmulAlgoGetHeuristic(c->h, e->op, e->la, e->lb, e->lc, e->lc, pref, want, res, &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || nres == 0) {
        destroy_entry(e);
        if (s == CUBLAS_STATUS_SUCCESS) s = CUBLAS_STATUS_NOT_SUPPORTED;
        return lt_fail(s, "algorithm search (no cuBLASLt algorithm for these dtypes/layouts)", g, dev);
    }
    e->algo = res[0].algo;
    if (nres > 1) autotune(c, e, res, nres, g, dev, stream);
    e->k = k;
    return 0;
#undef TRY
}

int get_ctx(int dev, cudaStream_t stream, dev_ctx **out, const zr_gemm_desc *g) {
    if (dev < 0 || dev >= MAX_DEV) return zr_error("matmul (cuda): bad device %d", dev);
    dev_ctx *c = &ctxs[dev];
    if (!c->ready) {
        LT(cublasLtCreate(&c->h), "cublasLtCreate");
        c->ws = zr_cuda_malloc(cuda_dev(dev), WORKSPACE, stream);
        if (!c->ws) {
            cublasLtDestroy(c->h);
            zr_error_prefix("matmul (cuda): workspace: ");
            return -1;
        }
        c->ready = 1;
    }
    *out = c;
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
template <typename T> int sum_cols(void *out, const void *x, int64_t rows, int64_t cols, cudaStream_t s) {
    int64_t blocks = (cols + 31) / 32;
    if (blocks > 0x7fffffff) return zr_error("sum_cols (cuda): too many columns");
    const int64_t rows_per = 512;
    int64_t chunks = (rows + rows_per - 1) / rows_per;
    if (chunks <= 1 || chunks > 65535) {
        sum_cols_kernel<T><<<(unsigned)blocks, dim3(32, 8), 0, s>>>((T *)out, (const T *)x, rows, cols);
        return launch_check("sum_cols (cuda)");
    }
    int dev = 0;
    cudaGetDevice(&dev);
    zr_device d = {ZR_CUDA, (int8_t)dev};
    double *part = (double *)zr_cuda_malloc(d, (size_t)(chunks * cols) * sizeof(double), s);
    if (!part) return -1;
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
    zr_cuda_free(d, part);
    return rc;
}

}  // namespace

extern "C" int gemm_ex_cuda(const zr_gemm_desc *g, cudaStream_t stream) {
    int dev = 0;
    cudaGetDevice(&dev);
    if (g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 0)
        return zr_error("matmul (cuda): negative size m=%lld n=%lld k=%lld", (long long)g->m, (long long)g->n,
                        (long long)g->k);
    if (g->m == 0 || g->n == 0 || g->batch == 0) return 0;
    if (g->k == 0) {
        if (g->ab_dtype != g->c_dtype && g->bias) return zr_error("matmul (cuda): k = 0 with a bias needs one dtype");
        ZRK_DISPATCH_FLOAT(g->c_dtype, "matmul (cuda)", scale_bias, g, stream)
    }
    if (g->batch > 0x7fffffff) return zr_error("matmul (cuda): batch %lld is too large", (long long)g->batch);
    key k;
    memset(&k, 0, sizeof k);
    k.dev = dev, k.ta = !!g->ta, k.tb = !!g->tb, k.abdt = g->ab_dtype, k.cdt = g->c_dtype, k.has_bias = g->bias != NULL;
    k.al_a = align_of(g->a), k.al_b = align_of(g->b), k.al_c = align_of(g->c);
    k.m = g->m, k.n = g->n, k.k = g->k, k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc;
    k.batch = g->batch;
    if (g->batch > 1) k.sa = g->stride_a, k.sb = g->stride_b, k.sc = g->stride_c;
    pthread_mutex_lock(&mtx);
    dev_ctx *c;
    if (get_ctx(dev, stream, &c, g)) {
        pthread_mutex_unlock(&mtx);
        return -1;
    }
    uint64_t h = hash_key(k);
    entry *e = NULL, *slot = NULL;
    for (int p = 0; p < PROBE && !e; p++) {
        entry *x = &cache[(h + p) % CACHE];
        if (x->used && memcmp(&x->k, &k, sizeof k) == 0) e = x;
        else if (!x->used && !slot) slot = x;
    }
    if (!e) {
        if (!slot) {
            slot = &cache[h % CACHE]; /* evict the home slot */
            destroy_entry(slot);
        }
        if (build(slot, k, g, c, dev, stream)) {
            pthread_mutex_unlock(&mtx);
            return -1;
        }
        e = slot;
    }
    if (g->bias) {
        cublasStatus_t s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                                          sizeof g->bias);
        if (s) {
            pthread_mutex_unlock(&mtx);
            return lt_fail(s, "bias pointer", g, dev);
        }
    }
    float af = (float)g->alpha, bf = (float)g->beta;
    const void *alpha = &af, *beta = &bf;
    if (g->ab_dtype == ZR_F64) alpha = &g->alpha, beta = &g->beta;
    cublasStatus_t s = cublasLtMatmul(c->h, e->op, alpha, g->b, e->la, g->a, e->lb, beta, g->c, e->lc, g->c, e->lc,
                                      &e->algo, c->ws, WORKSPACE, stream);
    pthread_mutex_unlock(&mtx);
    if (s != CUBLAS_STATUS_SUCCESS) return lt_fail(s, "cublasLtMatmul", g, dev);
    return launch_check("matmul (cuda)");
}

extern "C" int gemm_cuda(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const void *a, int64_t lda,
                         const void *b, int64_t ldb, double beta, void *c, int64_t ldc, zr_dtype dt,
                         cudaStream_t stream) {
    zr_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k, g.a = a, g.lda = lda, g.b = b, g.ldb = ldb, g.c = c, g.ldc = ldc;
    g.batch = 1, g.alpha = alpha, g.beta = beta, g.ab_dtype = dt, g.c_dtype = dt;
    return gemm_ex_cuda(&g, stream);
}

extern "C" int fill_rows_cuda(void *y, const void *bias, int64_t rows, int64_t cols, zr_dtype dt, cudaStream_t stream) {
    if (rows * cols <= 0) return 0;
    ZRK_DISPATCH_FLOAT(dt, "fill_rows (cuda)", fill_rows, y, bias, rows, cols, stream)
}

extern "C" int sum_cols_cuda(void *out, const void *x, int64_t rows, int64_t cols, zr_dtype dt, cudaStream_t stream) {
    if (cols <= 0) return 0;
    ZRK_DISPATCH_FLOAT(dt, "sum_cols (cuda)", sum_cols, out, x, rows, cols, stream)
}

extern "C" int linear_forward_cuda(void *y, const void *x, const void *w, const void *bias, int64_t rows, int64_t in,
                                   int64_t out, zr_dtype dt, cudaStream_t stream) {
    zr_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.ta = 0, g.tb = 1, g.m = rows, g.n = out, g.k = in;
    g.a = x, g.lda = in > 1 ? in : 1, g.b = w, g.ldb = in > 1 ? in : 1, g.c = y, g.ldc = out > 1 ? out : 1;
    g.batch = 1, g.bias = bias, g.alpha = 1, g.beta = 0, g.ab_dtype = dt, g.c_dtype = dt;
    return gemm_ex_cuda(&g, stream);
}

extern "C" int linear_backward_cuda(void *dx, void *dw, void *db, const void *g, const void *x, const void *w,
                                    int64_t rows, int64_t in, int64_t out, int accumulate, zr_dtype dt,
                                    cudaStream_t stream) {
    int64_t ldi = in > 1 ? in : 1, ldo = out > 1 ? out : 1;
    if (dx && gemm_cuda(0, 0, rows, in, out, 1.0, g, ldo, w, ldi, 0.0, dx, ldi, dt, stream)) return -1;
    if (dw && gemm_cuda(1, 0, out, in, rows, 1.0, g, ldo, x, ldi, accumulate ? 1.0 : 0.0, dw, ldi, dt, stream))
        return -1;
    if (db && sum_cols_cuda(db, g, rows, out, dt, stream)) return -1;
    return 0;
}

extern "C" void zr_matmul_cuda_release(void) {
    pthread_mutex_lock(&mtx);
    for (int i = 0; i < CACHE; i++) destroy_entry(&cache[i]);
    for (int d = 0; d < MAX_DEV; d++)
        if (ctxs[d].ready) {
            cublasLtDestroy(ctxs[d].h);
            zr_cuda_free(cuda_dev(d), ctxs[d].ws);
            ctxs[d].ready = 0;
        }
    pthread_mutex_unlock(&mtx);
}
