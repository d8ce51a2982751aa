/* Differentiable shape and movement ops: views share storage with their input (no copy), the
 * others copy. Dims are 0-based and may be negative here. */
#ifndef ZR_OPS_VIEW_H
#define ZR_OPS_VIEW_H

#include "core/tensor.h"

zr_tensor *zr_view(zr_tensor *x, int ndim, const int64_t *shape);    /* view or error */
zr_tensor *zr_reshape(zr_tensor *x, int ndim, const int64_t *shape); /* view if possible, else copy */
zr_tensor *zr_transpose(zr_tensor *x, int d0, int d1);
zr_tensor *zr_permute(zr_tensor *x, const int *perm);
zr_tensor *zr_narrow(zr_tensor *x, int dim, int64_t start, int64_t len);
zr_tensor *zr_select(zr_tensor *x, int dim, int64_t index); /* drops dim */
zr_tensor *zr_expand(zr_tensor *x, int ndim, const int64_t *shape);
zr_tensor *zr_unsqueeze(zr_tensor *x, int dim);
zr_tensor *zr_squeeze(zr_tensor *x, int dim); /* dim < -ndim-1 ... use ZR_ALL_DIMS for all */
#define ZR_ALL_DIMS 0x7fff
zr_tensor *zr_contiguous(zr_tensor *x);
zr_tensor *zr_clone(zr_tensor *x);
/* Cast and/or move; a new reference to x when nothing changes. */
zr_tensor *zr_to(zr_tensor *x, zr_dtype dt, zr_device dev);

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

#endif
