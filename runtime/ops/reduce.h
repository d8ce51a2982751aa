/* Reductions with autograd: sum, mean and max over a set of dims (0-based here; the Lua
 * bindings convert from 1-based). ndims = 0 reduces over all dims. */
#ifndef ZR_OPS_REDUCE_H
#define ZR_OPS_REDUCE_H

#include "core/tensor.h"

zr_tensor *zr_sum(zr_tensor *x, int ndims, const int *dims, int keepdim);
zr_tensor *zr_mean(zr_tensor *x, int ndims, const int *dims, int keepdim);
/* Max values; when indices is non-NULL and one dim is reduced, *indices gets i64 positions. */
zr_tensor *zr_max(zr_tensor *x, int ndims, const int *dims, int keepdim, zr_tensor **indices);

#endif
