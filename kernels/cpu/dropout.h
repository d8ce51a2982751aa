/* dropout kernels: declarations over real/K(), see kernels.h. */

/* y[i] = mask[i] ? x[i] * scale : 0 over n contiguous elements (dropout forward and backward). */
void K(dropout_apply_cpu)(real *y, const real *x, const uint8_t *mask, int64_t n, double scale);
