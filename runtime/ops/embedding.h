/* Embedding lookup with autograd: out[..., :] = weight[ids[...], :].
 *
 *   zr_tensor *h = zr_embedding(wte, ids);   // wte (V, D) float, ids (B, T) i64/i32 -> (B, T, D)
 *
 * ids are 0-based row numbers (token ids are data, not Lua positions); any id outside [0, V)
 * is an error naming the id and V. Backward scatter-adds into a dense (V, D) gradient in the
 * weight's dtype, deterministically (no atomics: the result is independent of thread count). */
#ifndef ZR_OPS_EMBEDDING_H
#define ZR_OPS_EMBEDDING_H

#include "core/tensor.h"

zr_tensor *zr_embedding(zr_tensor *weight, zr_tensor *ids);

#endif
