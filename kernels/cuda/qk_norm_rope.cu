/* Qwen3's q/k norms fused with the rope (see qk_norm_rope.h). A head row of Dh elements is held by
 * LPR = Dh/16 lanes: lane l of the row holds the 8 elements at 8l of each half (16-byte vectors in
 * 16 bits; the rope's pairs (i, i + Dh/2) in one thread), so a warp takes RPW = 32/LPR rows at once
 * and a row's sums are reductions over its LPR lanes. Every lane of a warp runs the reductions, as
 * the shuffles need: rows past the end on zeros, storing nothing; v's rows a sum they do not use.
 * The backward walks one part's head rows with a row-major grid of warps, each lane summing its
 * columns' dy·xhat for the weight's gradient; the blocks' sums go to a workspace that a second kernel
 * adds in block order (the same bits every run). */
#include "qk_norm_rope.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" {
#include "../base/error.h"
}

#include "fused_common.cuh"

#define QKN_WARPS 8 /* warps a block */
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

/* The sum over the LPR lanes of a row (aligned groups of LPR lanes; every lane of the warp calls it). */
template <int LPR> static __device__ __forceinline__ float row_sum(float v) {
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* rstd of a head row whose lanes hold x1 (first half) and x2 (second half): zr_rmsnorm's
 * (mean x² + eps)^-1/2, the forward and backward computing it alike (the same bits) */
template <int LPR, int D>
static __device__ __forceinline__ float row_rstd(const float (&x1)[8], const float (&x2)[8], float eps) {
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += x1[e] * x1[e] + x2[e] * x2[e];
    return rsqrtf(row_sum<LPR>(ss) / (float)D + eps);
}

/* 8 consecutive elements: one 16-byte vector (VEC: 16-bit types, aligned) or one by one. */
template <typename T, bool VEC> static __device__ __forceinline__ void ld8(float (&f)[8], const T *p) {
    if (VEC) ldv<T, 8>(f, p);
    else
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = tof<T>(p[e]);
}
template <typename T, bool VEC> static __device__ __forceinline__ void st8(T *p, const float (&f)[8]) {
    if (VEC) stv<T, 8>(p, f);
    else
#pragma unroll
        for (int e = 0; e < 8; ++e) p[e] = fromf<T>(f[e]);
}

/* The 8 elements at p and the 8 at p + half (a lane's share of a head row), or zeros (p NULL). */
template <typename T, bool VEC>
static __device__ __forceinline__ void ld_pairs(float (&a)[8], float (&b)[8], const T *p, int half) {
    if (p) {
        ld8<T, VEC>(a, p);
        ld8<T, VEC>(b, p + half);
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) a[e] = b[e] = 0.f;
    }
}

