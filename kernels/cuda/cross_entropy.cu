/* Fused cross-entropy (see cross_entropy.h): one block per row, 16-byte loads, a per-thread
 * online (max, sum of exp) over chunks of V elements, then a block reduction of the pairs. Label
 * smoothing is a template flag LS (eps != 0), so the kernels without it are unchanged. */
#include "cross_entropy.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

extern "C" {
#include "../base/error.h"
}

#include "fused_common.cuh"

#define CE_THREADS 512


/* The row's logsumexp, returned to every thread of the block: a per-thread online (max, sum of
 * exp) over 16-byte chunks, then a merge over the block. LS: also the row's sum of logits into
 * *tot (every thread), a third accumulator reduced alongside. Callers pass nullptr without LS: a
 * local whose address is taken (or a returned pair) changes the eps = 0 kernels' code. */
template <typename T, int V, bool LS>
static __device__ __forceinline__ float row_lse(const T *x, int64_t Vn, float *tot) {
    __shared__ float rm[32], rs[32], rt[32], zb, tb;
    float m = -INFINITY, s = 0.f, t = 0.f;
#pragma unroll 4
    for (int64_t i = threadIdx.x * V; i < Vn; i += CE_THREADS * V) {
        float f[V];
        ldv<T, V>(f, x + i);
        float cm = f[0];
#pragma unroll
        for (int k = 1; k < V; ++k) cm = fmaxf(cm, f[k]);
        const float mn = fmaxf(m, cm);
        float cs = 0.f;
#pragma unroll
        for (int k = 0; k < V; ++k) cs += __expf(f[k] - mn);
        s = s * __expf(m - mn) + cs; /* m = -inf on the first chunk: exp(-inf) = 0 */
        m = mn;
        if constexpr (LS)
#pragma unroll
            for (int k = 0; k < V; ++k) t += f[k];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_merge(m, s, m2, s2);
        if constexpr (LS) t += __shfl_xor_sync(0xffffffffu, t, o);
    }
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) {
        rm[w] = m, rs[w] = s;
        if constexpr (LS) rt[w] = t;
    }
    __syncthreads();
    if (w == 0) {
        m = l < CE_THREADS / 32 ? rm[l] : -INFINITY;
        s = l < CE_THREADS / 32 ? rs[l] : 0.f;
        if constexpr (LS) t = l < CE_THREADS / 32 ? rt[l] : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o),
                        s2 = __shfl_xor_sync(0xffffffffu, s, o);
            ms_merge(m, s, m2, s2);
            if constexpr (LS) t += __shfl_xor_sync(0xffffffffu, t, o);
        }
        if (l == 0) {
            zb = m + logf(s);
            if constexpr (LS) tb = t;
        }
    }
    __syncthreads();
    if constexpr (LS) *tot = tb;
    return zb;
}

/* The row's loss from row_lse's (logsumexp z, sum of logits tot) and the target logit xt:
 * z - (1 - eps) xt - eps/V tot, as the CPU's; without LS, z - xt. */
template <bool LS>
static __device__ __forceinline__ float row_loss(float z, float xt, float tot, float eps, int64_t Vn) {
    if constexpr (LS) return z - (1.f - eps) * xt - eps / (float)Vn * tot;
    else return z - xt;
}

/* dl[j] = (exp(x[j] - z) - (j == tgt)) * g over one row of Vn; ign: a zero row. LS: the target is
 * (1 - eps) onehot + eps/Vall, so dl[j] = (exp(x[j] - z) - eps/Vall - (j == tgt ? 1 - eps : 0)) * g. Vall:
 * the classes of the whole row (Vn, or more for a chunk of a row: lce_grad_kernel's). */
