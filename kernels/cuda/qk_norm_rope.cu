/* Qwen3's q/k norms fused with the rope (see qk_norm_rope.h). One warp per head row of the packed
 * product: lane l holds the E = Dh/64 elements at l·E of each half of the head (the rope's pairs
 * (i, i + Dh/2) in one thread), the row's sum of squares is a warp reduction. The backward walks
 * the q and k head rows of a row-major grid of warps, each lane summing its columns' dy·xhat for
 * the weight gradients; the blocks' sums go to a workspace that a second kernel adds in block order
 * (the same bits every run). */
#include "qk_norm_rope.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" {
#include "../base/error.h"
}

#include "fused_common.cuh"

#define QKN_WARPS 8 /* warps (head rows in flight) a block */
#define QKN_BWD_BLOCKS 512 /* the backward's grid at most (row-major: the same sums every run) */

struct qkn_fwd_args {
    const void *qkv, *wq, *wk;
    void *part[3];
    zr_qkv_layout L;
    const float *cos, *sin;
    int64_t rows;
    uint32_t T, H, KV, nh;
    float eps;
};

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* rstd of a head row whose lane holds x1 (first half) and x2 (second half): zr_rmsnorm's
 * (mean x² + eps)^-1/2, the forward and backward computing it alike (the same bits) */
template <int E, int D>
static __device__ __forceinline__ float row_rstd(const float (&x1)[E], const float (&x2)[E], float eps) {
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) ss += x1[e] * x1[e] + x2[e] * x2[e];
    return rsqrtf(warp_sum(ss) / (float)D + eps);
}

template <typename T, int E>
static __device__ __forceinline__ void ld_half(float (&f)[E], const T *p) {
#pragma unroll
    for (int e = 0; e < E; ++e) f[e] = tof<T>(p[e]);
}
template <typename T, int E>
static __device__ __forceinline__ void st_half(T *p, const float (&f)[E]) {
#pragma unroll
    for (int e = 0; e < E; ++e) p[e] = fromf<T>(f[e]);
}

template <typename T, int D>
__global__ void __launch_bounds__(QKN_WARPS * 32) qk_norm_rope_fwd_kernel(const qkn_fwd_args a) {
    constexpr int HALF = D / 2, E = HALF / 32;
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * QKN_WARPS + (threadIdx.x >> 5);
    if (r >= a.rows) return;
    const uint32_t j = (uint32_t)(r % a.nh);
    const int64_t bt = r / a.nh, t = bt % a.T, b = bt / a.T;
    const int p = j < a.H ? 0 : j < a.H + a.KV ? 1 : 2;
    const int64_t h = j - (p == 0 ? 0 : p == 1 ? a.H : a.H + a.KV);
    /* fields picked one by one: indexing the struct's arrays with p would copy it to the stack */
    const int64_t psb = p == 0 ? a.L.part[0][0] : p == 1 ? a.L.part[1][0] : a.L.part[2][0];
    const int64_t psh = p == 0 ? a.L.part[0][1] : p == 1 ? a.L.part[1][1] : a.L.part[2][1];
    const int64_t pst = p == 0 ? a.L.part[0][2] : p == 1 ? a.L.part[1][2] : a.L.part[2][2];
    const int c = lane * E;
    const T *xp = (const T *)a.qkv + b * a.L.sb + t * a.L.st + (int64_t)j * D + c;
    T *yp = (T *)(p == 0 ? a.part[0] : p == 1 ? a.part[1] : a.part[2]) + b * psb + h * psh + t * pst + c;
    float x1[E], x2[E];
    ld_half<T, E>(x1, xp);
    ld_half<T, E>(x2, xp + HALF);
    if (p == 2) {
        st_half<T, E>(yp, x1);
        st_half<T, E>(yp + HALF, x2);
        return;
    }
    const float rs = row_rstd<E, D>(x1, x2, a.eps);
    const T *w = (const T *)(p == 0 ? a.wq : a.wk) + c;
    const float *cs = a.cos + t * D + c, *sn = a.sin + t * D + c;
    float o1[E], o2[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        /* the norm as zr_rmsnorm: rounded, times the weight, rounded (HF's LlamaRMSNorm) */
        const float y1 = tof<T>(fromf<T>(tof<T>(fromf<T>(x1[e] * rs)) * tof<T>(w[e])));
        const float y2 = tof<T>(fromf<T>(tof<T>(fromf<T>(x2[e] * rs)) * tof<T>(w[HALF + e])));
        /* the rope as zr_rope: y cos + rotate_half(y) sin, rounded once */
        o1[e] = y1 * __ldg(cs + e) - y2 * __ldg(sn + e);
        o2[e] = y2 * __ldg(cs + HALF + e) + y1 * __ldg(sn + HALF + e);
    }
    st_half<T, E>(yp, o1);
    st_half<T, E>(yp + HALF, o2);
}

