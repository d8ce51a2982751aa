/* Causal scaled dot-product attention with grouped-query heads, with autograd. Saves q, k, v, the
 * output and one logsumexp per query row (B, Hq, T), never the T x T probabilities: backward
 * recomputes them (flash-attention style), so saved activations are O(T) per head. */
#ifndef ZR_OPS_ATTENTION_H
#define ZR_OPS_ATTENTION_H

#include "core/tensor.h"

/* out = softmax(q k^T * scale + causal mask) v, per head. q (B, Hq, T, Dh), k and v
 * (B, Hkv, T, Dh) with Hq a multiple of Hkv: query head h uses kv head h / (Hq / Hkv).
 * scale <= 0 means 1/sqrt(Dh). Output (B, Hq, T, Dh) in q's dtype. */
zr_tensor *zr_sdpa_causal(zr_tensor *q, zr_tensor *k, zr_tensor *v, double scale);

#endif