template <typename T, int V, bool LS>
static __device__ __forceinline__ void row_grad(T *dl, const T *x, float z, int64_t tgt, float g, bool ign,
                                                int64_t Vn, int64_t Vall, float eps) {
    const float off = eps / (float)Vall, on = 1.f - eps;
#pragma unroll 4
    for (int64_t i = threadIdx.x * V; i < Vn; i += CE_THREADS * V) {
        float f[V];
        if (!ign) ldv<T, V>(f, x + i);
#pragma unroll
        for (int k = 0; k < V; ++k)
            f[k] = ign ? 0.f
                 : LS  ? (__expf(f[k] - z) - off - (i + k == tgt ? on : 0.f)) * g
                       : (__expf(f[k] - z) - (i + k == tgt ? 1.f : 0.f)) * g;
        stv<T, V>(dl + i, f);
    }
}

template <typename T, int V, bool LS>
__global__ void __launch_bounds__(CE_THREADS)
    ce_fwd_kernel(float *__restrict__ loss, float *__restrict__ lse, const T *__restrict__ logits,
                  const int64_t *__restrict__ targets, int64_t Vn, int64_t ignore, float eps) {
    const int64_t row = blockIdx.x;
    const int64_t tgt = targets[row];
    if (tgt == ignore) {
        if (threadIdx.x == 0) loss[row] = 0.f, lse[row] = 0.f;
        return;
    }
    const T *x = logits + row * Vn;
    float tot = 0.f;
    const float z = row_lse<T, V, LS>(x, Vn, LS ? &tot : nullptr);
    if (threadIdx.x == 0) {
        lse[row] = z;
        loss[row] = (tgt >= 0 && tgt < Vn) ? row_loss<LS>(z, tof<T>(x[tgt]), tot, eps, Vn) : NAN;
    }
}

/* One block: mean of loss over rows whose target != ignore, in a fixed order. */
__global__ void ce_mean_kernel(float *__restrict__ mean, float *__restrict__ n_valid,
                               const float *__restrict__ loss, const int64_t *__restrict__ targets,
                               int64_t N, int64_t ignore) {
    __shared__ float red[32];
    float s = 0.f, c = 0.f;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x)
        if (targets[i] != ignore) s += loss[i], c += 1.f;
    s = block_sum(s, red);
    c = block_sum(c, red);
    if (threadIdx.x == 0) {
        *mean = s / c; /* 0/0 = NaN when every row is ignored */
        if (n_valid) *n_valid = c;
    }
}

template <typename T, int V, bool LS>
__global__ void __launch_bounds__(CE_THREADS)
    ce_bwd_kernel(T *dl, const T *x, const int64_t *__restrict__ targets,
                  const float *__restrict__ lse, const float *__restrict__ dloss,
                  int64_t dstride, int64_t Vn, int64_t ignore, float eps) {
    const int64_t row = blockIdx.x;
    const int64_t tgt = targets[row];
    const bool ign = tgt == ignore;
    const float z = ign ? 0.f : lse[row], g = ign ? 0.f : dloss[row * dstride];
    row_grad<T, V, LS>(dl + row * Vn, x + row * Vn, z, tgt, g, ign, Vn, Vn, eps);
}

/* *count += the rows whose target != ignore (count zeroed before; integer adds: exact). */
__global__ void ce_count_kernel(unsigned *__restrict__ count, const int64_t *__restrict__ targets, int64_t N,
                                int64_t ignore) {
    __shared__ float red[32];
    float c = 0.f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
        c += targets[i] != ignore ? 1.f : 0.f;
    c = block_sum(c, red);
    if (threadIdx.x == 0 && c > 0.f) atomicAdd(count, (unsigned)c);
}

/* The forward and the gradient for an upstream gradient `seed` in one pass: per row the loss and
 * logsumexp as ce_fwd_kernel, then dl as ce_bwd_kernel with g = seed (sum) or seed / count (mean,
 * divided in f32 as the unfused backward divides). The row's second read mostly hits L2.
 * dl may be logits (in place; no __restrict__ on either): the target's logit (and, LS, the row's
 * sum) is read before row_lse's closing barrier, and after it each thread writes only the
 * elements it reads. */
