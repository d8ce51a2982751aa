/* CPU reference for the fused SwiGLU h = silu(gate) * up and its two input gradients. fp32 or
 * fp64 per real.h; OpenMP over elements. The arithmetic follows `gate:silu() * up` and its
 * backward step by step (same operations, same order), so in f32/f64 the two agree to rounding. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

#define PAR _Pragma("omp parallel for schedule(static) if (n > 32768)")

static inline real sigmoid(real x) { return (real)1 / ((real)1 + R_EXP(-x)); }

/* Element i of a row-strided (M, F) operand: i is the flat index in the contiguous (M, F). */
static inline int64_t at(int64_t i, int64_t F, int64_t ld) {
    return ld == F ? i : i / F * ld + i % F;
}

void K(swiglu_forward_cpu)(real *h, const real *gate, const real *up, int64_t M, int64_t F,
                           int64_t ld) {
    const int64_t n = M * F;
    PAR for (int64_t i = 0; i < n; i++) {
        const int64_t j = at(i, F, ld);
        const real g = gate[j];
        h[i] = g * sigmoid(g) * up[j];
    }
}

void K(swiglu_backward_cpu)(real *dgate, real *dup, const real *dh, const real *gate,
                            const real *up, int64_t M, int64_t F, int64_t ld) {
    const int64_t n = M * F;
    PAR for (int64_t i = 0; i < n; i++) {
        const int64_t j = at(i, F, ld);
        const real g = gate[j], s = sigmoid(g);
        if (dgate) {
            const real gy = dh[i] * up[j]; /* the gradient reaching silu's output */
            dgate[j] = gy * s * ((real)1 + g * ((real)1 - s));
        }
        if (dup) dup[j] = dh[i] * (g * s);
    }
}