struct qkn_bwd_args {
    void *dqkv;
    const void *g, *x, *w;
    const float *cos, *sin;
    float *ws;
    int64_t dsb, dst, gsb, gsh, gst, xsb, xst, rows;
    uint32_t T, heads, j0;
    int accumulate;
    float eps;
};

/* Head rows r = (b·T + t)·heads + h of one part (packed heads j0 + h); the grid's warps take rows r,
 * r + the grid's warps, ..; NORM (q, k): g goes back through the rope's transpose (rounded to T, as
 * the composition stores it) and the norm, and each block writes its dy·xhat column sums to
 * ws[blockIdx.x] (ws NULL: not wanted); else (v) g is copied. g NULL: zeros. */
template <typename T, int D, bool NORM>
__global__ void __launch_bounds__(QKN_WARPS * 32) qk_norm_rope_bwd_kernel(const qkn_bwd_args a) {
    constexpr int HALF = D / 2, E = HALF / 32;
    __shared__ float sacc[NORM ? QKN_WARPS : 1][D];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = lane * E;
    float w1[E], w2[E], a1[E], a2[E];
#pragma unroll
    for (int e = 0; e < E; ++e) a1[e] = a2[e] = 0.f, w1[e] = w2[e] = 1.f;
    if (NORM) {
        ld_half<T, E>(w1, (const T *)a.w + c);
        ld_half<T, E>(w2, (const T *)a.w + HALF + c);
    }
    for (int64_t r = (int64_t)blockIdx.x * QKN_WARPS + warp; r < a.rows; r += (int64_t)gridDim.x * QKN_WARPS) {
        const int64_t h = r % a.heads, bt = r / a.heads, t = bt % a.T, b = bt / a.T;
        T *dp = (T *)a.dqkv + b * a.dsb + t * a.dst + (a.j0 + h) * D + c;
        float d1[E], d2[E], o1[E], o2[E];
        if (a.g) {
            const T *gp = (const T *)a.g + b * a.gsb + h * a.gsh + t * a.gst + c;
            ld_half<T, E>(d1, gp);
            ld_half<T, E>(d2, gp + HALF);
        } else {
#pragma unroll
            for (int e = 0; e < E; ++e) d1[e] = d2[e] = 0.f;
        }
        if (NORM) {
            const float *cs = a.cos + t * D + c, *sn = a.sin + t * D + c;
#pragma unroll
            for (int e = 0; e < E; ++e) { /* the rope's transpose, rounded as zr_rope's backward stores it */
                const float u1 = d1[e] * __ldg(cs + e) + d2[e] * __ldg(sn + HALF + e);
                const float u2 = d2[e] * __ldg(cs + HALF + e) - d1[e] * __ldg(sn + e);
                d1[e] = tof<T>(fromf<T>(u1)), d2[e] = tof<T>(fromf<T>(u2));
            }
            const T *xp = (const T *)a.x + b * a.xsb + t * a.xst + (a.j0 + h) * D + c;
            float x1[E], x2[E];
            ld_half<T, E>(x1, xp);
            ld_half<T, E>(x2, xp + HALF);
            const float rs = row_rstd<E, D>(x1, x2, a.eps);
            float dot = 0.f;
#pragma unroll
            for (int e = 0; e < E; ++e) {
                x1[e] *= rs, x2[e] *= rs; /* xhat */
                dot += d1[e] * w1[e] * x1[e] + d2[e] * w2[e] * x2[e];
            }
            const float cm = warp_sum(dot) / (float)D;
#pragma unroll
            for (int e = 0; e < E; ++e) { /* dx = rstd (g − xhat · mean(g · xhat)), g = dy w */
                o1[e] = rs * (d1[e] * w1[e] - x1[e] * cm);
                o2[e] = rs * (d2[e] * w2[e] - x2[e] * cm);
                a1[e] += d1[e] * x1[e], a2[e] += d2[e] * x2[e];
            }
        } else {
#pragma unroll
            for (int e = 0; e < E; ++e) o1[e] = d1[e], o2[e] = d2[e];
        }
        if (a.accumulate) {
            float p1[E], p2[E];
            ld_half<T, E>(p1, dp);
            ld_half<T, E>(p2, dp + HALF);
#pragma unroll
            for (int e = 0; e < E; ++e) o1[e] += p1[e], o2[e] += p2[e];
        }
        st_half<T, E>(dp, o1);
        st_half<T, E>(dp + HALF, o2);
    }
    if constexpr (NORM) {
        if (!a.ws) return;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            sacc[warp][c + e] = a1[e];
            sacc[warp][HALF + c + e] = a2[e];
        }
        __syncthreads();
        for (int i = threadIdx.x; i < D; i += QKN_WARPS * 32) {
            float s = 0.f;
#pragma unroll
            for (int w = 0; w < QKN_WARPS; ++w) s += sacc[w][i];
            a.ws[(int64_t)blockIdx.x * D + i] = s;
        }
    }
}

