/* Fused multi-tensor AdamW on CUDA over flat buffers (llm.c/ZeRO style: every parameter lives at
 * an offset of one f32 master buffer, with m, v and the gradients at the same offsets of theirs).
 * One launch updates up to 64 segments (tensors) with their own weight decay and learning rate; more segments take
 * more launches. Semantics are torch.optim.AdamW's: p -= lr*wd*p; m, v moments; bias-corrected
 * step p -= lr * m̂ / (sqrt(v̂) + eps). */
#ifndef ZR_CUDA_ADAMW_H
#define ZR_CUDA_ADAMW_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "dtype.h" /* C header: inside the extern "C" block */

typedef struct {
    int64_t offset;     /* first element of this tensor in the flat buffers */
    int64_t n;          /* its element count */
    float weight_decay; /* decoupled decay (0 for norms and biases) */
    float lr;           /* learning rate of the tensor's parameter group */
} zr_adamw_segment;

/* param, m, v: f32 flat buffers; grad: flat, grad_dtype ZR_F32, ZR_BF16 or ZR_F16, multiplied by
 * *grad_scale when grad_scale (device f32 scalar, e.g. a clipping factor) is non-NULL.
 * param_lp: NULL, or a flat ZR_BF16/ZR_F16 (lp_dtype) copy of the params written after the
 * update (the compute weights). segs: host array of nsegs segments. step counts from 1. */
int adamw_step_cuda(float *param, float *m, float *v, void *param_lp, zr_dtype lp_dtype,
                    const void *grad, zr_dtype grad_dtype, const zr_adamw_segment *segs,
                    int nsegs, float beta1, float beta2, float eps, int64_t step,
                    const float *grad_scale, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
