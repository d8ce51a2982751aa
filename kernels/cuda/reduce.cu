// Row reductions on CUDA (see reduce.h). Three shapes of launch by row length r: a thread per row
// (r <= 32), a warp per row (r <= 1024), a block per row above that; when there are few long rows
// each row is also split over several blocks whose f64 partials a second tiny kernel adds in a
// fixed order, so the result does not depend on scheduling.
#include "common.cuh"
#include "reduce.h"

using namespace zrk;

namespace {

const int BLOCK = 256;
const int SPLIT_CHUNK = 4096; // elements per block when a row is split
const int TARGET_BLOCKS = 1024;

int64_t split_for(int64_t outer, int64_t r) {
    if (r <= 1024 || outer >= TARGET_BLOCKS / 2) return 1;
    int64_t by_len = (r + SPLIT_CHUNK - 1) / SPLIT_CHUNK, by_rows = (TARGET_BLOCKS + outer - 1) / outer;
    int64_t s = by_len < by_rows ? by_len : by_rows;
    return s < 1 ? 1 : s;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T> __device__ __forceinline__ T store_sum(double s, double scale) {
    return from_acc<T>((typename acc<T>::type)(s * scale));
}

template <typename T>
__global__ void sum_thread_rows_kernel(T *out, const T *__restrict__ x, int64_t outer, int64_t r, double scale) {
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < outer; o += (int64_t)gridDim.x * blockDim.x) {
        const T *row = x + o * r;
        double s = 0;
        for (int64_t i = 0; i < r; i++) s += (double)to_acc(row[i]);
        out[o] = store_sum<T>(s, scale);
    }
}

template <typename T>
__global__ void sum_warp_rows_kernel(T *out, const T *__restrict__ x, int64_t outer, int64_t r, double scale) {
    int lane = threadIdx.x & 31;
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t o = w; o < outer; o += nw) {
        const T *row = x + o * r;
        double s = 0;
        for (int64_t i = lane; i < r; i += 32) s += (double)to_acc(row[i]);
        s = warp_sum(s);
        if (lane == 0) out[o] = store_sum<T>(s, scale);
    }
}

// Elements per 16-byte load for rows of length r at x: V when every row start is 16-byte
// aligned, else 1.
template <typename T> int row_vec(const void *x, int64_t r) {
    const int V = vec_of<T>::n;
    return aligned16(x) && r % V == 0 ? V : 1;
}

// grid (outer, split); with split > 1 block (o, p) writes partial ws[o * split + p]. Chunks are
// whole packs of V elements (V divides r when V > 1).
template <typename T, int V>
__global__ void sum_block_rows_kernel(T *out, double *ws, const T *__restrict__ x, int64_t r, int64_t split,
                                      double scale) {
    __shared__ double red[BLOCK / 32];
    int64_t o = blockIdx.x, p = blockIdx.y, nv = r / V, chunk = (nv + split - 1) / split;
    int64_t lo = p * chunk, hi = lo + chunk < nv ? lo + chunk : nv;
    const pack<T, V> *row = reinterpret_cast<const pack<T, V> *>(x + o * r);
    double s = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += BLOCK) {
        pack<T, V> v = row[i];
#pragma unroll
        for (int k = 0; k < V; k++) s += (double)to_acc(v.v[k]);
    }
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < BLOCK / 32 ? red[threadIdx.x] : 0.0;
        s = warp_sum(s);
        if (threadIdx.x == 0) {
            if (split == 1) out[o] = store_sum<T>(s, scale);
            else ws[o * split + p] = s;
        }
    }
}

template <typename T>
__global__ void sum_finish_kernel(T *out, const double *ws, int64_t outer, int64_t split, double scale) {
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < outer; o += (int64_t)gridDim.x * blockDim.x) {
        double s = 0;
        for (int64_t p = 0; p < split; p++) s += ws[o * split + p];
        out[o] = store_sum<T>(s, scale);
    }
}

template <typename T>
int sum_rows(void *out, const void *x, int64_t outer, int64_t r, double scale, void *ws, cudaStream_t s) {
    T *o = (T *)out;
    const T *xp = (const T *)x;
    if (r <= 32) sum_thread_rows_kernel<T><<<grid_for(outer, BLOCK), BLOCK, 0, s>>>(o, xp, outer, r, scale);
    else if (r <= 1024) sum_warp_rows_kernel<T><<<grid_for(outer * 32, BLOCK), BLOCK, 0, s>>>(o, xp, outer, r, scale);
    else {
        int64_t split = split_for(outer, r);
        if (split > 1 && !ws) return zr_error("sum (cuda): missing workspace");
        if (outer > 0x7fffffff) return zr_error("sum (cuda): too many rows (%lld)", (long long)outer);
        dim3 grid((unsigned)outer, (unsigned)split);
        if (row_vec<T>(x, r) > 1)
            sum_block_rows_kernel<T, vec_of<T>::n><<<grid, BLOCK, 0, s>>>(o, (double *)ws, xp, r, split, scale);
        else
            sum_block_rows_kernel<T, 1><<<grid, BLOCK, 0, s>>>(o, (double *)ws, xp, r, split, scale);
        if (split > 1) sum_finish_kernel<T><<<grid_for(outer, BLOCK), BLOCK, 0, s>>>(o, (const double *)ws, outer, split, scale);
    }
    return launch_check("sum (cuda)");
}

