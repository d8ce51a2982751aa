/* RMSNorm and LayerNorm on CUDA, forward and backward (the forward templates' RES variant fuses
 * the residual add: add_rmsnorm_forward_cuda, add_layernorm_forward_cuda). Rows
 * whose 16-byte chunks fit in registers (bf16: D <= 16K forward, 2K/4K RMS/LN backward) take the register
 * path: a group of 1-8 warps per row, the row read once, LayerNorm forward and both backwards
 * (RMSNorm forward measured faster with the block-per-row kernel); other rows take block-per-row
 * (forward) and row-striding blocks with shared-memory weight-gradient partials (backward). Both
 * backwards write one partial row per block, summed by a second kernel in a fixed order, launched
 * as a programmatic dependent (PDL) so that its launch overlaps the first kernel's tail. */
#include "norm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" {
#include "../base/error.h"
}

#include "fused_common.cuh"
#include "norm_reg.cuh" /* the register path's kernels */

/* ---- kernels -------------------------------------------------------------------------------- */

#define NORM_BWD_MAX_BLOCKS 512 /* 1024 measured slower on the H200 */
#ifndef NORM_FWD_WAVES
#define NORM_FWD_WAVES 0 /* forward register path: grid capped at this many rounds of resident
                          * blocks (rows stride over it); 0: one row per group (measured best) */
#endif


/* One block per row. LN: y = (x-mean)*rstd*w + b; else, woff 0: y = w * T(x*rstd) (Hugging Face's
 * LlamaRMSNorm: the normalised row is rounded to the dtype before the weight; one pass), woff 1:
 * y = T(x*rstd * (1 + w)) (Gemma's RMSNorm: in f32, rounded once). RES: x := x + res first,
 * rounded to T and written to hout (hout may alias x or res, so no __restrict__ on those). */
template <typename T, int V, bool LN, bool RES>
__global__ void norm_fwd_kernel(T *__restrict__ y, T *hout, float *__restrict__ mean_out,
                                float *__restrict__ rstd_out, const T *x, const T *res,
                                const T *__restrict__ w, const T *__restrict__ b, int64_t D,
                                float eps, float woff) {
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
            if (!LN && woff == 0.f) o = tof<T>(fromf<T>(o)); /* a no-op for f32 */
            if (w) o *= LN ? wv[k] : wv[k] + woff;
            if (LN && b) o += bv[k];
            f[k] = o;
        }
        stv<T, V>(y + row * D + i, f);
    }
}

/* Row-striding backward (woff: RMSNorm's weight offset, as the forward's); dx may alias dy or dres (each element is read before it is written). part (gridDim.x × 2D f32, NULL when no weight gradient is wanted):
 * this block's sums of dy*xhat (first D) and dy (next D). */
