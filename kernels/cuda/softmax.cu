/* Row softmax forward/backward (see softmax.h): one block per row, up to 1024 threads, 16-byte
 * accesses when D and the pointers allow. */
#include "softmax.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

extern "C" {
#include "../base/error.h"
}

#include "common.cuh" /* log_softmax below uses its zrk:: helpers */
#include "fused_common.cuh"


template <typename T, int V>
__global__ void softmax_fwd_kernel(T *y, const T *__restrict__ x, int64_t D) {
    __shared__ float rm[32], rs[32];
    const int64_t row = blockIdx.x;
    x += row * D;
    y += row * D;
    const int64_t step = (int64_t)blockDim.x * V;
    float m = -INFINITY, s = 0.f;
    for (int64_t i = threadIdx.x * V; i < D; i += step) {
        float f[V];
        ldv<T, V>(f, x + i);
        float cm = f[0];
#pragma unroll
        for (int k = 1; k < V; ++k) cm = fmaxf(cm, f[k]);
        const float mn = fmaxf(m, cm);
        if (mn == -INFINITY) continue;
        float cs = 0.f;
#pragma unroll
        for (int k = 0; k < V; ++k) cs += __expf(f[k] - mn);
        s = s * __expf(m - mn) + cs;
        m = mn;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    if (l == 0) rm[w] = m, rs[w] = s;
    __syncthreads();
    m = l < nw ? rm[l] : -INFINITY;
    s = l < nw ? rs[l] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    const float inv = 1.f / s;
    for (int64_t i = threadIdx.x * V; i < D; i += step) {
        float f[V];
        ldv<T, V>(f, x + i);
#pragma unroll
        for (int k = 0; k < V; ++k) f[k] = __expf(f[k] - m) * inv;
        stv<T, V>(y + i, f);
    }
}

template <typename T, int V>
__global__ void softmax_bwd_kernel(T *dx, const T *dy, const T *__restrict__ y, int64_t D) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x;
    dx += row * D;
    dy += row * D;
    y += row * D;
    const int64_t step = (int64_t)blockDim.x * V;
    float s = 0.f;
    for (int64_t i = threadIdx.x * V; i < D; i += step) {
        float a[V], b[V];
        ldv<T, V>(a, dy + i);
        ldv<T, V>(b, y + i);
#pragma unroll
        for (int k = 0; k < V; ++k) s += a[k] * b[k];
    }
    s = block_sum(s, red);
    for (int64_t i = threadIdx.x * V; i < D; i += step) {
        float a[V], b[V];
        ldv<T, V>(a, dy + i);
        ldv<T, V>(b, y + i);
#pragma unroll
        for (int k = 0; k < V; ++k) a[k] = b[k] * (a[k] - s);
        stv<T, V>(dx + i, a);
    }
}

/* ---- register-held rows: a group of WPR warps per row, C chunks of V elements per lane ------ */

static __device__ __forceinline__ void group_bar(int id, int nthreads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

/* Max (MAXR) or sum over the group of WPR warps; red: shared float[2][nwarps], parity slots. */
template <int WPR, bool MAXR>
static __device__ __forceinline__ float group_reduce(float a, float *red, int &par) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, a, o);
        a = MAXR ? fmaxf(a, oa) : a + oa;
    }
    if (WPR == 1) return a;
    const int warp = threadIdx.x >> 5, grp = warp / WPR, nw = blockDim.x >> 5;
    if ((threadIdx.x & 31) == 0) red[par * nw + warp] = a;
    group_bar(1 + grp, WPR * 32);
    float s = red[par * nw + grp * WPR];
#pragma unroll
    for (int k = 1; k < WPR; ++k) {
        const float t = red[par * nw + grp * WPR + k];
        s = MAXR ? fmaxf(s, t) : s + t;
    }
    par ^= 1;
    return s;
}


/* A row per group, its raw 16-byte chunks loaded before any use (measured 70% -> 76% of copy at
 * N=16384, D=2048 bf16 against the load-and-reduce loop). With SOFTMAX_WAVES > 0 the grid is
 * capped and groups stride over rows, loading the next row before working on the current one
 * (measured slower: 69%). */
