/* Inverted dropout with autograd (torch.nn.functional.dropout). */
#ifndef ZR_OPS_DROPOUT_H
#define ZR_OPS_DROPOUT_H

#include "core/tensor.h"

/* Inverted dropout: zeroes each element with probability p (mask from the global Philox
 * generator, zr_tensor_bernoulli_) and scales the kept ones by 1/(1-p); backward reuses the mask.
 * Returns a new reference to x itself when !training or p == 0. p must be in [0, 1]. */
zr_tensor *zr_dropout(zr_tensor *x, double p, int training);

#endif
