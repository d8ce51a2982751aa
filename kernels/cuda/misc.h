/* Small CUDA kernels the op families need beyond the fused ones: comparisons (u8 masks), row
 * log_softmax forward/backward, dropout's masked scale, and the SGD step. Twins of the CPU kernels
 * in kernels/cpu/misc.h, softmax.h and optim.h (same formulas, same op codes ZR_CMP_*). All
 * pointers are device pointers to element 0; every call returns 0, or -1 with zr_error set. */
#ifndef ZR_CUDA_MISC_H
#define ZR_CUDA_MISC_H

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
/* y (N, D) = x - max - log(sum exp(x - max)) per row; f32/bf16/f16 in f32, f64 in f64. */
int log_softmax_forward_cuda(void *y, const void *x, int64_t N, int64_t D, zr_dtype dt,
                             cudaStream_t stream);
/* dx (N, D) = dy - exp(y) * sum(dy) per row (dx may alias dy). */
int log_softmax_backward_cuda(void *dx, const void *dy, const void *y, int64_t N, int64_t D,
                              zr_dtype dt, cudaStream_t stream);
/* y[i] = mask[i] ? x[i] * scale : 0 over n contiguous elements (y may alias x). */
int dropout_apply_cuda(void *y, const void *x, const uint8_t *mask, int64_t n, double scale,
                       zr_dtype dt, cudaStream_t stream);
/* torch.optim.SGD on n contiguous elements of p (f32 or f64), g of p's dtype; buf NULL without
 * momentum. Same arithmetic as sgd_step_cpu (in the parameter's precision). */
int sgd_step_cuda(void *p, const void *g, void *buf, int64_t n, double lr, double momentum,
                  double dampening, double weight_decay, int nesterov, int first, zr_dtype dt,
                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