/* dw = column sums of ws's G rows of D, in row order. */
template <typename O>
__global__ void qk_norm_wgrad_kernel(O *dw, const float *__restrict__ ws, int G, int D) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= D) return;
    float s = 0.f;
    for (int g = 0; g < G; ++g) s += ws[(int64_t)g * D + i];
    dw[i] = fromf<O>(s);
}

/* ---- host side ------------------------------------------------------------------------------ */

extern "C" int qk_norm_rope_ok(int64_t Dh) { return Dh == 64 || Dh == 128; }

static int check_shape(const char *fn, int64_t B, int64_t Tn, int64_t H, int64_t KV, int64_t Dh) {
    if (B < 0 || Tn < 0 || H < 1 || KV < 1 || !qk_norm_rope_ok(Dh))
        return zr_error("%s: bad shape B=%lld T=%lld H=%lld KV=%lld head_dim=%lld (head_dim 64 or 128)", fn,
                        (long long)B, (long long)Tn, (long long)H, (long long)KV, (long long)Dh);
    return 0;
}

extern "C" int qk_norm_rope_forward_cuda(void *q, void *k, void *v, const void *qkv, const void *wq, const void *wk,
                                         float eps, const float *cos, const float *sin, const zr_qkv_layout *L,
                                         int64_t B, int64_t Tn, int64_t H, int64_t KV, int64_t Dh, zr_dtype dtype,
                                         cudaStream_t st) {
    const char *fn = "qk_norm_rope_forward_cuda";
    if (check_shape(fn, B, Tn, H, KV, Dh)) return -1;
    qkn_fwd_args a = {};
    a.qkv = qkv, a.wq = wq, a.wk = wk, a.part[0] = q, a.part[1] = k, a.part[2] = v;
    a.L = *L, a.cos = cos, a.sin = sin, a.eps = eps;
    a.rows = B * Tn * (H + 2 * KV);
    a.T = (uint32_t)Tn, a.H = (uint32_t)H, a.KV = (uint32_t)KV, a.nh = (uint32_t)(H + 2 * KV);
    if (a.rows == 0) return 0;
    const unsigned grid = (unsigned)((a.rows + QKN_WARPS - 1) / QKN_WARPS);
    ZR_FUSED_DISPATCH(fn, dtype, {
        if (Dh == 64) qk_norm_rope_fwd_kernel<T, 64><<<grid, QKN_WARPS * 32, 0, st>>>(a);
        else qk_norm_rope_fwd_kernel<T, 128><<<grid, QKN_WARPS * 32, 0, st>>>(a);
    });
    return launch_check(fn);
}

