/* CPU reference for elementwise ops (unary, binary with broadcasting, affine, axpy, where).
 * fp32 or fp64 per real.h; OpenMP over elements. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

#define PAR _Pragma("omp parallel for schedule(static) if (n > 32768)")
/* The unary ops: y[i] from x[i] alone (in place too), so in vector lanes (libmvec for exp, log, tanh, erf) */
#define PAR_SIMD _Pragma("omp parallel for simd schedule(static) if (n > 32768)")

static inline real gelu_tanh(real x) {
    const real c = (real)0.7978845608028654; /* sqrt(2/pi) */
    return (real)0.5 * x * ((real)1 + R_TANH(c * (x + (real)0.044715 * x * x * x)));
}
static inline real gelu_tanh_grad(real x) {
    const real c = (real)0.7978845608028654;
    real u = c * (x + (real)0.044715 * x * x * x), t = R_TANH(u);
    real du = c * ((real)1 + (real)0.134145 * x * x);
    return (real)0.5 * ((real)1 + t) + (real)0.5 * x * ((real)1 - t * t) * du;
}
static inline real sigmoid(real x) { return (real)1 / ((real)1 + R_EXP(-x)); }

void K(unary_forward_cpu)(real *y, const real *x, int64_t n, int op, double p) {
    real rp = (real)p;
    switch (op) {
    case ZR_UN_NEG: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = -x[i]; break;
    case ZR_UN_EXP: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = R_EXP(x[i]); break;
    case ZR_UN_LOG: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = R_LOG(x[i]); break;
    case ZR_UN_SQRT: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = R_SQRT(x[i]); break;
    case ZR_UN_RSQRT: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = (real)1 / R_SQRT(x[i]); break;
    case ZR_UN_RELU: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : 0; break;
    case ZR_UN_GELU_TANH: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = gelu_tanh(x[i]); break;
    case ZR_UN_GELU_ERF:
        PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] =
            (real)0.5 * x[i] * ((real)1 + R_ERF(x[i] * (real)0.7071067811865476));
        break;
    case ZR_UN_SILU: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = x[i] * sigmoid(x[i]); break;
    case ZR_UN_SIGMOID: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = sigmoid(x[i]); break;
    case ZR_UN_TANH: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = R_TANH(x[i]); break;
    case ZR_UN_POW: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = R_POW(x[i], rp); break;
    case ZR_UN_ABS: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = R_FABS(x[i]); break;
    case ZR_UN_SQUARE: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = x[i] * x[i]; break;
    case ZR_UN_RECIPROCAL: PAR_SIMD for (int64_t i = 0; i < n; i++) y[i] = (real)1 / x[i]; break;
    default: break;
    }
}

void K(unary_backward_cpu)(real *gx, const real *gy, const real *x, const real *y, int64_t n, int op,
                           double p) {
    real rp = (real)p;
    switch (op) {
    case ZR_UN_NEG: PAR_SIMD for (int64_t i = 0; i < n; i++) gx[i] = -gy[i]; break;
    case ZR_UN_EXP: PAR_SIMD for (int64_t i = 0; i < n; i++) gx[i] = gy[i] * y[i]; break;
    case ZR_UN_LOG: PAR_SIMD for (int64_t i = 0; i < n; i++) gx[i] = gy[i] / x[i]; break;
    case ZR_UN_SQRT: PAR_SIMD for (int64_t i = 0; i < n; i++) gx[i] = gy[i] * (real)0.5 / y[i]; break;
    case ZR_UN_RSQRT:
        PAR_SIMD for (int64_t i = 0; i < n; i++) gx[i] = gy[i] * (real)-0.5 * y[i] * y[i] * y[i];
        break;
    case ZR_UN_RELU: PAR_SIMD for (int64_t i = 0; i < n; i++) gx[i] = x[i] > 0 ? gy[i] : 0; break;
    case ZR_UN_GELU_TANH: PAR_SIMD for (int64_t i = 0; i < n; i++) gx[i] = gy[i] * gelu_tanh_grad(x[i]); break;
    case ZR_UN_GELU_ERF:
        PAR_SIMD for (int64_t i = 0; i < n; i++) {
            real cdf = (real)0.5 * ((real)1 + R_ERF(x[i] * (real)0.7071067811865476));
            real pdf = R_EXP((real)-0.5 * x[i] * x[i]) * (real)0.3989422804014327;
            gx[i] = gy[i] * (cdf + x[i] * pdf);
        }
        break;
    case ZR_UN_SILU:
        PAR_SIMD for (int64_t i = 0; i < n; i++) {
            real s = sigmoid(x[i]);
            gx[i] = gy[i] * s * ((real)1 + x[i] * ((real)1 - s));
        }
        break;
    case ZR_UN_SIGMOID: PAR_SIMD for (int64_t i = 0; i < n; i++) gx[i] = gy[i] * y[i] * ((real)1 - y[i]); break;
    case ZR_UN_TANH: PAR_SIMD for (int64_t i = 0; i < n; i++) gx[i] = gy[i] * ((real)1 - y[i] * y[i]); break;
    case ZR_UN_POW:
        PAR_SIMD for (int64_t i = 0; i < n; i++) gx[i] = gy[i] * rp * R_POW(x[i], rp - (real)1);
        break;
    case ZR_UN_ABS:
        PAR_SIMD for (int64_t i = 0; i < n; i++) gx[i] = x[i] > 0 ? gy[i] : x[i] < 0 ? -gy[i] : 0;
        break;
    case ZR_UN_SQUARE: PAR_SIMD for (int64_t i = 0; i < n; i++) gx[i] = gy[i] * (real)2 * x[i]; break;
    case ZR_UN_RECIPROCAL: PAR_SIMD for (int64_t i = 0; i < n; i++) gx[i] = -gy[i] * y[i] * y[i]; break;
    default: break;
    }
}

