/* embedding kernels: declarations over real/K(), see kernels.h. ids are i64 and already checked
 * to lie in [0, V). */

/* out (n, d) = w[ids[i], :] for each of the n ids; w is (V, d) contiguous. */
void K(embedding_forward_cpu)(real *out, const real *w, const int64_t *ids, int64_t n, int64_t d);
/* gw (V, d) += g[i, :] into row ids[i] for i = 0..n-1 (gw zeroed by the caller). Deterministic:
 * threads own disjoint column ranges and each adds rows in id order, so the result does not
 * depend on the thread count. */
void K(embedding_backward_cpu)(real *gw, const real *g, const int64_t *ids, int64_t n, int64_t d);
