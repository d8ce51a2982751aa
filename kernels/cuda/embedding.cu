/* Embedding forward (gather) and deterministic backward. Backward, fast path (V up to 2048 ids
 * per SM, N < 2^31): two launches and no host work between them (cub's sort was 45-52 us of
 * launches and memsets for 16K ids). A grouping kernel, where block b owns a slice of the
 * vocabulary, counts the ids below and inside its slice (per-warp histograms over contiguous
 * position ranges) and writes its ids' (key, position) pairs in (key, position) order at their
 * final sorted place, each run's length at its head and a list of the runs longer than EMB_LONG;
 * then a summing kernel, where a warp takes EMB_E sorted entries and sums the short runs that
 * start there (old value, then the rows in position order; 16-byte loads, two rows in flight),
 * and persistent blocks split each long run's columns into tiles of 8 chunks and its rows over 32
 * row groups, whose sums are added in group order. No atomics on values: the same bits every run.
 * Other shapes: cub radix sort of the ids, then one block per distinct id. */
#include "embedding.h"

#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" {
#include "../base/error.h"
}

#include "fused_common.cuh"

template <typename T, int V>
__global__ void emb_fwd_kernel(T *__restrict__ out, const T *__restrict__ w,
                               const int64_t *__restrict__ ids, int64_t N, int64_t Vn, int64_t D) {
    const int64_t nch = D / V, total = N * nch;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = idx / nch, c = (idx % nch) * V, id = ids[n];
        float f[V];
        if (id >= 0 && id < Vn) ldv<T, V>(f, w + id * D + c);
        else
#pragma unroll
            for (int k = 0; k < V; ++k) f[k] = 0.f;
        stv<T, V>(out + n * D + c, f);
    }
}

__global__ void emb_iota_kernel(int32_t *v, int64_t N) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N;
         i += (int64_t)gridDim.x * blockDim.x)
        v[i] = (int32_t)i;
}

/* Block p handles the run of equal sorted ids that starts at p (other blocks exit at once). */
template <typename T>
__global__ void emb_bwd_kernel(T *__restrict__ dW, const T *__restrict__ dout,
                               const int64_t *__restrict__ skeys, const int32_t *__restrict__ spos,
                               int64_t N, int64_t Vn, int64_t D, int accumulate) {
    const int64_t p = blockIdx.x, id = skeys[p];
    if ((p > 0 && skeys[p - 1] == id) || id < 0 || id >= Vn) return;
    int64_t e = p + 1;
    while (e < N && skeys[e] == id) ++e;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
        float s = accumulate ? tof<T>(dW[id * D + c]) : 0.f;
        for (int64_t q = p; q < e; ++q) s += tof<T>(dout[(int64_t)spos[q] * D + c]);
        dW[id * D + c] = fromf<T>(s);
    }
}

/* keys[i] = ids[i] when in [0, V), else V (one key for every skipped id); pos[i] = i. */
__global__ void emb_keys_kernel(uint32_t *keys, int32_t *pos, const int64_t *__restrict__ ids,
                                int64_t N, int64_t Vn) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t id = ids[i];
        keys[i] = (uint32_t)(id >= 0 && id < Vn ? id : Vn);
        pos[i] = (int32_t)i;
    }
}

/* Block p handles the run of equal sorted keys that starts at p (other blocks exit at once):
 * each thread owns U chunks of VW elements, adds the run's rows in position order. */
