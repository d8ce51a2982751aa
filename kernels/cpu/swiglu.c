/* CPU reference for the fused SwiGLU h = silu(gate) * up and its two input gradients. fp32 or
 * fp64 per real.h; OpenMP over elements. The arithmetic follows `gate:silu() * up` and its
 * backward step by step (same operations, same order), so in f32/f64 the two agree to rounding. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

/* Rows in parallel, each row's F elements in vector lanes (the operands' rows are ld apart: gate and
 * up may be the two halves of one packed (M, 2F) product). */
#define PAR_ROWS _Pragma("omp parallel for schedule(static) if (M * F > 32768)")

static inline real sigmoid(real x) { return (real)1 / ((real)1 + R_EXP(-x)); }

void K(swiglu_forward_cpu)(real *h, const real *gate, const real *up, int64_t M, int64_t F,
                           int64_t ld) {
    PAR_ROWS for (int64_t m = 0; m < M; m++) {
        const real *gr = gate + m * ld, *ur = up + m * ld;
        real *hr = h + m * F;
        _Pragma("omp simd")
        for (int64_t f = 0; f < F; f++) {
            const real g = gr[f];
            hr[f] = g * sigmoid(g) * ur[f];
        }
    }
}

void K(swiglu_backward_cpu)(real *dgate, real *dup, const real *dh, const real *gate,
                            const real *up, int64_t M, int64_t F, int64_t ld) {
    /* (one loop for both gradients: each element's inputs are read before its outputs are written,
     * so either may be written over its input) */
    PAR_ROWS for (int64_t m = 0; m < M; m++) {
        const real *gr = gate + m * ld, *ur = up + m * ld, *dhr = dh + m * F;
        real *dgr = dgate ? dgate + m * ld : 0, *dur = dup ? dup + m * ld : 0;
        if (dgr && dur) {
            _Pragma("omp simd")
            for (int64_t f = 0; f < F; f++) {
                const real g = gr[f], u = ur[f], s = sigmoid(g), d = dhr[f];
                dgr[f] = d * u * s * ((real)1 + g * ((real)1 - s)); /* dh * up: the gradient at silu's output */
                dur[f] = d * (g * s);
            }
        } else if (dgr) {
            _Pragma("omp simd")
            for (int64_t f = 0; f < F; f++) {
                const real g = gr[f], s = sigmoid(g);
                dgr[f] = dhr[f] * ur[f] * s * ((real)1 + g * ((real)1 - s));
            }
        } else if (dur) {
            _Pragma("omp simd")
            for (int64_t f = 0; f < F; f++) {
                const real g = gr[f];
                dur[f] = dhr[f] * (g * sigmoid(g));
            }
        }
    }
}
