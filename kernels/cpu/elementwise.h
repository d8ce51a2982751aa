/* Elementwise kernels: declarations over real/K(), included twice by kernels.h. */
#ifndef ZR_ELEMENTWISE_OPS_DEFINED
#define ZR_ELEMENTWISE_OPS_DEFINED
/* Unary ops; p is the op's scalar parameter where it has one. */
enum {
    ZR_UN_NEG, ZR_UN_EXP, ZR_UN_LOG, ZR_UN_SQRT, ZR_UN_RSQRT, ZR_UN_RELU, ZR_UN_GELU_TANH,
    ZR_UN_GELU_ERF, ZR_UN_SILU, ZR_UN_SIGMOID, ZR_UN_TANH, ZR_UN_POW, /* x^p */
    ZR_UN_ABS, ZR_UN_SQUARE, ZR_UN_RECIPROCAL, ZR_UN_COUNT
};
/* Binary ops with broadcasting. */
enum { ZR_BIN_ADD, ZR_BIN_SUB, ZR_BIN_MUL, ZR_BIN_DIV, ZR_BIN_MAX, ZR_BIN_MIN, ZR_BIN_COUNT };
#endif

/* y[i] = f(x[i]) over n contiguous elements. */
void K(unary_forward_cpu)(real *y, const real *x, int64_t n, int op, double p);
/* gx[i] = gy[i] * f'(x[i]); some ops use y = f(x) instead of x (either may be passed). */
void K(unary_backward_cpu)(real *gx, const real *gy, const real *x, const real *y, int64_t n, int op,
                           double p);
/* out = a (op) b; out is contiguous with `shape`; a and b are read through strides (0 where
 * broadcast). ndim >= 1. */
void K(binary_forward_cpu)(real *out, const real *a, const int64_t *astride, const real *b,
                           const int64_t *bstride, int ndim, const int64_t *shape, int op);
/* y = alpha * x + beta (scalars), contiguous. */
void K(affine_forward_cpu)(real *y, const real *x, int64_t n, double alpha, double beta);
/* y += alpha * x, contiguous. */
void K(axpy_cpu)(real *y, const real *x, int64_t n, double alpha);
/* out = cond ? a : b with broadcasting strides like binary_forward_cpu (cond is u8). */
void K(where_forward_cpu)(real *out, const uint8_t *cond, const int64_t *cstride, const real *a,
                          const int64_t *astride, const real *b, const int64_t *bstride, int ndim,
                          const int64_t *shape);
