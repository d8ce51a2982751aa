/* The register path of RMSNorm and LayerNorm on CUDA (norm.cu launches it): forward and backward
 * kernels whose rows are held in registers by a group of 1-8 warps, and the group reduction they
 * share. CUDA C++ only; norm.cu alone includes it. */
#ifndef ZR_CUDA_NORM_REG_CUH
#define ZR_CUDA_NORM_REG_CUH

#include "fused_common.cuh"

/* ---- register-held rows (the fast path) ------------------------------------------------------
 * A row is handled by a group of WPR warps; lane l of warp k of the group owns the C chunks of V
 * elements at ((c * WPR + k) * 32 + l) * V, held in registers, so the row is read from memory
 * once. A block holds NW = max(WPR, 4) warps (8 in backward), i.e. NW / WPR groups; a group's
 * reduction uses warp shuffles and, when WPR > 1, one named barrier of that group. */

static __device__ __forceinline__ void group_bar(int id, int nthreads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

/* Sums (a, b) over the group; red: shared float2[2][NW] (parity-alternated slots so that one
 * barrier per reduction suffices). Fixed order: the same bits every run. MAXA: a is a max. */
template <int WPR, bool MAXA>
static __device__ __forceinline__ float2 group_reduce(float a, float b, float2 *red, int &par) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, a, o);
        a = MAXA ? fmaxf(a, oa) : a + oa;
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if (WPR == 1) return make_float2(a, b);
    const int warp = threadIdx.x >> 5, grp = warp / WPR;
    const int nw = blockDim.x >> 5;
    if ((threadIdx.x & 31) == 0) red[par * nw + warp] = make_float2(a, b);
    group_bar(1 + grp, WPR * 32);
    float2 s = red[par * nw + grp * WPR];
#pragma unroll
    for (int k = 1; k < WPR; ++k) {
        const float2 t = red[par * nw + grp * WPR + k];
        s.x = MAXA ? fmaxf(s.x, t.x) : s.x + t.x;
        s.y += t.y;
    }
    par ^= 1;
    return s;
}

template <typename T, int V>
static __device__ __forceinline__ void unpack(float *f, const uint4 &r) {
    const T *e = reinterpret_cast<const T *>(&r);
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = tof<T>(e[k]);
}

/* Forward: a row per group, its raw 16-byte chunks loaded before any use. With NORM_FWD_WAVES > 0
 * the grid is capped and groups stride over rows, loading the next row before working on the
 * current one (measured no faster on the H200 at N=16384, D=2048, so off by default).
 * LN: y = (x-mean)*rstd*w + b, else y = x*rstd*w; RES: x := x + res rounded to T and written to
 * hout (which may alias x or res: each element is read before it is written, and the row
 * prefetched is another row). */
