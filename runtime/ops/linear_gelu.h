/* linear then GELU (tanh approximation) as one op, GPT-2's MLP up-projection:
 *
 *   zr_tensor *h = zr_linear_gelu(x, w, b);  // gelu_tanh(x · wᵀ + b); x (..., in), w (out, in)
 *
 * On CUDA (bf16/f16/f32 operands of one dtype, out a multiple of 8) it is one cuBLASLt product
 * whose GELU_AUX(_BIAS) epilogue writes both h and the pre-activation x · wᵀ + b; elsewhere it is
 * zr_linear then the tanh GELU. Either way the node saves x, w and the pre-activation (the bytes
 * the unfused pair keeps: the GELU's input and, instead of the next linear's saved input, h).
 *
 *   zr_tensor *y = zr_mlp_gelu(x, w_fc, b_fc, w_proj, b_proj, 0);  // linear_gelu, then a linear
 *
 * is GPT-2's whole MLP as one autograd node, so that its backward sees both halves: on CUDA the
 * second linear's dX product applies the GELU's derivative in its epilogue (DGELU, reading the
 * saved pre-activation), one pass instead of a product then a dGELU kernel. It saves what the
 * unfused ops save (x, pre, h and the weights). With in_out = 1 the weights are stored (in, out) as
 * GPT-2's Conv1D stores them (zr_conv1d's layout): read in place, their gradients made (in, out). */
#ifndef ZR_OPS_LINEAR_GELU_H
#define ZR_OPS_LINEAR_GELU_H

#include "core/tensor.h"

/* gelu_tanh(x · wᵀ + b) for x (..., in), w (out, in), b (out) or NULL; the result dtype is the
 * promoted dtype, as zr_linear's. Backward: dpre = g · gelu_tanh'(pre), then linear's backward. */
zr_tensor *zr_linear_gelu(zr_tensor *x, zr_tensor *w, zr_tensor *b);
/* y = linear(gelu_tanh(linear(x, w_fc, b_fc)), w_proj, b_proj): x (..., in), w_fc (hidden, in),
 * w_proj (out, hidden); biases (hidden) / (out) or NULL. in_out = 1: conv1d in place of linear,
 * w_fc (in, hidden) and w_proj (hidden, out). The same values and gradients as those three ops
 * (errors name mlp_gelu and the failing part). */
zr_tensor *zr_mlp_gelu(zr_tensor *x, zr_tensor *w_fc, zr_tensor *b_fc, zr_tensor *w_proj, zr_tensor *b_proj,
                       int in_out);

#endif