template <typename T, int V, int C, int WPR>
__global__ void __launch_bounds__(128 > WPR * 32 ? 128 : WPR * 32)
    softmax_fwd_reg_kernel(T *__restrict__ y, const T *__restrict__ x, int64_t N, int64_t D) {
    __shared__ float red[2 * 16];
    const int warp = threadIdx.x >> 5, G = (blockDim.x >> 5) / WPR, grp = warp / WPR;
    const int tig = threadIdx.x - grp * WPR * 32;
    const int64_t stride = (int64_t)gridDim.x * G;
    int64_t row = (int64_t)blockIdx.x * G + grp; /* uniform in the group */
    int par = 0;
    uint4 cur[C];
    ld_row<T, V, C, WPR>(cur, x, row, N, D, tig);
    for (; row < N; row += stride) {
        uint4 nxt[C];
        ld_row<T, V, C, WPR>(nxt, x, row + stride, N, D, tig);
        const int64_t base = row * D;
        float f[C][V];
        float m = -INFINITY;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int64_t i = ((int64_t)c * WPR * 32 + tig) * V;
            const T *e = reinterpret_cast<const T *>(&cur[c]);
#pragma unroll
            for (int k = 0; k < V; ++k) f[c][k] = tof<T>(e[k]);
            if (i < D)
#pragma unroll
                for (int k = 0; k < V; ++k) m = fmaxf(m, f[c][k]);
        }
        m = group_reduce<WPR, true>(m, red, par);
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int64_t i = ((int64_t)c * WPR * 32 + tig) * V;
            if (i < D)
#pragma unroll
                for (int k = 0; k < V; ++k) s += (f[c][k] = __expf(f[c][k] - m));
        }
        const float inv = 1.f / group_reduce<WPR, false>(s, red, par);
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int64_t i = ((int64_t)c * WPR * 32 + tig) * V;
            if (i < D) {
#pragma unroll
                for (int k = 0; k < V; ++k) f[c][k] *= inv;
                stv<T, V>(y + base + i, f[c]);
            }
        }
#pragma unroll
        for (int c = 0; c < C; ++c) cur[c] = nxt[c];
    }
}


#ifndef SOFTMAX_WAVES
#define SOFTMAX_WAVES 0 /* grid capped at this many rounds of resident blocks (rows stride over
                         * it); 0: one row per group (measured best: 75% vs 69% of copy) */
#endif

template <typename T, int C, int WPR>
static void softmax_reg_launch(void *y, const void *x, int64_t N, int64_t D, cudaStream_t st) {
    const int NW = WPR < 4 ? 4 : WPR, G = NW / WPR;
    auto k = softmax_fwd_reg_kernel<T, 16 / sizeof(T), C, WPR>;
    static int per_sm = -1; /* racy but idempotent; 0: unknown */
    if (SOFTMAX_WAVES > 0 && per_sm < 0 &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, NW * 32, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        per_sm = 0;
    }
    int64_t g = (N + G - 1) / G;
    const int64_t cap = (int64_t)num_sms() * per_sm * SOFTMAX_WAVES;
    if (cap > 0 && g > cap) g = cap;
    k<<<(unsigned)g, NW * 32, 0, st>>>((T *)y, (const T *)x, N, D);
}

/* Launches the register path for rows of D (V-element chunks, up to 8 per lane, 1-8 warps per
 * row); false when D is too long for it. */
template <typename T>
static bool softmax_fwd_reg(void *y, const void *x, int64_t N, int64_t D, cudaStream_t st) {
    const int V = 16 / sizeof(T);
    const int64_t nch = (D + 32 * V - 1) / (32 * V);
    if (N >= ((int64_t)1 << 31)) return false;
#define SM_CASE(W_, C_)                                                                            \
    {                                                                                              \
        softmax_reg_launch<T, C_, W_>(y, x, N, D, st);                                             \
        return true;                                                                               \
    }
    if (nch <= 1) SM_CASE(1, 1)
    if (nch <= 2) SM_CASE(1, 2)
    if (nch <= 4) SM_CASE(1, 4)
    if (nch <= 8) SM_CASE(1, 8)
    if (nch <= 16) SM_CASE(2, 8)
    if (nch <= 32) SM_CASE(4, 8)
    if (nch <= 64) SM_CASE(8, 8)
#undef SM_CASE
    return false;
}

static int sm_threads(int64_t D, int V) {
    int64_t n = (D / V + 31) / 32 * 32;
    return n < 32 ? 32 : n > 1024 ? 1024 : (int)n;
}

static int check_nd(const char *fn, int64_t N, int64_t D) {
    if (N < 0 || D <= 0 || N > 0x7fffffffLL)
        return zr_error("%s: bad shape N=%lld D=%lld", fn, (long long)N, (long long)D);
    return 0;
}

extern "C" int softmax_forward_cuda(void *y, const void *x, int64_t N, int64_t D, zr_dtype dtype,
                                    cudaStream_t stream) {
    const char *fn = "softmax_forward_cuda";
    if (check_nd(fn, N, D)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype, {
        const int VW = 16 / sizeof(T);
        if (D % VW == 0 && al16(x) && al16(y) && softmax_fwd_reg<T>(y, x, N, D, stream)) {
        } else if (D % VW == 0 && al16(x) && al16(y))
            softmax_fwd_kernel<T, 16 / sizeof(T)>
                <<<(unsigned)N, sm_threads(D, VW), 0, stream>>>((T *)y, (const T *)x, D);
        else
            softmax_fwd_kernel<T, 1>
                <<<(unsigned)N, sm_threads(D, 1), 0, stream>>>((T *)y, (const T *)x, D);
    });
    return launch_check(fn);
}

