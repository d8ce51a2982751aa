/* The optimizers' hyper-parameters (torch.optim's names), the one shape they travel in: from the
 * Lua options table through runtime/ops/optim.c and the ZeRO engine down to the CPU, offload and
 * CUDA kernels, which derive the per-step scalars (the bias corrections) from it and the step
 * count. Where parameters come in groups (the ZeRO engine's segments, the multi-tensor CUDA
 * kernel), each group's lr and weight_decay override the config's, which then supplies the rest.
 * `kind` picks the update; zero-initialised it is AdamW, and the fields a kind does not use are
 * ignored. */
#ifndef ZR_BASE_ADAMW_H
#define ZR_BASE_ADAMW_H

#include <stdint.h>

/* The ZeRO engine's optimizers and the states each keeps (zr_optim_states). */
typedef enum {
    ZR_OPTIM_ADAMW = 0, /* exp_avg, exp_avg_sq; decoupled weight decay */
    ZR_OPTIM_LION,      /* exp_avg; decoupled weight decay (DeepSpeed's Lion) */
    ZR_OPTIM_ADAGRAD,   /* sum of squared gradients; L2 weight decay (torch.optim.Adagrad) */
    ZR_OPTIM_SGD,       /* momentum buffer when momentum > 0; L2 weight decay (torch.optim.SGD) */
} zr_optim_kind;

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    int kind;                             /* zr_optim_kind */
    double momentum, dampening, lr_decay; /* SGD; Adagrad's lr_decay */
    int nesterov;                         /* SGD */
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
 * AdamW, 1 for Lion and Adagrad, 1 for SGD with momentum and 0 without. */
static inline int zr_optim_states(int kind, double momentum) {
    return kind == ZR_OPTIM_ADAMW ? 2 : kind == ZR_OPTIM_SGD ? (momentum != 0 ? 1 : 0) : 1;
}

#endif