static inline real bin(real a, real b, int op) {
    switch (op) {
    case ZR_BIN_ADD: return a + b;
    case ZR_BIN_SUB: return a - b;
    case ZR_BIN_MUL: return a * b;
    case ZR_BIN_DIV: return a / b;
    case ZR_BIN_MAX: return a > b ? a : b;
    default: return a < b ? a : b;
    }
}

void K(binary_forward_cpu)(real *out, const real *a, const int64_t *astride, const real *b,
                           const int64_t *bstride, int ndim, const int64_t *shape, int op) {
    int64_t inner = shape[ndim - 1], outer = 1;
    for (int d = 0; d < ndim - 1; d++) outer *= shape[d];
    int64_t as = astride[ndim - 1], bs = bstride[ndim - 1];
#pragma omp parallel for schedule(static) if (outer * inner > 32768)
    for (int64_t o = 0; o < outer; o++) {
        int64_t ao = 0, bo = 0, rem = o;
        for (int d = ndim - 2; d >= 0; d--) {
            int64_t idx = rem % shape[d];
            rem /= shape[d];
            ao += idx * astride[d];
            bo += idx * bstride[d];
        }
        const real *ap = a + ao, *bp = b + bo;
        real *op_ = out + o * inner;
        if (as == 1 && bs == 1) {
            switch (op) { /* let the compiler vectorise the common cases */
            case ZR_BIN_ADD: for (int64_t i = 0; i < inner; i++) op_[i] = ap[i] + bp[i]; break;
            case ZR_BIN_MUL: for (int64_t i = 0; i < inner; i++) op_[i] = ap[i] * bp[i]; break;
            default: for (int64_t i = 0; i < inner; i++) op_[i] = bin(ap[i], bp[i], op);
            }
        } else
            for (int64_t i = 0; i < inner; i++) op_[i] = bin(ap[i * as], bp[i * bs], op);
    }
}

void K(affine_forward_cpu)(real *y, const real *x, int64_t n, double alpha, double beta) {
    real ra = (real)alpha, rb = (real)beta;
    PAR for (int64_t i = 0; i < n; i++) y[i] = ra * x[i] + rb;
}

void K(axpy_cpu)(real *y, const real *x, int64_t n, double alpha) {
    real ra = (real)alpha;
    PAR for (int64_t i = 0; i < n; i++) y[i] += ra * x[i];
}

void K(where_forward_cpu)(real *out, const uint8_t *cond, const int64_t *cstride, const real *a,
                          const int64_t *astride, const real *b, const int64_t *bstride, int ndim,
                          const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    PAR for (int64_t i = 0; i < n; i++) {
        int64_t co = 0, ao = 0, bo = 0, rem = i;
        for (int d = ndim - 1; d >= 0; d--) {
            int64_t idx = rem % shape[d];
            rem /= shape[d];
            co += idx * cstride[d];
            ao += idx * astride[d];
            bo += idx * bstride[d];
        }
        out[i] = cond[co] ? a[ao] : b[bo];
    }
}