// (value, index) candidates for max: a NaN beats numbers, then larger, then the earlier index.
template <typename A> __device__ __forceinline__ bool better(A v, int64_t i, A bv, int64_t bi) {
    bool vn = v != v, bn = bv != bv;
    if (vn != bn) return vn;
    if (vn) return i < bi;
    return v > bv || (v == bv && i < bi);
}
template <typename A> __device__ __forceinline__ void warp_max(A &v, int64_t &i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        A ov = __shfl_xor_sync(0xffffffffu, v, o);
        int64_t oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) v = ov, i = oi;
    }
}

template <typename T>
__global__ void max_thread_rows_kernel(T *out, int64_t *idx, const T *__restrict__ x, int64_t outer, int64_t r) {
    typedef typename acc<T>::type A;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < outer; o += (int64_t)gridDim.x * blockDim.x) {
        const T *row = x + o * r;
        A m = to_acc(row[0]);
        int64_t mi = 0;
        for (int64_t i = 1; i < r && m == m; i++) {
            A v = to_acc(row[i]);
            if (v > m || v != v) m = v, mi = i;
        }
        out[o] = from_acc<T>(m);
        if (idx) idx[o] = mi;
    }
}

template <typename T>
__global__ void max_warp_rows_kernel(T *out, int64_t *idx, const T *__restrict__ x, int64_t outer, int64_t r) {
    typedef typename acc<T>::type A;
    int lane = threadIdx.x & 31;
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t o = w; o < outer; o += nw) {
        const T *row = x + o * r;
        A m = to_acc(row[0]);
        int64_t mi = 0;
        for (int64_t i = lane; i < r; i += 32) {
            A v = to_acc(row[i]);
            if (better(v, i, m, mi)) m = v, mi = i;
        }
        warp_max(m, mi);
        if (lane == 0) {
            out[o] = from_acc<T>(m);
            if (idx) idx[o] = mi;
        }
    }
}

template <typename T, int V>
__global__ void max_block_rows_kernel(T *out, int64_t *idx, const T *__restrict__ x, int64_t r) {
    typedef typename acc<T>::type A;
    __shared__ A sv[BLOCK / 32];
    __shared__ int64_t si[BLOCK / 32];
    int64_t o = blockIdx.x;
    const T *row = x + o * r;
    A m = to_acc(row[0]);
    int64_t mi = 0;
    const pack<T, V> *rv = reinterpret_cast<const pack<T, V> *>(row);
    for (int64_t i = threadIdx.x; i < r / V; i += BLOCK) {
        pack<T, V> p = rv[i];
#pragma unroll
        for (int k = 0; k < V; k++) {
            A v = to_acc(p.v[k]);
            if (better(v, i * V + k, m, mi)) m = v, mi = i * V + k;
        }
    }
    warp_max(m, mi);
    if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = m, si[threadIdx.x >> 5] = mi;
    __syncthreads();
    if (threadIdx.x < 32) {
        int k = threadIdx.x < BLOCK / 32 ? threadIdx.x : 0;
        m = sv[k], mi = si[k];
        warp_max(m, mi);
        if (threadIdx.x == 0) {
            out[o] = from_acc<T>(m);
            if (idx) idx[o] = mi;
        }
    }
}

