/* CPU causal grouped-query attention, flash-attention style: the forward keeps only the output and
 * a logsumexp per query row, and the backward recomputes the probabilities; both walk TB x TB tiles
 * of queries x keys, skipping fully masked ones (masked entries are zeros in the tile products, so
 * an inf or NaN in a masked key's row can reach its tile's rows). fp32 or fp64 per real.h; OpenMP
 * over (batch, query head), each task's sums in one order: the same bits whatever the threads. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

#include <stddef.h>

/* A tile's queries and keys: a row of its scores is 4 (f32) or 8 (f64) AVX2 vectors, and a tile
 * with its rows of q, k, v stays in L1. */
#define TB 32

/* (simd: the sum in vector lanes, then across them: one fixed order, not the threads') */
static inline real dot(const real *a, const real *b, int64_t n) {
    real s = 0;
    _Pragma("omp simd reduction(+ : s)")
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* xt (n, TB) = the first nc rows of x (nc, n) transposed: the keys (or values) of a tile laid out
 * for tile_scores. Columns past nc are zero (their scores are masked, but computed). */
static void transpose_tile(real *xt, const real *x, int nc, int64_t n) {
    for (int c = 0; c < TB; c++)
        for (int64_t d = 0; d < n; d++) xt[d * TB + c] = c < nc ? x[c * n + d] : 0;
}

/* Rows of a tile computed together: RB rows of TB sums are 12 (f32: 3 rows) or 8 (f64: 1 row) of
 * the 16 AVX2 registers, enough independent chains to hide the latency of a fused multiply-add. */
#define RB (384 / (TB * (int)sizeof(real)))

/* s (nr, TB) = a (nr, n) bt (n, TB): a tile's scores q k^T (or do v^T). */
static void tile_scores(real *s, const real *a, const real *bt, int nr, int64_t n) {
    for (int r0 = 0; r0 < nr; r0 += RB) {
        real acc[RB][TB] = {{0}};
        const real *ar[RB];
        for (int u = 0; u < RB; u++)
            ar[u] = a + (r0 + u < nr ? r0 + u : nr - 1) * n; /* (past nr: unused) */
        for (int64_t d = 0; d < n; d++)
            for (int u = 0; u < RB; u++) {
                real x = ar[u][d];
                _Pragma("omp simd")
                for (int c = 0; c < TB; c++) acc[u][c] += x * bt[d * TB + c];
            }
        for (int u = 0; u < RB && r0 + u < nr; u++)
            for (int c = 0; c < TB; c++) s[(r0 + u) * TB + c] = acc[u][c];
    }
}

/* c (mn, n) += A b with b (kn, n) and A the (TB, TB) tile a (rows: queries, columns: keys) or, with
 * keys set, its transpose: a tile's products with value, key or query rows, RB rows of TB columns
 * at a time. Each RB rows sum only the x where A may be nonzero: key <= query + off (i0 - j0). */
static void tile_acc(real *c, const real *a, int keys, const real *b, int mn, int kn, int64_t n,
                     int64_t off) {
    int64_t am = keys ? 1 : TB, ax = keys ? TB : 1;
    for (int m0 = 0; m0 < mn; m0 += RB) {
        int64_t x0 = keys && m0 > off ? m0 - off : 0,
                x1 = !keys && m0 + RB + off < kn ? m0 + RB + off : kn;
        int64_t d0 = 0;
        const real *ar[RB];
        for (int u = 0; u < RB; u++)
            ar[u] = a + (m0 + u < mn ? m0 + u : mn - 1) * am; /* (past mn: unused) */
        for (; d0 + TB <= n; d0 += TB) {
            real acc[RB][TB];
            for (int u = 0; u < RB; u++)
                for (int w = 0; w < TB; w++)
                    acc[u][w] = m0 + u < mn ? c[(m0 + u) * n + d0 + w] : 0;
            for (int64_t x = x0; x < x1; x++) {
                const real *bx = b + x * n + d0;
                for (int u = 0; u < RB; u++) {
                    real y = ar[u][x * ax];
                    _Pragma("omp simd")
                    for (int w = 0; w < TB; w++) acc[u][w] += y * bx[w];
                }
            }
            for (int u = 0; u < RB && m0 + u < mn; u++)
                for (int w = 0; w < TB; w++) c[(m0 + u) * n + d0 + w] = acc[u][w];
        }
        for (int u = 0; u < RB && m0 + u < mn; u++) /* the last n % TB columns */
            for (int64_t x = x0; x < x1; x++) {
                real y = ar[u][x * ax], *cm = c + (m0 + u) * n;
                const real *bx = b + x * n;
                _Pragma("omp simd")
                for (int64_t d = d0; d < n; d++) cm[d] += y * bx[d];
            }
    }
}

/* For the tile of queries i0 .. i0 + nr - 1 and keys j0 .. j0 + nc - 1, the columns [c0[r], c1[r])
 * that query i0 + r sees: its sequence's keys (from seg's lo, else 0) up to itself. 0: none sees
 * any key of the tile. */
static int tile_spans(int *c0, int *c1, const int32_t *lo, int64_t i0, int nr, int64_t j0, int nc) {
    int any = 0;
    for (int r = 0; r < nr; r++) {
        int64_t a = (lo ? lo[i0 + r] : 0) - j0, z = i0 + r - j0 + 1;
        c0[r] = a < 0 ? 0 : a > nc ? nc : (int)a;
        c1[r] = z < c0[r] ? c0[r] : z > nc ? nc : (int)z;
        any |= c0[r] < c1[r];
    }
    return any;
}

/* Online softmax over key tiles, each key tile transposed once for all the query tiles after it:
 * per query row the running max (kept in lse) and sum (in work) rescale the output rows in o. */
void K(sdpa_causal_forward_cpu)(real *o, real *lse, const real *q, const real *k, const real *v,
                                const int32_t *seg, real *work, int64_t B, int64_t Hq, int64_t Hkv,
                                int64_t T, int64_t Dh, double scale) {
    int64_t group = Hq / Hkv;
    real sc = (real)scale;
    _Pragma("omp parallel for schedule(dynamic, 1)")
    for (int64_t bh = 0; bh < B * Hq; bh++) {
        int64_t b = bh / Hq, h = bh % Hq, kvh = b * Hkv + h / group;
        const real *kb = k + kvh * T * Dh, *vb = v + kvh * T * Dh, *qb = q + bh * T * Dh;
        const int32_t *lo = seg ? seg + b * T : NULL;
        real *ob = o + bh * T * Dh, *m = lse + bh * T, *l = work + bh * T;
        /* (Dh, TB) keys transposed (on the stack: 64 KiB at Dh 256 in f64; + 1: never zero-sized);
         * (TB, TB) scores, then probabilities */
        real kt[Dh * TB + 1], s[TB * TB];
        int c0[TB], c1[TB];
        for (int64_t x = 0; x < T * Dh; x++) ob[x] = 0;
        for (int64_t i = 0; i < T; i++) m[i] = -REAL_MAX, l[i] = 0;
        for (int64_t j0 = 0; j0 < T; j0 += TB) {
            int nc = T - j0 < TB ? (int)(T - j0) : TB;
            transpose_tile(kt, kb + j0 * Dh, nc, Dh);
            for (int64_t i0 = j0; i0 < T; i0 += TB) {
                int nr = T - i0 < TB ? (int)(T - i0) : TB;
                if (!tile_spans(c0, c1, lo, i0, nr, j0, nc)) continue;
                tile_scores(s, qb + i0 * Dh, kt, nr, Dh);
                for (int r = 0; r < nr; r++) {
                    real *sr = s + r * TB, mx = m[i0 + r], sum = 0;
                    int a = c0[r], z = c1[r];
                    _Pragma("omp simd reduction(max : mx)")
                    for (int c = 0; c < TB; c++) {
                        real x = ((c >= a) & (c < z)) ? sc * sr[c] : -REAL_MAX;
                        mx = x > mx ? x : mx;
                    }
                    /* exp of every column (libmvec's, in lanes: real.h), then the mask: a call
                     * under a condition would stay scalar */
                    _Pragma("omp simd")
                    for (int c = 0; c < TB; c++) sr[c] = R_EXP(sc * sr[c] - mx);
                    _Pragma("omp simd reduction(+ : sum)")
                    for (int c = 0; c < TB; c++) {
                        sr[c] = ((c >= a) & (c < z)) ? sr[c] : 0;
                        sum += sr[c];
                    }
                    if (mx > m[i0 + r]) { /* a new max: rescale what the row has so far */
                        real f = R_EXP(m[i0 + r] - mx), *orow = ob + (i0 + r) * Dh;
                        for (int64_t d = 0; d < Dh; d++) orow[d] *= f;
                        l[i0 + r] *= f;
                        m[i0 + r] = mx;
                    }
                    l[i0 + r] += sum;
                }
                tile_acc(ob + i0 * Dh, s, 0, vb + j0 * Dh, nr, nc, Dh, i0 - j0);
            }
        }
        for (int64_t i = 0; i < T; i++) { /* every query sees itself: l >= 1 */
            real inv = 1 / l[i];
            for (int64_t d = 0; d < Dh; d++) ob[i * Dh + d] *= inv;
            m[i] += R_LOG(l[i]);
        }
    }
}

/* With p_ij = exp(s_ij - lse_i), s = scale q k^T:  dv_j = sum_i p_ij do_i,
 * ds_ij = p_ij (do_i . v_j - do_i . o_i),  dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i.
 * Per key tile (keys and values transposed once), each query tile from the diagonal on: the tile's
 * p and ds, then its parts of dv, dk (the key tile's rows) and dq (the query tile's rows). */
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
        const real *kb = k + kvh * T * Dh, *vb = v + kvh * T * Dh, *qb = q + bh * T * Dh;
        const real *gb = dout + bh * T * Dh, *ob = o + bh * T * Dh, *lb = lse + bh * T;
        const int32_t *lo = seg ? seg + b * T : NULL;
        real *dqb = dq + bh * T * Dh, *dkb = dkh + bh * T * Dh, *dvb = dvh + bh * T * Dh;
        /* (Dh, TB) keys and values transposed (as in the forward); (TB, TB) p; do v^T, then ds */
        real kt[Dh * TB + 1], vt[Dh * TB + 1], p[TB * TB], ds[TB * TB];
        int c0[TB], c1[TB];
        for (int64_t x = 0; x < T * Dh; x++) dqb[x] = dkb[x] = dvb[x] = 0;
        for (int64_t j0 = 0; j0 < T; j0 += TB) {
            int nc = T - j0 < TB ? (int)(T - j0) : TB;
            transpose_tile(kt, kb + j0 * Dh, nc, Dh);
            transpose_tile(vt, vb + j0 * Dh, nc, Dh);
            for (int64_t i0 = j0; i0 < T; i0 += TB) {
                int nr = T - i0 < TB ? (int)(T - i0) : TB;
                if (!tile_spans(c0, c1, lo, i0, nr, j0, nc)) continue;
                tile_scores(p, qb + i0 * Dh, kt, nr, Dh);
                tile_scores(ds, gb + i0 * Dh, vt, nr, Dh);
                for (int r = 0; r < nr; r++) {
                    real li = lb[i0 + r], Di = dot(gb + (i0 + r) * Dh, ob + (i0 + r) * Dh, Dh);
                    real *pr = p + r * TB, *dr = ds + r * TB;
                    int a = c0[r], z = c1[r];
                    _Pragma("omp simd") /* (as in the forward) */
                    for (int c = 0; c < TB; c++) pr[c] = R_EXP(sc * pr[c] - li);
                    _Pragma("omp simd")
                    for (int c = 0; c < TB; c++) {
                        pr[c] = ((c >= a) & (c < z)) ? pr[c] : 0;
                        dr[c] = pr[c] * (dr[c] - Di) * sc;
                    }
                }
                tile_acc(dvb + j0 * Dh, p, 1, gb + i0 * Dh, nc, nr, Dh, i0 - j0);
                tile_acc(dkb + j0 * Dh, ds, 1, qb + i0 * Dh, nc, nr, Dh, i0 - j0);
                tile_acc(dqb + i0 * Dh, ds, 0, kb + j0 * Dh, nr, nc, Dh, i0 - j0);
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
