/* Fused cross-entropy (see cross_entropy.h). Two kernel families:
 * - one block per row (any device): 16-byte loads, a per-thread online (max, sum of exp) over
 *   chunks of V elements, then a block reduction of the pairs;
 * - on sm_90 and later, a thread-block cluster of C = 1, 2, 4 or 8 blocks per row, each block
 *   owning a slice of at most CE_SLICE_BYTES: the slice's (max, sum of exp) as above, merged over
 *   the cluster through distributed shared memory. The fused pass keeps its slice in shared memory
 *   between the logsumexp and the gradient, so HBM sees one read and one write of the logits. The
 *   plain forward uses the same slices and merge order, so both give the same lse bits. */
#include "cross_entropy.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

extern "C" {
#include "../base/error.h"
}

#include "fused_common.cuh"

namespace cg = cooperative_groups;

#define CE_THREADS 512
/* The most shared memory one block of the cluster kernels keeps of a row: 3 blocks per SM (228 KB;
 * the fused kernel's __launch_bounds__ holds its registers to 40), so one block's loads overlap the
 * others' reductions and writes. Rows of more than CE_MAX_CLUSTER slices use the one-block kernels. */
#define CE_SLICE_BYTES (64 * 1024)
#define CE_MAX_CLUSTER 8

/* Loads V elements at p into f (as ldv); KEEP also copies the raw elements to k (shared memory). */
template <typename T, int V, bool KEEP>
static __device__ __forceinline__ void ld_keep(float *f, const T *p, T *k) {
    if (V * sizeof(T) == 16) {
        const uint4 r = *reinterpret_cast<const uint4 *>(p);
        if (KEEP) *reinterpret_cast<uint4 *>(k) = r;
        const T *e = reinterpret_cast<const T *>(&r);
#pragma unroll
        for (int i = 0; i < V; ++i) f[i] = tof<T>(e[i]);
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) {
            const T v = p[i];
            if (KEEP) k[i] = v;
            f[i] = tof<T>(v);
        }
    }
}

/* This thread's online (max m, sum s of exp(x - m)) over its chunks of x[0, n); KEEP: the chunks
 * also copied to keep[0, n). */
template <typename T, int V, bool KEEP>
static __device__ __forceinline__ void thread_ms(float &m, float &s, const T *x, int64_t n, T *keep) {
    m = -INFINITY, s = 0.f;
#pragma unroll 4
    for (int64_t i = threadIdx.x * V; i < n; i += CE_THREADS * V) {
        float f[V];
        ld_keep<T, V, KEEP>(f, x + i, keep + i);
        float cm = f[0];
#pragma unroll
        for (int k = 1; k < V; ++k) cm = fmaxf(cm, f[k]);
        const float mn = fmaxf(m, cm);
        float cs = 0.f;
#pragma unroll
        for (int k = 0; k < V; ++k) cs += __expf(f[k] - mn);
        s = s * __expf(m - mn) + cs; /* m = -inf on the first chunk: exp(-inf) = 0 */
        m = mn;
    }
}

/* Merges the threads' (m, s) over the block; the result is in thread 0. */
static __device__ __forceinline__ void block_ms(float &m, float &s) {
    __shared__ float rm[32], rs[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_merge(m, s, m2, s2);
    }
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) rm[w] = m, rs[w] = s;
    __syncthreads();
    if (w == 0) {
        m = l < CE_THREADS / 32 ? rm[l] : -INFINITY;
        s = l < CE_THREADS / 32 ? rs[l] : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o),
                        s2 = __shfl_xor_sync(0xffffffffu, s, o);
            ms_merge(m, s, m2, s2);
        }
    }
}

/* The row's logsumexp, returned to every thread of the block. */
template <typename T, int V> static __device__ __forceinline__ float row_lse(const T *x, int64_t Vn) {
    __shared__ float zb;
    float m, s;
    thread_ms<T, V, false>(m, s, x, Vn, nullptr);
    block_ms(m, s);
    if (threadIdx.x == 0) zb = m + logf(s);
    __syncthreads();
    return zb;
}

/* d[i] = (exp(x[i] - z) - (lo + i == tgt)) * g for i in [0, n): the gradient of a row from its
 * element lo on (x in global or shared memory); ign: zeros, x not read. */
template <typename T, int V>
static __device__ __forceinline__ void slice_grad(T *d, const T *x, float z, int64_t lo, int64_t tgt, float g,
                                                  bool ign, int64_t n) {
#pragma unroll 4
    for (int64_t i = threadIdx.x * V; i < n; i += CE_THREADS * V) {
        float f[V];
        if (!ign) ldv<T, V>(f, x + i);
#pragma unroll
        for (int j = 0; j < V; ++j) f[j] = ign ? 0.f : (__expf(f[j] - z) - (lo + i + j == tgt ? 1.f : 0.f)) * g;
        stv<T, V>(d + i, f);
    }
}

