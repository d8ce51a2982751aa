/* Reduction kernels: declarations over real/K(), included twice by kernels.h. */
/* x is (outer, r) contiguous; out[o] = sum (or max) over the row. For max, idx[o] (may be NULL)
 * receives the first position of the maximum. */
void K(reduce_sum_rows_cpu)(real *out, const real *x, int64_t outer, int64_t r);
void K(reduce_max_rows_cpu)(real *out, int64_t *idx, const real *x, int64_t outer, int64_t r);
/* gx (outer, r) = 0 except gx[o, idx[o]] = g[o]. */
void K(reduce_max_rows_backward_cpu)(real *gx, const real *g, const int64_t *idx, int64_t outer, int64_t r);
