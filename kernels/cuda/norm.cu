/* RMSNorm (with optional fused residual add) and LayerNorm on CUDA, forward and backward. One
 * block per row in forward; backward runs a grid of row-striding blocks that keep per-column
 * weight-gradient partials in shared memory, then a second kernel sums them in a fixed order. */
#include "norm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" {
#include "error.h"
}

#include "fused_common.cuh"

/* ---- kernels -------------------------------------------------------------------------------- */

#define NORM_BWD_MAX_BLOCKS 512 /* 1024 measured slower on the H200 */

/* One block per row. LN: y = (x-mean)*rstd*w + b; else y = x*rstd*w. RES: x := x + res first,
 * rounded to T and written to hout (hout may alias x or res, so no __restrict__ on those). */
template <typename T, int V, bool LN, bool RES>
__global__ void norm_fwd_kernel(T *__restrict__ y, T *hout, float *__restrict__ mean_out,
                                float *__restrict__ rstd_out, const T *x, const T *res,
                                const T *__restrict__ w, const T *__restrict__ b, int64_t D,
                                float eps) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x;
    const T *xr = (RES ? (const T *)hout : x) + row * D;
    const int64_t step = (int64_t)blockDim.x * V;
    float s = 0.f;
    if (RES) {
        for (int64_t i = threadIdx.x * V; i < D; i += step) {
            float f[V], r[V];
            ldv<T, V>(f, x + row * D + i);
            ldv<T, V>(r, res + row * D + i);
#pragma unroll
            for (int k = 0; k < V; ++k) f[k] = tof<T>(fromf<T>(f[k] + r[k]));
            stv<T, V>(hout + row * D + i, f);
#pragma unroll
            for (int k = 0; k < V; ++k) s += LN ? f[k] : f[k] * f[k];
        }
    } else {
        for (int64_t i = threadIdx.x * V; i < D; i += step) {
            float f[V];
            ldv<T, V>(f, xr + i);
#pragma unroll
            for (int k = 0; k < V; ++k) s += LN ? f[k] : f[k] * f[k];
        }
    }
    float mu = 0.f, var;
    if (LN) {
        mu = block_sum(s, red) / (float)D;
        float s2 = 0.f;
        for (int64_t i = threadIdx.x * V; i < D; i += step) {
            float f[V];
            ldv<T, V>(f, xr + i);
#pragma unroll
            for (int k = 0; k < V; ++k) s2 += (f[k] - mu) * (f[k] - mu);
        }
        var = block_sum(s2, red) / (float)D;
    } else {
        var = block_sum(s, red) / (float)D;
    }
    const float r = rsqrtf(var + eps);
    if (threadIdx.x == 0) {
        if (rstd_out) rstd_out[row] = r;
        if (LN && mean_out) mean_out[row] = mu;
    }
    for (int64_t i = threadIdx.x * V; i < D; i += step) {
        float f[V], wv[V], bv[V];
        ldv<T, V>(f, xr + i);
        if (w) ldv<T, V>(wv, w + i);
        if (LN && b) ldv<T, V>(bv, b + i);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            float o = (f[k] - mu) * r;
            if (w) o *= wv[k];
            if (LN && b) o += bv[k];
            f[k] = o;
        }
        stv<T, V>(y + row * D + i, f);
    }
}

/* Row-striding backward; dx may alias dy or dres (each element is read before it is written). part (gridDim.x × 2D f32, NULL when no weight gradient is wanted):
 * this block's sums of dy*xhat (first D) and dy (next D). */
