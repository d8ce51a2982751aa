/* Fused cross-entropy (see cross_entropy.h). Two kernel families:
 * - a block per row (any dtype, any V): 16-byte loads, a per-thread online (max, sum of exp) over
 *   chunks of V elements, then a block reduction of the pairs; the fused pass reads the row again
 *   for the gradient (three HBM passes in all);
 * - the fused pass on sm_90 for 16-bit rows (V a multiple of 8, 16-byte aligned): ce_smem_kernel,
 *   persistent, the row (or a cluster's slice of it) loaded by 1-D bulk copies into a ring of
 *   shared-memory slots while the previous rows are reduced and written: one read, one write.
 * Both add a thread's elements in the same order: the row in parts (the smem kernel's slices,
 *   ce_part_elems), each part's 16-byte vectors t, t + 512, ... for thread t, the parts' pairs
 *   merged in order; so the plain forward and the fused pass give the same lse bits. */
#include "cross_entropy.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../base/error.h"
}

#include "fused_common.cuh"
#include "sm90_sync.cuh"

#define CE_THREADS 512
#define CE_CW (CE_THREADS / 32) /* warps of a row block; the smem kernel's compute warps */
/* The smem kernel's ring: slots of CE_CH bytes (512 16-byte vectors: one a compute thread), at
 * most CE_MAXSLOT; the automatic cluster size leaves CE_SPARE slots beyond a slice for the next
 * rows' loads (64 KB in flight while a row is reduced). */
#define CE_CH 8192
#define CE_CHE (CE_CH / 2) /* 2-byte elements a slot */
#define CE_MAXSLOT 28
#define CE_SPARE 8

/* Adds V values to a thread's online (max m, sum s of exp(x - m)). */
template <int V> static __device__ __forceinline__ void ms_add(float &m, float &s, const float *f) {
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
/* Merges (m, s) over the lanes of a warp; every lane gets the result. */
static __device__ __forceinline__ void warp_ms(float &m, float &s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_merge(m, s, m2, s2);
    }
}

/* The row's logsumexp, returned to every thread of the block: per part of PE elements (PE a
 * multiple of CE_THREADS * V, or >= Vn: one part) a per-thread online (max, sum of exp) over
 * 16-byte chunks, the parts merged in order, then a merge over the block. */
template <typename T, int V>
static __device__ __forceinline__ float row_lse(const T *x, int64_t Vn, int64_t PE) {
    __shared__ float rm[32], rs[32], zb;
    float m = -INFINITY, s = 0.f, pm = -INFINITY, ps = 0.f; /* the row's pair; the part's */
    int64_t next = PE;                                        /* where the next part starts */
#pragma unroll 4
    for (int64_t i = threadIdx.x * V; i < Vn; i += CE_THREADS * V) {
        if (i >= next) { /* a part holds whole strides: i never skips one */
            ms_merge(m, s, pm, ps);
            pm = -INFINITY, ps = 0.f, next += PE;
        }
        float f[V];
        ldv<T, V>(f, x + i);
        ms_add<V>(pm, ps, f);
    }
    ms_merge(m, s, pm, ps);
    warp_ms(m, s);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) rm[w] = m, rs[w] = s;
    __syncthreads();
    if (w == 0) {
        m = l < CE_CW ? rm[l] : -INFINITY;
        s = l < CE_CW ? rs[l] : 0.f;
        warp_ms(m, s);
        if (l == 0) zb = m + logf(s);
    }
    __syncthreads();
    return zb;
}

/* dl[j] = (exp(x[j] - z) - (j == tgt)) * g over one row; ign: a zero row. */
template <typename T, int V>
static __device__ __forceinline__ void row_grad(T *dl, const T *x, float z, int64_t tgt, float g, bool ign,
                                                int64_t Vn) {
#pragma unroll 4
    for (int64_t i = threadIdx.x * V; i < Vn; i += CE_THREADS * V) {
        float f[V];
        if (!ign) ldv<T, V>(f, x + i);
#pragma unroll
        for (int k = 0; k < V; ++k)
            f[k] = ign ? 0.f : (__expf(f[k] - z) - (i + k == tgt ? 1.f : 0.f)) * g;
        stv<T, V>(dl + i, f);
    }
}

