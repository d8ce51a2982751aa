/* Rotary position embedding on CUDA, applied to q and k in one launch, forward and backward, in
 * the Hugging Face rotate_half layout: element i pairs with i + Dh/2 (i < Dh/2),
 *   out[i] = x[i] cos - x[i+Dh/2] sin,   out[i+Dh/2] = x[i+Dh/2] cos + x[i] sin,
 * with cos/sin tables (T, Dh/2) f32 for positions 0..T-1 (the caller builds them, so any rope
 * scaling such as Llama 3's is the caller's business). dtype: ZR_F32, ZR_BF16 or ZR_F16. */
#ifndef ZR_CUDA_ROPE_H
#define ZR_CUDA_ROPE_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h" /* C header: inside the extern "C" block */

/* Layout of the projection side (forward input, backward output): */
enum {
    ZR_ROPE_BHTD = 0, /* (B, H, T, Dh): in place allowed (out == in) */
    ZR_ROPE_BTHD = 1  /* (B, T, H, Dh): the linear projection's output; fuses the transpose */
};

/* q_out (B, Hq, T, Dh), k_out (B, Hkv, T, Dh) from q (B,Hq,T,Dh or B,T,Hq,Dh) and k likewise.
 * Dh must be even. */
int rope_forward_cuda(void *q_out, void *k_out, const void *q, const void *k, const float *cos,
                      const float *sin, int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t Dh,
                      int layout, zr_dtype dtype, cudaStream_t stream);
/* dq, dk (in `layout`) from dq_out (B,Hq,T,Dh), dk_out (B,Hkv,T,Dh): the inverse rotation. */
int rope_backward_cuda(void *dq, void *dk, const void *dq_out, const void *dk_out,
                       const float *cos, const float *sin, int64_t B, int64_t Hq, int64_t Hkv,
                       int64_t T, int64_t Dh, int layout, zr_dtype dtype, cudaStream_t stream);

/* Partial rotary embedding (transformers' partial_rotary_factor), in place: x (BH, T, Dh)
 * contiguous, its first R channels of each row rotated (pairs i, i + R/2; R even, 0 < R <= Dh),
 * channels R..Dh-1 left as they are; cos/sin (T, R/2) f32. backward != 0: the inverse rotation
 * (sin negated), the gradient's map. */
int rope_partial_cuda(void *x, const float *cos, const float *sin, int64_t BH, int64_t T,
                      int64_t Dh, int64_t R, int backward, zr_dtype dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
