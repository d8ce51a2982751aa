/* swiglu kernels: declarations over real/K(), see kernels.h. Twins of kernels/cuda/swiglu.h:
 * gate and up are (M, F) with row stride ld; h and dh are (M, F) contiguous. */

/* h = silu(gate) * up = gate * sigmoid(gate) * up. */
void K(swiglu_forward_cpu)(real *h, const real *gate, const real *up, int64_t M, int64_t F,
                           int64_t ld);
/* dgate = dh * up * silu'(gate), silu'(g) = s * (1 + g * (1 - s)) with s = sigmoid(g), and
 * dup = dh * silu(gate), written with row stride ld; either output may be NULL (not wanted). */
void K(swiglu_backward_cpu)(real *dgate, real *dup, const real *dh, const real *gate,
                            const real *up, int64_t M, int64_t F, int64_t ld);
