/* Optimizer steps on CUDA, the twins of kernels/cpu/optim.h: AdamW and SGD; Lion, Adagrad and SGD
 * over partition segments (twins of kernels/cpu/offload.h's optim_step_cpu); Lamb's two passes.
 * Fused multi-tensor AdamW on CUDA over flat buffers (llm.c/ZeRO style: every parameter lives at
 * an offset of one f32 master buffer, with m, v and the gradients at the same offsets of theirs).
 * One launch updates up to 64 segments (tensors) with their own weight decay and learning rate; more segments take
 * more launches. Semantics are torch.optim.AdamW's: p -= lr*wd*p; m, v moments; bias-corrected
 * step p -= lr * m̂ / (sqrt(v̂) + eps). */
#ifndef ZR_CUDA_OPTIM_H
#define ZR_CUDA_OPTIM_H

#include <cuda_runtime_api.h>
#include <math.h> /* before the extern "C" block: adamw.h's inline helpers use it */
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/adamw.h"
#include "../base/dtype.h" /* C header: inside the extern "C" block */

/* param, m, v: f32 flat buffers; grad: flat, grad_dtype ZR_F32, ZR_BF16 or ZR_F16, multiplied by
 * *grad_scale when grad_scale (device f32 scalar, e.g. a clipping factor) is non-NULL.
 * param_lp: NULL, or a flat ZR_BF16/ZR_F16 (lp_dtype) copy of the params written after the
 * update (the compute weights). segs: host array of nsegs segments, each with its own lr and weight
 * decay; c: the betas and eps (rounded to f32). step counts from 1. */
int adamw_step_cuda(float *param, float *m, float *v, void *param_lp, zr_dtype lp_dtype,
                    const void *grad, zr_dtype grad_dtype, const zr_adamw_segment *segs,
                    int nsegs, const zr_adamw_config *c, int64_t step,
                    const float *grad_scale, cudaStream_t stream);
/* AdamW over a bf16 or f32 master (master_dtype) with bf16 or f32 moments (state_dtype): the twin of
 * offload_adamw_lp_pieces_cpu (kernels/cpu/offload.h) over segments, with adamw_step_cuda's
 * segments, grad (f32 or bf16) and device grad_scale; param_lp NULL or a bf16 copy of the new master.
 * DeepSpeed's bf16_master_weights_and_grads / bf16_optimizer_states on the GPU. */
int adamw_lp_step_cuda(void *param, zr_dtype master_dtype, void *m, void *v, zr_dtype state_dtype, void *param_lp,
                       const void *grad, zr_dtype grad_dtype, const zr_adamw_segment *segs, int nsegs,
                       const zr_adamw_config *c, int64_t step, const float *grad_scale, cudaStream_t stream);
/* Lion, Adagrad or SGD (c->kind) over partition segments: the twin of optim_step_cpu
 * (kernels/cpu/offload.h, where the formulas are), same arguments + stream; grad_scale is a device
 * f32 scalar or NULL. state: f32 (S), NULL only for SGD without momentum. */
int optim_step_cuda(float *param, float *state, void *param_lp, zr_dtype lp_dtype, const void *grad,
                    zr_dtype grad_dtype, const zr_adamw_segment *segs, int nsegs, const zr_adamw_config *c,
                    int64_t step, const float *grad_scale, cudaStream_t stream);
/* Lamb's two passes over partition segments, the twins of lamb_sums_cpu and lamb_apply_cpu
 * (kernels/cpu/offload.h, where the formula is), same arguments + stream; grad_scale is a device f32
 * scalar or NULL. sums: device f64 (2 nsegs), written by lamb_sums_cuda (deterministic: per-block
 * partials in work, then added per segment in a fixed order) and read by lamb_apply_cuda, with any
 * cross-rank reduction in between. work: device f64 of lamb_workspace_cuda(segs, nsegs) elements. */
int64_t lamb_workspace_cuda(const zr_adamw_segment *segs, int nsegs);
int lamb_sums_cuda(const float *param, float *m, float *v, const void *grad, zr_dtype grad_dtype,
                   const zr_adamw_segment *segs, int nsegs, const zr_adamw_config *c, const float *grad_scale,
                   double *sums, double *work, cudaStream_t stream);
int lamb_apply_cuda(float *param, const float *m, const float *v, void *param_lp, zr_dtype lp_dtype,
                    const zr_adamw_segment *segs, int nsegs, const zr_adamw_config *c, int64_t step,
                    const double *sums, cudaStream_t stream);
/* torch.optim.SGD on n contiguous elements of p (f32 or f64), g of p's dtype; buf NULL without
 * momentum. Same arithmetic as sgd_step_cpu (in the parameter's precision). */
int sgd_step_cuda(void *p, const void *g, void *buf, int64_t n, double lr, double momentum,
                  double dampening, double weight_decay, int nesterov, int first, zr_dtype dt,
                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
