/* The optimizers' hyper-parameters (torch.optim's names), the one shape they travel in: from the
 * Lua options table through runtime/ops/optim.c and the ZeRO engine down to the CPU, offload and
 * CUDA kernels, which derive the per-step scalars (the bias corrections) from it and the step
 * count. Where parameters come in groups (the ZeRO engine's segments, the multi-tensor CUDA
 * kernel), each group's lr and weight_decay override the config's, which then supplies the rest.
 * `kind` picks the update; zero-initialised it is AdamW, and the fields a kind does not use are
 * ignored. */
#ifndef ZR_BASE_ADAMW_H
#define ZR_BASE_ADAMW_H

#include <math.h>
#include <stdint.h>

/* The ZeRO engine's optimizers and the states each keeps (zr_optim_states). */
typedef enum {
    ZR_OPTIM_ADAMW = 0, /* exp_avg, exp_avg_sq; decoupled weight decay */
    ZR_OPTIM_LION,      /* exp_avg; decoupled weight decay (DeepSpeed's Lion) */
    ZR_OPTIM_ADAGRAD,   /* sum of squared gradients; L2 weight decay (torch.optim.Adagrad) */
    ZR_OPTIM_SGD,       /* momentum buffer when momentum > 0; L2 weight decay (torch.optim.SGD) */
    ZR_OPTIM_LAMB,      /* exp_avg, exp_avg_sq; a trust ratio per parameter tensor (DeepSpeed's FusedLamb) */
} zr_optim_kind;

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    int kind;                             /* zr_optim_kind */
    double momentum, dampening, lr_decay; /* SGD; Adagrad's lr_decay */
    int nesterov;                         /* SGD */
    int no_bias_correction;               /* Lamb: bias_correction false (zero-initialised: true) */
    int eps_inside_sqrt;                  /* Lamb: sqrt(v + eps) instead of sqrt(v) + eps */
    double max_coeff, min_coeff;          /* Lamb: the trust ratio's clamp */
} zr_adamw_config;

/* One tensor of a flat partition: the multi-segment kernels (CPU and CUDA) update elements
 * [offset, offset + n) with this lr and weight decay. */
typedef struct {
    int64_t offset;     /* first element of this tensor in the flat buffers */
    int64_t n;          /* its element count */
    float weight_decay; /* decoupled (AdamW, Lion) or L2 (Adagrad, SGD); 0 for norms and biases */
    float lr;           /* learning rate of the tensor's parameter group */
} zr_adamw_segment;

/* How many f32 state buffers (each the size of the parameters) optimizer `kind` keeps: 2 for
 * AdamW and Lamb, 1 for Lion and Adagrad, 1 for SGD with momentum and 0 without. */
static inline int zr_optim_states(int kind, double momentum) {
    return kind == ZR_OPTIM_ADAMW || kind == ZR_OPTIM_LAMB ? 2 : kind == ZR_OPTIM_SGD ? (momentum != 0 ? 1 : 0) : 1;
}

#ifdef __CUDACC__
#define ZR_HOST_DEVICE __host__ __device__
#else
#define ZR_HOST_DEVICE
#endif

/* Lamb's trust ratio of one parameter tensor from its sums of squares over all its elements (every
 * rank's segment added up): ||p|| / ||u|| clamped to [min_coeff, max_coeff], and 1 when either norm
 * is 0 (DeepSpeed's fused_lamb_cuda_kernel.cu, lamb_cuda_kernel_part3). */
static inline ZR_HOST_DEVICE double zr_lamb_ratio(double p_sumsq, double u_sumsq, double max_coeff, double min_coeff) {
    if (!(p_sumsq != 0 && u_sumsq != 0)) return 1.0;
    double r = sqrt(p_sumsq) / sqrt(u_sumsq);
    if (r > max_coeff) r = max_coeff; /* then the minimum, in DeepSpeed's order */
    return r < min_coeff ? min_coeff : r;
}

/* Lamb's update direction of one element from its new moments: u = m / (sqrt(v) + eps) + wd p, or
 * m / sqrt(v + eps) + wd p (eps_inside_sqrt); the raw moments, as DeepSpeed's kernel has them. */
static inline ZR_HOST_DEVICE float zr_lamb_u(float m, float v, float p, float eps, float wd, int inside) {
    const float denom = inside ? sqrtf(v + eps) : sqrtf(v) + eps;
    return m / denom + wd * p;
}

/* Lamb's step size: lr * sqrt(1 - b2^t) / (1 - b1^t) with bias correction, lr without. */
static inline double zr_lamb_step_size(const zr_adamw_config *c, double lr, int64_t step) {
    if (c->no_bias_correction) return lr;
    return lr * sqrt(1 - pow(c->beta2, (double)step)) / (1 - pow(c->beta1, (double)step));
}

#endif