template <typename T, int V>
__global__ void __launch_bounds__(CE_THREADS, 4) /* 32 registers: 4 blocks an SM */
    ce_fwd_kernel(float *__restrict__ loss, float *__restrict__ lse, const T *__restrict__ logits,
                  const int64_t *__restrict__ targets, int64_t Vn, int64_t PE, int64_t ignore) {
    const int64_t row = blockIdx.x;
    const int64_t tgt = targets[row];
    if (tgt == ignore) {
        if (threadIdx.x == 0) loss[row] = 0.f, lse[row] = 0.f;
        return;
    }
    const T *x = logits + row * Vn;
    const float z = row_lse<T, V>(x, Vn, PE);
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
    row_grad<T, V>(dl + row * Vn, x + row * Vn, z, tgt, g, ign, Vn);
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
 * dl may be logits (in place; no __restrict__ on either): the target's logit is read before
 * row_lse's closing barrier, and after it each thread writes only the elements it reads. */
template <typename T, int V>
__global__ void __launch_bounds__(CE_THREADS, 4) /* 32 registers: 4 blocks an SM */
    ce_fused_kernel(float *__restrict__ loss, float *__restrict__ lse, T *dl, const T *logits,
                    const int64_t *__restrict__ targets, const unsigned *__restrict__ count, float seed,
                    int64_t Vn, int64_t PE, int64_t ignore) {
    const int64_t row = blockIdx.x;
    const int64_t tgt = targets[row];
    const bool ign = tgt == ignore, inr = tgt >= 0 && tgt < Vn;
    const T *x = logits + row * Vn;
    const float xt = (threadIdx.x == 0 && !ign && inr) ? tof<T>(x[tgt]) : 0.f;
    float z = 0.f;
    if (!ign) z = row_lse<T, V>(x, Vn, PE); /* the same branch for the whole block */
    if (threadIdx.x == 0) {
        lse[row] = z;
        loss[row] = ign ? 0.f : inr ? z - xt : NAN;
    }
    const float g = count ? seed / (float)*count : seed;
    row_grad<T, V>(dl + row * Vn, x, z, tgt, ign ? 0.f : g, ign, Vn);
}

/* The fused pass (ce_fused_kernel's results and contract) for 2-byte T on sm_90, persistent: a
 * cluster of C CTAs per row (C 1: a CTA), its rows first, first + step, ... ; CTA `rank` owns the
 * slice [rank S, rank S + S) of a row (S a multiple of CE_CHE: whole slots). Warp CE_CW (lane 0) is
 * the producer: each non-ignored row's slice, slot by slot, bulk-copied into the ring of nslot
 * slots as they are freed (full[i]: the bytes landed, empty[i]: the CE_CW compute warps are done
 * with it). The CE_CW compute warps, per row: pass 1 waits for each slot and adds its vector of it
 * (thread t: vector t, as row_lse's part); C > 1: every thread's pair goes to every CTA of the
 * cluster (st.async onto xbar[b], b the row's parity), and each CTA merges them in rank order per
 * thread (the same bits everywhere); the block merge (row_lse's) gives z; pass 2 reads the slots
 * again, writes the gradient to global memory and frees each slot. dl may be logits: a slice is
 * written only after all of it is in shared memory, and each CTA writes only its slice.
 * Barrier phases: a compute thread waits full for every slot of pass 1 before its warp frees any
 * in pass 2 (so never two phases behind); the producer waits empty only from its second lap on;
 * xbar[b]'s use u+1 (row after next) cannot start before every CTA has left use u (each CTA sends
 * the next row's pairs only after its own wait on that row), and its bytes are announced (thread 0,
 * right after its wait on use u) before any of them can be sent. Ignored rows load nothing and send
 * nothing (every CTA of the cluster skips the same ones). */
template <typename T, int C>
__global__ void __launch_bounds__(CE_THREADS + 32, 1)
    ce_smem_kernel(float *__restrict__ loss, float *__restrict__ lse, T *dl, const T *logits,
                   const int64_t *__restrict__ targets, const unsigned *__restrict__ count,
                   float seed, int64_t N, int64_t Vn, int64_t S, int nslot, int64_t ignore) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using namespace sm90;
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ uint64_t full[CE_MAXSLOT], empty[CE_MAXSLOT], xbar[2];
    __shared__ float2 part[2][C][C > 1 ? CE_THREADS : 1]; /* [row parity][sender rank][thread] */
    __shared__ float rm[CE_CW], rs[CE_CW], zs;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const uint32_t rank = C > 1 ? cluster_rank() : 0;
    const int64_t first = C > 1 ? cluster_id_x() : blockIdx.x,
                  step = C > 1 ? cluster_count_x() : gridDim.x;
    const int64_t lo = Vn < rank * S ? Vn : rank * S, n = (Vn < lo + S ? Vn : lo + S) - lo;
    const int K = (int)((n + CE_CHE - 1) / CE_CHE); /* slots a slice (0: an empty slice) */
    if (tid == 0) {
        for (int i = 0; i < nslot; ++i)
            mbar_init(&full[i], 1), mbar_init(&empty[i], CE_CW);
        mbar_init(&xbar[0], 1), mbar_init(&xbar[1], 1);
        mbar_init_fence();
        /* each use's bytes announced before any of them can come (see the wait below) */
        for (int i = 0; C > 1 && i < 2; ++i) mbar_expect_tx(&xbar[i], C * CE_THREADS * 8);
    }
    /* C > 1: the others' barriers initialised before any st.async reaches them */
    if (C > 1) cluster_sync();
    else __syncthreads();
    if (warp == CE_CW) {
        if (lane == 0) {
            int slot = 0;
            uint32_t ph = 0;
            bool lapped = false;
            for (int64_t row = first; row < N; row += step) {
                if (targets[row] == ignore) continue;
                const unsigned char *src =
                    reinterpret_cast<const unsigned char *>(logits + row * Vn + lo);
                for (int c = 0; c < K; ++c) {
                    if (lapped) mbar_wait(&empty[slot], ph ^ 1); /* the previous lap's use freed */
                    const int64_t left = n * 2 - (int64_t)c * CE_CH;
                    const uint32_t bytes = (uint32_t)(left < CE_CH ? left : CE_CH);
                    mbar_expect_tx(&full[slot], bytes);
                    bulk_load(ring + slot * CE_CH, src + (int64_t)c * CE_CH, bytes, &full[slot]);
                    if (++slot == nslot) slot = 0, ph ^= 1, lapped = true;
                }
            }
        }
    } else {
        const float g = count ? seed / (float)*count : seed;
        int slot = 0;
        uint32_t ph = 0, nx = 0; /* nx: rows reduced (the exchange's uses) */
        int64_t tnext = first < N ? targets[first] : 0; /* loaded a row ahead: off the row's path */
        for (int64_t row = first; row < N; row += step) {
            const int64_t tgt = tnext;
            if (row + step < N) tnext = targets[row + step];
            T *d = dl + row * Vn + lo;
            if (tgt == ignore) {
                for (int64_t e = tid * 8; e < n; e += CE_THREADS * 8)
                    *reinterpret_cast<uint4 *>(d + e) = make_uint4(0u, 0u, 0u, 0u);
                if (rank == 0 && tid == 0) loss[row] = 0.f, lse[row] = 0.f;
                continue;
            }
            const bool inr = tgt >= 0 && tgt < Vn;
            const int s0 = slot, b = nx & 1;
            const uint32_t p0 = ph;
            float m = -INFINITY, s = 0.f;
            for (int c = 0; c < K; ++c) { /* pass 1 */
                mbar_wait(&full[slot], ph);
                if ((int64_t)c * CE_CHE + tid * 8 < n) {
                    float f[8];
                    ldv<T, 8>(f, reinterpret_cast<const T *>(ring + slot * CE_CH) + tid * 8);
                    ms_add<8>(m, s, f);
                }
                if (++slot == nslot) slot = 0, ph ^= 1;
            }
            if (C > 1) {
#pragma unroll
                for (int q = 0; q < C; ++q)
                    st_async_f2(&part[b][rank][tid], &xbar[b], (uint32_t)q, make_float2(m, s));
                mbar_wait_cluster(&xbar[b], (nx >> 1) & 1);
                /* the next use's bytes (row after next): announced before this CTA's threads pass
                 * the barrier below, so before they send the next row's pairs, which every other
                 * CTA must have before it sends the row after next's */
                if (tid == 0) mbar_expect_tx(&xbar[b], C * CE_THREADS * 8);
                m = -INFINITY, s = 0.f;
#pragma unroll
                for (int q = 0; q < C; ++q)
                    ms_merge(m, s, part[b][q][tid].x, part[b][q][tid].y);
            }
            warp_ms(m, s);
            if (lane == 0) rm[warp] = m, rs[warp] = s;
            bar_sync(1, CE_THREADS);
            if (warp == 0) {
                m = lane < CE_CW ? rm[lane] : -INFINITY;
                s = lane < CE_CW ? rs[lane] : 0.f;
                warp_ms(m, s);
                if (lane == 0) {
                    const float z = m + logf(s);
                    zs = z;
                    if (rank == 0) lse[row] = z;
                    /* the target's CTA: its logit is in a slot */
                    if (rank == (inr ? (uint32_t)(tgt / S) : 0u)) {
                        float xt = NAN;
                        if (inr) {
                            const int64_t o = tgt - lo;
                            int sl = s0 + (int)(o / CE_CHE);
                            if (sl >= nslot) sl -= nslot;
                            xt = tof<T>(reinterpret_cast<const T *>(ring + sl * CE_CH)[o % CE_CHE]);
                        }
                        loss[row] = inr ? z - xt : NAN;
                    }
                }
            }
            bar_sync(1, CE_THREADS);
            const float z = zs;
            slot = s0, ph = p0;
            /* pass 2: this thread's slots already waited for in pass 1 */
            for (int c = 0; c < K; ++c) {
                const int64_t e = (int64_t)c * CE_CHE + tid * 8;
                if (e < n) {
                    float f[8];
                    ldv<T, 8>(f, reinterpret_cast<const T *>(ring + slot * CE_CH) + tid * 8);
#pragma unroll
                    for (int j = 0; j < 8; ++j)
                        f[j] = (__expf(f[j] - z) - (lo + e + j == tgt ? 1.f : 0.f)) * g;
                    stv<T, 8>(d + e, f);
                }
                __syncwarp();
                if (lane == 0) mbar_arrive(&empty[slot]);
                if (++slot == nslot) slot = 0, ph ^= 1;
            }
            ++nx;
        }
    }
    if (C > 1) cluster_sync(); /* no CTA leaves while another may still write into it */
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

/* ---- host: which kernel, and the parts a row is added up in ---- */

/* Ring slots of the smem kernel with clusters of c: what 227 KB leaves after the pairs that C > 1
 * exchanges (2 rows x c x 4 KB). */
static int ce_slots(int c) { return c == 1 ? 28 : c == 2 ? 26 : 24; }
/* Slots of a slice of rows of V 2-byte elements split over c CTAs. */
static int64_t ce_slice_slots(int64_t V, int c) { return ((V + CE_CHE - 1) / CE_CHE + c - 1) / c; }
/* The cluster size the smem kernel takes by itself for rows of V 2-byte elements: the fewest of 1,
 * 2, 4 whose slice leaves CE_SPARE slots of the ring for the next rows' loads; 0: none (too long). */
static int ce_auto_cluster(int64_t V) {
    for (int c = 1; c <= 4; c *= 2)
        if (ce_slice_slots(V, c) + CE_SPARE <= ce_slots(c)) return c;
    return 0;
}
/* The elements of a part (row_lse): the automatic cluster's slice for 16-byte vectors of 2-byte
 * elements, the whole row otherwise. A function of V and the element alone, so the plain forward,
 * the row-block fused pass and the smem kernel at its automatic cluster size add in the same order
 * (a size forced by cross_entropy_smem_force adds in its own slices). */
static int64_t ce_part_elems(int64_t V, size_t esz, bool vec) {
    const int c = esz == 2 && vec ? ce_auto_cluster(V) : 0;
    return c > 1 ? ce_slice_slots(V, c) * CE_CHE : V;
}

static int ce_force = -1, ce_last; /* cross_entropy_smem_force, cross_entropy_smem_last */

extern "C" int cross_entropy_smem_force(int c) {
    if (c != -1 && c != 0 && c != 1 && c != 2 && c != 4)
        return zr_error("cross_entropy_smem_force: %d is not -1 (default), 0 (off), 1, 2 or 4", c);
    ce_force = c;
    return 0;
}
extern "C" int cross_entropy_smem_last(void) { return ce_last; }

/* ZRUN_CE_SMEM, read once: 1 when unset, empty or "1", 0 for "0", -1 for anything else (*bad: the
 * value). */
static int ce_env(const char **bad) {
    static int on = -2;
    static const char *val;
    if (on == -2) {
        val = getenv("ZRUN_CE_SMEM");
        on = !val || !*val || !strcmp(val, "1") ? 1 : !strcmp(val, "0") ? 0 : -1;
    }
    *bad = val;
    return on;
}

/* Runs ce_smem_kernel<T, C> over the N rows; 1 when it ran, 0 when this device cannot (shared
 * memory, clusters: the caller falls back), -1 on a launch error. */
template <typename T, int C>
static int ce_smem_launch(const char *fn, float *loss, float *lse, T *dl, const T *logits,
                          const int64_t *targets, const unsigned *count, float seed, int64_t N,
                          int64_t V, int64_t ignore, cudaStream_t stream) {
    void (*k)(float *, float *, T *, const T *, const int64_t *, const unsigned *, float, int64_t,
              int64_t, int64_t, int, int64_t) = ce_smem_kernel<T, C>;
    const int nslot = ce_slots(C);
    const size_t dyn = (size_t)nslot * CE_CH;
    static int units[64]; /* per device: CTAs (C 1) or clusters that run at once; -1: none */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return (void)cudaGetLastError(), 0;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)C, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(CE_THREADS + 32);
    cfg.dynamicSmemBytes = dyn;
    cfg.stream = stream;
    cfg.attrs = at;
    cfg.numAttrs = C > 1 ? 1 : 0;
    if (!units[dev]) {
        int major = 0, u = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        if (major >= 9 && cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)dyn) == cudaSuccess) {
            if (C == 1) {
                if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&u, k, CE_THREADS + 32, dyn) ==
                    cudaSuccess)
                    u *= num_sms();
            } else {
                cfg.gridDim = dim3((unsigned)C);
                if (cudaOccupancyMaxActiveClusters(&u, k, &cfg) != cudaSuccess) u = 0;
            }
        }
        (void)cudaGetLastError();
        units[dev] = u > 0 ? u : -1;
    }
    if (units[dev] < 0) return 0;
    const int64_t S = ce_slice_slots(V, C) * CE_CHE;
    cfg.gridDim = dim3((unsigned)((N < units[dev] ? N : units[dev]) * C));
    const cudaError_t e = cudaLaunchKernelEx(&cfg, k, loss, lse, dl, logits, targets, count, seed,
                                             N, V, S, nslot, ignore);
    if (e != cudaSuccess)
        return zr_error("%s: the shared-memory kernel (clusters of %d) failed to launch: %s", fn, C,
                        cudaGetErrorString(e)),
               -1;
    return 1;
}

