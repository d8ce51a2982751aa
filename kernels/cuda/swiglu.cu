/* Fused SwiGLU forward/backward (see swiglu.h): one thread per V elements of one row, 16-byte
 * accesses when F and the pointers allow, a grid-stride loop over M * F / V chunks. */
#include "swiglu.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" {
#include "error.h"
}

/* ---- element access (kept local to this file; every fused .cu carries its own copy) -------- */
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

template <typename T, int V, bool BWD>
__global__ void swiglu_kernel(T *out0, T *out1, const T *dh, const T *gate, const T *up,
                              int64_t M, int64_t F, int64_t ld) {
    const int64_t nch = F / V, total = M * nch;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = idx / nch, c = (idx % nch) * V;
        float g[V], u[V];
        ldv<T, V>(g, gate + row * ld + c);
        ldv<T, V>(u, up + row * ld + c);
        if (!BWD) {
            float o[V];
#pragma unroll
            for (int k = 0; k < V; ++k) o[k] = g[k] / (1.f + __expf(-g[k])) * u[k];
            stv<T, V>(out0 + row * F + c, o);
        } else {
            float d[V], dg[V], du[V];
            ldv<T, V>(d, dh + row * F + c);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const float s = 1.f / (1.f + __expf(-g[k])), si = g[k] * s;
                du[k] = d[k] * si;
                dg[k] = d[k] * u[k] * (s + si * (1.f - s));
            }
            stv<T, V>(out0 + row * ld + c, dg);
            stv<T, V>(out1 + row * ld + c, du);
        }
    }
}

template <typename T, bool BWD>
static void swiglu_launch(void *o0, void *o1, const void *dh, const void *gate, const void *up,
                          int64_t M, int64_t F, int64_t ld, cudaStream_t st) {
    const int V = 16 / sizeof(T);
    const bool vec = F % V == 0 && ld % V == 0 && al16(o0) && al16(gate) && al16(up) &&
                     (!BWD || (al16(o1) && al16(dh)));
    const int64_t n = M * (vec ? F / V : F);
    int64_t blocks = (n + 255) / 256;
    if (blocks > 132 * 32) blocks = 132 * 32;
    if (vec)
        swiglu_kernel<T, 16 / sizeof(T), BWD><<<(unsigned)blocks, 256, 0, st>>>(
            (T *)o0, (T *)o1, (const T *)dh, (const T *)gate, (const T *)up, M, F, ld);
    else
        swiglu_kernel<T, 1, BWD><<<(unsigned)blocks, 256, 0, st>>>(
            (T *)o0, (T *)o1, (const T *)dh, (const T *)gate, (const T *)up, M, F, ld);
}

static int check_mf(const char *fn, int64_t M, int64_t F, int64_t ld) {
    if (M < 0 || F <= 0 || ld < F)
        return zr_error("%s: bad shape M=%lld F=%lld ld=%lld (ld >= F expected)", fn,
                        (long long)M, (long long)F, (long long)ld);
    return 0;
}

extern "C" int swiglu_forward_cuda(void *h, const void *gate, const void *up, int64_t M,
                                   int64_t F, int64_t ld, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "swiglu_forward_cuda";
    if (check_mf(fn, M, F, ld)) return ZR_ERR;
    if (M == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype,
                      swiglu_launch<T, false>(h, NULL, NULL, gate, up, M, F, ld, stream));
    return launch_check(fn);
}

extern "C" int swiglu_backward_cuda(void *dgate, void *dup, const void *dh, const void *gate,
                                    const void *up, int64_t M, int64_t F, int64_t ld,
                                    zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "swiglu_backward_cuda";
    if (check_mf(fn, M, F, ld)) return ZR_ERR;
    if (M == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype,
                      swiglu_launch<T, true>(dgate, dup, dh, gate, up, M, F, ld, stream));
    return launch_check(fn);
}
