/* CPU reference for causal grouped-query attention, flash-attention style: the forward keeps only
 * the output and a logsumexp per query row, and the backward recomputes the probabilities.
 * fp32 or fp64 per real.h; OpenMP over (batch, query head). */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

/* (simd: the sum in vector lanes, then across them: one fixed order, not the threads') */
static inline real dot(const real *a, const real *b, int64_t n) {
    real s = 0;
    _Pragma("omp simd reduction(+ : s)")
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void K(sdpa_causal_forward_cpu)(real *o, real *lse, const real *q, const real *k, const real *v,
                                const int32_t *seg, real *work, int64_t B, int64_t Hq, int64_t Hkv,
                                int64_t T, int64_t Dh, double scale) {
    int64_t group = Hq / Hkv;
    real sc = (real)scale;
    _Pragma("omp parallel for schedule(dynamic, 1)")
    for (int64_t bh = 0; bh < B * Hq; bh++) {
        int64_t b = bh / Hq, h = bh % Hq, kvh = b * Hkv + h / group;
        const real *kb = k + kvh * T * Dh, *vb = v + kvh * T * Dh;
        real *p = work + bh * T;
        for (int64_t i = 0; i < T; i++) {
            const real *qi = q + (bh * T + i) * Dh;
            real *oi = o + (bh * T + i) * Dh;
            int64_t j0 = seg ? seg[b * T + i] : 0; /* the first key of query i's sequence */
            real m = -REAL_MAX;
            for (int64_t j = j0; j <= i; j++) {
                p[j] = sc * dot(qi, kb + j * Dh, Dh);
                if (p[j] > m) m = p[j];
            }
            double sum = 0;
            for (int64_t j = j0; j <= i; j++) {
                p[j] = R_EXP(p[j] - m);
                sum += p[j];
            }
            for (int64_t d = 0; d < Dh; d++) oi[d] = 0;
            for (int64_t j = j0; j <= i; j++) {
                const real *vj = vb + j * Dh;
                real pj = p[j];
                _Pragma("omp simd")
                for (int64_t d = 0; d < Dh; d++) oi[d] += pj * vj[d];
            }
            real inv = (real)(1.0 / sum);
            for (int64_t d = 0; d < Dh; d++) oi[d] *= inv;
            lse[bh * T + i] = m + (real)log(sum);
        }
    }
}

/* With p_ij = exp(s_ij - lse_i), s = scale q k^T:  dv_j = sum_i p_ij do_i,
 * ds_ij = p_ij (do_i . v_j - do_i . o_i),  dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i. */
void K(sdpa_causal_backward_cpu)(real *dq, real *dk, real *dv, real *dk_work, real *dv_work,
                                 const real *dout, const real *q, const real *k, const real *v,
                                 const real *o, const real *lse, const int32_t *seg, int64_t B,
                                 int64_t Hq, int64_t Hkv, int64_t T, int64_t Dh, double scale) {
    int64_t group = Hq / Hkv;
    real sc = (real)scale;
    /* per query head: its own dk/dv slice (in place when there is no sharing) */
    real *dkh = group == 1 ? dk : dk_work, *dvh = group == 1 ? dv : dv_work;
    _Pragma("omp parallel for schedule(dynamic, 1)")
    for (int64_t bh = 0; bh < B * Hq; bh++) {
        int64_t b = bh / Hq, h = bh % Hq, kvh = b * Hkv + h / group;
        const real *kb = k + kvh * T * Dh, *vb = v + kvh * T * Dh;
        real *dkb = dkh + bh * T * Dh, *dvb = dvh + bh * T * Dh;
        for (int64_t x = 0; x < T * Dh; x++) dkb[x] = dvb[x] = 0;
        for (int64_t i = 0; i < T; i++) {
            const real *qi = q + (bh * T + i) * Dh, *gi = dout + (bh * T + i) * Dh;
            real *dqi = dq + (bh * T + i) * Dh;
            real Di = dot(gi, o + (bh * T + i) * Dh, Dh), li = lse[bh * T + i];
            for (int64_t d = 0; d < Dh; d++) dqi[d] = 0;
            for (int64_t j = seg ? seg[b * T + i] : 0; j <= i; j++) {
                const real *kj = kb + j * Dh, *vj = vb + j * Dh;
                real p = R_EXP(sc * dot(qi, kj, Dh) - li);
                real ds = p * (dot(gi, vj, Dh) - Di) * sc;
                real *dkj = dkb + j * Dh, *dvj = dvb + j * Dh;
                _Pragma("omp simd") /* (the gradients' rows overlap none of the inputs) */
                for (int64_t d = 0; d < Dh; d++) {
                    dvj[d] += p * gi[d];
                    dkj[d] += ds * qi[d];
                    dqi[d] += ds * kj[d];
                }
            }
        }
    }
    if (group == 1) return;
    int64_t per = T * Dh;
    _Pragma("omp parallel for schedule(static)")
    for (int64_t bk = 0; bk < B * Hkv; bk++) {
        int64_t b = bk / Hkv, hk = bk % Hkv;
        real *dkb = dk + bk * per, *dvb = dv + bk * per;
        for (int64_t x = 0; x < per; x++) dkb[x] = dvb[x] = 0;
        for (int64_t g = 0; g < group; g++) {
            int64_t src = (b * Hq + hk * group + g) * per;
            for (int64_t x = 0; x < per; x++) {
                dkb[x] += dk_work[src + x];
                dvb[x] += dv_work[src + x];
            }
        }
    }
}
