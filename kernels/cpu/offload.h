/* CPU kernels for ZeRO optimizer offload: fused passes over the flat fp32 host partition
 * (master weights, Adam moments, reduced gradients) of up to billions of elements. fp32 only
 * (no real/K() twins: the partition is always f32); OpenMP across threads, each thread's
 * contiguous chunk through a loop GCC vectorises, cloned for AVX-512 where the CPU has it.
 * 16-bit arrays hold bf16/f16 bit patterns (uint16_t), rounded to nearest even as dtype.h does. */
#ifndef ZR_KERNELS_CPU_OFFLOAD_H
#define ZR_KERNELS_CPU_OFFLOAD_H

#include <stdint.h>

#include "../base/adamw.h"
#include "../base/dtype.h"

/* sum of x[i]^2 over n elements (dt: f32, bf16 or f16, widened exactly), accumulated in double
 * (per thread, then added in thread order). */
double offload_sumsq_cpu(const void *x, zr_dtype dt, int64_t n);

/* AdamW step t (from 1) over n elements: p, m, v f32 (n), updated in place; g (n) f32, bf16 or
 * f16 (g_dt, widened to f32 exactly) is only read:
 *   g = grad * grad_scale;  m += (1-b1)(g-m);  v = b2 v + (1-b2) g^2;
 *   p = p * (1 - lr*wd) - lr / (1 - b1^t) * m / (sqrt(v)/sqrt(1 - b2^t) + eps)
 * with the scalars computed in double and rounded to f32 once, as kernels/cpu/optim.c does. When
 * out is not NULL it receives the new weights as out_dt (ZR_F32, ZR_BF16 or ZR_F16; n elements),
 * written with streaming stores (below). */
void offload_adamw_cpu(float *p, float *m, float *v, const void *g, zr_dtype g_dt, int64_t n,
                       const zr_adamw_config *c, int64_t step, double grad_scale, void *out, zr_dtype out_dt);

/* Elements [off, off + n) of the arrays, with their own lr and weight decay. */
typedef struct {
    int64_t off, n;
    double lr, wd;
} offload_adamw_piece;

/* offload_adamw_cpu over npc pieces at once (c supplies all but lr and weight_decay), in one
 * OpenMP parallel region whose threads split the pieces' elements laid end to end; each element's
 * arithmetic is offload_adamw_cpu's, so the bits are the same. With stream (and out), the whole
 * 64-byte lines of out are written with non-temporal stores (AVX-512, AVX2 or SSE2 picked at run
 * time; normal stores elsewhere) that skip the read-for-ownership of a normal store, and every
 * thread fences them (sfence) before the call returns, so a DMA issued after it reads them all. */
void offload_adamw_pieces_cpu(float *p, float *m, float *v, const void *g, zr_dtype g_dt,
                              const offload_adamw_piece *pc, int npc, const zr_adamw_config *c, int64_t step,
                              double grad_scale, void *out, zr_dtype out_dt, int stream);

/* AdamW over pieces (as offload_adamw_pieces_cpu) with the master p (p_dt) and the moments m, v (s_dt)
 * each f32 or bf16 (DeepSpeed's bf16_master_weights_and_grads and bf16_optimizer_states), in
 * DeepSpeed's FusedAdam arithmetic (multi_tensor_adam.cu at edaa72212, AdamW mode), op by op in f32
 * with no FMA contraction, scalars as f32 (1 - beta in f32, bias corrections rounded from double):
 *   g = grad * grad_scale (a bf16 grad rounded back to bf16, as DeepSpeed scales it in place);
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g g;  p -= lr ((m / bc1) / (sqrt(v / bc2) + eps) + wd p)
 * each bf16 state rounded to nearest even once, when stored. out: NULL, or p_dt (n) that receives
 * the new master's own bits. Returns -1 for another dtype. */
int offload_adamw_lp_pieces_cpu(void *p, zr_dtype p_dt, void *m, void *v, zr_dtype s_dt, const void *g,
                                zr_dtype g_dt, const offload_adamw_piece *pc, int npc, const zr_adamw_config *c,
                                int64_t step, double grad_scale, void *out);

