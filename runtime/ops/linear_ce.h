/* The LM head and its cross-entropy without the full logits (Liger's fused linear cross-entropy, TRL's chunked_nll):
 *
 *   zr_tensor *loss = zr_linear_cross_entropy(h, w, targets, -100, ZR_LOSS_MEAN, 0.0, 0);
 *
 * is cross_entropy(linear(h, w), targets) (ops/cross_entropy.h: the same loss, reductions mean and sum, ignore_index,
 * label smoothing) with the logits made a slice of the vocabulary at a time: h (..., D) and w (V, D) of one float dtype,
 * targets (...) i32/i64 with h's leading dims, on h's device or the host. Only the rows whose target counts enter the
 * products (the targets are read on the host for it: from a GPU, one copy that waits for the work queued before it,
 * which targets on the host skip; a target outside [0, V) is an error there, on CUDA too); an ignored
 * row's loss and gradient are 0, as cross_entropy's. The forward makes each slice of `chunk` columns (h · w[v0 : v0 +
 * chunk]ᵀ, rounded to the dtype as linear's output is), merges its logsumexp into each row's and drops it; the backward makes
 * each slice again, turns it into its columns of the logits' gradient in place, and adds its products: dW's rows
 * v0 .. v0 + chunk (straight into w's fp32 gradient where the engine keeps one, as linear's backward does) and dh
 * (summed in f32 over the slices, rounded once). So the logits held at any time are one slice (N x chunk), for one
 * more product than linear + cross_entropy (the forward's, made again in backward). chunk <= 0: the default,
 * zr_linear_ce_chunk's. */
#ifndef ZR_OPS_LINEAR_CE_H
#define ZR_OPS_LINEAR_CE_H

#include "ops/cross_entropy.h"

zr_tensor *zr_linear_cross_entropy(zr_tensor *h, zr_tensor *w, zr_tensor *targets, int64_t ignore_index,
                                   zr_loss_reduction reduction, double label_smoothing, int64_t chunk);

/* The same, and (entropy, argmax non-NULL) TRL's token statistics of the logits, made from the same slices: *entropy
 * (the targets' shape; f32, f64 for f64 on the CPU) the entropy of each row's softmax and *argmax (i64) the first
 * index of its largest logit, as zr_logits_stats gives them, at the rows whose target counts; 0 at ignored rows (no
 * logits are made for them). New references, or NULL with the result. */
zr_tensor *zr_linear_cross_entropy_stats(zr_tensor *h, zr_tensor *w, zr_tensor *targets, int64_t ignore_index,
                                         zr_loss_reduction reduction, double label_smoothing, int64_t chunk,
                                         int64_t keep, zr_tensor **entropy, zr_tensor **argmax);

/* The columns a slice has for rows x V logits of dtype dt: chunk when > 0, else the default (slices of about
 * ZR_LCE_CHUNK_BYTES, at least ZR_LCE_MIN_CHUNK columns, a multiple of 256); at most V. */
#define ZR_LCE_CHUNK_BYTES (64LL << 20)
#define ZR_LCE_MIN_CHUNK 4096
int64_t zr_linear_ce_chunk(int64_t rows, int64_t V, zr_dtype dt, int64_t chunk);

/* Whether the forward keeps the counted rows' whole logits for backward (rows x V elements of elem bytes: the
 * compute dtype's on the CPU, the dtype's on CUDA), so that backward turns them into their gradient in place instead
 * of making each slice again (linear + cross_entropy's three products, over the counted rows only): with the default
 * slices (chunk <= 0) where they take at most keep bytes (keep < 0: ZR_LCE_KEEP_BYTES; 0: never). Short batches
 * (an SFT micro-batch of a few hundred tokens) then cost no second product, and no more memory than a few slices. */
#define ZR_LCE_KEEP_BYTES (256LL << 20)
int zr_linear_ce_keeps(int64_t rows, int64_t V, size_t elem, int64_t chunk, int64_t keep);

#endif
