/* Optimizer kernels: declarations over real/K(), included twice by kernels.h. Each kernel updates
 * n contiguous elements in place; the per-step scalars (bias corrections) are computed once per
 * call from the config and the step. CUDA twins (kernels/cuda/optim.h) take the same arguments +
 * stream. */
#ifndef ZR_OPTIM_KERNELS_DEFINED
#define ZR_OPTIM_KERNELS_DEFINED
/* Dtype of the gradient array: the parameters' own `real`, or bf16 bit patterns (uint16_t). */
enum { ZR_OPTIM_GRAD_REAL = 0, ZR_OPTIM_GRAD_BF16 = 1 };
#include "../base/adamw.h" /* zr_adamw_config */
#endif

/* torch.optim.AdamW, step t (from 1) over n elements: p, m, v are real (n); g is real or bf16 (n).
 *   p *= 1 - lr*wd;  m += (1-b1)(g-m);  v = b2 v + (1-b2) g^2;
 *   p -= step_size * m / (sqrt(v)/bc2_sqrt + eps)
 * with step_size = lr / (1 - b1^t) and bc2_sqrt = sqrt(1 - b2^t), computed here in double. */
void K(adamw_step_cpu)(real *p, const void *g, int g_kind, real *m, real *v, int64_t n,
                       const zr_adamw_config *c, int64_t step);
/* torch.optim.SGD, one step over n elements: p, g real (n); buf (n) is the momentum buffer, NULL
 * when momentum == 0; `first` initialises buf to the (weight-decayed) gradient, undamped. */
void K(sgd_step_cpu)(real *p, const real *g, real *buf, int64_t n, double lr, double momentum,
                     double dampening, double weight_decay, int nesterov, int first);