template <typename T, int V, bool LS>
__global__ void __launch_bounds__(CE_THREADS)
    ce_fused_kernel(float *__restrict__ loss, float *__restrict__ lse, T *dl, const T *logits,
                    const int64_t *__restrict__ targets, const unsigned *__restrict__ count, float seed,
                    int64_t Vn, int64_t ignore, float eps) {
    const int64_t row = blockIdx.x;
    const int64_t tgt = targets[row];
    const bool ign = tgt == ignore, inr = tgt >= 0 && tgt < Vn;
    const T *x = logits + row * Vn;
    const float xt = (threadIdx.x == 0 && !ign && inr) ? tof<T>(x[tgt]) : 0.f;
    float z = 0.f, tot = 0.f;
    if (!ign) z = row_lse<T, V, LS>(x, Vn, LS ? &tot : nullptr); /* the same branch for the whole block */
    if (threadIdx.x == 0) {
        lse[row] = z;
        const float l = row_loss<LS>(z, xt, tot, eps, Vn); /* before the selects: the same eps = 0 code */
        loss[row] = ign ? 0.f : inr ? l : NAN;
    }
    const float g = count ? seed / (float)*count : seed;
    row_grad<T, V, LS>(dl + row * Vn, x, z, tgt, ign ? 0.f : g, ign, Vn, Vn, eps);
}

/* --- The linear cross-entropy's chunks (zr_linear_cross_entropy, ops/linear_ce.c): logits made a slice of the
 * vocabulary at a time, x (N, Vc) holding classes v0 .. v0 + Vc - 1 --- */

/* Per row whose target is not ignored: the chunk's logsumexp merged into the row's running lse (-inf before the first
 * chunk), the target's logit into xt when the chunk holds it, and (LS) the chunk's sum of logits added to tot. */
template <typename T, int V, bool LS>
__global__ void __launch_bounds__(CE_THREADS)
    lce_stats_kernel(float *__restrict__ lse, float *__restrict__ xt, float *__restrict__ tot, const T *__restrict__ xc,
                     const int64_t *__restrict__ targets, int64_t v0, int64_t Vc, int64_t ignore) {
    const int64_t row = blockIdx.x, tgt = targets[row];
    if (tgt == ignore) return;
    const T *x = xc + row * Vc;
    float t = 0.f;
    const float z = row_lse<T, V, LS>(x, Vc, LS ? &t : nullptr);
    if (threadIdx.x == 0) {
        const float a = lse[row], m = fmaxf(a, z);
        lse[row] = a == -INFINITY ? z : m + logf(expf(a - m) + expf(z - m));
        if (tgt >= v0 && tgt < v0 + Vc) xt[row] = tof<T>(x[tgt - v0]);
        if constexpr (LS) tot[row] += t;
    }
}

/* loss[r] from the chunks' lse, xt and tot: row_loss's, 0 on ignored rows, NaN for a target outside [0, V). */
__global__ void lce_loss_kernel(float *__restrict__ loss, const float *__restrict__ lse, const float *__restrict__ xt,
                                const float *__restrict__ tot, const int64_t *__restrict__ targets, int64_t N,
                                int64_t Vn, int64_t ignore, float eps) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= N) return;
    const int64_t tgt = targets[r];
    if (tgt == ignore) {
        loss[r] = 0.f;
        return;
    }
    const float l = eps != 0.f ? row_loss<true>(lse[r], xt[r], tot[r], eps, Vn) : row_loss<false>(lse[r], xt[r], 0.f, eps, Vn);
    loss[r] = tgt >= 0 && tgt < Vn ? l : NAN;
}

/* The chunk's gradient in place: row_grad's over the chunk's columns of all Vall classes, g = *dloss (sum) or
 * *dloss / *n_valid (mean, divided in f32 as cross_entropy's backward divides). */
template <typename T, int V, bool LS>
__global__ void __launch_bounds__(CE_THREADS)
    lce_grad_kernel(T *xc, const int64_t *__restrict__ targets, const float *__restrict__ lse,
                    const float *__restrict__ dloss, const float *__restrict__ n_valid, int64_t v0, int64_t Vc,
                    int64_t Vall, int64_t ignore, float eps) {
    const int64_t row = blockIdx.x, tgt = targets[row];
    const bool ign = tgt == ignore;
    const float g = ign ? 0.f : n_valid ? *dloss / *n_valid : *dloss;
    T *x = xc + row * Vc;
    row_grad<T, V, LS>(x, x, ign ? 0.f : lse[row], tgt - v0, g, ign, Vc, Vall, eps);
}

