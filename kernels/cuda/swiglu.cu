/* Fused gated linear units forward/backward (see swiglu.h): one thread per V elements of one row, 16-byte
 * accesses when F and the pointers allow, a grid-stride loop over M * F / V chunks. The activation is a
 * template parameter (ACT: zr_glu_act); silu's arithmetic is the one this kernel always had, GELU's
 * elementwise.cu's (the tanh form through a fast sigmoid, the exact one through erff). */
#include "swiglu.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" {
#include "../base/error.h"
}

#include "fused_common.cuh"

/* act(g), and act'(g) */
template <int ACT> __device__ __forceinline__ float glu_act(float g) {
    if (ACT == ZR_GLU_SILU) return g / (1.f + __expf(-g));
    if (ACT == ZR_GLU_GELU_TANH) return g * __frcp_rn(1.f + __expf(-1.5957691216057308f * (g + 0.044715f * g * g * g)));
    return 0.5f * g * (1.f + erff(g * 0.7071067811865476f));
}
template <int ACT> __device__ __forceinline__ float glu_act_grad(float g) {
    if (ACT == ZR_GLU_GELU_TANH) { /* 0.5 (1 + tanh u) = sigmoid(2u), 1 - tanh^2 u = 4 s (1 - s) */
        const float s = __frcp_rn(1.f + __expf(-1.5957691216057308f * (g + 0.044715f * g * g * g)));
        return s + g * s * (1.f - s) * 1.5957691216057308f * (1.f + 0.134145f * g * g);
    }
    return 0.5f * (1.f + erff(g * 0.7071067811865476f)) + g * __expf(-0.5f * g * g) * 0.3989422804014327f;
}

template <typename T, int V, bool BWD, int ACT>
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
            for (int k = 0; k < V; ++k) o[k] = glu_act<ACT>(g[k]) * u[k];
            stv<T, V>(out0 + row * F + c, o);
        } else {
            float d[V], dg[V], du[V];
            ldv<T, V>(d, dh + row * F + c);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                if (ACT == ZR_GLU_SILU) { /* (silu's sigmoid once for both) */
                    const float s = 1.f / (1.f + __expf(-g[k])), si = g[k] * s;
                    du[k] = d[k] * si;
                    dg[k] = d[k] * u[k] * (s + si * (1.f - s));
                } else {
                    du[k] = d[k] * glu_act<ACT>(g[k]);
                    dg[k] = d[k] * u[k] * glu_act_grad<ACT>(g[k]);
                }
            }
            stv<T, V>(out0 + row * ld + c, dg);
            stv<T, V>(out1 + row * ld + c, du);
        }
    }
}

template <typename T, bool BWD, int ACT>
static void swiglu_launch(void *o0, void *o1, const void *dh, const void *gate, const void *up,
                          int64_t M, int64_t F, int64_t ld, cudaStream_t st) {
    const int V = 16 / sizeof(T);
    const bool vec = F % V == 0 && ld % V == 0 && al16(o0) && al16(gate) && al16(up) &&
                     (!BWD || (al16(o1) && al16(dh)));
    const int64_t n = M * (vec ? F / V : F);
    int64_t blocks = (n + 255) / 256;
    if (blocks > 132 * 32) blocks = 132 * 32;
    if (vec)
        swiglu_kernel<T, 16 / sizeof(T), BWD, ACT><<<(unsigned)blocks, 256, 0, st>>>(
            (T *)o0, (T *)o1, (const T *)dh, (const T *)gate, (const T *)up, M, F, ld);
    else
        swiglu_kernel<T, 1, BWD, ACT><<<(unsigned)blocks, 256, 0, st>>>(
            (T *)o0, (T *)o1, (const T *)dh, (const T *)gate, (const T *)up, M, F, ld);
}

template <typename T, bool BWD>
static void glu_launch(zr_glu_act act, void *o0, void *o1, const void *dh, const void *gate, const void *up,
                       int64_t M, int64_t F, int64_t ld, cudaStream_t st) {
    auto f = act == ZR_GLU_SILU ? swiglu_launch<T, BWD, ZR_GLU_SILU>
             : act == ZR_GLU_GELU_TANH ? swiglu_launch<T, BWD, ZR_GLU_GELU_TANH> : swiglu_launch<T, BWD, ZR_GLU_GELU>;
    f(o0, o1, dh, gate, up, M, F, ld, st);
}

static int check_mf(const char *fn, int64_t M, int64_t F, int64_t ld, zr_glu_act act) {
    if (act != ZR_GLU_SILU && act != ZR_GLU_GELU_TANH && act != ZR_GLU_GELU)
        return zr_error("%s: unknown activation %d (zr_glu_act)", fn, (int)act);
    if (M < 0 || F <= 0 || ld < F)
        return zr_error("%s: bad shape M=%lld F=%lld ld=%lld (ld >= F expected)", fn,
                        (long long)M, (long long)F, (long long)ld);
    return 0;
}

extern "C" int glu_forward_cuda(void *h, const void *gate, const void *up, int64_t M, int64_t F, int64_t ld,
                                zr_glu_act act, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "glu_forward_cuda";
    if (check_mf(fn, M, F, ld, act)) return ZR_ERR;
    if (M == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype, glu_launch<T, false>(act, h, NULL, NULL, gate, up, M, F, ld, stream));
    return launch_check(fn);
}

extern "C" int glu_backward_cuda(void *dgate, void *dup, const void *dh, const void *gate, const void *up,
                                 int64_t M, int64_t F, int64_t ld, zr_glu_act act, zr_dtype dtype,
                                 cudaStream_t stream) {
    const char *fn = "glu_backward_cuda";
    if (check_mf(fn, M, F, ld, act)) return ZR_ERR;
    if (M == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype, glu_launch<T, true>(act, dgate, dup, dh, gate, up, M, F, ld, stream));
    return launch_check(fn);
}
