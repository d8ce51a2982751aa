/* Optimizer steps over parameter tensors (torch.optim.AdamW and SGD semantics), dispatching to
 * the fused kernels in kernels/cpu/optim.c. State tensors (exp_avg, exp_avg_sq, momentum buffers)
 * are owned by the caller (the Lua optimizer or the ZeRO engine); these functions only update
 * them in place. No autograd is recorded. */
#ifndef ZR_OPTIM_H
#define ZR_OPTIM_H

#include "core/tensor.h"
#include "kernels/base/adamw.h" /* zr_adamw_config */

typedef struct {
    double lr, momentum, dampening, weight_decay;
    int nesterov;
} zr_sgd_config;

/* One AdamW step on one parameter; step is the 1-based count including this step.
 * param, exp_avg, exp_avg_sq: contiguous, same shape, f32 (or f64) on one device.
 * grad: same shape; the parameter's dtype, or bf16 for f32 parameters (other dtypes and
 * non-contiguous grads are converted first). */
zr_status zr_adamw_step(zr_tensor *param, zr_tensor *grad, zr_tensor *exp_avg,
                        zr_tensor *exp_avg_sq, int64_t step, const zr_adamw_config *c);
/* The same over n parameters sharing one step count and config. */
zr_status zr_adamw_step_multi(int n, zr_tensor *const *params, zr_tensor *const *grads,
                              zr_tensor *const *exp_avgs, zr_tensor *const *exp_avg_sqs,
                              int64_t step, const zr_adamw_config *c);
/* Flat host buffers (the ZeRO engine's fp32 master shard): p, m, v are f32 (n); g is f32 or
 * bf16 (grad_dtype ZR_F32 or ZR_BF16). The arrays must not overlap. */
zr_status zr_adamw_step_flat(float *p, const void *g, zr_dtype grad_dtype, float *m, float *v,
                             int64_t n, int64_t step, const zr_adamw_config *c);

/* Lion, Adagrad or SGD (c->kind) on the segments of a flat f32 parameter tensor, with state (f32,
 * like param; NULL for SGD without momentum) and grad (f32, bf16 or f16) of the same numel, all on
 * one device: optim_step_cpu or optim_step_cuda, the ZeRO engine's kernels. grad is multiplied by
 * grad_scale. Each segment carries its lr and weight decay. */
zr_status zr_optim_step_segments(zr_tensor *param, zr_tensor *state, zr_tensor *grad, const zr_adamw_segment *segs,
                                 int nsegs, const zr_adamw_config *c, int64_t step, double grad_scale);
/* Lamb (c->kind ZR_OPTIM_LAMB) on the segments of a flat f32 parameter tensor, in the two passes of
 * kernels/cpu/offload.h's lamb_sums_cpu / lamb_apply_cpu (CUDA: lamb_*_cuda): zr_lamb_sums updates
 * exp_avg m and exp_avg_sq v from grad * grad_scale and writes each segment's sums of p^2 and u^2
 * into sums (f64, 2 nsegs, on the parameters' device); a caller whose segments are pieces of larger
 * tensors adds the pieces' sums up (across ranks) before zr_lamb_apply updates the parameters. */
zr_status zr_lamb_sums(zr_tensor *param, zr_tensor *m, zr_tensor *v, zr_tensor *grad, const zr_adamw_segment *segs,
                       int nsegs, const zr_adamw_config *c, double grad_scale, zr_tensor *sums);
zr_status zr_lamb_apply(zr_tensor *param, zr_tensor *m, zr_tensor *v, const zr_adamw_segment *segs, int nsegs,
                        const zr_adamw_config *c, int64_t step, zr_tensor *sums);
/* Both passes in one process, each segment a whole tensor (zr.optim.Lamb, tests). */
zr_status zr_lamb_step_segments(zr_tensor *param, zr_tensor *m, zr_tensor *v, zr_tensor *grad,
                                const zr_adamw_segment *segs, int nsegs, const zr_adamw_config *c, int64_t step,
                                double grad_scale);
/* One SGD step; momentum_buf is NULL when c->momentum == 0, else a tensor like param that
 * `first` initialises (the first step after the buffer was created). */
zr_status zr_sgd_step(zr_tensor *param, zr_tensor *grad, zr_tensor *momentum_buf, int first,
                      const zr_sgd_config *c);

/* Fails with a message naming the bad hyperparameter (lr < 0, betas outside [0,1), ...). */
zr_status zr_adamw_config_check(const zr_adamw_config *c);
zr_status zr_sgd_config_check(const zr_sgd_config *c);

#endif