extern "C" int softmax_backward_cuda(void *dx, const void *dy, const void *y, int64_t N,
                                     int64_t D, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "softmax_backward_cuda";
    if (check_nd(fn, N, D)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype, {
        const int VW = 16 / sizeof(T);
        if (D % VW == 0 && al16(dx) && al16(dy) && al16(y))
            softmax_bwd_kernel<T, 16 / sizeof(T)><<<(unsigned)N, sm_threads(D, VW), 0, stream>>>(
                (T *)dx, (const T *)dy, (const T *)y, D);
        else
            softmax_bwd_kernel<T, 1><<<(unsigned)N, sm_threads(D, 1), 0, stream>>>(
                (T *)dx, (const T *)dy, (const T *)y, D);
    });
    return launch_check(fn);
}

/* log_softmax: one block per row, f64 rows in f64 (common.cuh's acc<T>); inside namespace zrk so
 * that its helpers are found before fused_common.cuh's. */
namespace zrk {
namespace {

/* Block-wide reduction (sum or max) of a value of type A; every thread gets the result. */
template <typename A, bool MAX> __device__ A block_reduce(A v, A *red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        A u = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? (u > v || u != u ? u : v) : v + u;
    }
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    v = l < nw ? red[l] : (MAX ? (A)-INFINITY : (A)0);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        A u = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? (u > v || u != u ? u : v) : v + u;
    }
    return v;
}

template <typename T> __global__ void log_softmax_fwd_kernel(T *y, const T *x, int64_t D) {
    typedef typename acc<T>::type A;
    __shared__ A red[32];
    const T *xr = x + blockIdx.x * D;
    T *yr = y + blockIdx.x * D;
    A m = (A)-INFINITY;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        A v = to_acc<T>(xr[i]);
        m = (v > m || v != v) ? v : m;
    }
    m = block_reduce<A, true>(m, red);
    A s = 0;
    if (m != (A)-INFINITY)
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s += exp(to_acc<T>(xr[i]) - m);
    s = block_reduce<A, false>(s, red);
    const A lse = m == (A)-INFINITY ? m : m + log(s);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) yr[i] = from_acc<T>(to_acc<T>(xr[i]) - lse);
}

template <typename T> __global__ void log_softmax_bwd_kernel(T *dx, const T *dy, const T *y, int64_t D) {
    typedef typename acc<T>::type A;
    __shared__ A red[32];
    const int64_t o = blockIdx.x * D;
    A s = 0;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s += to_acc<T>(dy[o + i]);
    s = block_reduce<A, false>(s, red);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
        dx[o + i] = from_acc<T>(to_acc<T>(dy[o + i]) - exp(to_acc<T>(y[o + i])) * s);
}

static unsigned row_threads(int64_t D) {
    unsigned t = 32;
    while (t < 1024 && t < D) t <<= 1;
    return t;
}

template <typename T> int lsm_fwd(void *y, const void *x, int64_t N, int64_t D, cudaStream_t s) {
    log_softmax_fwd_kernel<T><<<(unsigned)N, row_threads(D), 0, s>>>((T *)y, (const T *)x, D);
    return launch_check("log_softmax_forward_cuda");
}
template <typename T> int lsm_bwd(void *dx, const void *dy, const void *y, int64_t N, int64_t D, cudaStream_t s) {
    log_softmax_bwd_kernel<T><<<(unsigned)N, row_threads(D), 0, s>>>((T *)dx, (const T *)dy, (const T *)y, D);
    return launch_check("log_softmax_backward_cuda");
}

}  // namespace

extern "C" int log_softmax_forward_cuda(void *y, const void *x, int64_t N, int64_t D, zr_dtype dt,
                                        cudaStream_t stream) {
    if (N == 0 || D == 0) return 0;
    if (N > 0x7fffffffLL) return zr_error("log_softmax_forward_cuda: %lld rows is too many", (long long)N);
    ZRK_DISPATCH_FLOAT(dt, "log_softmax_forward_cuda", lsm_fwd, y, x, N, D, stream)
}

extern "C" int log_softmax_backward_cuda(void *dx, const void *dy, const void *y, int64_t N, int64_t D,
                                         zr_dtype dt, cudaStream_t stream) {
    if (N == 0 || D == 0) return 0;
    if (N > 0x7fffffffLL) return zr_error("log_softmax_backward_cuda: %lld rows is too many", (long long)N);
    ZRK_DISPATCH_FLOAT(dt, "log_softmax_backward_cuda", lsm_bwd, dx, dy, y, N, D, stream)
}

}  // namespace zrk
