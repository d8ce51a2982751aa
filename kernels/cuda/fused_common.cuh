// Shared prelude of the fused kernels (adamw, cross_entropy, embedding, norm, rope, softmax,
// swiglu .cu): f32 <-> T element access, 16-byte vector load/store, block_sum, the f32/bf16/f16
// dispatch macro and the launch check. CUDA C++ only; each includer gets its own static copies.
#ifndef ZR_CUDA_FUSED_COMMON_CUH
#define ZR_CUDA_FUSED_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "../base/error.h"
}

template <typename T> static __device__ __forceinline__ float tof(T v);
template <> __device__ __forceinline__ float tof<float>(float v) { return v; }
template <> __device__ __forceinline__ float tof<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
template <> __device__ __forceinline__ float tof<__half>(__half v) { return __half2float(v); }
template <typename T> static __device__ __forceinline__ T fromf(float v);
template <> __device__ __forceinline__ float fromf<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 fromf<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half fromf<__half>(float v) { return __float2half_rn(v); }

/* V consecutive elements at p (16-byte aligned when V*sizeof(T) == 16) to/from floats. */
template <typename T, int V> static __device__ __forceinline__ void ldv(float *f, const T *p) {
    if (V * sizeof(T) == 16) {
        uint4 r = *reinterpret_cast<const uint4 *>(p);
        const T *e = reinterpret_cast<const T *>(&r);
#pragma unroll
        for (int i = 0; i < V; ++i) f[i] = tof<T>(e[i]);
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) f[i] = tof<T>(p[i]);
    }
}
template <typename T, int V> static __device__ __forceinline__ void stv(T *p, const float *f) {
    if (V * sizeof(T) == 16) {
        uint4 r;
        T *e = reinterpret_cast<T *>(&r);
#pragma unroll
        for (int i = 0; i < V; ++i) e[i] = fromf<T>(f[i]);
        *reinterpret_cast<uint4 *>(p) = r;
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) p[i] = fromf<T>(f[i]);
    }
}
[[maybe_unused]] static inline bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Sum (or max) over the block; every thread gets the result. red: >= 32 floats of shared memory. */
[[maybe_unused]] static __device__ __forceinline__ float block_sum(float v, float *red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    v = l < nw ? red[l] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Runs BODY with T bound to the element type of dt; other dtypes return an error from fn. */
#define ZR_FUSED_DISPATCH(fn, dt, ...)                                                             \
    switch (dt) {                                                                                  \
    case ZR_F32: { typedef float T; __VA_ARGS__; } break;                                          \
    case ZR_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; } break;                                 \
    case ZR_F16: { typedef __half T; __VA_ARGS__; } break;                                         \
    default:                                                                                       \
        return zr_error("%s: dtype %s not supported (f32, bf16 or f16 expected)", fn,              \
                        zr_dtype_name(dt));                                                        \
    }

[[maybe_unused]] static int launch_check(const char *fn) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return zr_error("%s: CUDA launch failed: %s", fn, cudaGetErrorString(e));
    return 0;
}

/* Merges (m, s) pairs of an online softmax: s is a sum of exp(x - m). */
[[maybe_unused]] static __device__ __forceinline__ void ms_merge(float &m, float &s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    if (mn == -INFINITY) return;
    s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
    m = mn;
}

/* 16 raw bytes (V elements) of row `row` at chunk c of this lane, zero when past the row or N. */
template <typename T, int V, int C, int WPR>
[[maybe_unused]] static __device__ __forceinline__ void ld_row(uint4 *r, const T *p, int64_t row, int64_t N,
                                              int64_t D, int tig) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int64_t i = ((int64_t)c * WPR * 32 + tig) * V;
        r[c] = row < N && i < D ? *reinterpret_cast<const uint4 *>(p + row * D + i)
                                : make_uint4(0u, 0u, 0u, 0u);
    }
}

/* Streaming multiprocessors of the current device (132 on an H200 when the query fails). */
[[maybe_unused]] static int num_sms(void) {
    static int sms[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
    if (!sms[dev] && cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        sms[dev] = 132;
    return sms[dev] > 0 ? sms[dev] : 132;
}

#endif