template <typename T, int V, bool LN>
__global__ void norm_bwd_kernel(T *dx, float *__restrict__ part, const T *dy,
                                const T *__restrict__ x,
                                const T *__restrict__ w, const float *__restrict__ mean,
                                const float *__restrict__ rstd, const T *dres,
                                int64_t N, int64_t D, float woff) {
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
                const float g = w ? d[k] * (LN ? wv[k] : wv[k] + woff) : d[k];
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
                const float xh = (f[k] - mu) * r, g = w ? d[k] * (LN ? wv[k] : wv[k] + woff) : d[k];
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

/* dw/db from the partial rows: block (32, 32) owns 32 columns of the (G, ncol) partials; row
 * group ty sums rows ty + 32 (4i + u) into four sums u (four loads in flight), adds them in
 * order, then the 32 group sums are added in order: the same bits every run. (Was (32, 8) with one
 * sum: latency-bound, 9 us for 396 x 4096 partials; now 7 us with its launch.) Launched as a
 * programmatic dependent of the backward kernel: griddepcontrol.wait returns once that grid is
 * complete and its writes visible (at once when launched plainly). dw in O and db in OB; acc bit 0:
 * dw += the sum (else dw = it), bit 1: the same for db. */
template <typename O, typename OB>
__global__ void __launch_bounds__(1024)
    norm_wgrad2_kernel(O *__restrict__ dw, OB *__restrict__ db, const float *__restrict__ part, int G,
                       int64_t D, int64_t ncol, int acc) {
    __shared__ float sm[32][33];
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const int64_t j = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
    if (j < ncol) {
        const float *p = part + j;
        const int64_t rs = 2 * D;
        int g = threadIdx.y;
        for (; g + 96 < G; g += 128) {
            s0 += p[(int64_t)g * rs];
            s1 += p[(int64_t)(g + 32) * rs];
            s2 += p[(int64_t)(g + 64) * rs];
            s3 += p[(int64_t)(g + 96) * rs];
        }
        if (g < G) s0 += p[(int64_t)g * rs];
        if (g + 32 < G) s1 += p[(int64_t)(g + 32) * rs];
        if (g + 64 < G) s2 += p[(int64_t)(g + 64) * rs];
    }
    sm[threadIdx.y][threadIdx.x] = (s0 + s1) + (s2 + s3);
    __syncthreads();
    if (threadIdx.y == 0 && j < ncol) {
        float t = sm[0][threadIdx.x];
#pragma unroll
        for (int k = 1; k < 32; ++k) t += sm[k][threadIdx.x];
        if (j < D) {
            if (dw) dw[j] = fromf<O>(acc & 1 ? tof<O>(dw[j]) + t : t);
        } else if (db)
            db[j - D] = fromf<OB>(acc & 2 ? tof<OB>(db[j - D]) + t : t);
    }
}

/* Launches norm_wgrad2_kernel as a programmatic dependent of the kernel before it on st (its
 * launch overlaps that kernel's tail), or plainly where the attribute is refused. dw in O and db in
 * OB (T, or f32: an fp32 gradient written or, acc, added to in the same pass: no cast or add
 * kernel after). */
template <typename O, typename OB>
static void wgrad2_launch(O *dw, OB *db, const float *part, int G, int64_t D, int64_t ncol, int acc,
                          cudaStream_t st) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)((ncol + 31) / 32));
    cfg.blockDim = dim3(32, 32);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, norm_wgrad2_kernel<O, OB>, dw, db, part, G, D, ncol, acc) != cudaSuccess) {
        (void)cudaGetLastError();
        norm_wgrad2_kernel<O, OB><<<cfg.gridDim, cfg.blockDim, 0, st>>>(dw, db, part, G, D, ncol, acc);
    }
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

static int64_t bwd_blocks(int64_t N) { return N < NORM_BWD_MAX_BLOCKS ? N : NORM_BWD_MAX_BLOCKS; }

/* Register-path configuration for rows of D elements in chunks of V: warps per row (1, 2, 4, 8)
 * and chunks per lane (up to maxc); 0 when D is too long (the shared-memory kernels take it).
 * Forward: up to 8 chunks per lane; backward: 1 or 2 (the weight-gradient sums live in registers
 * too). */
static int reg_config(int64_t D, int V, int maxc, int *wpr, int *c) {
    const int64_t nch = (D + 32 * V - 1) / (32 * V);
    for (int w = 1; w <= 8; w *= 2)
        for (int cc = 1; cc <= maxc; cc *= 2)
            if ((int64_t)w * cc >= nch && (w == 1 || cc == maxc)) {
                *wpr = w, *c = cc;
                return 1;
            }
    return 0;
}


template <typename T, int C, int WPR, bool LN, bool RES>
static void fwd_reg_launch(void *y, void *h, float *mean, float *rstd, const void *x,
                           const void *res, const void *w, const void *b, int64_t N, int64_t D,
                           float eps, cudaStream_t st) {
    const int NW = WPR < 4 ? 4 : WPR, G = NW / WPR;
    auto k = norm_fwd_reg_kernel<T, 16 / sizeof(T), C, WPR, LN, RES>;
    static int per_sm = -1; /* resident blocks per SM (racy but idempotent); 0: unknown */
    if (NORM_FWD_WAVES > 0 && per_sm < 0 &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, NW * 32, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        per_sm = 0;
    }
    int64_t g = (N + G - 1) / G; /* one row per group, unless more rows than fit at once */
    const int64_t cap = (int64_t)num_sms() * per_sm * NORM_FWD_WAVES;
    if (cap > 0 && g > cap) g = cap;
    k<<<(unsigned)g, NW * 32, 0, st>>>((T *)y, (T *)h, mean, rstd, (const T *)x, (const T *)res,
                                       (const T *)w, (const T *)b, N, D, eps);
}

