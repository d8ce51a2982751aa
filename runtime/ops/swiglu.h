/* The fused SwiGLU of the Llama MLP: h = silu(gate) * up in one op, with autograd. Unlike
 * `gate:silu() * up` it keeps no silu output for backward (only gate and up, which the
 * projections produced anyway), and on CUDA it reads gate and up once in each direction. */
#ifndef ZR_OPS_SWIGLU_H
#define ZR_OPS_SWIGLU_H

#include "core/tensor.h"
#include "kernels/base/glu.h"

/* h = silu(gate) * up = gate * sigmoid(gate) * up, elementwise. gate and up: the same shape, the
 * same float dtype, the same device (no broadcasting); h has that shape and dtype (computed in
 * f32 for bf16/f16 and rounded once), in the activations category. Gradients flow to both:
 * dgate = dh * up * silu'(gate), dup = dh * silu(gate). CUDA: f32, bf16 and f16. */
zr_tensor *zr_swiglu(zr_tensor *gate, zr_tensor *up);
/* The packed form for a fused gate/up projection (zr_linear_multi): gu (..., 2F) holds gate in
 * its first F columns and up in its last F; h (..., F). Backward writes ONE gradient of gu's shape
 * (dgate and dup side by side), so no split is needed. Same dtypes and devices as zr_swiglu. */
zr_tensor *zr_swiglu_packed(zr_tensor *gu);

/* The gated linear units by activation (kernels/base/glu.h): h = act(gate) * up; ZR_GLU_SILU is zr_swiglu,
 * ZR_GLU_GELU_TANH / ZR_GLU_GELU GeGLU (Gemma's MLP: gelu_pytorch_tanh; computed in f32 and rounded once,
 * where transformers' act(gate) * up rounds the activation first). The node is named "swiglu" or "geglu". */
zr_tensor *zr_glu(zr_tensor *gate, zr_tensor *up, zr_glu_act act);
zr_tensor *zr_glu_packed(zr_tensor *gu, zr_glu_act act);

#endif
