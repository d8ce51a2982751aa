/* The gated linear units on CUDA, fused: h = act(gate) * up forward (SwiGLU: silu; GeGLU: GELU, tanh or
 * exact), and both input gradients in one pass backward. gate and up are (M, F) with row stride ld (ld = F for
 * two separate tensors, ld = 2F for a fused gate_up projection where up = gate + F); h and dh are (M, F)
 * contiguous. dtype: ZR_F32, ZR_BF16 or ZR_F16; math in f32. act: kernels/base/glu.h. */
#ifndef ZR_CUDA_SWIGLU_H
#define ZR_CUDA_SWIGLU_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h" /* C header: inside the extern "C" block */

#include "../base/glu.h"

int glu_forward_cuda(void *h, const void *gate, const void *up, int64_t M, int64_t F, int64_t ld,
                     zr_glu_act act, zr_dtype dtype, cudaStream_t stream);
/* dgate = dh * up * act'(gate), dup = dh * act(gate), written with row stride ld (may alias
 * gate and up: each element is read before it is written). */
int glu_backward_cuda(void *dgate, void *dup, const void *dh, const void *gate, const void *up, int64_t M,
                      int64_t F, int64_t ld, zr_glu_act act, zr_dtype dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
