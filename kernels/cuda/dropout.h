/* Dropout on CUDA: the twin of kernels/cpu/dropout.h. Returns 0, or -1 with zr_error set. */
#ifndef ZR_CUDA_DROPOUT_H
#define ZR_CUDA_DROPOUT_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h" /* C header: inside the extern "C" block */

/* y[i] = mask[i] ? x[i] * scale : 0 over n contiguous elements (y may alias x). */
int dropout_apply_cuda(void *y, const void *x, const uint8_t *mask, int64_t n, double scale,
                       zr_dtype dt, cudaStream_t stream);

/* The twin of kernels/cpu/dropout.h's dropout_philox_cpu: y[i] = (accumulate ? y[i] : 0) + (keep(i) ?
 * x[i] * scale : 0), keep(i) = (Philox bits of element i at (seed, off)) >> 8 < thresh; one Philox call
 * per 4 elements, y may alias x. */
int dropout_philox_cuda(void *y, const void *x, int64_t n, uint32_t thresh, double scale, uint64_t seed,
                        uint64_t off, int accumulate, zr_dtype dt, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
