/* CPU reference for dropout's mask application (forward and backward are the same pass).
 * fp32 or fp64 per real.h; OpenMP over elements. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

#include "../base/philox.h"

void K(dropout_apply_cpu)(real *y, const real *x, const uint8_t *mask, int64_t n, double scale) {
    real s = (real)scale;
    _Pragma("omp parallel for schedule(static) if (n > 32768)")
    for (int64_t i = 0; i < n; i++) y[i] = mask[i] ? x[i] * s : (real)0;
}

void K(dropout_philox_cpu)(real *y, const real *x, int64_t n, uint32_t thresh, double scale, uint64_t seed,
                           uint64_t off, int accumulate) {
    real s = (real)scale;
    int64_t groups = (n + 3) / 4;
    _Pragma("omp parallel for schedule(static) if (n > 32768)")
    for (int64_t c = 0; c < groups; c++) {
        zr_philox4 r = zr_philox(seed, off + (uint64_t)c);
        for (int l = 0; l < 4 && 4 * c + l < n; l++) {
            int64_t i = 4 * c + l;
            real v = (r.x[l] >> 8) < thresh ? x[i] * s : (real)0;
            y[i] = accumulate ? y[i] + v : v;
        }
    }
}
