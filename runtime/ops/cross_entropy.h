/* Fused cross-entropy loss with autograd. Forward keeps one logsumexp per row (no (N, C)
 * log-probabilities tensor); backward recomputes softmax - onehot row by row.
 *
 *   zr_tensor *loss = zr_cross_entropy(logits, targets, -100, ZR_LOSS_MEAN, 0.0, 0);
 *
 * logits (..., C) float; targets (...) i32/i64 holding class indices 0..C-1 (0-based: they are
 * data, like token ids, not Lua positions) or ignore_index. So (N, C) with (N), and (B, T, C)
 * with (B, T), both work. label_smoothing eps in [0, 1] mixes the one-hot target with the uniform
 * distribution as torch does: loss = (1 - eps) * nll + eps * mean_j(-log p_j).
 * Reductions: ZR_LOSS_MEAN divides the sum by the number of non-ignored targets; when every
 * target is ignored that is 0/0 and the loss is nan, exactly like torch. ZR_LOSS_SUM sums;
 * ZR_LOSS_NONE returns the per-target losses (0 on ignored targets) with the targets' shape.
 * inplace: when the op is recorded for backward, the forward also computes the logits' gradient,
 * for the seed zr_loss_grad_hint() promises, and writes it over the logits' own storage (one pass
 * over them on CUDA instead of two, and no second logits-sized buffer); backward hands it on, or
 * rescales it in place when another seed comes. The caller must not read those logits again.
 * Needs contiguous logits and reduction mean or sum; not recorded (no grad, logits that need
 * none), it is the plain op. */
#ifndef ZR_OPS_LOSS_H
#define ZR_OPS_LOSS_H

#include "core/tensor.h"

typedef enum { ZR_LOSS_NONE = 0, ZR_LOSS_MEAN, ZR_LOSS_SUM } zr_loss_reduction;

/* "none" | "mean" | "sum" -> reduction, or -1. */
int zr_loss_reduction_parse(const char *s);

zr_tensor *zr_cross_entropy(zr_tensor *logits, zr_tensor *targets, int64_t ignore_index,
                            zr_loss_reduction reduction, double label_smoothing, int inplace);

/* TRL's per-token statistics of logits (..., C), no gradient: *entropy (...) the entropy (natural log) of
 * softmax over the last dimension (f32; f64 for f64 logits on the CPU), *argmax (...) i64 the first index of
 * the largest logit (torch.argmax's). One pass over the logits on CUDA. New references, or ZR_ERR. */
/* (CUDA builds; for ops/linear_ce.c) sum (0-dim f32) = the sum of loss (N) f32 on one device, in f64 in a fixed order:
 * the reduction 'sum' of cross_entropy's per-row losses. */
zr_status zr_cross_entropy_sum_dev(zr_tensor *sum, zr_tensor *loss);

zr_status zr_logits_stats(zr_tensor *logits, zr_tensor **entropy, zr_tensor **argmax);

#endif