/* Launches the register path when it applies; false otherwise. */
template <typename T, bool LN, bool RES>
static bool fwd_reg(void *y, void *h, float *mean, float *rstd, const void *x, const void *res,
                    const void *w, const void *b, int64_t N, int64_t D, float eps,
                    cudaStream_t st) {
    int wpr, c;
    if (N > ((int64_t)1 << 31) || !reg_config(D, 16 / sizeof(T), 8, &wpr, &c)) return false;
#define FWD_CASE(W_, C_)                                                                           \
    if (wpr == W_ && c == C_) {                                                                    \
        fwd_reg_launch<T, C_, W_, LN, RES>(y, h, mean, rstd, x, res, w, b, N, D, eps, st);         \
        return true;                                                                               \
    }
    FWD_CASE(1, 1) FWD_CASE(1, 2) FWD_CASE(1, 4) FWD_CASE(1, 8)
    FWD_CASE(2, 8) FWD_CASE(4, 8) FWD_CASE(8, 8)
#undef FWD_CASE
    return false;
}

template <typename T, int C, int WPR, bool LN, bool PF = !LN>
static int bwd_reg_launch(const char *fn, void *dx, float *part, const void *dy, const void *x,
                          const void *w, const float *mean, const float *rstd, const void *dres,
                          int64_t N, int64_t D, float woff, unsigned *grid, cudaStream_t st) {
    auto k = norm_bwd_reg_kernel<T, 16 / sizeof(T), C, WPR, LN, PF>;
    const size_t smem = part && WPR < 8 ? (size_t)(LN ? 2 : 1) * D * 4 : 0; /* G = 1: none */
    static int per_sm = 0; /* blocks per SM at smem_seen bytes (racy but idempotent) */
    static size_t smem_seen = (size_t)-1;
    if (smem != smem_seen) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, 256, smem) != cudaSuccess)
            return zr_error("%s: cannot size the launch: %s", fn,
                            cudaGetErrorString(cudaGetLastError()));
        smem_seen = smem;
    }
    const int G = 8 / WPR;
    int64_t g = (N + G - 1) / G, cap = (int64_t)num_sms() * (per_sm > 0 ? per_sm : 1);
    if (g > cap) g = cap;
    if (g > NORM_BWD_MAX_BLOCKS) g = NORM_BWD_MAX_BLOCKS;
    *grid = (unsigned)g;
    k<<<*grid, 256, smem, st>>>((T *)dx, part, (const T *)dy, (const T *)x, (const T *)w, mean,
                                rstd, (const T *)dres, N, D, woff);
    return 0;
}