// Many long rows (r > 1024) with 16-byte-aligned packs: a warp per row, each lane reading U packs
// with all loads issued before the compares. A lane visits its elements in increasing index order,
// so a strict "greater" keeps the earliest index of its maximum; NaNs are only noted, and a row in
// which any lane saw one is redone with the exact (NaN-first) rule. Lanes then merge with `better`.
template <typename T, int V, int U>
__global__ void max_warp_rows_vec_kernel(T *out, int64_t *idx, const T *__restrict__ x, int64_t outer, int64_t r) {
    typedef typename acc<T>::type A;
    const int lane = threadIdx.x & 31;
    const int64_t nv = r / V;
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t o = w; o < outer; o += nw) {
        const pack<T, V> *rv = reinterpret_cast<const pack<T, V> *>(x + o * r);
        A m = to_acc(x[o * r + (int64_t)lane * V]); // nv > 32: every lane has pack `lane`
        int64_t mi = (int64_t)lane * V;
        bool nan = false;
        for (int64_t b0 = lane; b0 < nv; b0 += 32 * U) {
            pack<T, V> p[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                if (b0 + u * 32 < nv) p[u] = rv[b0 + u * 32];
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (b0 + u * 32 >= nv) break;
#pragma unroll
                for (int k = 0; k < V; k++) {
                    A v = to_acc(p[u].v[k]);
                    nan |= v != v;
                    if (v > m) m = v, mi = (b0 + u * 32) * V + k;
                }
            }
        }
        if (__any_sync(0xffffffffu, nan)) { // exact rule: the first NaN wins
            mi = INT64_MAX;
            for (int64_t b0 = lane; b0 < nv; b0 += 32) {
                pack<T, V> p = rv[b0];
#pragma unroll
                for (int k = 0; k < V; k++) {
                    A v = to_acc(p.v[k]);
                    if (mi == INT64_MAX || v > m || (v != v && m == m)) m = v, mi = b0 * V + k;
                }
            }
        }
        warp_max(m, mi);
        if (lane == 0) {
            out[o] = from_acc<T>(m);
            if (idx) idx[o] = mi;
        }
    }
}

template <typename T> int max_rows(void *out, int64_t *idx, const void *x, int64_t outer, int64_t r, cudaStream_t s) {
    T *o = (T *)out;
    const T *xp = (const T *)x;
    if (r <= 32) max_thread_rows_kernel<T><<<grid_for(outer, BLOCK), BLOCK, 0, s>>>(o, idx, xp, outer, r);
    else if (r <= 1024) max_warp_rows_kernel<T><<<grid_for(outer * 32, BLOCK), BLOCK, 0, s>>>(o, idx, xp, outer, r);
    else {
        if (outer > 0x7fffffff) return zr_error("max (cuda): too many rows (%lld)", (long long)outer);
        if (row_vec<T>(x, r) > 1 && outer >= 512)
            max_warp_rows_vec_kernel<T, vec_of<T>::n, 4><<<grid_for(outer * 32, BLOCK), BLOCK, 0, s>>>(o, idx, xp, outer, r);
        else if (row_vec<T>(x, r) > 1)
            max_block_rows_kernel<T, vec_of<T>::n><<<(unsigned)outer, BLOCK, 0, s>>>(o, idx, xp, r);
        else
            max_block_rows_kernel<T, 1><<<(unsigned)outer, BLOCK, 0, s>>>(o, idx, xp, r);
    }
    return launch_check("max (cuda)");
}

template <typename T>
__global__ void max_backward_kernel(T *gx, const T *g, const int64_t *idx, int64_t outer, int64_t r) {
    int64_t n = outer * r;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = i / r, c = i - o * r;
        gx[i] = c == idx[o] ? g[o] : from_acc<T>(0);
    }
}

template <typename T>
int max_bwd(void *gx, const void *g, const int64_t *idx, int64_t outer, int64_t r, cudaStream_t s) {
    max_backward_kernel<T><<<grid_for(outer * r, BLOCK), BLOCK, 0, s>>>((T *)gx, (const T *)g, idx, outer, r);
    return launch_check("max backward (cuda)");
}

}  // namespace

extern "C" size_t reduce_sum_rows_cuda_workspace(int64_t outer, int64_t r) {
    int64_t split = split_for(outer, r);
    return split > 1 ? (size_t)(outer * split) * sizeof(double) : 0;
}

extern "C" int reduce_sum_rows_cuda(void *out, const void *x, int64_t outer, int64_t r, double scale,
                                    void *workspace, zr_dtype dt, cudaStream_t stream) {
    if (outer <= 0) return 0;
    if (r == 0) return zr_error("sum (cuda): rows of length 0 (fill the output instead)");
    ZRK_DISPATCH_FLOAT(dt, "sum (cuda)", sum_rows, out, x, outer, r, scale, workspace, stream)
}

extern "C" int reduce_max_rows_cuda(void *out, int64_t *idx, const void *x, int64_t outer, int64_t r, zr_dtype dt,
                                    cudaStream_t stream) {
    if (outer <= 0) return 0;
    if (r <= 0) return zr_error("max (cuda): cannot reduce rows of length 0");
    ZRK_DISPATCH_FLOAT(dt, "max (cuda)", max_rows, out, idx, x, outer, r, stream)
}

extern "C" int reduce_max_rows_backward_cuda(void *gx, const void *g, const int64_t *idx, int64_t outer, int64_t r,
                                             zr_dtype dt, cudaStream_t stream) {
    if (outer * r <= 0) return 0;
    ZRK_DISPATCH_FLOAT(dt, "max backward (cuda)", max_bwd, gx, g, idx, outer, r, stream)
}
