/* Matrix products with autograd: matmul (torch.matmul semantics: 1-D, 2-D and batched N-D with
 * broadcast batch dims), bmm, linear (x · Wᵀ + b) and conv1d (Hugging Face's Conv1D: x · W + b).
 * GEMM (OpenBLAS on CPU, cuBLASLt on CUDA) gets transposition flags, so transposed views and
 * contiguous inputs are never copied; on CPU bf16/f16 are widened to f32 for the product and the
 * result is narrowed back.
 *
 *   zr_tensor *y = zr_linear(x, w, b);   // x (..., in), w (out, in), b (out) or NULL -> (..., out)
 *   zr_tensor *y = zr_conv1d(x, w, b);   // x (..., in), w (in, out), b (out) or NULL -> (..., out)
 *   zr_tensor *c = zr_matmul(a, b);      // (..., m, k) x (..., k, n) -> (broadcast..., m, n) */
#ifndef ZR_OPS_MATMUL_H
#define ZR_OPS_MATMUL_H

#include "core/tensor.h"

/* torch.matmul: 1-D x 1-D is a dot product (0-dim); a 1-D left operand is a row vector and a
 * 1-D right operand a column vector (the added dim is removed from the result); N-D operands
 * broadcast their batch dims (all but the last two). The result dtype is the promoted dtype. */
zr_tensor *zr_matmul(zr_tensor *a, zr_tensor *b);
/* Batched product of (B, m, k) and (B, k, n) with equal B (no broadcasting). */
zr_tensor *zr_bmm(zr_tensor *a, zr_tensor *b);
/* y = x · wᵀ + b for x (..., in), w (out, in), b (out) or NULL. Backward uses one GEMM each for
 * dx = gy · w and dW = gyᵀ · x (summed over all leading dims of x), and a column sum for db. */
zr_tensor *zr_linear(zr_tensor *x, zr_tensor *w, zr_tensor *b);
/* GPT-2's Conv1D (transformers' torch.addmm(b, x, w)): y = x · w + b for x (..., in), w (in, out)
 * as stored, b (out) or NULL. The values and gradients of zr_linear(x, wᵀ, b), but w is the node's
 * input: its gradient is made (in, out) directly (on CUDA one GEMM xᵀ · g, straight into w's
 * existing gradient when it has one), with no copy of w or transpose of dW. */
zr_tensor *zr_conv1d(zr_tensor *x, zr_tensor *w, zr_tensor *b);
/* A weight as (out, in): a new reference to w (in_out 0, linear's layout) or to its transposed view
 * (in_out 1, conv1d's (in, out); never copied). A w that is not 2-D is returned as it is, for the
 * product's own checks to name. */
zr_tensor *zr_weight_out_in(zr_tensor *w, int in_out);
/* For ops that end in a linear (ops/linear_gelu.c): linear's backward for a node whose edges are
 * x, w, b and whose saved[0], saved[1] are x, w, given g, the gradient of the product's output;
 * n->i[0] = 1 says w is stored (in, out) as conv1d's (0: (out, in) as linear's). */
zr_status zr_linear_backward(zr_node *n, zr_tensor *g, zr_tensor **gin);

/* For other ops files (ops/linear_multi.c): a GEMM operand read in place where its layout allows.
 * t holds a reference (t itself, or a contiguous copy in dtype ct); the matrix is t's last two
 * dims, read transposed when trans != 0, with leading dimension ld. Release op->t after use. */
typedef struct {
    zr_tensor *t;
    int trans;
    int64_t ld;
} zr_gemm_operand;
zr_status zr_gemm_operand_prepare(zr_tensor *t, zr_dtype ct, zr_gemm_operand *op);

#endif