/* 1 launched, 0 not applicable, -1 error. */
template <typename T, bool LN>
static int bwd_reg(const char *fn, void *dx, float *part, const void *dy, const void *x,
                   const void *w, const float *mean, const float *rstd, const void *dres,
                   int64_t N, int64_t D, float woff, unsigned *grid, cudaStream_t st) {
    int wpr, c;
    /* chunks per lane: RMSNorm 1 (more warps per row, fewer registers). LayerNorm 1 with the next
     * row prefetched and registers capped at 80 (3 blocks per SM; measured 60% -> 65% of copy at
     * D=2048 bf16); rows too long for that take 2 without prefetch (its db sums double the
     * registers: the prefetch registers would cost occupancy) */
    /* LayerNorm rows of three chunks a lane (16-bit 512 < D <= 768, GPT-2's 768; f32 256 < D <= 384):
     * a warp a row with the next row prefetched, instead of 4 warps a row with one chunk a lane and
     * a quarter of the lanes idle. `bench_fused norm`, N=65536 D=768 on the H200: with dres 0.121 ->
     * 0.118 ms (78 -> 80% of copy), without 0.112 -> 0.103 (session 36; three other layouts were
     * slower). */
    if (LN && (D + 32 * 16 / (int64_t)sizeof(T) - 1) / (32 * 16 / (int64_t)sizeof(T)) == 3)
        return bwd_reg_launch<T, 3, 1, LN, true>(fn, dx, part, dy, x, w, mean, rstd, dres, N, D,
                                                 woff, grid, st) ? -1 : 1;
    if (LN && reg_config(D, 16 / sizeof(T), 1, &wpr, &c)) {
#define BWDP_CASE(W_, C_)                                                                          \
    if (wpr == W_ && c == C_)                                                                      \
        return bwd_reg_launch<T, C_, W_, LN, true>(fn, dx, part, dy, x, w, mean, rstd, dres, N, D, \
                                                   woff, grid, st) ? -1 : 1;
        BWDP_CASE(1, 1) BWDP_CASE(2, 1) BWDP_CASE(4, 1) BWDP_CASE(8, 1)
#undef BWDP_CASE
        return 0;
    }
    if (!reg_config(D, 16 / sizeof(T), LN ? 2 : 1, &wpr, &c)) {
        /* RMSNorm rows longer than one chunk per lane of 8 warps (bf16 D > 2048): two chunks,
         * no prefetch (registers), as LayerNorm's; measured 68% of copy on the block path at
         * N=65536 D=4096 */
        if (LN || !reg_config(D, 16 / sizeof(T), 2, &wpr, &c) || wpr != 8 || c != 2) return 0;
        return bwd_reg_launch<T, 2, 8, false, false>(fn, dx, part, dy, x, w, mean, rstd, dres, N,
                                                     D, woff, grid, st) ? -1 : 1;
    }
#define BWD_CASE(W_, C_)                                                                           \
    if (wpr == W_ && c == C_)                                                                      \
        return bwd_reg_launch<T, C_, W_, LN>(fn, dx, part, dy, x, w, mean, rstd, dres, N, D, woff, \
                                             grid, st) ? -1 : 1;
    if (LN) {
        BWD_CASE(1, 1) BWD_CASE(1, 2) BWD_CASE(2, 2) BWD_CASE(4, 2) BWD_CASE(8, 2)
    } else {
        BWD_CASE(1, 1) BWD_CASE(2, 1) BWD_CASE(4, 1) BWD_CASE(8, 1)
    }
#undef BWD_CASE
    return 0;
}

template <typename T, bool LN, bool RES>
static void fwd_launch(void *y, void *h, float *mean, float *rstd, const void *x, const void *res,
                       const void *w, const void *b, int64_t N, int64_t D, float eps, float woff,
                       cudaStream_t st) {
    const int V = 16 / sizeof(T);
    const bool vec = D % V == 0 && al16(y) && al16(x) && (!RES || (al16(h) && al16(res))) &&
                     (!w || al16(w)) && (!b || al16(b));
    /* RMSNorm forward (plain and residual) measured faster with the block-per-row kernel */
    if (vec && LN && fwd_reg<T, LN, RES>(y, h, mean, rstd, x, res, w, b, N, D, eps, st)) return;
    if (vec)
        norm_fwd_kernel<T, 16 / sizeof(T), LN, RES><<<(unsigned)N, row_threads(D, V), 0, st>>>(
            (T *)y, (T *)h, mean, rstd, (const T *)x, (const T *)res, (const T *)w, (const T *)b, D,
            eps, woff);
    else
        norm_fwd_kernel<T, 1, LN, RES><<<(unsigned)N, row_threads(D, 1), 0, st>>>(
            (T *)y, (T *)h, mean, rstd, (const T *)x, (const T *)res, (const T *)w, (const T *)b, D,
            eps, woff);
}

