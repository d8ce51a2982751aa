/* Dropout's masked scale on CUDA (see dropout.h): a grid-stride kernel, y may alias x. */
#include "common.cuh" /* first: it includes the C headers inside extern "C" */
#include "dropout.h"

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

}  // namespace

extern "C" int dropout_apply_cuda(void *y, const void *x, const uint8_t *mask, int64_t n, double scale,
                                  zr_dtype dt, cudaStream_t stream) {
    if (n <= 0) return 0;
    ZRK_DISPATCH_FLOAT(dt, "dropout_apply_cuda", dropout_launch, y, x, mask, n, scale, stream)
}
