// CUDA twins of kernels/cpu/zenflow.c (ZenFlow's selective column update): one thread per
// element of the (rows, k) selection; the column sum is one thread per column walking its rows
// (coalesced across threads: neighbouring threads read neighbouring columns of a row); the sums of
// update_interval "auto" one block per chunk of every entry at once, then one block per entry.
#include "common.cuh"
#include "zenflow.h"

using zrk::from_acc;
using zrk::launch_check;
using zrk::to_acc;

static const int kThreads = 256;

static __global__ void colsum_kernel(float *out, const float *g, int64_t rows, int64_t cols) {
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    float acc = 0.0f;
    for (int64_t i = 0; i < rows; i++) acc += fabsf(g[i * cols + j]);
    out[j] = acc;
}

/* A block's threads' doubles summed in a fixed order (warp shuffles, then the 8 warps in order); the
 * total is thread 0's. blockDim.x must be 256. */
static __device__ double block_sum256(double acc) {
    __shared__ double warp_sum[8];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = acc;
    __syncthreads();
    double s = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < 8; w++) s += warp_sum[w];
    return s;
}

/* One block per chunk (blockIdx.x: its number over all entries): part[chunk] = sum |a - prev| over the
 * chunk's elements, each thread's in index order in double (float4 loads when a and prev are 16-byte
 * aligned; a chunk's start keeps that, ZENFLOW_ABSDIFF_CHUNK being a multiple of 4). */
static __global__ void __launch_bounds__(256) absdiff_chunks_kernel(double *part, const zenflow_absdiff_entry *tab,
                                                                     int64_t nent) {
    const int64_t c = blockIdx.x;
    int64_t lo = 0, hi = nent - 1; /* the last entry whose first chunk is <= c: the one holding c (empty
                                      entries share the next one's first) */
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (tab[mid].first <= c) lo = mid;
        else hi = mid - 1;
    }
    const zenflow_absdiff_entry e = tab[lo];
    const int64_t c0 = (c - e.first) * ZENFLOW_ABSDIFF_CHUNK;
    const int64_t len = e.n - c0 < ZENFLOW_ABSDIFF_CHUNK ? e.n - c0 : ZENFLOW_ABSDIFF_CHUNK;
    const float *a = e.a + c0;
    float *prev = e.flags ? e.prev + c0 : NULL; /* read or written: its alignment counts */
    const int have_prev = e.flags & ZENFLOW_HAVE_PREV, keep = e.flags & ZENFLOW_KEEP;
    double acc = 0;
    const int64_t n4 = ((uintptr_t)a % 16 == 0 && (uintptr_t)prev % 16 == 0) ? len / 4 : 0;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
        const float4 x = reinterpret_cast<const float4 *>(a)[i];
        float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
        if (have_prev) y = reinterpret_cast<const float4 *>(prev)[i];
        acc += fabs((double)x.x - y.x) + fabs((double)x.y - y.y) + fabs((double)x.z - y.z) + fabs((double)x.w - y.w);
        if (keep) reinterpret_cast<float4 *>(prev)[i] = x;
    }
    for (int64_t i = 4 * n4 + threadIdx.x; i < len; i += blockDim.x) {
        const float x = a[i];
        acc += fabs((double)x - (have_prev ? (double)prev[i] : 0.0));
        if (keep) prev[i] = x;
    }
    const double s = block_sum256(acc);
    if (threadIdx.x == 0) part[c] = s;
}

/* One block per entry: sums[slot] = its chunks' partials summed in a fixed order, rounded to f32. */
static __global__ void __launch_bounds__(256) absdiff_totals_kernel(float *sums, const double *part,
                                                                     const zenflow_absdiff_entry *tab) {
    const zenflow_absdiff_entry e = tab[blockIdx.x];
    const int64_t end = e.first + (e.n + ZENFLOW_ABSDIFF_CHUNK - 1) / ZENFLOW_ABSDIFF_CHUNK; /* its chunks' */
    double acc = 0;
    for (int64_t i = e.first + threadIdx.x; i < end; i += blockDim.x) acc += part[i];
    const double s = block_sum256(acc);
    if (threadIdx.x == 0) sums[e.slot] = (float)s;
}

template <typename T>
static __global__ void move_kernel(T *dst, const T *src, int64_t rows, int64_t cols, const int32_t *idx, int64_t k,
                                   int scatter) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= rows * k) return;
    int64_t i = e / k, c = e % k, j = i * cols + (idx ? idx[c] : c);
    if (scatter) dst[j] = src[e];
    else dst[e] = src[j];
}