template <typename T, int V, int C, int WPR, bool LN, bool RES>
__global__ void __launch_bounds__(128 > WPR * 32 ? 128 : WPR * 32)
    norm_fwd_reg_kernel(T *__restrict__ y, T *hout, float *__restrict__ mean_out,
                        float *__restrict__ rstd_out, const T *x, const T *res,
                        const T *__restrict__ w, const T *__restrict__ b, int64_t N, int64_t D,
                        float eps) {
    __shared__ float2 red[2 * 16];
    const int warp = threadIdx.x >> 5, G = (blockDim.x >> 5) / WPR, grp = warp / WPR;
    const int tig = threadIdx.x - grp * WPR * 32;
    const int64_t stride = (int64_t)gridDim.x * G;
    int64_t row = (int64_t)blockIdx.x * G + grp; /* uniform in the group: its barrier is its own */
    int par = 0;
    uint4 cx[C], cr[C];
    ld_row<T, V, C, WPR>(cx, x, row, N, D, tig);
    if (RES) ld_row<T, V, C, WPR>(cr, res, row, N, D, tig);
    for (; row < N; row += stride) {
        uint4 nx[C], nr[C];
        ld_row<T, V, C, WPR>(nx, x, row + stride, N, D, tig);
        if (RES) ld_row<T, V, C, WPR>(nr, res, row + stride, N, D, tig);
        const int64_t base = row * D;
        float f[C][V];
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            unpack<T, V>(f[c], cx[c]);
            if (RES) {
                float r[V];
                unpack<T, V>(r, cr[c]);
#pragma unroll
                for (int k = 0; k < V; ++k) f[c][k] = tof<T>(fromf<T>(f[c][k] + r[k]));
            }
        }
        if (RES) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const int64_t i = ((int64_t)c * WPR * 32 + tig) * V;
                if (i < D) stv<T, V>(hout + base + i, f[c]);
            }
        }
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
            for (int k = 0; k < V; ++k) s += LN ? f[c][k] : f[c][k] * f[c][k];
        float mu = 0.f, var;
        if (LN) {
            mu = group_reduce<WPR, false>(s, 0.f, red, par).x / (float)D;
            float s2 = 0.f;
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const int64_t i = ((int64_t)c * WPR * 32 + tig) * V;
                if (i < D)
#pragma unroll
                    for (int k = 0; k < V; ++k) s2 += (f[c][k] - mu) * (f[c][k] - mu);
            }
            var = group_reduce<WPR, false>(s2, 0.f, red, par).x / (float)D;
        } else {
            var = group_reduce<WPR, false>(s, 0.f, red, par).x / (float)D;
        }
        const float r = rsqrtf(var + eps);
        if (tig == 0) {
            if (rstd_out) rstd_out[row] = r;
            if (LN && mean_out) mean_out[row] = mu;
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int64_t i = ((int64_t)c * WPR * 32 + tig) * V;
            if (i < D) {
                float wv[V], bv[V];
                if (w) ldv<T, V>(wv, w + i);
                if (LN && b) ldv<T, V>(bv, b + i);
#pragma unroll
                for (int k = 0; k < V; ++k) {
                    float o = (f[c][k] - mu) * r;
                    if (w) o *= wv[k];
                    if (LN && b) o += bv[k];
                    f[c][k] = o;
                }
                stv<T, V>(y + base + i, f[c]);
            }
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
            cx[c] = nx[c];
            if (RES) cr[c] = nr[c];
        }
    }
}

/* Backward: a grid of row-striding blocks of 8 warps (8 / WPR groups). RMSNorm: each group loads
 * the next row (x, dy, dres, rstd) before working on the current one, and dres with x and dy (not
 * after the reduction): one memory latency per row and two rows per group in flight (measured
 * 68% -> 80% of copy); LayerNorm does too with one chunk per lane (PF; its registers capped
 * for 3 blocks per SM) and with three (a warp a row, GPT-2's width), and loads only the current
 * row with two (the prefetch registers cost occupancy: 63% -> 61%). Each
 * thread keeps the weight-gradient sums of its own columns in registers, the block adds its
 * groups' sums in group order and writes one partial row: part[blockIdx.x] = (sum dy*xhat (D),
 * sum dy (D)). dx may alias dy or dres (a row is read before it is written; the prefetched row is
 * another one). RMSNorm's weight is w + woff (0, or Gemma's 1). */