/* Lion, Adagrad or SGD (c->kind; AdamW has offload_adamw_cpu) over nsegs segments of the flat
 * partition, each with its own lr and weight decay (the config supplies the rest); step t from 1:
 *   g = grad * *grad_scale (grad_scale NULL: 1), grad f32, bf16 or f16 (grad_dtype);
 *   Lion:    c = b1 s + (1-b1) g;  p = p (1 - lr wd) - lr sign(c);  s = b2 s + (1-b2) g
 *   Adagrad: g += wd p;  s += g^2;  p -= lr / (1 + (t-1) lr_decay) * g / (sqrt(s) + eps)
 *   SGD:     d = g + wd p;  s = t == 1 ? d : momentum s + (1 - dampening) d;
 *            p -= lr (nesterov ? d + momentum s : s)   (state NULL: p -= lr d)
 * param, state f32 (S); param_lp NULL or the new weights as lp_dtype (f32, bf16, f16) at the same
 * offsets. The CPU reference of optim_step_cuda, with the same arguments (grad_scale on the host). */
void optim_step_cpu(float *param, float *state, void *param_lp, zr_dtype lp_dtype, const void *grad,
                    zr_dtype grad_dtype, const zr_adamw_segment *segs, int nsegs, const zr_adamw_config *c,
                    int64_t step, const float *grad_scale);

/* Lamb (DeepSpeed's FusedLamb, deepspeed/ops/lamb/fused_lamb.py and csrc/lamb/
 * fused_lamb_cuda_kernel.cu at edaa72212) over nsegs segments, each one parameter tensor's elements
 * in this partition with its own lr and weight decay, in two passes because the trust ratio needs
 * the whole tensor (the ZeRO engine adds the sums of every rank's segment in between):
 *   lamb_sums_cpu:  g = grad * *grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *                   u = m / (sqrt(v) + eps) + wd p    (eps_inside_sqrt: m / sqrt(v + eps) + wd p)
 *                   sums[2k] = sum p^2, sums[2k+1] = sum u^2 over segment k (in double)
 *   lamb_apply_cpu: ratio = ||p|| / ||u|| clamped to [min_coeff, max_coeff], 1 when either is 0;
 *                   p -= step_size * ratio * u  (u recomputed from the new m, v and the old p),
 *                   step_size = lr sqrt(1 - b2^t) / (1 - b1^t), or lr without bias correction.
 * As DeepSpeed does, u uses the raw moments (not m-hat, v-hat): the bias correction is all in the
 * step size, so it scales the weight decay term too. grad f32, bf16 or f16 (grad_dtype); param,
 * m, v f32 (S); param_lp NULL or the new weights as lp_dtype at the same offsets. */
void lamb_sums_cpu(const float *param, float *m, float *v, const void *grad, zr_dtype grad_dtype,
                   const zr_adamw_segment *segs, int nsegs, const zr_adamw_config *c, const float *grad_scale,
                   double *sums);
void lamb_apply_cpu(float *param, const float *m, const float *v, void *param_lp, zr_dtype lp_dtype,
                    const zr_adamw_segment *segs, int nsegs, const zr_adamw_config *c, int64_t step,
                    const double *sums);

/* dst (n, f32) += src (n, src_dt: ZR_F32, ZR_BF16 or ZR_F16), or dst = src when overwrite. */
void offload_accumulate_cpu(float *dst, const void *src, zr_dtype src_dt, int64_t n, int overwrite);

/* dst (n, dst_dt: ZR_BF16 or ZR_F16 bit patterns) = dst + src rounded to nearest even, the sum in
 * f32 of both widened exactly (src: n of ZR_F32, ZR_BF16 or ZR_F16), as a 16-bit tensor's add_
 * does; or dst = src rounded when overwrite. */
void offload_accumulate16_cpu(uint16_t *dst, zr_dtype dst_dt, const void *src, zr_dtype src_dt, int64_t n,
                              int overwrite);

/* dst (n, f32) = v. */
void offload_fill_cpu(float *dst, int64_t n, float v);

/* dst (n, dst_dt: ZR_F32, ZR_BF16 or ZR_F16) = src (n, f32), rounded to nearest even. */
void offload_cast_cpu(void *dst, zr_dtype dst_dt, const float *src, int64_t n);

#endif
