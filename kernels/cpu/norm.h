/* norm kernels: declarations over real/K(), see kernels.h. Rows are contiguous: x, y, dx are
 * (N, D) row-major; per-row statistics are (N). Optional weight/bias pointers may be NULL. */

/* RMSNorm (Hugging Face LlamaRMSNorm): rstd[r] = 1/sqrt(mean_j x[r,j]^2 + eps),
 * y[r,j] = x[r,j] * rstd[r] * (w ? w[j] : 1). */
void K(rmsnorm_forward_cpu)(real *y, real *rstd, const real *x, const real *w, int64_t N, int64_t D,
                            double eps);
/* dx (N,D) is written; dw (D) is written (not accumulated) when non-NULL. w may be NULL. */
void K(rmsnorm_backward_cpu)(real *dx, real *dw, const real *dy, const real *x, const real *w,
                             const real *rstd, int64_t N, int64_t D);
/* LayerNorm (torch): mean[r], rstd[r] = 1/sqrt(var_biased + eps), y = (x-mean)*rstd*w + b. */
void K(layernorm_forward_cpu)(real *y, real *mean, real *rstd, const real *x, const real *w,
                              const real *b, int64_t N, int64_t D, double eps);
/* dx (N,D) written when non-NULL; dw, db (D) written when non-NULL. */
void K(layernorm_backward_cpu)(real *dx, real *dw, real *db, const real *dy, const real *x,
                               const real *w, const real *mean, const real *rstd, int64_t N,
                               int64_t D);
/* y[r,j] *= w[j] (applies a weight after a separate rounding step, see ops/norm.c). */
void K(scale_cols_cpu)(real *y, const real *w, int64_t N, int64_t D);