template <typename T, int V, int C, int WPR, bool LN, bool PF = !LN>
__global__ void __launch_bounds__(256, LN && PF && C == 1 ? 3 : 1)
    norm_bwd_reg_kernel(T *dx, float *__restrict__ part, const T *dy, const T *__restrict__ x,
                        const T *__restrict__ w, const float *__restrict__ mean,
                        const float *__restrict__ rstd, const T *dres, int64_t N, int64_t D, float woff) {
    __shared__ float2 red[2 * 8];
    extern __shared__ float accs[]; /* 2*D floats when part != NULL */
    const int warp = threadIdx.x >> 5, G = 8 / WPR, grp = warp / WPR;
    const int tig = threadIdx.x - grp * WPR * 32;
    int par = 0;
    float wv[C][V], aw[C][V], ab[C][V];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int64_t i = ((int64_t)c * WPR * 32 + tig) * V;
#pragma unroll
        for (int k = 0; k < V; ++k) aw[c][k] = ab[c][k] = 0.f, wv[c][k] = 1.f;
        if (w && i < D) {
            ldv<T, V>(wv[c], w + i);
            if (!LN)
#pragma unroll
                for (int k = 0; k < V; ++k) wv[c][k] += woff; /* Gemma's (1 + w) */
        }
    }
    const int64_t stride = (int64_t)gridDim.x * G;
    int64_t row = (int64_t)blockIdx.x * G + grp;
    uint4 cx[C], cd[C], cr[C];
    float crs = 0.f, cmu = 0.f;
    if (PF) {
        ld_row<T, V, C, WPR>(cx, x, row, N, D, tig);
        ld_row<T, V, C, WPR>(cd, dy, row, N, D, tig);
        if (dres) ld_row<T, V, C, WPR>(cr, dres, row, N, D, tig);
        if (row < N) crs = rstd[row], cmu = LN ? mean[row] : 0.f;
    }
    for (; row < N; row += stride) {
        const int64_t nrow = PF ? row + stride : row; /* the row loaded now */
        uint4 nx[C], nd[C], nr[C];
        float nrs = 0.f, nmu = 0.f;
        ld_row<T, V, C, WPR>(PF ? nx : cx, x, nrow, N, D, tig);
        ld_row<T, V, C, WPR>(PF ? nd : cd, dy, nrow, N, D, tig);
        if (dres) ld_row<T, V, C, WPR>(PF ? nr : cr, dres, nrow, N, D, tig);
        if (nrow < N) {
            float &rs = PF ? nrs : crs, &mu_ = PF ? nmu : cmu;
            rs = rstd[nrow];
            mu_ = LN ? mean[nrow] : 0.f;
        }
        const float r = crs, mu = cmu;
        const int64_t base = row * D;
        float f[C][V], d[C][V];
#pragma unroll
        for (int c = 0; c < C; ++c) {
            unpack<T, V>(f[c], cx[c]);
            unpack<T, V>(d[c], cd[c]);
        }
        float sg = 0.f, sgx = 0.f;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int64_t i = ((int64_t)c * WPR * 32 + tig) * V;
            if (i < D)
#pragma unroll
                for (int k = 0; k < V; ++k) {
                    const float g = d[c][k] * wv[c][k];
                    sg += g;
                    sgx += g * (f[c][k] - mu) * r;
                }
        }
        const float2 t = group_reduce<WPR, false>(sgx, sg, red, par);
        sgx = t.x / (float)D;
        sg = LN ? t.y / (float)D : 0.f;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int64_t i = ((int64_t)c * WPR * 32 + tig) * V;
            if (i < D) {
                float o[V];
                if (dres) unpack<T, V>(o, cr[c]);
#pragma unroll
                for (int k = 0; k < V; ++k) {
                    const float xh = (f[c][k] - mu) * r, g = d[c][k] * wv[c][k];
                    const float v = r * (g - sg - xh * sgx);
                    o[k] = dres ? o[k] + v : v;
                    aw[c][k] += d[c][k] * xh;
                    ab[c][k] += d[c][k];
                }
                stv<T, V>(dx + base + i, o);
            }
        }
        if (PF) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
                cx[c] = nx[c], cd[c] = nd[c];
                if (dres) cr[c] = nr[c];
            }
            crs = nrs, cmu = nmu;
        }
    }
    /* the weight-gradient kernel may launch now (it waits for this grid before reading) */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (!part) return;
    if constexpr (WPR == 8) { /* one group (G = 1): its sums are the block's, straight from registers */
        float *pr = part + (int64_t)blockIdx.x * 2 * D;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int64_t i = ((int64_t)c * WPR * 32 + tig) * V;
            if (i < D)
#pragma unroll
                for (int k = 0; k < V; k += 4) {
                    *reinterpret_cast<float4 *>(pr + i + k) = make_float4(aw[c][k], aw[c][k + 1], aw[c][k + 2], aw[c][k + 3]);
                    if (LN)
                        *reinterpret_cast<float4 *>(pr + D + i + k) = make_float4(ab[c][k], ab[c][k + 1], ab[c][k + 2], ab[c][k + 3]);
                }
        }
    } else {
        for (int g = 0; g < G; ++g) {
            if (grp == g)
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    const int64_t i = ((int64_t)c * WPR * 32 + tig) * V;
                    if (i < D)
#pragma unroll
                        for (int k = 0; k < V; ++k) {
                            accs[i + k] = g ? accs[i + k] + aw[c][k] : aw[c][k];
                            if (LN) accs[D + i + k] = g ? accs[D + i + k] + ab[c][k] : ab[c][k];
                        }
                }
            __syncthreads();
        }
        const int64_t nacc = LN ? 2 * D : D;
        for (int64_t i = threadIdx.x; i < nacc; i += blockDim.x)
            part[(int64_t)blockIdx.x * 2 * D + i] = accs[i];
    }
}

#endif