/* Entropy and argmax of one row: (m, s, t) over the elements seen, s = sum exp(x - m) and t = sum exp(x - m) (x - m),
 * so the entropy is log s - t / s (no cancellation of two large terms); merged with another's as the pair's max
 * moves. (bv, bi): the largest value and its first index (a larger index wins only with a larger value). */
struct ce_stats {
    float m, s, t, bv;
    long long bi;
};
static __device__ __forceinline__ void stats_merge(ce_stats &a, const ce_stats &b) {
    const float mn = fmaxf(a.m, b.m);
    float s = 0.f, t = 0.f;
    if (a.s > 0.f) {
        const float e = __expf(a.m - mn);
        s += e * a.s, t += e * (a.t + (a.m - mn) * a.s);
    }
    if (b.s > 0.f) {
        const float e = __expf(b.m - mn);
        s += e * b.s, t += e * (b.t + (b.m - mn) * b.s);
    }
    a.m = mn, a.s = s, a.t = t;
    if (b.bv > a.bv || (b.bv == a.bv && b.bi < a.bi)) a.bv = b.bv, a.bi = b.bi;
}
static __device__ __forceinline__ ce_stats stats_shfl(const ce_stats &a, int o) {
    ce_stats b;
    b.m = __shfl_xor_sync(0xffffffffu, a.m, o);
    b.s = __shfl_xor_sync(0xffffffffu, a.s, o);
    b.t = __shfl_xor_sync(0xffffffffu, a.t, o);
    b.bv = __shfl_xor_sync(0xffffffffu, a.bv, o);
    b.bi = __shfl_xor_sync(0xffffffffu, a.bi, o);
    return b;
}

/* The row's statistics over x[0 .. Vn) (argmax indices offset by base), valid in thread 0: per-thread stats over
 * 16-byte chunks, then merged over the block. */
template <typename T, int V>
static __device__ __forceinline__ ce_stats row_stats(const T *x, int64_t Vn, int64_t base) {
    __shared__ ce_stats red[32];
    ce_stats a = {-INFINITY, 0.f, 0.f, -INFINITY, 0x7fffffffffffffffLL};
    for (int64_t i = threadIdx.x * V; i < Vn; i += CE_THREADS * V) {
        float f[V];
        ldv<T, V>(f, x + i);
        ce_stats c = {f[0], 0.f, 0.f, f[0], (long long)(base + i)};
#pragma unroll
        for (int k = 1; k < V; ++k)
            if (f[k] > c.bv) c.bv = f[k], c.bi = base + i + k;
        c.m = c.bv;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float d = f[k] - c.m, e = __expf(d);
            c.s += e, c.t += e * d;
        }
        stats_merge(a, c);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) stats_merge(a, stats_shfl(a, o));
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) red[w] = a;
    __syncthreads();
    if (w == 0) {
        a = l < CE_THREADS / 32 ? red[l] : ce_stats{-INFINITY, 0.f, 0.f, -INFINITY, 0x7fffffffffffffffLL};
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) stats_merge(a, stats_shfl(a, o));
    }
    return a;
}

template <typename T, int V>
__global__ void __launch_bounds__(CE_THREADS)
    ce_stats_kernel(float *__restrict__ entropy, int64_t *__restrict__ argmax, const T *__restrict__ logits,
                    int64_t Vn) {
    const ce_stats a = row_stats<T, V>(logits + (int64_t)blockIdx.x * Vn, Vn, 0);
    if (threadIdx.x == 0) {
        entropy[blockIdx.x] = logf(a.s) - a.t / a.s;
        argmax[blockIdx.x] = a.bi;
    }
}

/* TRL's token statistics over the linear cross-entropy's slices (lce_chunk_stats_cpu's twin, lce_chunk_token_stats_cpu):
 * per row whose target is not ignored, the slice's ce_stats merged into the row's running (m, s, t, bv, bi). */
