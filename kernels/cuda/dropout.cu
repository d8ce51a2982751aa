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

// Thread c handles elements V c .. V c + V-1 with Philox counters off + V c / 4 .. (4 lanes each: their
// masks); VEC: V elements in one 16-byte (f64: 32-byte) load and store, for n % V == 0 and aligned y, x
// (else V = 4, one element at a time).
template <typename T, int V, bool VEC, bool ACC>
__global__ void dropout_philox_kernel(T *y, const T *x, int64_t n, uint32_t thresh, float scale, uint64_t seed,
                                      uint64_t off) {
    typedef typename acc<T>::type A;
    const int64_t groups = (n + V - 1) / V;
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < groups; c += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i0 = V * c;
        pack<T, V> xv, yv;
        if (VEC) {
            xv = *reinterpret_cast<const pack<T, V> *>(x + i0);
            if (ACC) yv = *reinterpret_cast<const pack<T, V> *>(y + i0);
        }
#pragma unroll
        for (int q = 0; q < V / 4; q++) {
            zr_philox4 r = zr_philox(seed, off + (uint64_t)(i0 / 4 + q));
#pragma unroll
            for (int l = 0; l < 4; l++) {
                const int e = 4 * q + l;
                const int64_t i = i0 + e;
                if (VEC || i < n) {
                    A v = (r.x[l] >> 8) < thresh ? to_acc<T>(VEC ? xv.v[e] : x[i]) * (A)scale : (A)0;
                    if (ACC) v += to_acc<T>(VEC ? yv.v[e] : y[i]);
                    if (VEC) yv.v[e] = from_acc<T>(v);
                    else y[i] = from_acc<T>(v);
                }
            }
        }
        if (VEC) *reinterpret_cast<pack<T, V> *>(y + i0) = yv;
    }
}
template <typename T, int V, bool VEC, bool ACC>
void dropout_philox_run(void *y, const void *x, int64_t n, uint32_t thresh, double scale, uint64_t seed, uint64_t off,
                        cudaStream_t s) {
    dropout_philox_kernel<T, V, VEC, ACC><<<grid_for((n + V - 1) / V, 256), 256, 0, s>>>(
        (T *)y, (const T *)x, n, thresh, (float)scale, seed, off);
}
template <typename T>
int dropout_philox_launch(void *y, const void *x, int64_t n, uint32_t thresh, double scale, uint64_t seed,
                          uint64_t off, int accumulate, cudaStream_t s) {
    constexpr int V = sizeof(T) >= 4 ? 4 : 16 / sizeof(T);
    const bool vec = n % V == 0 && ((uintptr_t)x % (sizeof(T) * V)) == 0 && ((uintptr_t)y % (sizeof(T) * V)) == 0;
    if (vec && accumulate) dropout_philox_run<T, V, true, true>(y, x, n, thresh, scale, seed, off, s);
    else if (vec) dropout_philox_run<T, V, true, false>(y, x, n, thresh, scale, seed, off, s);
    else if (accumulate) dropout_philox_run<T, 4, false, true>(y, x, n, thresh, scale, seed, off, s);
    else dropout_philox_run<T, 4, false, false>(y, x, n, thresh, scale, seed, off, s);
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
