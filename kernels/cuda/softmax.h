/* Row softmax on CUDA over the last dimension: x, y (N, D) contiguous in ZR_F32, ZR_BF16 or
 * ZR_F16, f32 math. Forward reads each row once for max and sum (online) and once to write;
 * backward dx = y * (dy - sum(dy * y)). dx may alias dy. */
#ifndef ZR_CUDA_SOFTMAX_H
#define ZR_CUDA_SOFTMAX_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h" /* C header: inside the extern "C" block */

int softmax_forward_cuda(void *y, const void *x, int64_t N, int64_t D, zr_dtype dtype,
                         cudaStream_t stream);
int softmax_backward_cuda(void *dx, const void *dy, const void *y, int64_t N, int64_t D,
                          zr_dtype dtype, cudaStream_t stream);
/* y (N, D) = x - max - log(sum exp(x - max)) per row; f32/bf16/f16 in f32, f64 in f64. */
int log_softmax_forward_cuda(void *y, const void *x, int64_t N, int64_t D, zr_dtype dt,
                             cudaStream_t stream);
/* dx (N, D) = dy - exp(y) * sum(dy) per row (dx may alias dy). */
int log_softmax_backward_cuda(void *dx, const void *dy, const void *y, int64_t N, int64_t D,
                              zr_dtype dt, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
