/* dropout kernels: declarations over real/K(), see kernels.h. */

/* y[i] = mask[i] ? x[i] * scale : 0 over n contiguous elements (dropout forward and backward). */
void K(dropout_apply_cpu)(real *y, const real *x, const uint8_t *mask, int64_t n, double scale);
/* y[i] = (accumulate ? y[i] : 0) + (keep(i) ? x[i] * scale : 0) over n contiguous elements, keep(i)
 * made here instead of read: element i's Philox bits (kernels/base/philox.h at seed, off), shifted
 * to 24, below thresh (= ceil(keep probability * 2^24)): the mask zr_tensor_bernoulli_ draws at that
 * offset. Dropout applied (accumulate 0) or its gradient added (1) without a stored mask. */
void K(dropout_philox_cpu)(real *y, const real *x, int64_t n, uint32_t thresh, double scale, uint64_t seed,
                           uint64_t off, int accumulate);