extern "C" size_t rmsnorm_backward_workspace_size(int64_t N, int64_t D) {
    return N > 0 && D > 0 ? (size_t)bwd_blocks(N) * 2 * D * 4 : 0;
}
extern "C" size_t layernorm_backward_workspace_size(int64_t N, int64_t D) {
    return rmsnorm_backward_workspace_size(N, D);
}

/* dw32 / db32: dw / db is f32 (else T); acc bit 0: dw += the sum (else dw = the sum), bit 1: db. */
template <typename T, bool LN>
static int bwd_launch(const char *fn, void *dx, void *dw, int dw32, void *db, int db32, int acc, const void *dy,
                      const void *x, const void *w, const float *mean, const float *rstd,
                      const void *dres, void *ws, int64_t N, int64_t D, float woff, cudaStream_t st) {
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
    unsigned grid = (unsigned)G;
    const int rc = vec ? bwd_reg<T, LN>(fn, dx, part, dy, x, w, mean, rstd, dres, N, D, woff, &grid, st)
                       : 0;
    if (rc < 0) return ZR_ERR;
    if (rc == 0 && vec) {
        auto k = norm_bwd_kernel<T, 16 / sizeof(T), LN>;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        k<<<(unsigned)G, row_threads(D, V), smem, st>>>((T *)dx, part, (const T *)dy,
                                                        (const T *)x, (const T *)w, mean, rstd,
                                                        (const T *)dres, N, D, woff);
    } else if (rc == 0) {
        auto k = norm_bwd_kernel<T, 1, LN>;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        k<<<(unsigned)G, row_threads(D, 1), smem, st>>>((T *)dx, part, (const T *)dy,
                                                        (const T *)x, (const T *)w, mean, rstd,
                                                        (const T *)dres, N, D, woff);
    }
    if (want) {
        const int64_t ncol = db ? 2 * D : D;
        if (dw32 && db32)
            wgrad2_launch<float, float>((float *)dw, (float *)db, part, (int)grid, D, ncol, acc, st);
        else if (dw32)
            wgrad2_launch<float, T>((float *)dw, (T *)db, part, (int)grid, D, ncol, acc, st);
        else if (db32)
            wgrad2_launch<T, float>((T *)dw, (float *)db, part, (int)grid, D, ncol, acc, st);
        else
            wgrad2_launch<T, T>((T *)dw, (T *)db, part, (int)grid, D, ncol, acc, st);
    }
    return 0;
}

static int check_woff(const char *fn, const void *w, float woff) {
    if (woff != 0.f && (woff != 1.f || !w))
        return zr_error("%s: w_offset must be 0, or 1 with a weight (got %g%s)", fn, (double)woff, w ? "" : ", no weight");
    return 0;
}

extern "C" int rmsnorm_forward_cuda(void *y, float *rstd, const void *x, const void *w, int64_t N,
                                    int64_t D, float eps, float w_offset, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "rmsnorm_forward_cuda";
    if (check_nd(fn, N, D) || check_woff(fn, w, w_offset)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype,
                      fwd_launch<T, false, false>(y, NULL, NULL, rstd, x, NULL, w, NULL, N, D,
                                                  eps, w_offset, stream));
    return launch_check(fn);
}

extern "C" int add_rmsnorm_forward_cuda(void *y, void *h, float *rstd, const void *x,
                                        const void *res, const void *w, int64_t N, int64_t D,
                                        float eps, float w_offset, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "add_rmsnorm_forward_cuda";
    if (check_nd(fn, N, D) || check_woff(fn, w, w_offset)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype,
                      fwd_launch<T, false, true>(y, h, NULL, rstd, x, res, w, NULL, N, D, eps,
                                                 w_offset, stream));
    return launch_check(fn);
}