template <typename T, int D, bool VEC>
__global__ void __launch_bounds__(QKN_WARPS * 32) qk_norm_rope_fwd_kernel(const qkn_fwd_args a) {
    constexpr int HALF = D / 2, LPR = D / 16, RPW = 32 / LPR;
    const int lane = threadIdx.x & 31, c = (lane % LPR) * 8;
    const int64_t r = ((int64_t)blockIdx.x * QKN_WARPS + (threadIdx.x >> 5)) * RPW + lane / LPR;
    const bool valid = r < a.rows;
    float x1[8], x2[8];
    int p = 2;
    const T *xp = nullptr;
    T *yp = nullptr;
    int64_t t = 0;
    if (valid) {
        const uint32_t j = (uint32_t)(r % a.nh);
        const int64_t bt = r / a.nh, b = bt / a.T;
        t = bt % a.T;
        p = j < a.H ? 0 : j < a.H + a.KV ? 1 : 2;
        const int64_t h = j - (p == 0 ? 0 : p == 1 ? a.H : a.H + a.KV);
        /* fields picked one by one: indexing the struct's arrays with p would copy it to the stack */
        const int64_t psb = p == 0 ? a.L.part[0][0] : p == 1 ? a.L.part[1][0] : a.L.part[2][0];
        const int64_t psh = p == 0 ? a.L.part[0][1] : p == 1 ? a.L.part[1][1] : a.L.part[2][1];
        const int64_t pst = p == 0 ? a.L.part[0][2] : p == 1 ? a.L.part[1][2] : a.L.part[2][2];
        xp = (const T *)a.qkv + b * a.L.sb + t * a.L.st + (int64_t)j * D + c;
        yp = (T *)(p == 0 ? a.part[0] : p == 1 ? a.part[1] : a.part[2]) + b * psb + h * psh + t * pst + c;
    }
    ld_pairs<T, VEC>(x1, x2, xp, HALF);
    const float rs = row_rstd<LPR, D>(x1, x2, a.eps);
    if (!valid) return;
    if (p == 2) {
        st8<T, VEC>(yp, x1);
        st8<T, VEC>(yp + HALF, x2);
        return;
    }
    float w1[8], w2[8], c1[8], c2[8], s1[8], s2[8];
    const T *w = (const T *)(p == 0 ? a.wq : a.wk) + c;
    ld8<T, VEC>(w1, w);
    ld8<T, VEC>(w2, w + HALF);
    const float *cs = a.cos + t * D + c, *sn = a.sin + t * D + c;
#pragma unroll
    for (int e = 0; e < 8; ++e)
        c1[e] = __ldg(cs + e), c2[e] = __ldg(cs + HALF + e), s1[e] = __ldg(sn + e), s2[e] = __ldg(sn + HALF + e);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        /* the norm as zr_rmsnorm: rounded, times the weight, rounded (HF's LlamaRMSNorm) */
        const float y1 = tof<T>(fromf<T>(tof<T>(fromf<T>(x1[e] * rs)) * w1[e]));
        const float y2 = tof<T>(fromf<T>(tof<T>(fromf<T>(x2[e] * rs)) * w2[e]));
        /* the rope as zr_rope: y cos + rotate_half(y) sin, rounded once */
        x1[e] = y1 * c1[e] - y2 * s1[e];
        x2[e] = y2 * c2[e] + y1 * s2[e];
    }
    st8<T, VEC>(yp, x1);
    st8<T, VEC>(yp + HALF, x2);
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

/* Head rows r = (b·T + t)·heads + h of one part (packed heads j0 + h), RPW a warp, the warps of the
 * grid taking consecutive groups in turn; NORM (q, k): g goes back through the rope's transpose
 * (rounded to T, as the composition stores it) and the norm, and each block writes its dy·xhat
 * column sums to ws[blockIdx.x] (ws NULL: not wanted); else (v) g is copied. g NULL: zeros. */