template <typename T>
static __global__ void adamw_kernel(T *p, const float *g, int g_sel, float *m, float *v, int64_t rows,
                                    int64_t cols, const int32_t *idx, int64_t k, float decay, float a1, float b2,
                                    float a2, float step_size, float bc2s, float eps) {
    int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= rows * k) return;
    int64_t i = s / k, c = s % k, j = i * cols + (idx ? idx[c] : c);
    float gr = g[g_sel ? s : j];
    float w = to_acc(p[j]) * decay;
    float mm = m[s] + a1 * (gr - m[s]);
    float vv = b2 * v[s] + a2 * gr * gr;
    m[s] = mm;
    v[s] = vv;
    w -= step_size * mm / (sqrtf(vv) / bc2s + eps);
    p[j] = from_acc<T>(w);
}

static unsigned blocks(int64_t n) { return (unsigned)((n + kThreads - 1) / kThreads); }

int zenflow_colsum_cuda(float *out, const float *g, int64_t rows, int64_t cols, cudaStream_t stream) {
    if (cols == 0) return 0;
    colsum_kernel<<<blocks(cols), kThreads, 0, stream>>>(out, g, rows, cols);
    return launch_check("zenflow_colsum");
}

int zenflow_absdiff_sums_cuda(float *sums, const zenflow_absdiff_entry *tab, int64_t nent, double *part,
                              int64_t nchunks, cudaStream_t stream) {
    if (nent == 0) return 0;
    if (nchunks > INT32_MAX || nent > INT32_MAX)
        return zr_error("zenflow_absdiff_sums: %lld chunks of %d elements in %lld entries, more than one launch takes",
                        (long long)nchunks, ZENFLOW_ABSDIFF_CHUNK, (long long)nent);
    if (nchunks > 0) {
        absdiff_chunks_kernel<<<(unsigned)nchunks, 256, 0, stream>>>(part, tab, nent);
        if (launch_check("zenflow_absdiff_sums")) return ZR_ERR;
    }
    absdiff_totals_kernel<<<(unsigned)nent, 256, 0, stream>>>(sums, part, tab);
    return launch_check("zenflow_absdiff_sums");
}

static int move(void *dst, const void *src, int esz, int64_t rows, int64_t cols, const int32_t *idx, int64_t k,
                int scatter, cudaStream_t stream) {
    if (rows * k == 0) return 0;
    if (esz == 4)
        move_kernel<float><<<blocks(rows * k), kThreads, 0, stream>>>((float *)dst, (const float *)src, rows, cols,
                                                                      idx, k, scatter);
    else if (esz == 2)
        move_kernel<uint16_t><<<blocks(rows * k), kThreads, 0, stream>>>((uint16_t *)dst, (const uint16_t *)src, rows,
                                                                         cols, idx, k, scatter);
    else return zr_error("zenflow: element size %d not supported (2 or 4 bytes)", esz);
    return launch_check(scatter ? "zenflow_scatter" : "zenflow_gather");
}

int zenflow_gather_cuda(void *out, const void *src, int esz, int64_t rows, int64_t cols, const int32_t *idx, int64_t k,
                        cudaStream_t stream) {
    return move(out, src, esz, rows, cols, idx, k, 0, stream);
}

int zenflow_scatter_cuda(void *dst, const void *src, int esz, int64_t rows, int64_t cols, const int32_t *idx,
                         int64_t k, cudaStream_t stream) {
    return move(dst, src, esz, rows, cols, idx, k, 1, stream);
}

int zenflow_adamw_cuda(void *p, zr_dtype pdt, const float *g, int g_sel, float *m, float *v, int64_t rows,
                       int64_t cols, const int32_t *idx, int64_t k, double lr, double b1, double b2, double eps,
                       double wd, int64_t step, cudaStream_t stream) {
    if (rows * k == 0) return 0;
    float decay = (float)(1.0 - lr * wd), a1 = (float)(1.0 - b1), a2 = (float)(1.0 - b2);
    float step_size = (float)(lr / (1.0 - pow(b1, (double)step))), bc2s = (float)sqrt(1.0 - pow(b2, (double)step));
    if (pdt == ZR_F32)
        adamw_kernel<float><<<blocks(rows * k), kThreads, 0, stream>>>((float *)p, g, g_sel, m, v, rows, cols, idx, k,
                                                                       decay, a1, (float)b2, a2, step_size, bc2s,
                                                                       (float)eps);
    else if (pdt == ZR_BF16)
        adamw_kernel<__nv_bfloat16><<<blocks(rows * k), kThreads, 0, stream>>>(
            (__nv_bfloat16 *)p, g, g_sel, m, v, rows, cols, idx, k, decay, a1, (float)b2, a2, step_size, bc2s,
            (float)eps);
    else return zr_error("zenflow_adamw: parameter dtype %s not supported (f32 or bf16)", zr_dtype_name(pdt));
    return launch_check("zenflow_adamw");
}
