/* CPU reference for the fused q/k/v rope: the packed (B, T, (H + 2 KV)·Dh) projection to rotated
 * q, k and copied v in any strided layout, and back. fp32 or fp64 per real.h; OpenMP over (b, t).
 * The arithmetic is kernels/cpu/rope.c's, operation for operation. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

#include <stddef.h>

/* Head j of the packed row: part p (0 q, 1 k, 2 v) and its head index h within that part. */
static inline int head_part(int64_t j, int64_t H, int64_t KV, int64_t *h) {
    int p = j < H ? 0 : j < H + KV ? 1 : 2;
    *h = j - (p == 0 ? 0 : p == 1 ? H : H + KV);
    return p;
}

static inline int64_t part_at(const zr_qkv_layout *L, int p, int64_t b, int64_t h, int64_t t) {
    return b * L->part[p][0] + h * L->part[p][1] + t * L->part[p][2];
}

/* Forward (fwd: packed -> parts, y = x cos + rotate_half(x) sin) or backward (parts -> packed,
 * its transpose: dx = g cos + rotate_half^T(g sin), added to packed with accumulate). */
static void run(real *packed, real *const *parts, const real *cos, const real *sin, const zr_qkv_layout *L,
                int64_t B, int64_t T, int64_t H, int64_t KV, int64_t Dh, int fwd, int accumulate) {
    int64_t n = B * T, nh = H + 2 * KV, hf = Dh / 2;
    real sg = fwd ? 1 : -1;
    _Pragma("omp parallel for schedule(static) if (n * nh * Dh > 32768)")
    for (int64_t bt = 0; bt < n; bt++) {
        int64_t b = bt / T, t = bt % T;
        const real *c = cos + t * Dh;
        /* the sin entries that multiply the first and the second half */
        const real *s1 = sin + t * Dh + (fwd ? 0 : hf), *s2 = sin + t * Dh + (fwd ? hf : 0);
        for (int64_t j = 0; j < nh; j++) {
            int64_t h;
            int p = head_part(j, H, KV, &h);
            real *pk = packed + b * L->sb + t * L->st + j * Dh;
            real *pt = parts[p] ? parts[p] + part_at(L, p, b, h, t) : NULL;
            const real *a = fwd ? pk : pt; /* read */
            real *d = fwd ? pt : pk;       /* written */
            for (int64_t i = 0; i < hf; i++) {
                real lo = 0, hi = 0; /* results for elements i and i + hf */
                if (a && p == 2) lo = a[i], hi = a[i + hf];
                else if (a) {
                    lo = a[i] * c[i] - sg * a[i + hf] * s1[i];
                    hi = a[i + hf] * c[i + hf] + sg * a[i] * s2[i];
                }
                d[i] = accumulate ? d[i] + lo : lo;
                d[i + hf] = accumulate ? d[i + hf] + hi : hi;
            }
        }
    }
}

void K(qkv_rope_forward_cpu)(real *q, real *k, real *v, const real *qkv, const real *cos,
                             const real *sin, const zr_qkv_layout *L, int64_t B, int64_t T,
                             int64_t H, int64_t KV, int64_t Dh) {
    real *parts[3] = {q, k, v};
    run((real *)qkv, parts, cos, sin, L, B, T, H, KV, Dh, 1, 0);
}

void K(qkv_rope_backward_cpu)(real *dqkv, const real *dq, const real *dk, const real *dv,
                              const real *cos, const real *sin, const zr_qkv_layout *L, int64_t B,
                              int64_t T, int64_t H, int64_t KV, int64_t Dh, int accumulate) {
    real *parts[3] = {(real *)dq, (real *)dk, (real *)dv};
    run(dqkv, parts, cos, sin, L, B, T, H, KV, Dh, 0, accumulate);
}