template <typename T, int VW, int U>
__global__ void emb_bwd_vec_kernel(T *__restrict__ dW, const T *__restrict__ dout,
                                   const uint32_t *__restrict__ skeys,
                                   const int32_t *__restrict__ spos, int64_t N, int64_t Vn,
                                   int64_t D, int accumulate) {
    const int64_t p = blockIdx.x;
    const uint32_t key = skeys[p];
    if ((p > 0 && skeys[p - 1] == key) || (int64_t)key >= Vn) return;
    int64_t e = p + 1;
    while (e < N && skeys[e] == key) ++e;
    const int64_t nch = D / VW, id = key;
    for (int64_t c0 = threadIdx.x; c0 < nch; c0 += (int64_t)blockDim.x * U) {
        float acc[U][VW];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t c = c0 + (int64_t)u * blockDim.x;
            if (accumulate && c < nch) ldv<T, VW>(acc[u], dW + id * D + c * VW);
            else
#pragma unroll
                for (int k = 0; k < VW; ++k) acc[u][k] = 0.f;
        }
        for (int64_t q = p; q < e; ++q) {
            const T *src = dout + (int64_t)spos[q] * D;
            float t[U][VW];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int64_t c = c0 + (int64_t)u * blockDim.x;
                if (c < nch) ldv<T, VW>(t[u], src + c * VW);
            }
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int k = 0; k < VW; ++k) acc[u][k] += t[u][k];
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t c = c0 + (int64_t)u * blockDim.x;
            if (c < nch) stv<T, VW>(dW + id * D + c * VW, acc[u]);
        }
    }
}

/* ---- fast path: grouping by vocabulary slice, then run sums ---------------------------------- */

#define EMB_NW 16      /* warps of a grouping block */
#define EMB_WMAX 2048  /* vocabulary ids per grouping block at most */
#define EMB_LONG 32    /* runs longer than this are summed by the long-run blocks */
#define EMB_E 8        /* sorted entries per short-run warp */
#define EMB_BMAX 2048  /* grouping blocks at most (the long-run blocks scan their counts) */

struct emb_ws { /* the fast path's workspace: N-long arrays, then per-grouping-block pairs */
    uint32_t *skeys; /* sorted ids */
    int32_t *spos;   /* their positions, ascending within an id */
    int32_t *segl;   /* at a run's first entry: its length; elsewhere 0 */
    int32_t *lstart, *llen; /* long runs of grouping block b at [cl[b], cl[b] + nl[b]) */
    int32_t *nl, *cl, *M;   /* M: number of valid ids (sorted entries) */
};

/* VW elements of T as loaded (one 16-byte access when VW * sizeof(T) == 16), converted at use:
 * half the registers of loading straight into floats. */
template <typename T, int VW> struct alignas(VW * sizeof(T)) emb_raw { T v[VW]; };
template <typename T, int VW>
static __device__ __forceinline__ emb_raw<T, VW> ldraw(const T *p) {
    return *reinterpret_cast<const emb_raw<T, VW> *>(p);
}

/* VW elements of T as loaded (16-byte pieces when VW * sizeof(T) is a multiple of 16: two for
 * an f32 table's eight), read as floats at use. */
template <typename T, int VW> struct emb_chunk {
    static constexpr int NQ = (int)(VW * sizeof(T) / 16);
    uint4 q[NQ > 0 ? NQ : 1];
    T e[NQ > 0 ? 1 : VW];
    __device__ __forceinline__ void load(const T *p) {
        if constexpr (NQ > 0) {
#pragma unroll
            for (int i = 0; i < NQ; ++i)
                q[i] = reinterpret_cast<const uint4 *>(p)[i];
        } else {
#pragma unroll
            for (int k = 0; k < VW; ++k)
                e[k] = p[k];
        }
    }
    __device__ __forceinline__ float at(int k) const {
        if constexpr (NQ > 0) return tof<T>(reinterpret_cast<const T *>(q)[k]);
        else return tof<T>(e[k]);
    }
};

/* Exclusive sum over a block of EMB_NW warps; *total gets the block's sum. red: EMB_NW ints. */
static __device__ __forceinline__ int emb_exscan(int v, int *red, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) red[warp] = x;
    __syncthreads();
    int before = 0, all = 0;
#pragma unroll
    for (int w = 0; w < EMB_NW; ++w) {
        const int r = red[w];
        before += w < warp ? r : 0;
        all += r;
    }
    *total = all;
    return before + x - v;
}

/* 16 ids per lane, strided by the warp (positions base + u*32 + lane below r1; -1 past it). */
static __device__ __forceinline__ void load_ids16(int64_t *v, const int64_t *ids, int64_t base, int64_t r1, int lane) {
#pragma unroll
    for (int u = 0; u < 16; ++u) {
        const int64_t i = base + u * 32 + lane;
        v[u] = i < r1 ? ids[i] : -1;
    }
}

