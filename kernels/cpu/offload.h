/* CPU kernels for ZeRO optimizer offload: fused passes over the flat fp32 host partition
 * (master weights, Adam moments, reduced gradients) of up to billions of elements. fp32 only
 * (no real/K() twins: the partition is always f32); OpenMP across threads, each thread's
 * contiguous chunk through a loop GCC vectorises, cloned for AVX-512 where the CPU has it.
 * 16-bit arrays hold bf16/f16 bit patterns (uint16_t), rounded to nearest even as dtype.h does. */
#ifndef ZR_KERNELS_CPU_OFFLOAD_H
#define ZR_KERNELS_CPU_OFFLOAD_H

#include <stdint.h>

#include "../base/dtype.h"

/* Per-step scalars of one AdamW segment (runtime/zero/offload.c computes them):
 *   g = grad * grad_scale;  m += (1-b1)(g-m);  v = b2 v + (1-b2) g^2;
 *   p = p * decay - step_size * m / (sqrt(v)/bc2_sqrt + eps)
 * decay = 1 - lr*wd, step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t); omb1 = 1 - b1 and
 * omb2 = 1 - b2 rounded from double, as kernels/cpu/optim.c does. */
typedef struct {
    float grad_scale, decay, omb1, beta2, omb2, eps, step_size, bc2_sqrt;
} offload_adamw_args;

/* sum of x[i]^2 over n floats, accumulated in double (per thread, then added in thread order). */
double offload_sumsq_cpu(const float *x, int64_t n);

/* AdamW over n elements: p, m, v, g f32 (n), updated in place (g is only read). When out is not
 * NULL it receives the new weights as out_dt (ZR_F32, ZR_BF16 or ZR_F16; n elements). */
void offload_adamw_cpu(float *p, float *m, float *v, const float *g, int64_t n, const offload_adamw_args *a,
                       void *out, zr_dtype out_dt);

/* dst (n, f32) += src (n, src_dt: ZR_F32, ZR_BF16 or ZR_F16), or dst = src when overwrite. */
void offload_accumulate_cpu(float *dst, const void *src, zr_dtype src_dt, int64_t n, int overwrite);

/* dst (n, f32) = v. */
void offload_fill_cpu(float *dst, int64_t n, float v);

/* dst (n, dst_dt: ZR_F32, ZR_BF16 or ZR_F16) = src (n, f32), rounded to nearest even. */
void offload_cast_cpu(void *dst, zr_dtype dst_dt, const float *src, int64_t n);

#endif
