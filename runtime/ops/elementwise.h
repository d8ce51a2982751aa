/* Elementwise ops with autograd: unary math/activations, binary arithmetic with broadcasting,
 * scalar affine, and in-place accumulation (no autograd). */
#ifndef ZR_OPS_ELEMENTWISE_H
#define ZR_OPS_ELEMENTWISE_H

#include "core/tensor.h"
#include "kernels/cpu/kernels.h" /* ZR_UN_* and ZR_BIN_* op codes */

zr_tensor *zr_unary(int op, zr_tensor *x, double p);
/* The unary op's backward, no autograd: g · op'(.) as a new tensor of dtype dt shaped like xy, where
 * xy is the op's input, or its output for the ops whose derivative reads the output (exp, sqrt,
 * rsqrt, sigmoid, tanh, reciprocal). For fused ops that save the input themselves (linear_gelu). */
zr_tensor *zr_unary_grad(int op, double p, zr_tensor *xy, zr_tensor *g, zr_dtype dt);
zr_tensor *zr_binary(int op, zr_tensor *a, zr_tensor *b);
/* alpha * x + beta */
zr_tensor *zr_affine(zr_tensor *x, double alpha, double beta);
/* dst += alpha * src (src broadcasts to dst); no autograd. */
zr_status zr_add_(zr_tensor *dst, zr_tensor *src, double alpha);
/* dst *= s in place; no autograd. */
zr_status zr_mul_scalar_(zr_tensor *dst, double s);
const char *zr_unary_name(int op);

static inline zr_tensor *zr_add(zr_tensor *a, zr_tensor *b) { return zr_binary(ZR_BIN_ADD, a, b); }
static inline zr_tensor *zr_sub(zr_tensor *a, zr_tensor *b) { return zr_binary(ZR_BIN_SUB, a, b); }
static inline zr_tensor *zr_mul(zr_tensor *a, zr_tensor *b) { return zr_binary(ZR_BIN_MUL, a, b); }
static inline zr_tensor *zr_div(zr_tensor *a, zr_tensor *b) { return zr_binary(ZR_BIN_DIV, a, b); }
static inline zr_tensor *zr_neg(zr_tensor *x) { return zr_unary(ZR_UN_NEG, x, 0); }
static inline zr_tensor *zr_exp(zr_tensor *x) { return zr_unary(ZR_UN_EXP, x, 0); }
static inline zr_tensor *zr_log(zr_tensor *x) { return zr_unary(ZR_UN_LOG, x, 0); }
static inline zr_tensor *zr_sqrt(zr_tensor *x) { return zr_unary(ZR_UN_SQRT, x, 0); }
static inline zr_tensor *zr_rsqrt(zr_tensor *x) { return zr_unary(ZR_UN_RSQRT, x, 0); }
static inline zr_tensor *zr_relu(zr_tensor *x) { return zr_unary(ZR_UN_RELU, x, 0); }
static inline zr_tensor *zr_silu(zr_tensor *x) { return zr_unary(ZR_UN_SILU, x, 0); }
static inline zr_tensor *zr_sigmoid(zr_tensor *x) { return zr_unary(ZR_UN_SIGMOID, x, 0); }
static inline zr_tensor *zr_tanh(zr_tensor *x) { return zr_unary(ZR_UN_TANH, x, 0); }
static inline zr_tensor *zr_pow_scalar(zr_tensor *x, double p) { return zr_unary(ZR_UN_POW, x, p); }

#endif
