/* The activations of the gated linear units (SwiGLU, GeGLU) that the CPU and CUDA GLU kernels and
 * ops/swiglu.h share. Plain C. */
#ifndef ZR_BASE_GLU_H
#define ZR_BASE_GLU_H

/* act(gate) of h = act(gate) * up: silu (Llama), torch's tanh-approximated GELU (Gemma's gelu_pytorch_tanh),
 * torch's exact GELU (erf) */
typedef enum { ZR_GLU_SILU = 0, ZR_GLU_GELU_TANH = 1, ZR_GLU_GELU = 2 } zr_glu_act;

#endif