template <typename T, int D, bool NORM, bool VEC>
__global__ void __launch_bounds__(QKN_WARPS * 32) qk_norm_rope_bwd_kernel(const qkn_bwd_args a) {
    constexpr int HALF = D / 2, LPR = D / 16, RPW = 32 / LPR;
    __shared__ float sacc[NORM ? QKN_WARPS : 1][D];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = (lane % LPR) * 8;
    float w1[8], w2[8], a1[8], a2[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) a1[e] = a2[e] = 0.f, w1[e] = w2[e] = 1.f;
    if (NORM) {
        ld8<T, VEC>(w1, (const T *)a.w + c);
        ld8<T, VEC>(w2, (const T *)a.w + HALF + c);
    }
    for (int64_t r0 = ((int64_t)blockIdx.x * QKN_WARPS + warp) * RPW; r0 < a.rows;
         r0 += (int64_t)gridDim.x * QKN_WARPS * RPW) {
        const int64_t r = r0 + lane / LPR;
        const bool valid = r < a.rows;
        const int64_t h = r % a.heads, bt = r / a.heads, t = bt % a.T, b = bt / a.T;
        T *dp = (T *)a.dqkv + b * a.dsb + t * a.dst + (a.j0 + h) * D + c;
        float d1[8], d2[8];
        ld_pairs<T, VEC>(d1, d2, valid && a.g ? (const T *)a.g + b * a.gsb + h * a.gsh + t * a.gst + c : nullptr, HALF);
        if (NORM) {
            float x1[8], x2[8];
            ld_pairs<T, VEC>(x1, x2, valid ? (const T *)a.x + b * a.xsb + t * a.xst + (a.j0 + h) * D + c : nullptr, HALF);
            if (valid) {
                const float *cs = a.cos + t * D + c, *sn = a.sin + t * D + c;
#pragma unroll
                for (int e = 0; e < 8; ++e) { /* the rope's transpose, rounded as zr_rope's backward stores it */
                    const float u1 = d1[e] * __ldg(cs + e) + d2[e] * __ldg(sn + HALF + e);
                    const float u2 = d2[e] * __ldg(cs + HALF + e) - d1[e] * __ldg(sn + e);
                    d1[e] = tof<T>(fromf<T>(u1)), d2[e] = tof<T>(fromf<T>(u2));
                }
            }
            const float rs = row_rstd<LPR, D>(x1, x2, a.eps);
            float dot = 0.f;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                x1[e] *= rs, x2[e] *= rs; /* xhat */
                dot += d1[e] * w1[e] * x1[e] + d2[e] * w2[e] * x2[e];
            }
            const float cm = row_sum<LPR>(dot) / (float)D;
#pragma unroll
            for (int e = 0; e < 8; ++e) { /* dx = rstd (g − xhat · mean(g · xhat)), g = dy w; dw += dy · xhat */
                a1[e] += d1[e] * x1[e], a2[e] += d2[e] * x2[e];
                d1[e] = rs * (d1[e] * w1[e] - x1[e] * cm);
                d2[e] = rs * (d2[e] * w2[e] - x2[e] * cm);
            }
        }
        if (!valid) continue;
        if (a.accumulate) {
            float p1[8], p2[8];
            ld8<T, VEC>(p1, dp);
            ld8<T, VEC>(p2, dp + HALF);
#pragma unroll
            for (int e = 0; e < 8; ++e) d1[e] += p1[e], d2[e] += p2[e];
        }
        st8<T, VEC>(dp, d1);
        st8<T, VEC>(dp + HALF, d2);
    }
    if constexpr (NORM) {
        if (!a.ws) return;
#pragma unroll
        for (int e = 0; e < 8; ++e) /* the warp's rows' sums of each column: over its RPW row groups */
#pragma unroll
            for (int o = LPR; o < 32; o <<= 1) {
                a1[e] += __shfl_xor_sync(0xffffffffu, a1[e], o);
                a2[e] += __shfl_xor_sync(0xffffffffu, a2[e], o);
            }
        if (lane < LPR)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
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

/* dw = column sums of ws's G rows of D: block (32, 32) owns 32 columns, row group ty sums rows ty,
 * ty + 32, .., then the 32 group sums are added in order (the same bits every run). */
template <typename O>
__global__ void __launch_bounds__(1024) qk_norm_wgrad_kernel(O *dw, const float *__restrict__ ws, int G, int D) {
    __shared__ float sm[32][33];
    const int j = blockIdx.x * 32 + threadIdx.x;
    float s = 0.f;
    if (j < D)
        for (int g = threadIdx.y; g < G; g += 32) s += ws[(int64_t)g * D + j];
    sm[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < D) {
        float t = sm[0][threadIdx.x];
#pragma unroll
        for (int k = 1; k < 32; ++k) t += sm[k][threadIdx.x];
        dw[j] = fromf<O>(t);
    }
}

/* ---- host side ------------------------------------------------------------------------------ */

extern "C" int qk_norm_rope_ok(int64_t Dh) { return Dh == 64 || Dh == 128; }

static int check_shape(const char *fn, int64_t B, int64_t Tn, int64_t H, int64_t KV, int64_t Dh) {
    if (B < 0 || Tn < 0 || H < 1 || KV < 1 || !qk_norm_rope_ok(Dh))
        return zr_error("%s: bad shape B=%lld T=%lld H=%lld KV=%lld head_dim=%lld (head_dim 64 or 128)", fn,
                        (long long)B, (long long)Tn, (long long)H, (long long)KV, (long long)Dh);
    return 0;
}

/* rows a block takes at once: QKN_WARPS warps of 32 / (Dh / 16) rows */
static int64_t block_rows(int64_t Dh) { return QKN_WARPS * (32 / (Dh / 16)); }

static int bwd_blocks(int64_t rows, int64_t Dh) {
    const int64_t g = (rows + block_rows(Dh) - 1) / block_rows(Dh);
    return (int)(g < QKN_BWD_BLOCKS ? (g > 0 ? g : 1) : QKN_BWD_BLOCKS);
}

/* 16-byte vectors: 16-bit elements, every pointer 16-byte aligned and every stride a multiple of 8. */
static bool vec_ok(zr_dtype dt, const void *const *ptrs, int np, const int64_t *strides, int ns) {
    if (dt != ZR_BF16 && dt != ZR_F16) return false;
    for (int i = 0; i < np; ++i)
        if (ptrs[i] && !al16(ptrs[i])) return false;
    for (int i = 0; i < ns; ++i)
        if (strides[i] % 8) return false;
    return true;
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
    const unsigned grid = (unsigned)((a.rows + block_rows(Dh) - 1) / block_rows(Dh));
    const void *ptrs[6] = {qkv, wq, wk, q, k, v};
    int64_t strides[11] = {L->sb, L->st};
    for (int i = 0; i < 9; ++i) strides[2 + i] = L->part[i / 3][i % 3];
    const bool vec = vec_ok(dtype, ptrs, 6, strides, 11);
    ZR_FUSED_DISPATCH(fn, dtype, {
        if (Dh == 64 && vec) qk_norm_rope_fwd_kernel<T, 64, true><<<grid, QKN_WARPS * 32, 0, st>>>(a);
        else if (Dh == 64) qk_norm_rope_fwd_kernel<T, 64, false><<<grid, QKN_WARPS * 32, 0, st>>>(a);
        else if (vec) qk_norm_rope_fwd_kernel<T, 128, true><<<grid, QKN_WARPS * 32, 0, st>>>(a);
        else qk_norm_rope_fwd_kernel<T, 128, false><<<grid, QKN_WARPS * 32, 0, st>>>(a);
    });
    return launch_check(fn);
}

extern "C" size_t qk_norm_rope_backward_workspace(int64_t B, int64_t Tn, int64_t heads, int64_t Dh) {
    return (size_t)bwd_blocks(B * Tn * heads, Dh) * (size_t)Dh * sizeof(float);
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
    const int G = bwd_blocks(a.rows, Dh), D = (int)Dh;
    const void *ptrs[4] = {dqkv, g, x, w};
    const int64_t strides[7] = {a.dsb, a.dst, a.gsb, a.gsh, a.gst, a.xsb, a.xst};
    const bool vec = vec_ok(dtype, ptrs, 4, strides, 7);
#define QKN_BWD(DH, NORM)                                                                          \
    (vec ? qk_norm_rope_bwd_kernel<T, DH, NORM, true> : qk_norm_rope_bwd_kernel<T, DH, NORM, false>) \
        <<<G, QKN_WARPS * 32, 0, st>>>(a)
    ZR_FUSED_DISPATCH(fn, dtype, {
        if (a.rows > 0) {
            if (p == 2 && Dh == 64) QKN_BWD(64, false);
            else if (p == 2) QKN_BWD(128, false);
            else if (Dh == 64) QKN_BWD(64, true);
            else QKN_BWD(128, true);
        } else if (dw && cudaMemsetAsync(ws, 0, (size_t)G * D * sizeof(float), st) != cudaSuccess) {
            return zr_error("%s: cudaMemsetAsync failed", fn);
        }
        if (dw) {
            const dim3 g2((unsigned)((D + 31) / 32)), b2(32, 32);
            if (wdtype == ZR_F32) qk_norm_wgrad_kernel<float><<<g2, b2, 0, st>>>((float *)dw, ws, G, D);
            else qk_norm_wgrad_kernel<T><<<g2, b2, 0, st>>>((T *)dw, ws, G, D);
        }
    });
#undef QKN_BWD
    return launch_check(fn);
}
