/* Fused q/k/v rope on CUDA, twin of kernels/cpu/qkv_rope.h: one launch turns the packed
 * (B, T, (H + 2 KV)·Dh) q/k/v projection into rotated q, k and copied v in any strided layout
 * (kernels/base/qkv_layout.h), and one launch turns their gradients back into the packed
 * gradient. Hugging Face rotate_half rotation (pairs (i, i + Dh/2)); cos, sin: (T, Dh) f32
 * contiguous. dtype: ZR_F32, ZR_BF16 or ZR_F16 for every operand. */
#ifndef ZR_CUDA_QKV_ROPE_H
#define ZR_CUDA_QKV_ROPE_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h" /* C headers: inside the extern "C" block */
#include "../base/qkv_layout.h"

/* q, k = rope(their heads of qkv), v = its heads copied. Dh must be even. */
int qkv_rope_forward_cuda(void *q, void *k, void *v, const void *qkv, const float *cos,
                          const float *sin, const zr_qkv_layout *L, int64_t B, int64_t T,
                          int64_t H, int64_t KV, int64_t Dh, zr_dtype dtype, cudaStream_t stream);
/* dqkv (packed) = inverse rotation of dq and dk, dv copied; a NULL part counts as zeros. With
 * accumulate the result is added to dqkv, else it overwrites it. */
int qkv_rope_backward_cuda(void *dqkv, const void *dq, const void *dk, const void *dv,
                           const float *cos, const float *sin, const zr_qkv_layout *L, int64_t B,
                           int64_t T, int64_t H, int64_t KV, int64_t Dh, int accumulate,
                           zr_dtype dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
