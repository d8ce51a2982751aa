/* Elementwise kernels on CUDA: twins of kernels/cpu/elementwise.h (same op codes ZR_UN_* and
 * ZR_BIN_*, same argument order) with the dtype and stream added. f32/bf16/f16 compute in f32,
 * f64 in f64. Contiguous operands use 16-byte packs when aligned; broadcasting is by strides
 * (0 on broadcast dims). All pointers are device pointers to element 0 (offset applied).
 * Every call returns 0, or -1 with zr_error set naming the kernel. */
#ifndef ZR_CUDA_ELEMENTWISE_H
#define ZR_CUDA_ELEMENTWISE_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "../base/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[i] = f(x[i]) over n contiguous elements. */
int unary_forward_cuda(void *y, const void *x, int64_t n, int op, double p, zr_dtype dt,
                       cudaStream_t stream);
/* gx[i] = gy[i] * f'(x[i]); ops whose derivative uses y = f(x) read y instead (pass what the
 * CPU twin needs; the other may be NULL). */
int unary_backward_cuda(void *gx, const void *gy, const void *x, const void *y, int64_t n, int op,
                        double p, zr_dtype dt, cudaStream_t stream);
/* out (contiguous, shape) = a (op) b, a and b read through strides. ndim >= 1. */
int binary_forward_cuda(void *out, const void *a, const int64_t *astride, const void *b,
                        const int64_t *bstride, int ndim, const int64_t *shape, int op, zr_dtype dt,
                        cudaStream_t stream);
/* y = alpha * x + beta, contiguous (y may equal x). */
int affine_forward_cuda(void *y, const void *x, int64_t n, double alpha, double beta, zr_dtype dt,
                        cudaStream_t stream);
/* y += alpha * x, contiguous. */
int axpy_cuda(void *y, const void *x, int64_t n, double alpha, zr_dtype dt, cudaStream_t stream);
/* y (f32) += alpha * x (bf16 or f16), contiguous, no widened copy. Returns -2 (nothing done)
 * for other dtypes or when y is not 32-byte / x not 16-byte aligned. */
int axpy_widen_cuda(float *y, const void *x, zr_dtype xdt, int64_t n, double alpha, cudaStream_t stream);
/* out (contiguous, shape) = cond ? a : b; cond is u8; all three read through strides. */
int where_forward_cuda(void *out, const uint8_t *cond, const int64_t *cstride, const void *a,
                       const int64_t *astride, const void *b, const int64_t *bstride, int ndim,
                       const int64_t *shape, zr_dtype dt, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