template <typename T, int V, bool LN>
__global__ void norm_bwd_kernel(T *dx, float *__restrict__ part, const T *dy,
                                const T *__restrict__ x,
                                const T *__restrict__ w, const float *__restrict__ mean,
                                const float *__restrict__ rstd, const T *dres,
                                int64_t N, int64_t D) {
    __shared__ float red[32];
    /* 2*D when part != NULL, stored element-major ([k][chunk]) so that a warp's accesses for one
     * k hit 32 consecutive words instead of 8-way bank conflicts. */
    extern __shared__ float acc[];
    const int64_t step = (int64_t)blockDim.x * V;
    if (part)
        for (int64_t i = threadIdx.x * V; i < D; i += step)
#pragma unroll
            for (int k = 0; k < V; ++k) {
                acc[k * (D / V) + i / V] = 0.f;
                acc[D + k * (D / V) + i / V] = 0.f;
            }
    for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
        const float r = rstd[row], mu = LN ? mean[row] : 0.f;
        const T *xr = x + row * D, *dyr = dy + row * D;
        float sg = 0.f, sgx = 0.f;
        for (int64_t i = threadIdx.x * V; i < D; i += step) {
            float f[V], d[V], wv[V];
            ldv<T, V>(f, xr + i);
            ldv<T, V>(d, dyr + i);
            if (w) ldv<T, V>(wv, w + i);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const float g = w ? d[k] * wv[k] : d[k];
                sg += g;
                sgx += g * (f[k] - mu) * r;
            }
        }
        sgx = block_sum(sgx, red) / (float)D;
        if (LN) sg = block_sum(sg, red) / (float)D;
        for (int64_t i = threadIdx.x * V; i < D; i += step) {
            float f[V], d[V], wv[V], o[V];
            ldv<T, V>(f, xr + i);
            ldv<T, V>(d, dyr + i);
            if (w) ldv<T, V>(wv, w + i);
            if (dres) ldv<T, V>(o, dres + row * D + i);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const float xh = (f[k] - mu) * r, g = w ? d[k] * wv[k] : d[k];
                const float v = r * (g - (LN ? sg : 0.f) - xh * sgx);
                o[k] = dres ? o[k] + v : v;
                if (part) {
                    acc[k * (D / V) + i / V] += d[k] * xh;
                    acc[D + k * (D / V) + i / V] += d[k];
                }
            }
            stv<T, V>(dx + row * D + i, o);
        }
    }
    if (part)
        for (int64_t i = threadIdx.x * V; i < D; i += step)
#pragma unroll
            for (int k = 0; k < V; ++k) {
                part[(int64_t)blockIdx.x * 2 * D + i + k] = acc[k * (D / V) + i / V];
                part[(int64_t)blockIdx.x * 2 * D + D + i + k] = acc[D + k * (D / V) + i / V];
            }
}

/* dw[i] = sum over blocks of part[g][i], db[i] likewise from the second half; fixed order. */
template <typename T>
__global__ void norm_wgrad_kernel(T *__restrict__ dw, T *__restrict__ db,
                                  const float *__restrict__ part, int G, int64_t D) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= D) return;
    float sw = 0.f, sb = 0.f;
    for (int g = 0; g < G; ++g) {
        sw += part[(int64_t)g * 2 * D + i];
        sb += part[(int64_t)g * 2 * D + D + i];
    }
    if (dw) dw[i] = fromf<T>(sw);
    if (db) db[i] = fromf<T>(sb);
}

/* ---- host side ------------------------------------------------------------------------------ */

static int row_threads(int64_t D, int V) {
    int64_t n = (D / V + 31) / 32 * 32;
    return n < 32 ? 32 : n > 256 ? 256 : (int)n;
}

static int check_nd(const char *fn, int64_t N, int64_t D) {
    if (N < 0 || D <= 0 || N > 0x7fffffffLL)
        return zr_error("%s: bad shape N=%lld D=%lld (N in [0, 2^31), D >= 1)", fn, (long long)N,
                        (long long)D);
    return 0;
}

template <typename T, bool LN, bool RES>
static void fwd_launch(void *y, void *h, float *mean, float *rstd, const void *x, const void *res,
                       const void *w, const void *b, int64_t N, int64_t D, float eps,
                       cudaStream_t st) {
    const int V = 16 / sizeof(T);
    const bool vec = D % V == 0 && al16(y) && al16(x) && (!RES || (al16(h) && al16(res))) &&
                     (!w || al16(w)) && (!b || al16(b));
    if (vec)
        norm_fwd_kernel<T, 16 / sizeof(T), LN, RES><<<(unsigned)N, row_threads(D, V), 0, st>>>(
            (T *)y, (T *)h, mean, rstd, (const T *)x, (const T *)res, (const T *)w, (const T *)b, D,
            eps);
    else
        norm_fwd_kernel<T, 1, LN, RES><<<(unsigned)N, row_threads(D, 1), 0, st>>>(
            (T *)y, (T *)h, mean, rstd, (const T *)x, (const T *)res, (const T *)w, (const T *)b, D,
            eps);
}

static int64_t bwd_blocks(int64_t N) { return N < NORM_BWD_MAX_BLOCKS ? N : NORM_BWD_MAX_BLOCKS; }

