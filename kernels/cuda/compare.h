/* Comparisons on CUDA (u8 masks): the twin of kernels/cpu/compare.h (same op codes ZR_CMP_*).
 * All pointers are device pointers to element 0; every call returns 0, or -1 with zr_error set. */
#ifndef ZR_CUDA_COMPARE_H
#define ZR_CUDA_COMPARE_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h" /* C header: inside the extern "C" block */

/* out (contiguous u8, shape) = a (op) b, a and b of one dtype dt (any, compared as double) read
 * through strides (0 on broadcast dims). ndim >= 1. */
int compare_cuda(uint8_t *out, const void *a, const int64_t *astride, const void *b,
                 const int64_t *bstride, int ndim, const int64_t *shape, int op, zr_dtype dt,
                 cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
