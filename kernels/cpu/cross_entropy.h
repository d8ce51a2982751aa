/* cross_entropy kernels: declarations over real/K(), see kernels.h. Twins of
 * kernels/cuda/cross_entropy.h. */

/* Fused cross-entropy over logits x (n, c) contiguous and class targets tgt (n) (i64, already
 * range-checked; rows with tgt == ignore_index are skipped). Per row:
 *   lse[i]  = logsumexp(x[i, :])
 *   loss[i] = lse[i] - (1 - eps) * x[i, t] - eps / c * sum_j x[i, j]   (0 for ignored rows)
 * where eps is the label smoothing. No (n, c) temporary is written. */
void K(cross_entropy_forward_cpu)(real *loss, real *lse, const real *x, const int64_t *tgt,
                                  int64_t n, int64_t c, int64_t ignore_index, double eps);
/* gx (n, c) = s_i * (softmax(x[i]) - (1 - eps) * onehot(t_i) - eps / c), softmax recomputed from
 * lse; 0 on ignored rows. s_i = scale * (g ? g[i] : 1). */
void K(cross_entropy_backward_cpu)(real *gx, const real *x, const real *lse, const int64_t *tgt,
                                   const real *g, double scale, int64_t n, int64_t c,
                                   int64_t ignore_index, double eps);
/* Per row of logits x (n, c) contiguous, c >= 1: entropy[i] = the entropy (natural log) of
 * softmax(x[i]) = logsumexp - sum_j p_j x_j, and argmax[i] = the first index of the row's largest
 * logit (torch.argmax's). For TRL's logged entropy and mean_token_accuracy. */
void K(logits_stats_cpu)(real *entropy, int64_t *argmax, const real *x, int64_t n, int64_t c);

/* The linear cross-entropy's chunks (ops/linear_ce.c): logits made a slice of the vocabulary at a time, x (n, vc)
 * contiguous holding classes v0 .. v0 + vc - 1. Per row whose target is not ignore_index: lse[i] becomes the logsumexp
 * of the classes seen so far (-inf before the first chunk), xt[i] the target's logit when the target is in this chunk,
 * and, with ls, tot[i] += the chunk's sum of logits (label smoothing's term). */
void K(lce_chunk_stats_cpu)(real *lse, real *xt, real *tot, const real *x, const int64_t *tgt, int64_t n, int64_t vc,
                            int64_t v0, int64_t ignore_index, int ls);
/* gx (n, vc) (may be x: in place) = scale * (exp(x - lse[i]) - eps / vall - (1 - eps) onehot(t_i - v0)), the chunk's
 * columns of cross_entropy_backward_cpu's gradient over all vall classes; 0 on ignored rows. */
void K(lce_chunk_grad_cpu)(real *gx, const real *x, const real *lse, const int64_t *tgt, double scale, int64_t n,
                           int64_t vc, int64_t v0, int64_t vall, int64_t ignore_index, double eps);
/* TRL's token statistics over the slices (ops/linear_ce.c): per row whose target is not ignore_index, the slice's
 * (max m, sum s of exp(x - m), t = sum of exp(x - m) (x - m)) merged into the row's (m, s, t) (m = -inf, s = t = 0
 * before the first slice), and its largest logit and first index (bv, bi: global indices) kept when larger than the
 * row's: after the last slice the entropy is log s - t / s and the argmax bi (logits_stats_cpu's). */
void K(lce_chunk_token_stats_cpu)(real *m, real *s, real *t, real *bv, int64_t *bi, const real *x, const int64_t *tgt,
                                  int64_t n, int64_t vc, int64_t v0, int64_t ignore_index);
