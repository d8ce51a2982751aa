/* Cross-entropy over a large vocabulary on CUDA, fused: forward reads each row of logits once
 * (online max/sum) and writes only per-row f32 loss and logsumexp; backward writes the gradient
 * softmax(x) - onehot(target), times the incoming gradient, straight into dlogits, which may be
 * the logits buffer itself. Or both in one pass (cross_entropy_fused_cuda) when the incoming
 * gradient can be predicted: one read of the logits and one write of the gradient in all.
 * logits (N, V) in ZR_F32, ZR_BF16 or ZR_F16; targets (N) int64; rows whose target equals
 * ignore_index (Hugging Face uses -100) get loss 0 and a zero gradient row. A target outside
 * [0, V) that is not ignore_index gives a NaN loss for that row. eps in [0, 1] is the label
 * smoothing (torch's label_smoothing, Hugging Face's LabelSmoother): the target (1 - eps) onehot
 * + eps/V, so loss = lse - (1 - eps) x[target] - eps/V sum_j x[j], and the gradient subtracts that
 * target instead of the onehot. eps = 0 runs the kernels without it. */
#ifndef ZR_CUDA_CROSS_ENTROPY_H
#define ZR_CUDA_CROSS_ENTROPY_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h" /* C header: inside the extern "C" block */

/* loss (N) and lse (N) f32 per row (lse does not depend on eps). When loss_mean is non-NULL it
 * receives the mean loss over non-ignored rows (NaN when there are none, like PyTorch), and
 * n_valid (nullable) their count, both f32 scalars on the device, summed in a fixed order. */
int cross_entropy_forward_cuda(float *loss, float *lse, float *loss_mean, float *n_valid,
                               const void *logits, const int64_t *targets, int64_t N, int64_t V,
                               int64_t ignore_index, float eps, zr_dtype dtype, cudaStream_t stream);
/* dlogits[r, j] = (exp(logits[r, j] - lse[r]) - eps/V - (j == target[r]) (1 - eps))
 *                 * dloss[r * dloss_stride].
 * dloss_stride 0 broadcasts one device scalar (for the mean: 1/n_valid times the upstream
 * gradient). dlogits may equal logits (in place). */
int cross_entropy_backward_cuda(void *dlogits, const void *logits, const int64_t *targets,
                                const float *lse, const float *dloss, int64_t dloss_stride,
                                int64_t N, int64_t V, int64_t ignore_index, float eps, zr_dtype dtype,
                                cudaStream_t stream);

/* The forward and the gradient in one pass, for a backward whose upstream gradient is expected to
 * be `seed` (zr_loss_grad_hint): loss, lse, loss_mean and n_valid as cross_entropy_forward_cuda,
 * and dlogits as cross_entropy_backward_cuda with dloss = seed / n_valid when `count` is non-NULL
 * (the mean: count, one unsigned of device workspace, receives the non-ignored rows first), else
 * seed. dlogits may equal logits (in place: the gradient written over them). */
int cross_entropy_fused_cuda(float *loss, float *lse, float *loss_mean, float *n_valid, void *dlogits,
                             const void *logits, const int64_t *targets, unsigned *count, float seed,
                             int64_t N, int64_t V, int64_t ignore_index, float eps, zr_dtype dtype,
                             cudaStream_t stream);
/* Corrects a gradient made for the upstream gradient *baked to the one that came, *g (device f32
 * scalars): d *= *g / *baked unless they are equal (then d is not touched), then *baked = *g. */
int cross_entropy_rescale_cuda(void *d, int64_t n, const float *g, float *baked, zr_dtype dtype,
                               cudaStream_t stream);

/* Per row of logits (N, V) contiguous: entropy[r] (f32) = the entropy (natural log) of softmax(logits[r]),
 * and argmax[r] = the first index of the row's largest logit (torch.argmax's), for TRL's logged entropy and
 * mean_token_accuracy. The CPU twin: logits_stats_cpu. */
int logits_stats_cuda(float *entropy, int64_t *argmax, const void *logits, int64_t N, int64_t V, zr_dtype dtype,
                      cudaStream_t stream);

/* The linear cross-entropy's chunks (ops/linear_ce.c): logits made a slice of the vocabulary at a time, xc (N, Vc)
 * contiguous holding classes v0 .. v0 + Vc - 1 of V. CPU twins: lce_chunk_stats_cpu, lce_chunk_grad_cpu.
 * lce_chunk_stats_cuda: per row whose target is not ignore_index, the chunk's logsumexp merged into lse (f32, -inf
 * before the first chunk), the target's logit into xt when the chunk holds it, and (eps != 0) the chunk's sum of
 * logits added to tot. lce_loss_cuda: loss (N) from them as cross_entropy_forward_cuda's (xt NaN-filled beforehand
 * gives a target outside [0, V) its NaN), with loss_mean and n_valid as there. lce_chunk_grad_cuda: the chunk's
 * columns of cross_entropy_backward_cuda's gradient, in place, for dloss = *dloss / *n_valid (n_valid non-NULL: the
 * mean) or *dloss (device f32 scalars). */
int lce_chunk_stats_cuda(float *lse, float *xt, float *tot, const void *xc, const int64_t *targets, int64_t N,
                         int64_t v0, int64_t Vc, int64_t ignore_index, float eps, zr_dtype dtype, cudaStream_t stream);
int lce_loss_cuda(float *loss, float *loss_mean, float *n_valid, const float *lse, const float *xt, const float *tot,
                  const int64_t *targets, int64_t N, int64_t V, int64_t ignore_index, float eps, cudaStream_t stream);
int lce_chunk_grad_cuda(void *xc, const int64_t *targets, const float *lse, const float *dloss, const float *n_valid,
                        int64_t N, int64_t v0, int64_t Vc, int64_t V, int64_t ignore_index, float eps, zr_dtype dtype,
                        cudaStream_t stream);

/* TRL's token statistics over the slices (twin: lce_chunk_token_stats_cpu): per row whose target is not ignored, the
 * slice's (max m, sum s of exp(x - m), t = sum of exp(x - m) (x - m), largest logit bv and its first index bi) merged
 * into the row's (m = bv = -inf, s = t = 0 before the first slice). lce_token_stats_out_cuda: entropy[r] = log s -
 * t / s and argmax[r] = bi for the n counted rows, r = idx[k] (idx NULL: k); the other rows are left as they are. */
int lce_chunk_token_stats_cuda(float *m, float *s, float *t, float *bv, int64_t *bi, const void *xc,
                               const int64_t *targets, int64_t N, int64_t v0, int64_t Vc, int64_t ignore_index,
                               zr_dtype dtype, cudaStream_t stream);
int lce_token_stats_out_cuda(float *entropy, int64_t *argmax, const float *s, const float *t, const int64_t *bi,
                             const int64_t *idx, int64_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
