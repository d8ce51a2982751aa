/* Philox4x32-10 counter-based generator (Salmon et al., SC'11), shared by the CPU and CUDA
 * backends so that the same seed and offset give the same numbers on both.
 * Element i of a tensor filled at generator offset `off` uses counter (off + i/4, 0, 0, 0) and
 * key (seed lo, seed hi); lane i%4 of the output is its 32 random bits. */
#ifndef ZR_PHILOX_H
#define ZR_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define ZR_HD __host__ __device__ __forceinline__
#else
#define ZR_HD static inline
#endif

typedef struct {
    uint32_t x[4];
} zr_philox4;

ZR_HD uint32_t zr_mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

ZR_HD zr_philox4 zr_philox(uint64_t seed, uint64_t counter) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = zr_mulhilo(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = zr_mulhilo(0xCD9E8D57u, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    zr_philox4 o = {{c0, c1, c2, c3}};
    return o;
}

/* Uniform in [0, 1) with 24 random bits (exactly representable in f32). */
ZR_HD float zr_u01(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

/* Element i's uniform and normal values for (seed, offset). Normals pair lanes (0,1) and (2,3)
 * by Box-Muller, computed in double so CPU and GPU agree to rounding. */
ZR_HD float zr_philox_uniform(uint64_t seed, uint64_t off, uint64_t i) {
    zr_philox4 r = zr_philox(seed, off + i / 4);
    return zr_u01(r.x[i % 4]);
}
/* The Box-Muller pair of lanes (base, base + 1) of block r: their radius and angle. */
ZR_HD void zr_philox_polar(zr_philox4 r, int base, double *rad, double *th) {
    double u1 = ((double)(r.x[base] >> 8) + 1.0) / 16777217.0; /* (0, 1] avoids log(0) */
    double u2 = (double)(r.x[base + 1] >> 8) / 16777216.0;
    *rad = sqrt(-2.0 * log(u1)), *th = 6.283185307179586 * u2;
}
ZR_HD double zr_philox_normal(uint64_t seed, uint64_t off, uint64_t i) {
    zr_philox4 r = zr_philox(seed, off + i / 4);
    int lane = (int)(i % 4);
    double rad, th;
    zr_philox_polar(r, lane & 2, &rad, &th);
    return (lane & 1) ? rad * sin(th) : rad * cos(th);
}
/* Elements 4g .. 4g + 3 at once (what zr_philox_normal gives each, from one Philox block and two
 * Box-Muller pairs instead of four blocks and four). */
ZR_HD void zr_philox_normal4(uint64_t seed, uint64_t off, uint64_t g, double v[4]) {
    zr_philox4 r = zr_philox(seed, off + g);
    for (int base = 0; base < 4; base += 2) {
        double rad, th;
        zr_philox_polar(r, base, &rad, &th);
        v[base] = rad * cos(th), v[base + 1] = rad * sin(th);
    }
}

#endif
