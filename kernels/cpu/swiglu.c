/* CPU reference for the fused gated linear units h = act(gate) * up (SwiGLU: silu; GeGLU: GELU) and their
 * two input gradients. fp32 or fp64 per real.h; OpenMP over elements. The arithmetic follows
 * `gate:silu() * up` (or :gelu()) and its backward step by step (same operations, same order as
 * elementwise.c's), so in f32/f64 the two agree to rounding. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

/* Rows in parallel, each row's F elements in vector lanes (the operands' rows are ld apart: gate and
 * up may be the two halves of one packed (M, 2F) product). */
#define PAR_ROWS _Pragma("omp parallel for schedule(static) if (M * F > 32768)")

static inline real sigmoid(real x) { return (real)1 / ((real)1 + R_EXP(-x)); }
static inline real act_f(int act, real g) {
    if (act == ZR_GLU_SILU) return g * sigmoid(g);
    if (act == ZR_GLU_GELU_TANH) {
        const real c = (real)0.7978845608028654; /* sqrt(2/pi) */
        return (real)0.5 * g * ((real)1 + R_TANH(c * (g + (real)0.044715 * g * g * g)));
    }
    return (real)0.5 * g * ((real)1 + R_ERF(g * (real)0.7071067811865476));
}
/* dh * up * act'(g) (SiLU's in swiglu's order of operations) */
static inline real dgate_of(int act, real d, real u, real g) {
    if (act == ZR_GLU_SILU) {
        const real s = sigmoid(g);
        return d * u * s * ((real)1 + g * ((real)1 - s));
    }
    if (act == ZR_GLU_GELU_TANH) {
        const real c = (real)0.7978845608028654;
        const real t = R_TANH(c * (g + (real)0.044715 * g * g * g)), du = c * ((real)1 + (real)0.134145 * g * g);
        return d * u * ((real)0.5 * ((real)1 + t) + (real)0.5 * g * ((real)1 - t * t) * du);
    }
    const real cdf = (real)0.5 * ((real)1 + R_ERF(g * (real)0.7071067811865476));
    return d * u * (cdf + g * R_EXP((real)-0.5 * g * g) * (real)0.3989422804014327);
}

/* One row of each pass for the activation act, inlined with act a constant (the callers switch on it per row), so
 * that every loop is specialised and vectorised; SiLU's backward takes its sigmoid once for both gradients, as
 * swiglu's always did. */
static inline __attribute__((always_inline)) void fwd_row(int act, real *hr, const real *gr, const real *ur, int64_t F) {
    _Pragma("omp simd")
    for (int64_t f = 0; f < F; f++) hr[f] = act_f(act, gr[f]) * ur[f];
}
static inline __attribute__((always_inline)) void bwd_row(int act, real *dgr, real *dur, const real *dhr, const real *gr,
                                                         const real *ur, int64_t F) {
    if (dgr && dur) {
        _Pragma("omp simd")
        for (int64_t f = 0; f < F; f++) {
            const real g = gr[f], u = ur[f], d = dhr[f];
            if (act == ZR_GLU_SILU) {
                const real s = sigmoid(g);
                dgr[f] = d * u * s * ((real)1 + g * ((real)1 - s)); /* dh * up: the gradient at silu's output */
                dur[f] = d * (g * s);
            } else {
                dgr[f] = dgate_of(act, d, u, g);
                dur[f] = d * act_f(act, g);
            }
        }
    } else if (dgr) {
        _Pragma("omp simd")
        for (int64_t f = 0; f < F; f++) dgr[f] = dgate_of(act, dhr[f], ur[f], gr[f]);
    } else if (dur) {
        _Pragma("omp simd")
        for (int64_t f = 0; f < F; f++) dur[f] = dhr[f] * act_f(act, gr[f]);
    }
}

void K(glu_forward_cpu)(real *h, const real *gate, const real *up, int64_t M, int64_t F, int64_t ld, int act) {
    PAR_ROWS for (int64_t m = 0; m < M; m++) {
        const real *gr = gate + m * ld, *ur = up + m * ld;
        real *hr = h + m * F;
        switch (act) {
        case ZR_GLU_SILU: fwd_row(ZR_GLU_SILU, hr, gr, ur, F); break;
        case ZR_GLU_GELU_TANH: fwd_row(ZR_GLU_GELU_TANH, hr, gr, ur, F); break;
        default: fwd_row(ZR_GLU_GELU, hr, gr, ur, F);
        }
    }
}

void K(glu_backward_cpu)(real *dgate, real *dup, const real *dh, const real *gate, const real *up, int64_t M,
                         int64_t F, int64_t ld, int act) {
    /* (each element's inputs are read before its outputs are written, so either may be written over its input) */
    PAR_ROWS for (int64_t m = 0; m < M; m++) {
        const real *gr = gate + m * ld, *ur = up + m * ld, *dhr = dh + m * F;
        real *dgr = dgate ? dgate + m * ld : 0, *dur = dup ? dup + m * ld : 0;
        switch (act) {
        case ZR_GLU_SILU: bwd_row(ZR_GLU_SILU, dgr, dur, dhr, gr, ur, F); break;
        case ZR_GLU_GELU_TANH: bwd_row(ZR_GLU_GELU_TANH, dgr, dur, dhr, gr, ur, F); break;
        default: bwd_row(ZR_GLU_GELU, dgr, dur, dhr, gr, ur, F);
        }
    }
}