extern "C" int rmsnorm_backward_acc_cuda(void *dx, void *dw, zr_dtype dw_dtype, int acc,
                                         const void *dy, const void *x, const void *w,
                                         const float *rstd, const void *dres, void *workspace,
                                         int64_t N, int64_t D, float w_offset, zr_dtype dtype,
                                         cudaStream_t stream) {
    const char *fn = "rmsnorm_backward_cuda";
    if (check_nd(fn, N, D) || check_woff(fn, w, w_offset)) return ZR_ERR;
    if (dw && dw_dtype != dtype && dw_dtype != ZR_F32)
        return zr_error("%s: the weight gradient must be f32 or x's dtype, got dtype %d", fn, (int)dw_dtype);
    if (N == 0) return 0; /* dw untouched */
    ZR_FUSED_DISPATCH(fn, dtype,
                      if (bwd_launch<T, false>(fn, dx, dw, dw && dw_dtype == ZR_F32 && dtype != ZR_F32, NULL, 0, acc ? 1 : 0,
                                               dy, x, w, NULL, rstd, dres, workspace, N, D, w_offset, stream))
                          return ZR_ERR);
    return launch_check(fn);
}

extern "C" int rmsnorm_backward_cuda(void *dx, void *dw, const void *dy, const void *x,
                                     const void *w, const float *rstd, const void *dres,
                                     void *workspace, int64_t N, int64_t D, float w_offset, zr_dtype dtype,
                                     cudaStream_t stream) {
    return rmsnorm_backward_acc_cuda(dx, dw, dtype, 0, dy, x, w, rstd, dres, workspace, N, D, w_offset, dtype,
                                     stream);
}

extern "C" int layernorm_forward_cuda(void *y, float *mean, float *rstd, const void *x,
                                      const void *w, const void *b, int64_t N, int64_t D,
                                      float eps, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "layernorm_forward_cuda";
    if (check_nd(fn, N, D)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype,
                      fwd_launch<T, true, false>(y, NULL, mean, rstd, x, NULL, w, b, N, D, eps, 0.f,
                                                 stream));
    return launch_check(fn);
}

extern "C" int add_layernorm_forward_cuda(void *y, void *h, float *mean, float *rstd,
                                          const void *x, const void *res, const void *w,
                                          const void *b, int64_t N, int64_t D, float eps,
                                          zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "add_layernorm_forward_cuda";
    if (check_nd(fn, N, D)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype,
                      fwd_launch<T, true, true>(y, h, mean, rstd, x, res, w, b, N, D, eps, 0.f,
                                                stream));
    return launch_check(fn);
}

extern "C" int layernorm_backward_acc_cuda(void *dx, void *dw, zr_dtype dw_dtype, int acc_w, void *db,
                                           zr_dtype db_dtype, int acc_b, const void *dy, const void *x,
                                           const void *w, const float *mean, const float *rstd,
                                           const void *dres, void *workspace, int64_t N, int64_t D,
                                           zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "layernorm_backward_cuda";
    if (check_nd(fn, N, D)) return ZR_ERR;
    if ((dw && dw_dtype != dtype && dw_dtype != ZR_F32) || (db && db_dtype != dtype && db_dtype != ZR_F32))
        return zr_error("%s: the weight and bias gradients must be f32 or x's dtype, got dtypes %d and %d", fn,
                        (int)dw_dtype, (int)db_dtype);
    if (N == 0) return 0; /* dw, db untouched */
    const int dw32 = dw && dw_dtype == ZR_F32 && dtype != ZR_F32, db32 = db && db_dtype == ZR_F32 && dtype != ZR_F32;
    ZR_FUSED_DISPATCH(fn, dtype,
                      if (bwd_launch<T, true>(fn, dx, dw, dw32, db, db32, (acc_w ? 1 : 0) | (acc_b ? 2 : 0), dy,
                                              x, w, mean, rstd, dres, workspace, N, D, 0.f, stream)) return ZR_ERR);
    return launch_check(fn);
}

extern "C" int layernorm_backward_cuda(void *dx, void *dw, void *db, const void *dy,
                                       const void *x, const void *w, const float *mean,
                                       const float *rstd, const void *dres, void *workspace,
                                       int64_t N, int64_t D, zr_dtype dtype, cudaStream_t stream) {
    return layernorm_backward_acc_cuda(dx, dw, dtype, 0, db, dtype, 0, dy, x, w, mean, rstd, dres, workspace,
                                       N, D, dtype, stream);
}
