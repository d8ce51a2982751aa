/* Normalisation layers with autograd: RMSNorm (Hugging Face LlamaRMSNorm) and LayerNorm (torch).
 * Both normalise over the last dim of x (..., D); weight and bias are (D) or NULL. */
#ifndef ZR_OPS_NORM_H
#define ZR_OPS_NORM_H

#include "core/tensor.h"

/* y = x / sqrt(mean(x^2, -1) + eps) * weight. Statistics in f32 (f64 for f64 inputs). For bf16/f16
 * x the normalised value is rounded to x's dtype before the weight is applied, exactly as
 * LlamaRMSNorm does (`weight * hidden.to(input_dtype)`); the output keeps x's dtype (HF would
 * promote to the weight's dtype if it were wider). Saves x, weight and rstd (one per row). */
zr_tensor *zr_rmsnorm(zr_tensor *x, zr_tensor *weight, double eps);
/* unit_offset 0: zr_rmsnorm. 1: Gemma's RMSNorm (Gemma3RMSNorm): y = x / sqrt(mean(x^2) + eps) * (1 + weight),
 * computed in f32 (f64 for f64 inputs) and rounded to x's dtype once, weight required. On CUDA the weight must be
 * of x's dtype, or 16-bit under f32 x (it is read in x's dtype: any other would be rounded first); an error says so. */
zr_tensor *zr_rmsnorm_ex(zr_tensor *x, zr_tensor *weight, double eps, int unit_offset);
/* The residual add of a pre-norm block with the norm after it: *h = x + r, returns
 * zr_rmsnorm(*h, weight, eps) (new references both). The graph is the composition's, an add node
 * on h (x and r receive h's gradient, shared: no copy) and an rms_norm node on y saving h, so
 * backward is unchanged; on a GPU, for x and r of one shape and dtype, one kernel computes h and y
 * (x and r read once, h not read back by a second kernel). Otherwise zr_add then zr_rmsnorm. */
zr_tensor *zr_add_rmsnorm(zr_tensor *x, zr_tensor *r, zr_tensor *weight, double eps, zr_tensor **h);
/* zr_add_rmsnorm with the norm zr_rmsnorm_ex's (unit_offset 1: Gemma's). */
zr_tensor *zr_add_rmsnorm_ex(zr_tensor *x, zr_tensor *r, zr_tensor *weight, double eps, int unit_offset,
                             zr_tensor **h);
/* torch.nn.functional.layer_norm over the last dim (biased variance). Saves x, weight and the
 * per-row mean and rstd. */
zr_tensor *zr_layernorm(zr_tensor *x, zr_tensor *weight, zr_tensor *bias, double eps);
/* The LayerNorm twin of zr_add_rmsnorm: *h = x + r, returns zr_layernorm(*h, weight, bias, eps)
 * (new references both), with the same graph (an add node on h, a layer_norm node on y) and, on a
 * GPU for x and r of one shape and dtype, one kernel for h, y and the row statistics. */
zr_tensor *zr_add_layernorm(zr_tensor *x, zr_tensor *r, zr_tensor *weight, zr_tensor *bias, double eps,
                            zr_tensor **h);

#endif
