/* softmax kernels: declarations over real/K(), see kernels.h. The reduced dim has size r and
 * stride inner inside a contiguous (outer, r, inner) block, so any dim is handled without a
 * permute; inner == 1 is the fast contiguous-row case. */

/* y = softmax(x) (or log_softmax when is_log != 0) along the middle dim; numerically stable. */
void K(softmax_forward_cpu)(real *y, const real *x, int64_t outer, int64_t r, int64_t inner, int is_log);
/* gx from gy and the forward output y:
 *   softmax:     gx = y * (gy - sum(gy * y))
 *   log_softmax: gx = gy - exp(y) * sum(gy) */
void K(softmax_backward_cpu)(real *gx, const real *gy, const real *y, int64_t outer, int64_t r,
                             int64_t inner, int is_log);

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