extern "C" size_t rmsnorm_backward_workspace_size(int64_t N, int64_t D) {
    return N > 0 && D > 0 ? (size_t)bwd_blocks(N) * 2 * D * 4 : 0;
}
extern "C" size_t layernorm_backward_workspace_size(int64_t N, int64_t D) {
    return rmsnorm_backward_workspace_size(N, D);
}

template <typename T, bool LN>
static int bwd_launch(const char *fn, void *dx, void *dw, void *db, const void *dy, const void *x,
                      const void *w, const float *mean, const float *rstd, const void *dres,
                      void *ws, int64_t N, int64_t D, cudaStream_t st) {
    const int V = 16 / sizeof(T);
    const bool want = dw || db;
    if (want && !ws) return zr_error("%s: workspace is NULL but a weight gradient was asked", fn);
    const int64_t G = bwd_blocks(N);
    const size_t smem = want ? (size_t)2 * D * 4 : 0;
    if (smem > 227 * 1024)
        return zr_error("%s: D=%lld too large for the weight-gradient accumulator (max 29056)",
                        fn, (long long)D);
    float *part = want ? (float *)ws : NULL;
    const bool vec = D % V == 0 && al16(dx) && al16(dy) && al16(x) && (!w || al16(w)) &&
                     (!dres || al16(dres));
    if (vec) {
        auto k = norm_bwd_kernel<T, 16 / sizeof(T), LN>;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        k<<<(unsigned)G, row_threads(D, V), smem, st>>>((T *)dx, part, (const T *)dy,
                                                        (const T *)x, (const T *)w, mean, rstd,
                                                        (const T *)dres, N, D);
    } else {
        auto k = norm_bwd_kernel<T, 1, LN>;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        k<<<(unsigned)G, row_threads(D, 1), smem, st>>>((T *)dx, part, (const T *)dy,
                                                        (const T *)x, (const T *)w, mean, rstd,
                                                        (const T *)dres, N, D);
    }
    if (want)
        norm_wgrad_kernel<T><<<(unsigned)((D + 255) / 256), 256, 0, st>>>((T *)dw, (T *)db, part,
                                                                         (int)G, D);
    return 0;
}

extern "C" int rmsnorm_forward_cuda(void *y, float *rstd, const void *x, const void *w, int64_t N,
                                    int64_t D, float eps, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "rmsnorm_forward_cuda";
    if (check_nd(fn, N, D)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype,
                      fwd_launch<T, false, false>(y, NULL, NULL, rstd, x, NULL, w, NULL, N, D,
                                                  eps, stream));
    return launch_check(fn);
}

extern "C" int rmsnorm_residual_forward_cuda(void *y, void *h, float *rstd, const void *x,
                                             const void *res, const void *w, int64_t N, int64_t D,
                                             float eps, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "rmsnorm_residual_forward_cuda";
    if (check_nd(fn, N, D)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype,
                      fwd_launch<T, false, true>(y, h, NULL, rstd, x, res, w, NULL, N, D, eps,
                                                 stream));
    return launch_check(fn);
}

extern "C" int rmsnorm_backward_cuda(void *dx, void *dw, const void *dy, const void *x,
                                     const void *w, const float *rstd, const void *dres,
                                     void *workspace, int64_t N, int64_t D, zr_dtype dtype,
                                     cudaStream_t stream) {
    const char *fn = "rmsnorm_backward_cuda";
    if (check_nd(fn, N, D)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype,
                      if (bwd_launch<T, false>(fn, dx, dw, NULL, dy, x, w, NULL, rstd, dres,
                                               workspace, N, D, stream)) return ZR_ERR);
    return launch_check(fn);
}

extern "C" int layernorm_forward_cuda(void *y, float *mean, float *rstd, const void *x,
                                      const void *w, const void *b, int64_t N, int64_t D,
                                      float eps, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "layernorm_forward_cuda";
    if (check_nd(fn, N, D)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype,
                      fwd_launch<T, true, false>(y, NULL, mean, rstd, x, NULL, w, b, N, D, eps,
                                                 stream));
    return launch_check(fn);
}

extern "C" int layernorm_backward_cuda(void *dx, void *dw, void *db, const void *dy,
                                       const void *x, const void *w, const float *mean,
                                       const float *rstd, void *workspace, int64_t N, int64_t D,
                                       zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "layernorm_backward_cuda";
    if (check_nd(fn, N, D)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype,
                      if (bwd_launch<T, true>(fn, dx, dw, db, dy, x, w, mean, rstd, NULL,
                                              workspace, N, D, stream)) return ZR_ERR);
    return launch_check(fn);
}