template <typename T, int V>
__global__ void __launch_bounds__(CE_THREADS)
    ce_fwd_kernel(float *__restrict__ loss, float *__restrict__ lse, const T *__restrict__ logits,
                  const int64_t *__restrict__ targets, int64_t Vn, int64_t ignore) {
    const int64_t row = blockIdx.x;
    const int64_t tgt = targets[row];
    if (tgt == ignore) {
        if (threadIdx.x == 0) loss[row] = 0.f, lse[row] = 0.f;
        return;
    }
    const T *x = logits + row * Vn;
    const float z = row_lse<T, V>(x, Vn);
    if (threadIdx.x == 0) {
        lse[row] = z;
        loss[row] = (tgt >= 0 && tgt < Vn) ? z - tof<T>(x[tgt]) : NAN;
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

template <typename T, int V>
__global__ void __launch_bounds__(CE_THREADS)
    ce_bwd_kernel(T *dl, const T *x, const int64_t *__restrict__ targets,
                  const float *__restrict__ lse, const float *__restrict__ dloss,
                  int64_t dstride, int64_t Vn, int64_t ignore) {
    const int64_t row = blockIdx.x;
    const int64_t tgt = targets[row];
    const bool ign = tgt == ignore;
    const float z = ign ? 0.f : lse[row], g = ign ? 0.f : dloss[row * dstride];
    slice_grad<T, V>(dl + row * Vn, x + row * Vn, z, 0, tgt, g, ign, Vn);
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
 * divided in f32 as the unfused backward divides). The row is read twice (the second read misses
 * L2 at training shapes: ce_cluster_kernel is the one-read path). dl may be logits (in place; no __restrict__ on either): the target's logit is read before
 * row_lse's closing barrier, and after it each thread writes only the elements it reads. */
template <typename T, int V>
__global__ void __launch_bounds__(CE_THREADS)
    ce_fused_kernel(float *__restrict__ loss, float *__restrict__ lse, T *dl, const T *logits,
                    const int64_t *__restrict__ targets, const unsigned *__restrict__ count, float seed,
                    int64_t Vn, int64_t ignore) {
    const int64_t row = blockIdx.x;
    const int64_t tgt = targets[row];
    const bool ign = tgt == ignore, inr = tgt >= 0 && tgt < Vn;
    const T *x = logits + row * Vn;
    const float xt = (threadIdx.x == 0 && !ign && inr) ? tof<T>(x[tgt]) : 0.f;
    float z = 0.f;
    if (!ign) z = row_lse<T, V>(x, Vn); /* the same branch for the whole block */
    if (threadIdx.x == 0) {
        lse[row] = z;
        loss[row] = ign ? 0.f : inr ? z - xt : NAN;
    }
    const float g = count ? seed / (float)*count : seed;
    slice_grad<T, V>(dl + row * Vn, x, z, 0, tgt, ign ? 0.f : g, ign, Vn);
}

/* One row per cluster of C blocks (grid N * C, cluster (C, 1, 1)); block r owns the slice
 * [r S, min(V, (r + 1) S)) of its row. Each block's (max, sum of exp) of its slice goes to its
 * shared memory; after a cluster barrier every block merges the C partials in rank order (so all
 * get the same z). GRAD: the slice is kept in dynamic shared memory while it is read, and the
 * gradient written from there as ce_fused_kernel's (dl may be logits: a block writes only its
 * slice, after reading all of it); else the forward alone (ce_fwd_kernel's results). Rank 0 writes
 * lse, the block holding the target writes loss (rank 0 when the target is outside [0, V)).
 * Ignored rows: loss and lse 0, a zero gradient, no barrier (the whole cluster skips it). A block
 * leaves only after the cluster's second barrier: the others may still read its partial. */
template <typename T, int V, bool GRAD>
__global__ void __launch_bounds__(CE_THREADS, GRAD ? 3 : 1)
    ce_cluster_kernel(float *__restrict__ loss, float *__restrict__ lse, T *dl, const T *logits,
                      const int64_t *__restrict__ targets, const unsigned *__restrict__ count, float seed,
                      int64_t Vn, int64_t S, int64_t ignore) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) unsigned char ce_slice[];
    __shared__ float2 part;
    __shared__ float zb;
    cg::cluster_group cl = cg::this_cluster();
    const unsigned C = cl.num_blocks(), r = cl.block_rank();
    const int64_t row = blockIdx.x / C;
    const int64_t tgt = targets[row];
    const bool ign = tgt == ignore, inr = tgt >= 0 && tgt < Vn;
    const int64_t lo = Vn < r * S ? Vn : r * S, hi = Vn < lo + S ? Vn : lo + S, n = hi - lo;
    const T *x = logits + row * Vn + lo;
    T *keep = reinterpret_cast<T *>(ce_slice);
    if (ign) {
        if (threadIdx.x == 0 && r == 0) loss[row] = 0.f, lse[row] = 0.f;
        if (GRAD) slice_grad<T, V>(dl + row * Vn + lo, keep, 0.f, lo, tgt, 0.f, true, n);
        return;
    }
    float m, s;
    thread_ms<T, V, GRAD>(m, s, x, n, keep);
    block_ms(m, s);
    if (threadIdx.x == 0) part = make_float2(m, s);
    cl.sync(); /* every partial written; the kept slice visible to the whole block */
    if (threadIdx.x == 0) {
        float mz = -INFINITY, sz = 0.f;
        for (unsigned b = 0; b < C; ++b) {
            const float2 p = *cl.map_shared_rank(&part, b);
            ms_merge(mz, sz, p.x, p.y);
        }
        zb = mz + logf(sz);
    }
    __syncthreads();
    const float z = zb;
    __cluster_barrier_arrive(); /* this block's reads of the others' partials are done */
    if (threadIdx.x == 0) {
        if (r == 0) lse[row] = z;
        if (r == (inr ? (unsigned)(tgt / S) : 0u))
            loss[row] = inr ? z - tof<T>(GRAD ? keep[tgt - lo] : x[tgt - lo]) : NAN;
    }
    if (GRAD) slice_grad<T, V>(dl + row * Vn + lo, keep, z, lo, tgt, count ? seed / (float)*count : seed, false, n);
    __cluster_barrier_wait();
#else
    __trap(); /* launched only where the compute capability is 9.0 or more */
#endif
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

static int check_nv(const char *fn, int64_t N, int64_t V) {
    if (N < 0 || V <= 0 || N > 0x7fffffffLL)
        return zr_error("%s: bad shape N=%lld V=%lld", fn, (long long)N, (long long)V);
    return 0;
}

/* Whether the current device can run the cluster kernels (compute capability 9.0 or more). */
static bool cluster_capable(void) {
    static int cc[64]; /* major + 1; 0: not asked yet */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
    if (!cc[dev]) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) major = 0;
        cc[dev] = major + 1;
    }
    return cc[dev] - 1 >= 9;
}

