// CUDA kernels for the ZeRO engine's step: the sum of squares of the gradient partition (f32, or
// bf16/f16 with data_types.grad_accum_dtype) for the global gradient norm, read once with 16-byte
// loads, no temporary the size of the partition.
#include "common.cuh"
#include "zero_ops.h"

using zrk::to_acc;

static const int kThreads = 512;

static int blocks_for(int64_t n) {
    int64_t b = (n / 4 + kThreads - 1) / kThreads;
    if (b < 1) b = 1;
    return b > 1024 ? 1024 : (int)b;
}

__device__ __forceinline__ double block_sum(double v) {
    __shared__ double part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) part[w] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0;
    if (w == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

template <typename T> static __global__ void sumsq_partial_kernel(double *partial, const T *x, int64_t n) {
    constexpr int V = 16 / sizeof(T);
    double acc = 0;
    int64_t nv = n / V, stride = (int64_t)gridDim.x * blockDim.x;
    const uint4 *xv = reinterpret_cast<const uint4 *>(x);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += stride) {
        const uint4 r = xv[i];
        const T *e = reinterpret_cast<const T *>(&r);
#pragma unroll
        for (int k = 0; k < V; ++k) acc += (double)to_acc(e[k]) * (double)to_acc(e[k]);
    }
    for (int64_t i = nv * V + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        acc += (double)to_acc(x[i]) * (double)to_acc(x[i]);
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

static __global__ void sumsq_final_kernel(double *out, const double *partial, int np) {
    double acc = 0;
    for (int i = threadIdx.x; i < np; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) *out = acc;
}

size_t zero_sumsq_workspace(int64_t n) { return (size_t)blocks_for(n) + 1; }

int zero_sumsq_cuda(double *out, const void *x, zr_dtype dt, int64_t n, double *ws, cudaStream_t stream) {
    int nb = blocks_for(n);
    if (((uintptr_t)x & 15) != 0) return zr_error("zero_sumsq: the gradient buffer is not 16-byte aligned");
    if (dt == ZR_F32) sumsq_partial_kernel<float><<<nb, kThreads, 0, stream>>>(ws, (const float *)x, n);
    else if (dt == ZR_BF16)
        sumsq_partial_kernel<__nv_bfloat16><<<nb, kThreads, 0, stream>>>(ws, (const __nv_bfloat16 *)x, n);
    else if (dt == ZR_F16) sumsq_partial_kernel<__half><<<nb, kThreads, 0, stream>>>(ws, (const __half *)x, n);
    else return zr_error("zero_sumsq: gradient dtype %s not supported (f32, bf16 or f16)", zr_dtype_name(dt));
    sumsq_final_kernel<<<1, kThreads, 0, stream>>>(out, ws, nb);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return zr_error("zero_sumsq: %s", cudaGetErrorString(e));
    return 0;
}
