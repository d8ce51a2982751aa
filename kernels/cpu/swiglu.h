/* The gated linear units of the Llama and Gemma MLPs (SwiGLU, GeGLU): declarations over real/K(), see
 * kernels.h. Twins of kernels/cuda/swiglu.h: gate and up are (M, F) with row stride ld; h and dh are (M, F)
 * contiguous. act: ZR_GLU_SILU, ZR_GLU_GELU_TANH or ZR_GLU_GELU (kernels/base/glu.h). */
#include "../base/glu.h"

/* h = act(gate) * up (silu(g) = g * sigmoid(g); gelu: torch's, tanh-approximated or exact). */
void K(glu_forward_cpu)(real *h, const real *gate, const real *up, int64_t M, int64_t F, int64_t ld, int act);
/* dgate = dh * up * act'(gate) (silu'(g) = s * (1 + g * (1 - s)) with s = sigmoid(g)) and dup = dh * act(gate),
 * written with row stride ld; either output may be NULL (not wanted). */
void K(glu_backward_cpu)(real *dgate, real *dup, const real *dh, const real *gate, const real *up, int64_t M,
                         int64_t F, int64_t ld, int act);
