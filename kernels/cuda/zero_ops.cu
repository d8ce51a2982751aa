// CUDA kernels for the ZeRO engine's step: the sum of squares of the fp32 gradient partition for
// the global gradient norm, read once with 16-byte loads, no temporary the size of the partition.
extern "C" {
#include "error.h"
}
#include "zero_ops.h"

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

static __global__ void sumsq_partial_kernel(double *partial, const float *x, int64_t n) {
    double acc = 0;
    int64_t n4 = n / 4, stride = (int64_t)gridDim.x * blockDim.x;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x4[i];
        acc += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
    }
    for (int64_t i = n4 * 4 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        acc += (double)x[i] * x[i];
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

int zero_sumsq_cuda(double *out, const float *x, int64_t n, double *ws, cudaStream_t stream) {
    int nb = blocks_for(n);
    if (((uintptr_t)x & 15) != 0) return zr_error("zero_sumsq: the gradient buffer is not 16-byte aligned");
    sumsq_partial_kernel<<<nb, kThreads, 0, stream>>>(ws, x, n);
    sumsq_final_kernel<<<1, kThreads, 0, stream>>>(out, ws, nb);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return zr_error("zero_sumsq: %s", cudaGetErrorString(e));
    return 0;
}
