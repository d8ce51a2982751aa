/* softmax and log_softmax along one dim, with autograd. Numerically stable (the row max is
 * subtracted first); any dim works without a permute. bf16/f16 compute in f32 and return the
 * input dtype. dim is 0-based here and may be negative (-1 = last). */
#ifndef ZR_OPS_SOFTMAX_H
#define ZR_OPS_SOFTMAX_H

#include "core/tensor.h"

zr_tensor *zr_softmax(zr_tensor *x, int dim);
zr_tensor *zr_log_softmax(zr_tensor *x, int dim);

#endif
