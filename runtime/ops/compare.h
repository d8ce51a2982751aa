/* Comparisons that produce u8 masks (no autograd), and the ops that take a mask, with autograd:
 * where, masked_fill. Masks broadcast like elementwise operands. */
#ifndef ZR_OPS_COMPARE_H
#define ZR_OPS_COMPARE_H

#include "core/tensor.h"
#include "kernels/cpu/kernels.h" /* ZR_CMP_* op codes */

/* cond ? a : b elementwise, with cond (u8), a and b broadcast together; result dtype is the
 * promotion of a and b. Gradients flow to a where cond and to b elsewhere. */
zr_tensor *zr_where(zr_tensor *cond, zr_tensor *a, zr_tensor *b);
/* x with value where mask (u8, broadcast to x's shape) is nonzero; gradient is zero there. */
zr_tensor *zr_masked_fill(zr_tensor *x, zr_tensor *mask, double value);

/* a (op) b -> u8 mask (1/0), broadcasting; any dtypes (compared as f64). No autograd. */
zr_tensor *zr_compare(int op, zr_tensor *a, zr_tensor *b);
zr_tensor *zr_compare_scalar(int op, zr_tensor *a, double s);
/* u8: 1 where m is 0 (any dtype). No autograd. */
zr_tensor *zr_logical_not(zr_tensor *m);

#endif
