/* CPU reference for dropout's mask application (forward and backward are the same pass).
 * fp32 or fp64 per real.h; OpenMP over elements. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

void K(dropout_apply_cpu)(real *y, const real *x, const uint8_t *mask, int64_t n, double scale) {
    real s = (real)scale;
    _Pragma("omp parallel for schedule(static) if (n > 32768)")
    for (int64_t i = 0; i < n; i++) y[i] = mask[i] ? x[i] * s : (real)0;
}