/* Blocks per row for the cluster kernels: the fewest of 1, 2, 4, ..., CE_MAX_CLUSTER whose slices
 * of V elements of esz bytes fit CE_SLICE_BYTES; 0 for the one-block kernels (a longer row, a
 * device before sm_90, or a grid of N * C blocks past the limit). *S: the slice, a multiple of vw. */
static int ce_cluster_size(int64_t N, int64_t V, size_t esz, int vw, int64_t *S) {
    if (!cluster_capable()) return 0;
    for (int c = 1; c <= CE_MAX_CLUSTER; c *= 2) {
        const int64_t per = (V + c - 1) / c;
        if (per * (int64_t)esz <= CE_SLICE_BYTES) {
            if (N * c > 0x7fffffffLL) return 0;
            *S = (per + vw - 1) / vw * vw;
            return c;
        }
    }
    return 0;
}

/* Launches ce_cluster_kernel<T, V, GRAD> over N rows in clusters of C; a refused launch (an error
 * returned, cleared so the caller can fall back) is not an error of the op. */
template <typename T, int V, bool GRAD>
static cudaError_t ce_cluster_launch(int C, int64_t S, float *loss, float *lse, T *dl, const T *logits,
                                     const int64_t *targets, const unsigned *count, float seed, int64_t N,
                                     int64_t Vn, int64_t ignore, cudaStream_t stream) {
    void (*k)(float *, float *, T *, const T *, const int64_t *, const unsigned *, float, int64_t, int64_t,
              int64_t) = ce_cluster_kernel<T, V, GRAD>;
    static bool big[64]; /* per device: the kernel may have CE_SLICE_BYTES of dynamic shared memory */
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    const bool known = dev >= 0 && dev < 64;
    if (e == cudaSuccess && GRAD && !(known && big[dev])) {
        e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, CE_SLICE_BYTES);
        if (e == cudaSuccess && known) big[dev] = true;
    }
    if (e == cudaSuccess) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = (unsigned)C;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3((unsigned)(N * C));
        cfg.blockDim = dim3(CE_THREADS);
        cfg.dynamicSmemBytes = GRAD ? (size_t)S * sizeof(T) : 0;
        cfg.stream = stream;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        e = cudaLaunchKernelEx(&cfg, k, loss, lse, dl, logits, targets, count, seed, Vn, S, ignore);
    }
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e;
}