template <typename T, int V>
__global__ void __launch_bounds__(CE_THREADS)
    lce_token_stats_kernel(float *__restrict__ sm, float *__restrict__ ss, float *__restrict__ st,
                           float *__restrict__ sbv, int64_t *__restrict__ sbi, const T *__restrict__ xc,
                           const int64_t *__restrict__ targets, int64_t v0, int64_t Vc, int64_t ignore) {
    const int64_t row = blockIdx.x;
    if (targets[row] == ignore) return;
    const ce_stats a = row_stats<T, V>(xc + row * Vc, Vc, v0);
    if (threadIdx.x == 0) {
        ce_stats r = {sm[row], ss[row], st[row], sbv[row], (long long)sbi[row]};
        stats_merge(r, a); /* (the running pair first: its indices are the smaller) */
        sm[row] = r.m, ss[row] = r.s, st[row] = r.t, sbv[row] = r.bv, sbi[row] = r.bi;
    }
}

/* entropy (rows) and argmax (rows) from the running statistics of the n counted rows, at their positions idx (NULL:
 * row k is row k); the other rows were zeroed by the caller. */
__global__ void lce_token_stats_out_kernel(float *__restrict__ entropy, int64_t *__restrict__ argmax,
                                           const float *__restrict__ ss, const float *__restrict__ st,
                                           const int64_t *__restrict__ sbi, const int64_t *__restrict__ idx, int64_t n) {
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    const int64_t r = idx ? idx[k] : k;
    entropy[r] = logf(ss[k]) - st[k] / ss[k];
    argmax[r] = sbi[k];
}

/* d *= g / *baked unless g == *baked (then nothing is written). */
template <typename T, int V>
__global__ void ce_rescale_kernel(T *__restrict__ d, int64_t n, const float *__restrict__ g,
                                  const float *__restrict__ baked) {
    const float gv = *g, bv = *baked;
    if (gv == bv) return;
    const float f = gv / bv;
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V; i < n;
         i += (int64_t)gridDim.x * blockDim.x * V) {
        float v[V];
        ldv<T, V>(v, d + i);
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] *= f;
        stv<T, V>(d + i, v);
    }
}
__global__ void ce_set_kernel(float *__restrict__ baked, const float *__restrict__ g) { *baked = *g; }

static int check_nv(const char *fn, int64_t N, int64_t V, float eps) {
    if (N < 0 || V <= 0 || N > 0x7fffffffLL)
        return zr_error("%s: bad shape N=%lld V=%lld", fn, (long long)N, (long long)V);
    if (!(eps >= 0.f && eps <= 1.f)) return zr_error("%s: label smoothing must be in [0, 1], got %g", fn, eps);
    return 0;
}

/* KERN<T, VW, LS><<<N rows, CE_THREADS>>>(...) inside ZR_FUSED_DISPATCH (T, N, eps and stream
 * from the caller): VW = the 16-byte vector when vec, else 1; LS = eps != 0. */
#define CE_LAUNCH(KERN, vec, ...)                                                                  \
    do {                                                                                           \
        constexpr int VW = 16 / sizeof(T);                                                         \
        if ((vec) && eps != 0) KERN<T, VW, true><<<(unsigned)N, CE_THREADS, 0, stream>>>(__VA_ARGS__); \
        else if (vec) KERN<T, VW, false><<<(unsigned)N, CE_THREADS, 0, stream>>>(__VA_ARGS__);    \
        else if (eps != 0) KERN<T, 1, true><<<(unsigned)N, CE_THREADS, 0, stream>>>(__VA_ARGS__);   \
        else KERN<T, 1, false><<<(unsigned)N, CE_THREADS, 0, stream>>>(__VA_ARGS__);              \
    } while (0)

