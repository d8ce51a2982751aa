/* Fused SwiGLU forward/backward (see swiglu.h): one thread per V elements of one row, 16-byte
 * accesses when F and the pointers allow, a grid-stride loop over M * F / V chunks; the forward
 * takes SWIGLU_U chunks a pass (a grid stride apart), all loaded before the first store, so that
 * the resident grid keeps as many bytes in flight as the backward's three loads do. */
#include "swiglu.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" {
#include "../base/error.h"
}

#include "fused_common.cuh"

#define SWIGLU_U 2
template <typename T, int V, bool BWD>
__global__ void swiglu_kernel(T *out0, T *out1, const T *dh, const T *gate, const T *up,
                              int64_t M, int64_t F, int64_t ld) {
    const int64_t nch = F / V, total = M * nch, stride = (int64_t)gridDim.x * blockDim.x;
    if constexpr (!BWD) {
        for (int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i0 < total;
             i0 += SWIGLU_U * stride) {
            float g[SWIGLU_U][V], u[SWIGLU_U][V];
            int64_t row[SWIGLU_U], c[SWIGLU_U];
#pragma unroll
            for (int j = 0; j < SWIGLU_U; ++j) {
                const int64_t idx = i0 + j * stride;
                if (idx >= total) break;
                row[j] = idx / nch, c[j] = (idx % nch) * V;
                ldv<T, V>(g[j], gate + row[j] * ld + c[j]);
                ldv<T, V>(u[j], up + row[j] * ld + c[j]);
            }
#pragma unroll
            for (int j = 0; j < SWIGLU_U; ++j) {
                if (i0 + j * stride >= total) break;
                float o[V];
#pragma unroll
                for (int k = 0; k < V; ++k) o[k] = g[j][k] / (1.f + __expf(-g[j][k])) * u[j][k];
                stv<T, V>(out0 + row[j] * F + c[j], o);
            }
        }
    } else {
        for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
             idx += stride) {
            const int64_t row = idx / nch, c = (idx % nch) * V;
            float g[V], u[V], d[V], dg[V], du[V];
            ldv<T, V>(g, gate + row * ld + c);
            ldv<T, V>(u, up + row * ld + c);
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
