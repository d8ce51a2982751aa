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

void K(qkv_rope_forward_cpu)(real *q, real *k, real *v, const real *qkv, const real *cos,
                             const real *sin, const zr_qkv_layout *L, int64_t B, int64_t T,
                             int64_t H, int64_t KV, int64_t Dh) {
    int64_t n = B * T, nh = H + 2 * KV, hf = Dh / 2;
    real *dst[3] = {q, k, v};
    _Pragma("omp parallel for schedule(static) if (n * nh * Dh > 32768)")
    for (int64_t bt = 0; bt < n; bt++) {
        int64_t b = bt / T, t = bt % T;
        const real *c = cos + t * Dh, *s = sin + t * Dh;
        for (int64_t j = 0; j < nh; j++) {
            int64_t h;
            int p = head_part(j, H, KV, &h);
            const real *x = qkv + b * L->sb + t * L->st + j * Dh;
            real *y = dst[p] + part_at(L, p, b, h, t);
            if (p == 2) {
                for (int64_t i = 0; i < Dh; i++) y[i] = x[i];
                continue;
            }
            for (int64_t i = 0; i < hf; i++) {
                y[i] = x[i] * c[i] - x[i + hf] * s[i];
                y[i + hf] = x[i + hf] * c[i + hf] + x[i] * s[i + hf];
            }
        }
    }
}

void K(qkv_rope_backward_cpu)(real *dqkv, const real *dq, const real *dk, const real *dv,
                              const real *cos, const real *sin, const zr_qkv_layout *L, int64_t B,
                              int64_t T, int64_t H, int64_t KV, int64_t Dh, int accumulate) {
    int64_t n = B * T, nh = H + 2 * KV, hf = Dh / 2;
    const real *src[3] = {dq, dk, dv};
    _Pragma("omp parallel for schedule(static) if (n * nh * Dh > 32768)")
    for (int64_t bt = 0; bt < n; bt++) {
        int64_t b = bt / T, t = bt % T;
        const real *c = cos + t * Dh, *s = sin + t * Dh;
        for (int64_t j = 0; j < nh; j++) {
            int64_t h;
            int p = head_part(j, H, KV, &h);
            real *d = dqkv + b * L->sb + t * L->st + j * Dh;
            const real *g = src[p] ? src[p] + part_at(L, p, b, h, t) : NULL;
            for (int64_t i = 0; i < hf; i++) {
                real lo = 0, hi = 0; /* the gradients of elements i and i + hf */
                if (g && p == 2) lo = g[i], hi = g[i + hf];
                else if (g) {
                    lo = g[i] * c[i] + g[i + hf] * s[i + hf];
                    hi = g[i + hf] * c[i + hf] - g[i] * s[i];
                }
                d[i] = accumulate ? d[i] + lo : lo;
                d[i + hf] = accumulate ? d[i + hf] + hi : hi;
            }
        }
    }
}
