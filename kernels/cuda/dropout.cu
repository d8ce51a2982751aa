/* Dropout's masked scale on CUDA (see dropout.h): a grid-stride kernel, y may alias x. */
#include "common.cuh" /* first: it includes the C headers inside extern "C" */
#include "dropout.h"
#include "../base/philox.h"

using namespace zrk;

namespace {

template <typename T> __global__ void dropout_kernel(T *y, const T *x, const uint8_t *mask, int64_t n, float scale) {
    typedef typename acc<T>::type A;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = mask[i] ? from_acc<T>(to_acc<T>(x[i]) * (A)scale) : from_acc<T>((A)0);
}
template <typename T> int dropout_launch(void *y, const void *x, const uint8_t *mask, int64_t n, double scale, cudaStream_t s) {
    dropout_kernel<T><<<grid_for(n, 256), 256, 0, s>>>((T *)y, (const T *)x, mask, n, (float)scale);
    return launch_check("dropout_apply_cuda");
}

// Thread c handles elements 4c .. 4c+3 with Philox counter off + c (its 4 lanes: their masks).
template <typename T>
__global__ void dropout_philox_kernel(T *y, const T *x, int64_t n, uint32_t thresh, float scale, uint64_t seed,
                                      uint64_t off, int accumulate) {
    typedef typename acc<T>::type A;
    int64_t groups = (n + 3) / 4;
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < groups; c += (int64_t)gridDim.x * blockDim.x) {
        zr_philox4 r = zr_philox(seed, off + (uint64_t)c);
        int64_t i0 = 4 * c;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            int64_t i = i0 + l;
            if (i < n) {
                A v = (r.x[l] >> 8) < thresh ? to_acc<T>(x[i]) * (A)scale : (A)0;
                if (accumulate) y[i] = from_acc<T>(to_acc<T>(y[i]) + v);
                else y[i] = from_acc<T>(v);
            }
        }
    }
}
template <typename T>
int dropout_philox_launch(void *y, const void *x, int64_t n, uint32_t thresh, double scale, uint64_t seed,
                          uint64_t off, int accumulate, cudaStream_t s) {
    dropout_philox_kernel<T><<<grid_for((n + 3) / 4, 256), 256, 0, s>>>((T *)y, (const T *)x, n, thresh, (float)scale,
                                                                      seed, off, accumulate);
    return launch_check("dropout_philox_cuda");
}

}  // namespace

extern "C" int dropout_apply_cuda(void *y, const void *x, const uint8_t *mask, int64_t n, double scale,
                                  zr_dtype dt, cudaStream_t stream) {
    if (n <= 0) return 0;
    ZRK_DISPATCH_FLOAT(dt, "dropout_apply_cuda", dropout_launch, y, x, mask, n, scale, stream)
}

extern "C" int dropout_philox_cuda(void *y, const void *x, int64_t n, uint32_t thresh, double scale, uint64_t seed,
                                   uint64_t off, int accumulate, zr_dtype dt, cudaStream_t stream) {
    if (n <= 0) return 0;
    ZRK_DISPATCH_FLOAT(dt, "dropout_philox_cuda", dropout_philox_launch, y, x, n, thresh, scale, seed, off,
                       accumulate, stream)
}