/* Block b owns ids [b*W, min(b*W + W, V)). Warp w of the block owns positions [w*L, w*L + L). */
__global__ void __launch_bounds__(EMB_NW * 32)
    emb_group_kernel(const int64_t *__restrict__ ids, int64_t N, int64_t Vn, int W, emb_ws ws) {
    extern __shared__ int esm[];
    int *hist = esm;                    /* [EMB_NW][W]: counts, then each warp's next place */
    int *sstart = esm + EMB_NW * W;     /* [W]: first sorted place of each id of the slice */
    int *stot = sstart + W;             /* [W]: its run length */
    __shared__ int red[EMB_NW];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t lo = (int64_t)blockIdx.x * W, hi = lo + W < Vn ? lo + W : Vn;
    const int nw = (int)(hi - lo);
    for (int i = threadIdx.x; i < EMB_NW * W; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    const int64_t L = (N + EMB_NW - 1) / EMB_NW, r0 = warp * L, r1 = r0 + L < N ? r0 + L : N;
    int *myh = hist + warp * W;
    int below = 0;
    for (int64_t base = r0; base < r1; base += 32 * 16) {
        int64_t v[16];
        load_ids16(v, ids, base, r1, lane);
#pragma unroll
        for (int u = 0; u < 16; ++u) {
            if (v[u] >= lo && v[u] < hi) atomicAdd(&myh[v[u] - lo], 1);
            else below += v[u] >= 0 && v[u] < lo;
        }
    }
    int c_lo;
    (void)emb_exscan(below, red, &c_lo);
    /* per id: run length and, per warp, the first place of that warp's entries */
    const int k = (nw + blockDim.x - 1) / blockDim.x, j0 = threadIdx.x * k;
    const int j1 = j0 + k < nw ? j0 + k : nw;
    int loc = 0, nlong = 0;
    for (int j = j0; j < j1; ++j) {
        int s = 0;
        for (int w = 0; w < EMB_NW; ++w) s += hist[w * W + j];
        stot[j] = s;
        loc += s;
        nlong += s > EMB_LONG;
    }
    int total, ltotal;
    int run = c_lo + emb_exscan(loc, red, &total);
    int li = c_lo + emb_exscan(nlong, red, &ltotal);
    for (int j = j0; j < j1; ++j) {
        sstart[j] = run;
        if (stot[j] > EMB_LONG) ws.lstart[li] = run, ws.llen[li] = stot[j], ++li;
        for (int w = 0; w < EMB_NW; ++w) {
            const int c = hist[w * W + j];
            hist[w * W + j] = run;
            run += c;
        }
    }
    if (threadIdx.x == 0) {
        ws.nl[blockIdx.x] = ltotal;
        ws.cl[blockIdx.x] = c_lo;
        if (blockIdx.x == gridDim.x - 1) *ws.M = c_lo + total;
    }
    __syncthreads();
    /* place the entries: a warp walks its positions in order, equal ids of one step ranked by
     * lane (so each id's positions come out ascending) */
    for (int64_t base = r0; base < r1; base += 32 * 16) {
        int64_t v[16];
        load_ids16(v, ids, base, r1, lane);
#pragma unroll
        for (int u = 0; u < 16; ++u) {
            const bool in = v[u] >= lo && v[u] < hi;
            if (!__ballot_sync(0xffffffffu, in)) continue;
            const int l = in ? (int)(v[u] - lo) : -1;
            const unsigned peers = __match_any_sync(0xffffffffu, l);
            const int leader = __ffs(peers) - 1;
            int b = 0;
            if (in && lane == leader) {
                b = myh[l];
                myh[l] = b + __popc(peers);
            }
            b = __shfl_sync(0xffffffffu, b, leader);
            if (in) {
                const int dest = b + __popc(peers & ((1u << lane) - 1u));
                ws.skeys[dest] = (uint32_t)v[u];
                ws.spos[dest] = (int32_t)(base + u * 32 + lane);
                ws.segl[dest] = dest == sstart[l] ? stot[l] : 0;
            }
        }
    }
}

/* Blocks [0, nlb): the long runs, as (run, tile of 8 chunks) items striding over the blocks; a
 * tile's rows are split over 32 row groups (rows g, g+32, ... in order), summed in group order.
 * Other blocks: warp -> (EMB_E sorted entries, a column chunk of 32*U chunks of VW elements); it
 * sums each short run that starts in its entries (old value first when accumulating, then the rows
 * in position order). */
template <typename T, typename TW, int VW, int U, int LU, int MINB>
__global__ void __launch_bounds__(256, MINB)
    emb_sum_kernel(TW *__restrict__ dW, const T *__restrict__ dout, emb_ws ws, int nb, int nlb,
                   int64_t D, int ncc, int accumulate) {
    const int64_t nch = D / VW;
    const int lane = threadIdx.x & 31;
    if ((int)blockIdx.x < nlb) {
        __shared__ int pre[EMB_BMAX + 1];
        __shared__ int sp[1024];
        __shared__ float part[32][8 * VW];
        __shared__ int red[8];
        /* prefix of the long-run counts over the grouping blocks: 8 per thread */
        int c[8], s = 0;
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            const int b = threadIdx.x * 8 + q;
            c[q] = b < nb ? ws.nl[b] : 0;
            s += c[q];
        }
        int x = s;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (lane == 31) red[threadIdx.x >> 5] = x;
        __syncthreads();
        int before = x - s, all = 0;
        for (int w = 0; w < 8; ++w) {
            before += w < (int)(threadIdx.x >> 5) ? red[w] : 0;
            all += red[w];
        }
        if (all == 0) return;
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            const int b = threadIdx.x * 8 + q;
            if (b <= nb) pre[b] = before;
            before += c[q];
        }
        __syncthreads();
        const int64_t ntl = (nch + 7) / 8;
        const int g = threadIdx.x >> 3, li = threadIdx.x & 7;
        for (int64_t it = blockIdx.x; it < (int64_t)all * ntl; it += nlb) {
            const int q = (int)(it / ntl);
            const int64_t ch = (it % ntl) * 8 + li;
            int lo = 0, hi = nb; /* the grouping block b with pre[b] <= q < pre[b + 1] */
            while (hi - lo > 1) {
                const int m = (lo + hi) / 2;
                if (pre[m] <= q) lo = m;
                else hi = m;
            }
            const int e = ws.cl[lo] + (q - pre[lo]);
            const int st = ws.lstart[e], len = ws.llen[e];
            const int64_t id = ws.skeys[st];
            float acc[VW];
#pragma unroll
            for (int k2 = 0; k2 < VW; ++k2) acc[k2] = 0.f;
            for (int p0 = 0; p0 < len; p0 += 1024) {
                const int n = len - p0 < 1024 ? len - p0 : 1024;
                __syncthreads();
                for (int i = threadIdx.x; i < n; i += 256) sp[i] = ws.spos[st + p0 + i];
                __syncthreads();
                if (ch < nch)
                    for (int r = g; r < n; r += 32 * LU) {
                        emb_raw<T, VW> t[LU];
#pragma unroll
                        for (int u = 0; u < LU; ++u)
                            if (r + 32 * u < n)
                                t[u] = ldraw<T, VW>(dout + (int64_t)sp[r + 32 * u] * D + ch * VW);
#pragma unroll
                        for (int u = 0; u < LU; ++u)
                            if (r + 32 * u < n)
#pragma unroll
                                for (int k2 = 0; k2 < VW; ++k2) acc[k2] += tof<T>(t[u].v[k2]);
                    }
            }
#pragma unroll
            for (int k2 = 0; k2 < VW; ++k2) part[g][li * VW + k2] = acc[k2];
            __syncthreads();
            if (g == 0 && ch < nch) {
                float o[VW];
                if (accumulate) ldv<TW, VW>(o, dW + id * D + ch * VW);
                else
#pragma unroll
                    for (int k2 = 0; k2 < VW; ++k2) o[k2] = 0.f;
                for (int gg = 0; gg < 32; ++gg)
#pragma unroll
                    for (int k2 = 0; k2 < VW; ++k2) o[k2] += part[gg][li * VW + k2];
                stv<TW, VW>(dW + id * D + ch * VW, o);
            }
        }
        return;
    }
    const int64_t gw = (int64_t)(blockIdx.x - nlb) * 8 + (threadIdx.x >> 5);
    const int64_t e0 = gw / ncc * EMB_E, c0 = gw % ncc * 32 * U;
    const int64_t M = *ws.M;
    if (e0 >= M) return;
    const int64_t idx = e0 + lane;
    const bool valid = idx < M;
    const uint32_t key = valid ? ws.skeys[idx] : 0u;
    const int pos = valid ? ws.spos[idx] : 0, sl = valid ? ws.segl[idx] : 0;
    unsigned heads = __ballot_sync(0xffffffffu, lane < EMB_E && sl > 0 && sl <= EMB_LONG);
    if (!heads) return;
    /* A run's old dW chunk and first dout row are loaded while the previous run is summed and
     * stored (runs are distinct ids: no overlap), so two rows per lane are in flight, not one. */
    struct run_t {
        int len, pl, off;
        int64_t id;
        emb_chunk<TW, VW> old[U];
        emb_chunk<T, VW> first[U];
    };
    auto start = [&](int l, run_t &h) {
        h.len = __shfl_sync(0xffffffffu, sl, l);
        h.id = __shfl_sync(0xffffffffu, key, l);
        h.pl = pos, h.off = l;
        if (l + h.len > 32) { /* the run goes past the entries loaded: load its positions */
            h.pl = lane < h.len ? ws.spos[e0 + l + lane] : 0;
            h.off = 0;
        }
        const int p0 = __shfl_sync(0xffffffffu, h.pl, h.off);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t ch = c0 + u * 32 + lane;
            if (ch < nch) {
                if (accumulate) h.old[u].load(dW + h.id * D + ch * VW);
                h.first[u].load(dout + (int64_t)p0 * D + ch * VW);
            }
        }
    };
    run_t cur, nxt;
    start(__ffs(heads) - 1, cur);
    heads &= heads - 1;
    for (;;) {
        const bool more = heads != 0;
        if (more) {
            start(__ffs(heads) - 1, nxt);
            heads &= heads - 1;
        }
        float acc[U][VW];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int k2 = 0; k2 < VW; ++k2)
                acc[u][k2] = (accumulate ? cur.old[u].at(k2) : 0.f) + cur.first[u].at(k2);
        for (int r = 1; r < cur.len; r += 2) {
            const int p0 = __shfl_sync(0xffffffffu, cur.pl, cur.off + r);
            const int p1 = __shfl_sync(0xffffffffu, cur.pl, (cur.off + r + 1) & 31);
            const bool two = r + 1 < cur.len;
            emb_raw<T, VW> t0[U], t1[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int64_t ch = c0 + u * 32 + lane;
                if (ch < nch) {
                    t0[u] = ldraw<T, VW>(dout + (int64_t)p0 * D + ch * VW);
                    if (two) t1[u] = ldraw<T, VW>(dout + (int64_t)p1 * D + ch * VW);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (c0 + u * 32 + lane < nch)
#pragma unroll
                    for (int k2 = 0; k2 < VW; ++k2) acc[u][k2] += tof<T>(t0[u].v[k2]);
            if (two)
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (c0 + u * 32 + lane < nch)
#pragma unroll
                        for (int k2 = 0; k2 < VW; ++k2) acc[u][k2] += tof<T>(t1[u].v[k2]);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t ch = c0 + u * 32 + lane;
            if (ch < nch) stv<TW, VW>(dW + cur.id * D + ch * VW, acc[u]);
        }
        if (!more) break;
        cur = nxt;
    }
}