static int bwd_blocks(int64_t rows) {
    const int64_t g = (rows + QKN_WARPS - 1) / QKN_WARPS;
    return (int)(g < QKN_BWD_BLOCKS ? (g > 0 ? g : 1) : QKN_BWD_BLOCKS);
}

extern "C" size_t qk_norm_rope_backward_workspace(int64_t B, int64_t Tn, int64_t heads, int64_t Dh) {
    return (size_t)bwd_blocks(B * Tn * heads) * (size_t)Dh * sizeof(float);
}

extern "C" int qk_norm_rope_backward_cuda(void *dqkv, const void *g, const zr_qkv_layout *L, int p, const void *x,
                                          int64_t xsb, int64_t xst, const void *w, float eps, const float *cos,
                                          const float *sin, void *dw, zr_dtype wdtype, float *ws, int accumulate,
                                          int64_t B, int64_t Tn, int64_t H, int64_t KV, int64_t Dh, zr_dtype dtype,
                                          cudaStream_t st) {
    const char *fn = "qk_norm_rope_backward_cuda";
    if (check_shape(fn, B, Tn, H, KV, Dh)) return -1;
    if (p < 0 || p > 2) return zr_error("%s: part %d (0 q, 1 k, 2 v)", fn, p);
    if (dw && wdtype != dtype && wdtype != ZR_F32)
        return zr_error("%s: the weight gradient's dtype must be the activations' or f32", fn);
    if (dw && (p == 2 || !ws)) return zr_error("%s: a weight gradient needs part q or k and the workspace", fn);
    const int64_t heads = p == 0 ? H : KV;
    qkn_bwd_args a = {};
    a.dqkv = dqkv, a.g = g, a.x = x, a.w = w, a.cos = cos, a.sin = sin, a.ws = dw ? ws : NULL, a.eps = eps;
    a.dsb = L->sb, a.dst = L->st, a.gsb = L->part[p][0], a.gsh = L->part[p][1], a.gst = L->part[p][2];
    a.xsb = xsb, a.xst = xst, a.rows = B * Tn * heads, a.accumulate = accumulate;
    a.T = (uint32_t)Tn, a.heads = (uint32_t)heads, a.j0 = (uint32_t)(p == 0 ? 0 : p == 1 ? H : H + KV);
    const int G = bwd_blocks(a.rows), D = (int)Dh;
    ZR_FUSED_DISPATCH(fn, dtype, {
        if (a.rows > 0) {
            if (p == 2 && Dh == 64) qk_norm_rope_bwd_kernel<T, 64, false><<<G, QKN_WARPS * 32, 0, st>>>(a);
            else if (p == 2) qk_norm_rope_bwd_kernel<T, 128, false><<<G, QKN_WARPS * 32, 0, st>>>(a);
            else if (Dh == 64) qk_norm_rope_bwd_kernel<T, 64, true><<<G, QKN_WARPS * 32, 0, st>>>(a);
            else qk_norm_rope_bwd_kernel<T, 128, true><<<G, QKN_WARPS * 32, 0, st>>>(a);
        } else if (dw && cudaMemsetAsync(ws, 0, (size_t)G * D * sizeof(float), st) != cudaSuccess) {
            return zr_error("%s: cudaMemsetAsync failed", fn);
        }
        if (dw) {
            const unsigned g2 = (unsigned)((D + 127) / 128);
            if (wdtype == ZR_F32) qk_norm_wgrad_kernel<float><<<g2, 128, 0, st>>>((float *)dw, ws, G, D);
            else qk_norm_wgrad_kernel<T><<<g2, 128, 0, st>>>((T *)dw, ws, G, D);
        }
    });
    return launch_check(fn);
}
