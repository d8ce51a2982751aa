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
