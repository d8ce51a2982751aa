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
