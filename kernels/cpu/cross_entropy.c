/* CPU reference for the fused cross-entropy forward and backward (logsumexp per row; softmax -
 * onehot recomputed in backward, with label smoothing). fp32 or fp64 per real.h; OpenMP over
 * rows. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

/* logsumexp of one row xi (c): its max, then the sum of exp(x - max) (in vector lanes: max is exact in any order; a
 * NaN logit makes the loss NaN either way). */
static inline real row_logsumexp(const real *xi, int64_t c) {
    real mx = -REAL_MAX, sum = 0;
    _Pragma("omp simd reduction(max : mx)")
    for (int64_t j = 0; j < c; j++) mx = xi[j] > mx ? xi[j] : mx;
    if (mx == -REAL_MAX) mx = 0;
    _Pragma("omp simd reduction(+ : sum)")
    for (int64_t j = 0; j < c; j++) sum += R_EXP(xi[j] - mx);
    return mx + R_LOG(sum);
}

void K(cross_entropy_forward_cpu)(real *loss, real *lse, const real *x, const int64_t *tgt,
                                  int64_t n, int64_t c, int64_t ignore_index, double eps) {
    real re = (real)eps;
#pragma omp parallel for schedule(static) if (n * c > 32768)
    for (int64_t i = 0; i < n; i++) {
        const real *xi = x + i * c;
        real tot = 0, l = row_logsumexp(xi, c);
        lse[i] = l;
        if (tgt[i] == ignore_index) {
            loss[i] = 0;
            continue;
        }
        if (re != 0) {
            _Pragma("omp simd reduction(+ : tot)")
            for (int64_t j = 0; j < c; j++) tot += xi[j];
        }
        loss[i] = l - ((real)1 - re) * xi[tgt[i]] - re / (real)c * tot;
    }
}

/* Rows of the gradient over the classes v0 .. v0 + vc - 1 of vall: s_i * (softmax - eps / vall - (1 - eps) onehot),
 * s_i = scale * (g ? g[i] : 1); 0 on ignored rows. gx may be x (in place). */
static inline void grad_rows(real *gx, const real *x, const real *lse, const int64_t *tgt, const real *g, double scale,
                             int64_t n, int64_t vc, int64_t v0, int64_t vall, int64_t ignore_index, double eps) {
    real off = (real)(eps / (double)vall), on = (real)(1 - eps);
#pragma omp parallel for schedule(static) if (n * vc > 32768)
    for (int64_t i = 0; i < n; i++) {
        real *gi = gx + i * vc;
        const real *xi = x + i * vc;
        if (tgt[i] == ignore_index) {
            for (int64_t j = 0; j < vc; j++) gi[j] = 0;
            continue;
        }
        real s = (real)scale * (g ? g[i] : (real)1), l = lse[i];
        _Pragma("omp simd")
        for (int64_t j = 0; j < vc; j++) gi[j] = s * (R_EXP(xi[j] - l) - off);
        if (tgt[i] >= v0 && tgt[i] < v0 + vc) gi[tgt[i] - v0] -= s * on;
    }
}

void K(cross_entropy_backward_cpu)(real *gx, const real *x, const real *lse, const int64_t *tgt,
                                   const real *g, double scale, int64_t n, int64_t c,
                                   int64_t ignore_index, double eps) {
    grad_rows(gx, x, lse, tgt, g, scale, n, c, 0, c, ignore_index, eps);
}

/* Over one row xi (c) with its max mx: *s = sum of exp(x - mx), *t = sum of exp(x - mx) (x - mx) (the entropy is
 * log s - t / s: no cancellation of two large terms). */
static inline void row_entropy_sums(const real *xi, int64_t c, real mx, real *sp, real *tp) {
    real s = 0, t = 0;
    _Pragma("omp simd reduction(+ : s, t)")
    for (int64_t j = 0; j < c; j++) {
        real e = R_EXP(xi[j] - mx);
        s += e;
        t += e * (xi[j] - mx);
    }
    *sp = s, *tp = t;
}

void K(logits_stats_cpu)(real *entropy, int64_t *argmax, const real *x, int64_t n, int64_t c) {
    K(reduce_max_rows_cpu)(entropy, argmax, x, n, c); /* each row's max (torch's argmax), then its entropy */
#pragma omp parallel for schedule(static) if (n * c > 32768)
    for (int64_t i = 0; i < n; i++) {
        real s, t;
        row_entropy_sums(x + i * c, c, entropy[i], &s, &t);
        entropy[i] = R_LOG(s) - t / s;
    }
}

void K(lce_chunk_stats_cpu)(real *lse, real *xt, real *tot, const real *x, const int64_t *tgt, int64_t n, int64_t vc,
                            int64_t v0, int64_t ignore_index, int ls) {
#pragma omp parallel for schedule(static) if (n * vc > 32768)
    for (int64_t i = 0; i < n; i++) {
        if (tgt[i] == ignore_index) continue;
        const real *xi = x + i * vc;
        real t = 0, z = row_logsumexp(xi, vc), a = lse[i];
        if (a == -(real)INFINITY) lse[i] = z;
        else {
            real m = a > z ? a : z;
            lse[i] = m + R_LOG(R_EXP(a - m) + R_EXP(z - m));
        }
        if (tgt[i] >= v0 && tgt[i] < v0 + vc) xt[i] = xi[tgt[i] - v0];
        if (ls) {
            _Pragma("omp simd reduction(+ : t)")
            for (int64_t j = 0; j < vc; j++) t += xi[j];
            tot[i] += t;
        }
    }
}

void K(lce_chunk_grad_cpu)(real *gx, const real *x, const real *lse, const int64_t *tgt, double scale, int64_t n,
                           int64_t vc, int64_t v0, int64_t vall, int64_t ignore_index, double eps) {
    grad_rows(gx, x, lse, tgt, (const real *)0, scale, n, vc, v0, vall, ignore_index, eps);
}

void K(lce_chunk_token_stats_cpu)(real *m, real *s, real *t, real *bv, int64_t *bi, const real *x, const int64_t *tgt,
                                  int64_t n, int64_t vc, int64_t v0, int64_t ignore_index) {
#pragma omp parallel for schedule(static) if (n * vc > 32768)
    for (int64_t i = 0; i < n; i++) {
        if (tgt[i] == ignore_index || vc == 0) continue;
        const real *xi = x + i * vc;
        real mc;
        int64_t ic;
        K(reduce_max_rows_cpu)(&mc, &ic, xi, 1, vc); /* the slice's max and its first index */
        real sc, tc;
        row_entropy_sums(xi, vc, mc, &sc, &tc);
        if (s[i] == 0) {
            m[i] = mc, s[i] = sc, t[i] = tc;
        } else {
            real mn = m[i] > mc ? m[i] : mc, ea = R_EXP(m[i] - mn), eb = R_EXP(mc - mn);
            t[i] = ea * (t[i] + (m[i] - mn) * s[i]) + eb * (tc + (mc - mn) * sc);
            s[i] = ea * s[i] + eb * sc;
            m[i] = mn;
        }
        if (v0 == 0 || mc > bv[i]) bv[i] = mc, bi[i] = v0 + ic;
    }
}
