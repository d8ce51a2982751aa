/* LoRA adapters on frozen projections that read one input, as one op (Hugging Face PEFT's LoraLayer,
 * q/k/v or gate/up side by side):
 *
 *   y = x · [W_1; ...; W_n]ᵀ (+ b)   and, in the column block of each adapted projection i,
 *       + s_i · (D_i(x) · A_iᵀ) · B_iᵀ
 *
 * for x (..., in), W_i (out_i, in) and b_i (out_i) frozen (no gradient), A_i (r_i, in) and B_i
 * (out_i, r_i) trained, D_i inverted dropout with probability p (training only). Each product writes
 * into y in place (the adapters' with alpha s_i, beta 1): no separate base output, scaled copy or sum;
 * the n bases are one GEMM when their weights sit back to back.
 * The masks are the ones n zr_dropout(x, p) calls would draw, adapter by adapter (the global
 * generator's offsets reserved in order), made by the kernel that applies them and made again in
 * backward from (seed, offset): none is stored. Saved: x, h = [D_i(x) A_iᵀ] (rows, Σ r_i) in y's dtype.
 * Backward: dB_i = s_i gyᵢᵀ h_i, dh_i = s_i gyᵢ B_i, dA_i = dh_iᵀ D_i(x), dx = gy · W + Σ D_i(dh_i A_i)
 * (without dropout the last sum is one GEMM into dx per run of adjacent A_i); dA_i, dB_i straight into
 * the leaf gradients where they can be (as zr_linear_multi's dW). */
#ifndef ZR_OPS_LORA_H
#define ZR_OPS_LORA_H

#include "core/tensor.h"

/* Most projections one zr_lora_multi takes (q, k, v). */
#define ZR_LORA_MULTI_MAX 3

/* y (..., Σ out_i) in the promoted dtype. b: NULL or n biases. A[i], B[i]: both NULL for a plain
 * projection (k_proj beside adapted q and v), else both given. scale[i]: s_i (lora_alpha / r, or
 * / sqrt(r) for rsLoRA). p in [0, 1). Refused with a message: a base weight or bias that requires a
 * gradient (this op takes frozen bases; run the projections one by one), shapes that do not fit. */
zr_tensor *zr_lora_multi(zr_tensor *x, int n, zr_tensor *const *w, zr_tensor *const *b, zr_tensor *const *A,
                         zr_tensor *const *B, const double *scale, double p, int training);

#endif