static size_t a256(size_t n) { return (n + 255) & ~(size_t)255; }
static size_t cub_bytes(int64_t N) {
    size_t t = 0;
    cub::DeviceRadixSort::SortPairs(NULL, t, (const int64_t *)NULL, (int64_t *)NULL,
                                    (const int32_t *)NULL, (int32_t *)NULL, (int)N);
    return t;
}

static size_t cub_bytes32(int64_t N) {
    size_t t = 0;
    cub::DeviceRadixSort::SortPairs(NULL, t, (const uint32_t *)NULL, (uint32_t *)NULL,
                                    (const int32_t *)NULL, (int32_t *)NULL, (int)N);
    return t;
}

/* The fast path's blocks for V ids: W ids each (at least 256, at most EMB_WMAX), one per SM. */
static int emb_slices(int64_t N, int64_t V, int *W) {
    static int sms[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) dev = 0, (void)cudaGetLastError();
    if (!sms[dev] && cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        (void)cudaGetLastError(), sms[dev] = 132;
    if (N >= 0x7fffffffLL || V >= 0x7fffffffLL) return 0;
    int64_t w = (V + sms[dev] - 1) / sms[dev];
    if (w < 256) w = V < 256 ? V : 256;
    if (w > EMB_WMAX) return 0;
    const int64_t b = (V + w - 1) / w;
    if (b >= EMB_BMAX) return 0;
    *W = (int)w;
    return (int)b;
}

static size_t emb_fast_bytes(int64_t N, int64_t V) {
    return 5 * a256((size_t)N * 4) + 2 * a256((size_t)((V + 255) / 256 + 1) * 4) + 256;
}

static emb_ws emb_ws_at(void *p, int64_t N, int64_t V) {
    char *c = (char *)p;
    const size_t n4 = a256((size_t)N * 4), b4 = a256((size_t)((V + 255) / 256 + 1) * 4);
    emb_ws w;
    w.skeys = (uint32_t *)c;
    w.spos = (int32_t *)(c + n4);
    w.segl = (int32_t *)(c + 2 * n4);
    w.lstart = (int32_t *)(c + 3 * n4);
    w.llen = (int32_t *)(c + 4 * n4);
    w.nl = (int32_t *)(c + 5 * n4);
    w.cl = (int32_t *)(c + 5 * n4 + b4);
    w.M = (int32_t *)(c + 5 * n4 + 2 * b4);
    return w;
}

extern "C" size_t embedding_backward_workspace_size(int64_t N, int64_t V) {
    if (N <= 0 || V <= 0) return 0;
    const size_t w64 = a256((size_t)N * 8) + 2 * a256((size_t)N * 4) + a256(cub_bytes(N));
    const size_t w32 = 4 * a256((size_t)N * 4) + a256(cub_bytes32(N));
    const size_t wf = emb_fast_bytes(N, V);
    const size_t m = w64 > w32 ? w64 : w32;
    return m > wf ? m : wf;
}

/* The fast path; false when the shape does not suit it (nothing launched). dW's type TW is T, or
 * float for a 16-bit dout added into an fp32 table. */
template <typename T, typename TW = T>
static bool emb_bwd_fast(TW *dW, const T *dout, const int64_t *ids, void *workspace, int64_t N,
                         int64_t V, int64_t D, int accumulate, cudaStream_t stream) {
    int W = 0;
    const int nb = emb_slices(N, V, &W);
    if (nb <= 0) return false;
    const emb_ws ws = emb_ws_at(workspace, N, V);
    const size_t smem = (size_t)(EMB_NW + 2) * W * 4;
    int sms = 0, dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        (void)cudaGetLastError(), dev = 0, sms = 132;
    static bool attr[64]; /* per device; racy but idempotent */
    if (dev < 0 || dev >= 64) return false;
    if (!attr[dev]) {
        if (cudaFuncSetAttribute(emb_group_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (EMB_NW + 2) * EMB_WMAX * 4) != cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
        attr[dev] = true;
    }
    emb_group_kernel<<<(unsigned)nb, EMB_NW * 32, smem, stream>>>(ids, N, V, W, ws);
    const int VW = 16 / sizeof(T);
    const int64_t nr = (N + EMB_E - 1) / EMB_E;
    if (D % VW == 0 && al16(dW) && al16(dout)) {
        /* 4 column chunks of 32 lanes per short-run warp, 8 rows in flight per long-run thread
         * (measured against 2 and 4 with registers capped for 3 blocks per SM: 95 vs 92 us on
         * distinct ids, 93 vs 118 us with 30% of the ids one token) */
        const int64_t ncc = (D / VW + 32 * 4 - 1) / (32 * 4), warps = nr * ncc;
        emb_sum_kernel<T, TW, 16 / sizeof(T), 4, 8, 1><<<(unsigned)(sms + (warps + 7) / 8), 256, 0,
                                                     stream>>>(dW, dout, ws, nb, sms, D, (int)ncc,
                                                               accumulate);
    } else {
        const int64_t ncc = (D + 32 * 2 - 1) / (32 * 2), warps = nr * ncc;
        emb_sum_kernel<T, TW, 1, 2, 4, 3><<<(unsigned)(sms + (warps + 7) / 8), 256, 0, stream>>>(
            dW, dout, ws, nb, sms, D, (int)ncc, accumulate);
    }
    return true;
}

extern "C" int embedding_backward_add_f32_cuda(float *dW, const void *dout, const int64_t *ids,
                                               void *workspace, int64_t N, int64_t V, int64_t D,
                                               zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "embedding_backward_add_f32_cuda";
    if (N < 0 || V <= 0 || D <= 0 || N > 0x7fffffffLL)
        return zr_error("%s: bad shape N=%lld V=%lld D=%lld", fn, (long long)N, (long long)V,
                        (long long)D);
    if (dtype != ZR_BF16 && dtype != ZR_F16) return -2;
    if (N == 0) return 0;
    if (!workspace) return zr_error("%s: workspace is NULL", fn);
    const bool done =
        dtype == ZR_BF16
            ? emb_bwd_fast<__nv_bfloat16, float>(dW, (const __nv_bfloat16 *)dout, ids, workspace,
                                                 N, V, D, 1, stream)
            : emb_bwd_fast<__half, float>(dW, (const __half *)dout, ids, workspace, N, V, D, 1,
                                          stream);
    return done ? launch_check(fn) : -2;
}

extern "C" int embedding_forward_cuda(void *out, const void *weight, const int64_t *ids,
                                      int64_t N, int64_t V, int64_t D, zr_dtype dtype,
                                      cudaStream_t stream) {
    const char *fn = "embedding_forward_cuda";
    if (N < 0 || V <= 0 || D <= 0)
        return zr_error("%s: bad shape N=%lld V=%lld D=%lld", fn, (long long)N, (long long)V,
                        (long long)D);
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype, {
        const int VW = 16 / sizeof(T);
        const bool vec = D % VW == 0 && al16(out) && al16(weight);
        const int64_t n = N * (vec ? D / VW : D);
        int64_t blocks = (n + 255) / 256;
        if (blocks > 132 * 32) blocks = 132 * 32;
        if (vec)
            emb_fwd_kernel<T, 16 / sizeof(T)><<<(unsigned)blocks, 256, 0, stream>>>(
                (T *)out, (const T *)weight, ids, N, V, D);
        else
            emb_fwd_kernel<T, 1><<<(unsigned)blocks, 256, 0, stream>>>((T *)out, (const T *)weight,
                                                                       ids, N, V, D);
    });
    return launch_check(fn);
}

extern "C" int embedding_backward_cuda(void *dW, const void *dout, const int64_t *ids,
                                       void *workspace, int64_t N, int64_t V, int64_t D,
                                       int accumulate, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "embedding_backward_cuda";
    if (N < 0 || V <= 0 || D <= 0 || N > 0x7fffffffLL)
        return zr_error("%s: bad shape N=%lld V=%lld D=%lld", fn, (long long)N, (long long)V,
                        (long long)D);
    if (dtype != ZR_F32 && dtype != ZR_BF16 && dtype != ZR_F16)
        return zr_error("%s: dtype %s not supported (f32, bf16 or f16 expected)", fn,
                        zr_dtype_name(dtype));
    if (!accumulate &&
        cudaMemsetAsync(dW, 0, (size_t)V * D * zr_dtype_size(dtype), stream) != cudaSuccess)
        return zr_error("%s: cudaMemsetAsync of dW (%lld x %lld) failed", fn, (long long)V,
                        (long long)D);
    if (N == 0) return launch_check(fn);
    if (!workspace) return zr_error("%s: workspace is NULL", fn);
    bool done = false;
    ZR_FUSED_DISPATCH(fn, dtype,
                      done = emb_bwd_fast<T>((T *)dW, (const T *)dout, ids, workspace, N, V, D,
                                             accumulate, stream));
    if (done) return launch_check(fn);
    char *ws = (char *)workspace;
    if (V < 0x7fffffffLL) { /* 32-bit keys over the bits that V needs */
        uint32_t *keys = (uint32_t *)ws;
        uint32_t *skeys32 = (uint32_t *)(ws + a256((size_t)N * 4));
        int32_t *pos = (int32_t *)(ws + 2 * a256((size_t)N * 4));
        int32_t *spos = (int32_t *)(ws + 3 * a256((size_t)N * 4));
        void *tmp = ws + 4 * a256((size_t)N * 4);
        int nbits = 1;
        while (nbits < 32 && ((int64_t)1 << nbits) <= V) ++nbits; /* the key V fits too */
        emb_keys_kernel<<<(unsigned)((N + 255) / 256 < 4096 ? (N + 255) / 256 : 4096), 256, 0,
                          stream>>>(keys, pos, ids, N, V);
        size_t tmpb = cub_bytes32(N); /* host work after the first launch: the GPU is busy */
        if (cub::DeviceRadixSort::SortPairs(tmp, tmpb, keys, skeys32, pos, spos, (int)N, 0, nbits,
                                            stream) != cudaSuccess)
            return zr_error("%s: radix sort of %lld ids failed: %s", fn, (long long)N,
                            cudaGetErrorString(cudaGetLastError()));
        ZR_FUSED_DISPATCH(fn, dtype, {
            const int VW = 16 / sizeof(T);
            if (D % VW == 0 && al16(dW) && al16(dout)) {
                const int64_t nch = D / VW, per = (nch + 3) / 4;
                const int th = per >= 128 ? 128 : per <= 32 ? 32 : (int)((per + 31) / 32 * 32);
                emb_bwd_vec_kernel<T, 16 / sizeof(T), 4><<<(unsigned)N, th, 0, stream>>>(
                    (T *)dW, (const T *)dout, skeys32, spos, N, V, D, accumulate);
            } else {
                const int th = D >= 256 ? 256 : (int)((D + 31) / 32 * 32);
                emb_bwd_vec_kernel<T, 1, 1><<<(unsigned)N, th, 0, stream>>>(
                    (T *)dW, (const T *)dout, skeys32, spos, N, V, D, accumulate);
            }
        });
        return launch_check(fn);
    }
    int64_t *skeys = (int64_t *)ws;
    int32_t *pos = (int32_t *)(ws + a256((size_t)N * 8));
    int32_t *spos = (int32_t *)((char *)pos + a256((size_t)N * 4));
    void *tmp = (char *)spos + a256((size_t)N * 4);
    size_t tmpb = cub_bytes(N);
    emb_iota_kernel<<<(unsigned)((N + 255) / 256 < 4096 ? (N + 255) / 256 : 4096), 256, 0,
                      stream>>>(pos, N);
    if (cub::DeviceRadixSort::SortPairs(tmp, tmpb, ids, skeys, pos, spos, (int)N, 0, 64, stream) != cudaSuccess)
        return zr_error("%s: radix sort of %lld ids failed: %s", fn, (long long)N,
                        cudaGetErrorString(cudaGetLastError()));
    const int th = D >= 256 ? 256 : (int)((D + 31) / 32 * 32);
    ZR_FUSED_DISPATCH(fn, dtype,
                      emb_bwd_kernel<T><<<(unsigned)N, th, 0, stream>>>(
                          (T *)dW, (const T *)dout, skeys, spos, N, V, D, accumulate));
    return launch_check(fn);
}
