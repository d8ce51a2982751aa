/* compare kernels: declarations over real/K(), see kernels.h. Twins of kernels/cuda/compare.h's
 * compare_cuda (the same op codes). */
#ifndef ZR_COMPARE_OPS_DEFINED
#define ZR_COMPARE_OPS_DEFINED
/* Comparison ops producing u8 masks. */
enum { ZR_CMP_EQ, ZR_CMP_NE, ZR_CMP_LT, ZR_CMP_LE, ZR_CMP_GT, ZR_CMP_GE, ZR_CMP_COUNT };
#endif

/* out[i] = a (op) b as 0/1; out is contiguous with `shape`; a and b are read through strides
 * (0 where broadcast). ndim >= 1. */
void K(compare_cpu)(uint8_t *out, const real *a, const int64_t *astride, const real *b,
                    const int64_t *bstride, int ndim, const int64_t *shape, int op);