extern "C" int cross_entropy_forward_cuda(float *loss, float *lse, float *loss_mean,
                                          float *n_valid, const void *logits,
                                          const int64_t *targets, int64_t N, int64_t V,
                                          int64_t ignore_index, zr_dtype dtype,
                                          cudaStream_t stream) {
    const char *fn = "cross_entropy_forward_cuda";
    if (check_nv(fn, N, V)) return ZR_ERR;
    if (N > 0) {
        ZR_FUSED_DISPATCH(fn, dtype, {
            const int VW = 16 / sizeof(T);
            const bool vec = V % VW == 0 && al16(logits);
            int64_t S = 0;
            const int C = ce_cluster_size(N, V, sizeof(T), vec ? VW : 1, &S);
            const bool clustered =
                C && (vec ? ce_cluster_launch<T, 16 / sizeof(T), false> : ce_cluster_launch<T, 1, false>)(
                         C, S, loss, lse, nullptr, (const T *)logits, targets, nullptr, 0.f, N, V,
                         ignore_index, stream) == cudaSuccess;
            if (!clustered && vec)
                ce_fwd_kernel<T, 16 / sizeof(T)><<<(unsigned)N, CE_THREADS, 0, stream>>>(
                    loss, lse, (const T *)logits, targets, V, ignore_index);
            else if (!clustered)
                ce_fwd_kernel<T, 1><<<(unsigned)N, CE_THREADS, 0, stream>>>(
                    loss, lse, (const T *)logits, targets, V, ignore_index);
        });
    }
    if (loss_mean)
        ce_mean_kernel<<<1, 1024, 0, stream>>>(loss_mean, n_valid, loss, targets, N, ignore_index);
    return launch_check(fn);
}

extern "C" int cross_entropy_backward_cuda(void *dlogits, const void *logits,
                                           const int64_t *targets, const float *lse,
                                           const float *dloss, int64_t dloss_stride, int64_t N,
                                           int64_t V, int64_t ignore_index, zr_dtype dtype,
                                           cudaStream_t stream) {
    const char *fn = "cross_entropy_backward_cuda";
    if (check_nv(fn, N, V)) return ZR_ERR;
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype, {
        const int VW = 16 / sizeof(T);
        if (V % VW == 0 && al16(logits) && al16(dlogits))
            ce_bwd_kernel<T, 16 / sizeof(T)><<<(unsigned)N, CE_THREADS, 0, stream>>>(
                (T *)dlogits, (const T *)logits, targets, lse, dloss, dloss_stride, V,
                ignore_index);
        else
            ce_bwd_kernel<T, 1><<<(unsigned)N, CE_THREADS, 0, stream>>>(
                (T *)dlogits, (const T *)logits, targets, lse, dloss, dloss_stride, V,
                ignore_index);
    });
    return launch_check(fn);
}

extern "C" int cross_entropy_fused_cuda(float *loss, float *lse, float *loss_mean, float *n_valid,
                                        void *dlogits, const void *logits, const int64_t *targets,
                                        unsigned *count, float seed, int64_t N, int64_t V,
                                        int64_t ignore_index, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "cross_entropy_fused_cuda";
    if (check_nv(fn, N, V)) return ZR_ERR;
    if (N == 0) return 0;
    if (count) {
        if (cudaMemsetAsync(count, 0, sizeof *count, stream) != cudaSuccess)
            return zr_error("%s: clearing the target count failed: %s", fn, cudaGetErrorString(cudaGetLastError()));
        const int64_t blocks = (N + 255) / 256;
        ce_count_kernel<<<(unsigned)(blocks < 264 ? blocks : 264), 256, 0, stream>>>(count, targets, N,
                                                                                 ignore_index);
    }
    ZR_FUSED_DISPATCH(fn, dtype, {
        const int VW = 16 / sizeof(T);
        const bool vec = V % VW == 0 && al16(logits) && al16(dlogits);
        int64_t S = 0;
        const int C = ce_cluster_size(N, V, sizeof(T), vec ? VW : 1, &S);
        const bool clustered =
            C && (vec ? ce_cluster_launch<T, 16 / sizeof(T), true> : ce_cluster_launch<T, 1, true>)(
                     C, S, loss, lse, (T *)dlogits, (const T *)logits, targets, count, seed, N, V,
                     ignore_index, stream) == cudaSuccess;
        if (!clustered && vec)
            ce_fused_kernel<T, 16 / sizeof(T)><<<(unsigned)N, CE_THREADS, 0, stream>>>(
                loss, lse, (T *)dlogits, (const T *)logits, targets, count, seed, V, ignore_index);
        else if (!clustered)
            ce_fused_kernel<T, 1><<<(unsigned)N, CE_THREADS, 0, stream>>>(
                loss, lse, (T *)dlogits, (const T *)logits, targets, count, seed, V, ignore_index);
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