/* The fused pass through ce_smem_kernel when the dtype (bf16, f16), V (a multiple of 8), the
 * pointers (16-byte aligned), the device (sm_90+), ZRUN_CE_SMEM and cross_entropy_smem_force let
 * it; sets ce_last. 1: it ran; 0: the caller runs ce_fused_kernel; -1: an error (message left). */
static int ce_smem_fused(const char *fn, float *loss, float *lse, void *dl, const void *logits,
                         const int64_t *targets, const unsigned *count, float seed, int64_t N,
                         int64_t V, int64_t ignore, zr_dtype dtype, cudaStream_t stream) {
    ce_last = 0;
    int c = ce_force;
    if (c < 0) {
        const char *bad;
        const int on = ce_env(&bad);
        if (on < 0)
            return zr_error("ZRUN_CE_SMEM=%s: use 1 (the in-place cross-entropy's rows kept in shared "
                            "memory on Hopper, the default) or 0 (the block-per-row kernel)", bad),
                   -1;
        c = on ? -1 : 0;
    }
    if (c == 0 || (dtype != ZR_BF16 && dtype != ZR_F16) || V % 8 || !al16(logits) || !al16(dl))
        return 0;
    if (c < 0) c = ce_auto_cluster(V);
    if (c == 0 || ce_slice_slots(V, c) > ce_slots(c)) return 0; /* a slice must fit the ring */
    int r = 0;
#define CE_SMEM_RUN(TT)                                                                            \
    r = c == 1   ? ce_smem_launch<TT, 1>(fn, loss, lse, (TT *)dl, (const TT *)logits, targets,     \
                                       count, seed, N, V, ignore, stream)                        \
        : c == 2 ? ce_smem_launch<TT, 2>(fn, loss, lse, (TT *)dl, (const TT *)logits, targets,     \
                                         count, seed, N, V, ignore, stream)                        \
                 : ce_smem_launch<TT, 4>(fn, loss, lse, (TT *)dl, (const TT *)logits, targets,     \
                                         count, seed, N, V, ignore, stream)
    if (dtype == ZR_BF16) CE_SMEM_RUN(__nv_bfloat16);
    else CE_SMEM_RUN(__half);
#undef CE_SMEM_RUN
    if (r == 1) ce_last = c;
    return r;
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
            const int64_t PE = ce_part_elems(V, sizeof(T), vec);
            if (vec)
                ce_fwd_kernel<T, 16 / sizeof(T)><<<(unsigned)N, CE_THREADS, 0, stream>>>(
                    loss, lse, (const T *)logits, targets, V, PE, ignore_index);
            else
                ce_fwd_kernel<T, 1><<<(unsigned)N, CE_THREADS, 0, stream>>>(
                    loss, lse, (const T *)logits, targets, V, PE, ignore_index);
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
    const int sm = ce_smem_fused(fn, loss, lse, dlogits, logits, targets, count, seed, N, V, ignore_index, dtype,
                                 stream);
    if (sm < 0) return ZR_ERR;
    if (!sm) {
        ZR_FUSED_DISPATCH(fn, dtype, {
            const int VW = 16 / sizeof(T);
            const bool vec = V % VW == 0 && al16(logits) && al16(dlogits);
            const int64_t PE = ce_part_elems(V, sizeof(T), vec);
            if (vec)
                ce_fused_kernel<T, 16 / sizeof(T)><<<(unsigned)N, CE_THREADS, 0, stream>>>(
                    loss, lse, (T *)dlogits, (const T *)logits, targets, count, seed, V, PE, ignore_index);
            else
                ce_fused_kernel<T, 1><<<(unsigned)N, CE_THREADS, 0, stream>>>(
                    loss, lse, (T *)dlogits, (const T *)logits, targets, count, seed, V, PE, ignore_index);
        });
    }
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