extern "C" int cross_entropy_forward_cuda(float *loss, float *lse, float *loss_mean,
                                          float *n_valid, const void *logits,
                                          const int64_t *targets, int64_t N, int64_t V,
                                          int64_t ignore_index, float eps, zr_dtype dtype,
                                          cudaStream_t stream) {
    const char *fn = "cross_entropy_forward_cuda";
    if (check_nv(fn, N, V, eps)) return ZR_ERR;
    if (N > 0) {
        ZR_FUSED_DISPATCH(fn, dtype, {
            CE_LAUNCH(ce_fwd_kernel, V % (16 / sizeof(T)) == 0 && al16(logits), loss, lse, (const T *)logits,
                      targets, V, ignore_index, eps);
        });
    }
    if (loss_mean)
        ce_mean_kernel<<<1, 1024, 0, stream>>>(loss_mean, n_valid, loss, targets, N, ignore_index);
    return launch_check(fn);
}

extern "C" int cross_entropy_backward_cuda(void *dlogits, const void *logits,
                                           const int64_t *targets, const float *lse,
                                           const float *dloss, int64_t dloss_stride, int64_t N,
                                           int64_t V, int64_t ignore_index, float eps, zr_dtype dtype,
                                           cudaStream_t stream) {
    const char *fn = "cross_entropy_backward_cuda";
    if (check_nv(fn, N, V, eps)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype, {
        CE_LAUNCH(ce_bwd_kernel, V % (16 / sizeof(T)) == 0 && al16(logits) && al16(dlogits), (T *)dlogits,
                  (const T *)logits, targets, lse, dloss, dloss_stride, V, ignore_index, eps);
    });
    return launch_check(fn);
}

extern "C" int cross_entropy_fused_cuda(float *loss, float *lse, float *loss_mean, float *n_valid,
                                        void *dlogits, const void *logits, const int64_t *targets,
                                        unsigned *count, float seed, int64_t N, int64_t V,
                                        int64_t ignore_index, float eps, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "cross_entropy_fused_cuda";
    if (check_nv(fn, N, V, eps)) return ZR_ERR;
    if (N == 0) return 0;
    if (count) {
        if (cudaMemsetAsync(count, 0, sizeof *count, stream) != cudaSuccess)
            return zr_error("%s: clearing the target count failed: %s", fn, cudaGetErrorString(cudaGetLastError()));
        const int64_t blocks = (N + 255) / 256;
        ce_count_kernel<<<(unsigned)(blocks < 264 ? blocks : 264), 256, 0, stream>>>(count, targets, N,
                                                                                 ignore_index);
    }
    ZR_FUSED_DISPATCH(fn, dtype, {
        CE_LAUNCH(ce_fused_kernel, V % (16 / sizeof(T)) == 0 && al16(logits) && al16(dlogits), loss, lse,
                  (T *)dlogits, (const T *)logits, targets, count, seed, V, ignore_index, eps);
    });
    if (loss_mean)
        ce_mean_kernel<<<1, 1024, 0, stream>>>(loss_mean, n_valid, loss, targets, N, ignore_index);
    return launch_check(fn);
}

extern "C" int cross_entropy_rescale_cuda(void *d, int64_t n, const float *g, float *baked, zr_dtype dtype,
                                          cudaStream_t stream) {
    const char *fn = "cross_entropy_rescale_cuda";
    if (n > 0) {
        ZR_FUSED_DISPATCH(fn, dtype, {
            const int VW = 16 / sizeof(T);
            const bool vec = n % VW == 0 && al16(d);
            const int64_t items = vec ? n / VW : n, blocks = (items + 255) / 256;
            const unsigned grid = (unsigned)(blocks < 132 * 8 ? blocks : 132 * 8);
            if (vec)
                ce_rescale_kernel<T, 16 / sizeof(T)><<<grid, 256, 0, stream>>>((T *)d, n, g, baked);
            else
                ce_rescale_kernel<T, 1><<<grid, 256, 0, stream>>>((T *)d, n, g, baked);
        });
    }
    ce_set_kernel<<<1, 1, 0, stream>>>(baked, g);
    return launch_check(fn);
}

