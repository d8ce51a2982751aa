/* AdamW's hyper-parameters (torch.optim.AdamW's names), the one shape they travel in: from the Lua
 * options table through runtime/ops/optim.c and the ZeRO engine down to the CPU, offload and CUDA
 * kernels, which derive the per-step scalars (the bias corrections) from it and the step count.
 * Where parameters come in groups (the ZeRO engine's segments, the multi-tensor CUDA kernel), each
 * group's lr and weight_decay override the config's, which then supplies the betas and eps. */
#ifndef ZR_BASE_ADAMW_H
#define ZR_BASE_ADAMW_H

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
} zr_adamw_config;

#endif
