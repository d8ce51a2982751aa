/* CPU reference for comparisons (u8 masks, operands read through broadcast strides).
 * fp32 or fp64 per real.h; OpenMP over elements. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

void K(compare_cpu)(uint8_t *out, const real *a, const int64_t *astride, const real *b,
                    const int64_t *bstride, int ndim, const int64_t *shape, int op) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    _Pragma("omp parallel for schedule(static) if (n > 32768)")
    for (int64_t i = 0; i < n; i++) {
        int64_t ao = 0, bo = 0, rem = i;
        for (int d = ndim - 1; d >= 0; d--) {
            int64_t idx = rem % shape[d];
            rem /= shape[d];
            ao += idx * astride[d];
            bo += idx * bstride[d];
        }
        real x = a[ao], y = b[bo];
        int r = 0;
        switch (op) {
        case ZR_CMP_EQ: r = x == y; break;
        case ZR_CMP_NE: r = x != y; break;
        case ZR_CMP_LT: r = x < y; break;
        case ZR_CMP_LE: r = x <= y; break;
        case ZR_CMP_GT: r = x > y; break;
        case ZR_CMP_GE: r = x >= y; break;
        default: break;
        }
        out[i] = (uint8_t)r;
    }
}
