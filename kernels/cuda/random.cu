// Philox fills on CUDA (see random.h). One thread per Philox call: it writes the 4 elements that
// share the counter, so each normal pair's Box-Muller is done once. The values are computed in
// double exactly as runtime/random.c does, then rounded to the destination dtype the same way.
#include "common.cuh"
#include "philox.h"
#include "random.h"

using namespace zrk;

namespace {

template <typename D> __device__ __forceinline__ D store_d(double x) { return (D)x; }
template <> __device__ __forceinline__ __nv_bfloat16 store_d<__nv_bfloat16>(double x) { return __float2bfloat16_rn((float)x); }
template <> __device__ __forceinline__ __half store_d<__half>(double x) { return __float2half_rn((float)x); }

template <typename D>
__global__ void philox_fill_kernel(D *__restrict__ dst, int64_t n, int kind, double a, double b, uint64_t seed,
                                   uint64_t offset) {
    int64_t groups = (n + 3) / 4, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < groups; j += step) {
        zr_philox4 r = zr_philox(seed, offset + (uint64_t)j);
        double v[4];
        if (kind == 1) {
#pragma unroll
            for (int base = 0; base < 4; base += 2) {
                double u1 = ((double)(r.x[base] >> 8) + 1.0) / 16777217.0;
                double u2 = (double)(r.x[base + 1] >> 8) / 16777216.0;
                double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
                v[base] = a + b * (rad * cos(th));
                v[base + 1] = a + b * (rad * sin(th));
            }
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float u = zr_u01(r.x[k]);
                v[k] = kind == 0 ? a + (b - a) * (double)u : (double)((double)u < a);
            }
        }
        int64_t i0 = 4 * j;
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (i0 + k < n) dst[i0 + k] = store_d<D>(v[k]);
    }
}

template <typename D>
int launch(void *dst, int64_t n, int kind, double a, double b, uint64_t seed, uint64_t offset, cudaStream_t s) {
    philox_fill_kernel<D><<<grid_for((n + 3) / 4, 256), 256, 0, s>>>((D *)dst, n, kind, a, b, seed, offset);
    return launch_check("random fill (cuda)");
}

}  // namespace

extern "C" int random_fill_cuda(void *dst, zr_dtype dt, int64_t n, int kind, double a, double b, uint64_t seed,
                                uint64_t offset, cudaStream_t stream) {
    if (n <= 0) return 0;
    switch (dt) {
    case ZR_F32: return launch<float>(dst, n, kind, a, b, seed, offset, stream);
    case ZR_BF16: return launch<__nv_bfloat16>(dst, n, kind, a, b, seed, offset, stream);
    case ZR_F16: return launch<__half>(dst, n, kind, a, b, seed, offset, stream);
    case ZR_F64: return launch<double>(dst, n, kind, a, b, seed, offset, stream);
    case ZR_I32: return launch<int32_t>(dst, n, kind, a, b, seed, offset, stream);
    case ZR_I64: return launch<int64_t>(dst, n, kind, a, b, seed, offset, stream);
    case ZR_U8: return launch<uint8_t>(dst, n, kind, a, b, seed, offset, stream);
    default: return zr_error("random fill (cuda): unknown dtype %d", (int)dt);
    }
}
