/* Small layer ops with autograd: dropout, cat/split, where/masked_fill; plus comparisons that
 * produce u8 masks (no autograd). Dims are 0-based here and may be negative. */
#ifndef ZR_OPS_MISC_H
#define ZR_OPS_MISC_H

#include "core/tensor.h"
#include "kernels/cpu/kernels.h" /* ZR_CMP_* op codes */

/* Inverted dropout: zeroes each element with probability p (mask from the global Philox
 * generator, zr_tensor_bernoulli_) and scales the kept ones by 1/(1-p); backward reuses the mask.
 * Returns a new reference to x itself when !training or p == 0. p must be in [0, 1]. */
zr_tensor *zr_dropout(zr_tensor *x, double p, int training);

/* Concatenates n tensors along dim (same ndim; equal sizes except along dim; dtype promoted). */
zr_tensor *zr_cat(zr_tensor *const *ts, int n, int dim);
/* torch.split(x, sizes, dim): n views of x along dim (sizes sum to x's size there); out receives
 * n new references. Backward writes each part's gradient into ONE gradient buffer of x (its
 * producer's pending gradient, zr_node_input_grad_buffer): the first part to arrive creates it,
 * zero-filling the other parts' slices, each part copies its slice in (or adds, when other
 * gradients of x are there too), parts that receive no gradient read as zero; no part returns a
 * full-size gradient. When x is a leaf, a part adds into x's existing gradient in place, or
 * returns a zero-padded one. */
zr_status zr_split_sizes(zr_tensor *x, int n, const int64_t *sizes, int dim, zr_tensor **out);
/* torch.split(x, chunk, dim): pieces of `chunk` (the last may be smaller). Returns a malloc'd
 * array of *n new references (free the array with free()), or NULL. */
zr_tensor **zr_split(zr_tensor *x, int64_t chunk, int dim, int *n);

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
