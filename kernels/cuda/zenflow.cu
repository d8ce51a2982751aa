// CUDA twins of kernels/cpu/zenflow.c (ZenFlow's selective column update): one thread per
// element of the (rows, k) selection; the column sum is one thread per column walking its rows
// (coalesced across threads: neighbouring threads read neighbouring columns of a row).
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

/* One pass over a (and prev): |a - prev| summed per thread in double, then per block (fixed order). */
#define AD_BLOCKS 528 /* 4 per SM of an H100/H200: enough loads in flight for the bandwidth */
static __global__ void __launch_bounds__(256) absdiff_kernel(double *part, const float *a, float *prev, int64_t n,
                                                              int have_prev, int keep) {
    double acc = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t n4 = ((uintptr_t)a % 16 == 0 && (uintptr_t)prev % 16 == 0) ? n / 4 : 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        const float4 x = reinterpret_cast<const float4 *>(a)[i];
        float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
        if (have_prev) y = reinterpret_cast<const float4 *>(prev)[i];
        acc += fabs((double)x.x - y.x) + fabs((double)x.y - y.y) + fabs((double)x.z - y.z) + fabs((double)x.w - y.w);
        if (keep) reinterpret_cast<float4 *>(prev)[i] = x;
    }
    for (int64_t i = 4 * n4 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float x = a[i];
        acc += fabs((double)x - (have_prev ? (double)prev[i] : 0.0));
        if (keep) prev[i] = x;
    }
    __shared__ double warp_sum[8];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0;
        for (int w = 0; w < 8; w++) s += warp_sum[w];
        part[blockIdx.x] = s;
    }
}

static __global__ void absdiff_total_kernel(float *out, const double *part, int nb) {
    double s = 0;
    for (int b = 0; b < nb; b++) s += part[b];
    *out = (float)s;
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

int zenflow_absdiff_parts(void) { return AD_BLOCKS; }

int zenflow_absdiff_sum_cuda(float *out, double *part, const float *a, float *prev, int64_t n, int have_prev, int keep,
                             cudaStream_t stream) {
    absdiff_kernel<<<AD_BLOCKS, 256, 0, stream>>>(part, a, prev, n, have_prev, keep);
    absdiff_total_kernel<<<1, 1, 0, stream>>>(out, part, AD_BLOCKS);
    return launch_check("zenflow_absdiff_sum");
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
