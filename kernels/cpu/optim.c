/* CPU optimizer kernels (fused AdamW, SGD with momentum): one pass over flat contiguous arrays,
 * OpenMP across threads and a branch-free inner loop the compiler vectorises. fp32 or fp64 per
 * real.h; bf16 gradients are widened in registers. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

#include "../base/dtype.h" /* zr_bf16_to_f32 */

#define PAR_N 65536 /* below this, threads cost more than they save */

/* The loop body is shared by the grad-dtype variants. */
#define ADAMW_LOOP(GET_G)                                                                          \
    _Pragma("omp parallel for simd schedule(static) if (n > PAR_N)")                              \
    for (int64_t i = 0; i < n; i++) {                                                              \
        real gi = GET_G;                                                                           \
        real mi = m[i] + omb1 * (gi - m[i]);                                                       \
        real vi = b2 * v[i] + omb2 * gi * gi;                                                      \
        m[i] = mi;                                                                                 \
        v[i] = vi;                                                                                 \
        p[i] = p[i] * dec - ss * mi / (R_SQRT(vi) / bc2 + ep);                                     \
    }

void K(adamw_step_cpu)(real *p, const void *g, int g_kind, real *m, real *v, int64_t n,
                       const zr_adamw_config *c, int64_t step) {
    const double bc1 = 1 - pow(c->beta1, (double)step), bc2_sqrt = sqrt(1 - pow(c->beta2, (double)step));
    const real dec = (real)(1 - c->lr * c->weight_decay), omb1 = (real)(1 - c->beta1), b2 = (real)c->beta2;
    const real omb2 = (real)(1 - c->beta2), ep = (real)c->eps, ss = (real)(c->lr / bc1), bc2 = (real)bc2_sqrt;
    if (g_kind == ZR_OPTIM_GRAD_BF16) {
        const uint16_t *gb = g;
        ADAMW_LOOP((real)zr_bf16_to_f32(gb[i]))
    } else {
        const real *gr = g;
        ADAMW_LOOP(gr[i])
    }
}

void K(sgd_step_cpu)(real *p, const real *g, real *buf, int64_t n, double lr, double momentum,
                     double dampening, double weight_decay, int nesterov, int first) {
    const real lr_ = (real)lr, mo = (real)momentum, damp = (real)(1 - dampening);
    const real wd = (real)weight_decay;
    if (!buf) {
        _Pragma("omp parallel for simd schedule(static) if (n > PAR_N)")
        for (int64_t i = 0; i < n; i++) p[i] -= lr_ * (g[i] + wd * p[i]);
        return;
    }
    _Pragma("omp parallel for simd schedule(static) if (n > PAR_N)")
    for (int64_t i = 0; i < n; i++) {
        real d = g[i] + wd * p[i];
        real b = first ? d : mo * buf[i] + damp * d;
        buf[i] = b;
        p[i] -= lr_ * (nesterov ? d + mo * b : b);
    }
}
