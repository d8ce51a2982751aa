/* Device-side strided copy with cast between any two dtypes, and fill, for CUDA tensors on one
 * device (cross-device and host transfers are cudaMemcpy in runtime/cuda/hooks.c).
 * Pointers are element 0 of each tensor (offset applied); strides count elements and may be 0
 * (broadcast source). Casts round like the CPU path (tensor_copy.c): through double, then to f32
 * and round-to-nearest-even for bf16/f16; float -> int truncates. Every call returns 0, or -1 with
 * zr_error set naming the kernel. Stream-ordered; nothing here synchronizes. */
#ifndef ZR_CUDA_COPY_H
#define ZR_CUDA_COPY_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "../base/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst (shape) <- src (shape), any dtypes, any strides; ndim 0 copies one element. */
int copy_strided_cuda(void *dst, zr_dtype dt, const int64_t *dstride, const void *src, zr_dtype st,
                      const int64_t *sstride, int ndim, const int64_t *shape, cudaStream_t stream);
/* Every element of dst (shape, strides) = v, converted to dt as the CPU does. */
int fill_strided_cuda(void *dst, zr_dtype dt, const int64_t *stride, int ndim, const int64_t *shape,
                      double v, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