extern "C" int logits_stats_cuda(float *entropy, int64_t *argmax, const void *logits, int64_t N, int64_t V,
                                 zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "logits_stats_cuda";
    if (check_nv(fn, N, V, 0.f)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype, {
        constexpr int VW = 16 / sizeof(T);
        if (V % VW == 0 && al16(logits))
            ce_stats_kernel<T, VW><<<(unsigned)N, CE_THREADS, 0, stream>>>(entropy, argmax, (const T *)logits, V);
        else
            ce_stats_kernel<T, 1><<<(unsigned)N, CE_THREADS, 0, stream>>>(entropy, argmax, (const T *)logits, V);
    });
    return launch_check(fn);
}

extern "C" int lce_chunk_stats_cuda(float *lse, float *xt, float *tot, const void *xc, const int64_t *targets,
                                    int64_t N, int64_t v0, int64_t Vc, int64_t ignore_index, float eps, zr_dtype dtype,
                                    cudaStream_t stream) {
    const char *fn = "lce_chunk_stats_cuda";
    if (check_nv(fn, N, Vc, eps)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype, {
        CE_LAUNCH(lce_stats_kernel, Vc % (16 / sizeof(T)) == 0 && al16(xc), lse, xt, tot, (const T *)xc, targets, v0,
                  Vc, ignore_index);
    });
    return launch_check(fn);
}

extern "C" int lce_loss_cuda(float *loss, float *loss_mean, float *n_valid, const float *lse, const float *xt,
                             const float *tot, const int64_t *targets, int64_t N, int64_t V, int64_t ignore_index,
                             float eps, cudaStream_t stream) {
    const char *fn = "lce_loss_cuda";
    if (check_nv(fn, N, V, eps)) return ZR_ERR;
    if (N > 0) lce_loss_kernel<<<(unsigned)((N + 255) / 256), 256, 0, stream>>>(loss, lse, xt, tot, targets, N, V,
                                                                                 ignore_index, eps);
    if (loss_mean) ce_mean_kernel<<<1, 1024, 0, stream>>>(loss_mean, n_valid, loss, targets, N, ignore_index);
    return launch_check(fn);
}

extern "C" int lce_chunk_grad_cuda(void *xc, const int64_t *targets, const float *lse, const float *dloss,
                                   const float *n_valid, int64_t N, int64_t v0, int64_t Vc, int64_t V,
                                   int64_t ignore_index, float eps, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "lce_chunk_grad_cuda";
    if (check_nv(fn, N, Vc, eps)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype, {
        CE_LAUNCH(lce_grad_kernel, Vc % (16 / sizeof(T)) == 0 && al16(xc), (T *)xc, targets, lse, dloss, n_valid, v0,
                  Vc, V, ignore_index, eps);
    });
    return launch_check(fn);
}

extern "C" int lce_chunk_token_stats_cuda(float *m, float *s, float *t, float *bv, int64_t *bi, const void *xc,
                                          const int64_t *targets, int64_t N, int64_t v0, int64_t Vc,
                                          int64_t ignore_index, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "lce_chunk_token_stats_cuda";
    if (check_nv(fn, N, Vc, 0.f)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype, {
        constexpr int VW = 16 / sizeof(T);
        if (Vc % VW == 0 && al16(xc))
            lce_token_stats_kernel<T, VW><<<(unsigned)N, CE_THREADS, 0, stream>>>(m, s, t, bv, bi, (const T *)xc,
                                                                                targets, v0, Vc, ignore_index);
        else
            lce_token_stats_kernel<T, 1><<<(unsigned)N, CE_THREADS, 0, stream>>>(m, s, t, bv, bi, (const T *)xc,
                                                                               targets, v0, Vc, ignore_index);
    });
    return launch_check(fn);
}

extern "C" int lce_token_stats_out_cuda(float *entropy, int64_t *argmax, const float *s, const float *t,
                                        const int64_t *bi, const int64_t *idx, int64_t n, cudaStream_t stream) {
    if (n > 0)
        lce_token_stats_out_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(entropy, argmax, s, t, bi, idx, n);
    return launch_check("lce_token_stats_out_cuda");
}
