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

#ifdef __cplusplus
}
#endif

#endif
