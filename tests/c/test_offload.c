/* C tests for the ZeRO offload kernels (kernels/cpu/offload.c) and the host bookkeeping of
 * runtime/zero/offload.c: every kernel against a plain double-precision loop at awkward sizes
 * (1, 7, 65537, 200003: the last two run on several OpenMP threads), the 16-bit outputs against
 * dtype.h's scalar conversions (ties, NaN, inf, overflow, subnormals), the gradient scale, and
 * the lazy zeroing of the gradient partition (overwrite on first add, untouched ranges zeroed). */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/base/dtype.h"
#include "kernels/cpu/offload.h"
#include "zero/offload.h"

static const int64_t SIZES[] = {1, 7, 65537, 200003};
#define NSIZES (int)(sizeof SIZES / sizeof SIZES[0])

/* Deterministic values in [-2, 2]. */
static double val(int64_t i, int k) { return 2.0 * sin(0.37 * (double)i + 1.3 * k) * cos(0.011 * (double)i * (k + 1)); }

static float *fvec(int64_t n, int k) {
    float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) x[i] = (float)val(i, k);
    return x;
}

TEST(sumsq_matches_double_loop) {
    int64_t sizes[] = {0, 1, 7, 65537, 200003};
    for (int s = 0; s < 5; s++) {
        int64_t n = sizes[s];
        float *x = fvec(n, 1);
        double ref = 0;
        for (int64_t i = 0; i < n; i++) ref += (double)x[i] * (double)x[i];
        double got = offload_sumsq_cpu(x, ZR_F32, n);
        CHECK_MSG(fabs(got - ref) <= 1e-12 * (ref + 1e-300) || (n == 0 && got == 0), "n=%lld: %.17g vs %.17g",
                  (long long)n, got, ref);
        free(x);
    }
}

/* Three AdamW steps with a gradient scale, against torch's formula in double. out_dt 0: none.
 * g_dt: the gradients' dtype (16-bit: rounded first; the reference reads the rounded values). */
static void adamw_case(int64_t n, zr_dtype out_dt, int with_out, zr_dtype g_dt) {
    const double lr = 0.01, b1 = 0.9, b2 = 0.98, eps = 1e-6, wd = 0.1, gs = 0.37;
    float *p = fvec(n, 0), *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4), *g = NULL;
    uint16_t *g16 = malloc((size_t)n * 2);
    double *rp = malloc(8 * (size_t)n), *rm = calloc((size_t)n, 8), *rv = calloc((size_t)n, 8);
    /* the largest term m's update has added or carried (|m|, (1 - beta1)|g|): m can cancel to far
     * below it, and f32 rounds at its scale (m[165936] of 200003: 7.56e-5 from terms near 0.2 is
     * off by 1.4e-8 without fused multiply-adds, e.g. an -O1 or ASan build) */
    double *mscale = calloc((size_t)n, 8);
    void *out = with_out ? malloc((size_t)n * 4) : NULL;
    for (int64_t i = 0; i < n; i++) rp[i] = p[i];
    for (int step = 1; step <= 3; step++) {
        free(g);
        g = fvec(n, step + 3);
        for (int64_t i = 0; g_dt != ZR_F32 && i < n; i++) { /* the 16-bit gradient and its exact value */
            g16[i] = g_dt == ZR_BF16 ? zr_f32_to_bf16(g[i]) : zr_f32_to_f16(g[i]);
            g[i] = g_dt == ZR_BF16 ? zr_bf16_to_f32(g16[i]) : zr_f16_to_f32(g16[i]);
        }
        double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
        zr_adamw_config c = {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd};
        offload_adamw_cpu(p, m, v, g_dt == ZR_F32 ? (const void *)g : g16, g_dt, n, &c, step, gs, out, out_dt);
        for (int64_t i = 0; i < n; i++) {
            double gi = (double)g[i] * gs;
            rp[i] -= lr * wd * rp[i];
            mscale[i] = fmax(mscale[i], fmax(fabs(rm[i]), (1 - b1) * fabs(gi)));
            rm[i] = b1 * rm[i] + (1 - b1) * gi;
            rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
            rp[i] -= lr * (rm[i] / bc1) / (sqrt(rv[i] / bc2) + eps);
        }
    }
    for (int64_t i = 0; i < n && !test_failed_flag; i++) {
        CHECK_MSG(fabs(p[i] - rp[i]) <= 2e-5, "n=%lld p[%lld] = %.9g, expected %.9g", (long long)n, (long long)i, p[i], rp[i]);
        CHECK_MSG(fabs(m[i] - rm[i]) <= 1e-5 * (fabs(rm[i]) + 1e-3) + 1e-6 * mscale[i],
                  "n=%lld m[%lld] = %.9g, expected %.9g", (long long)n, (long long)i, m[i], rm[i]);
        CHECK_MSG(fabs(v[i] - rv[i]) <= 1e-5 * (fabs(rv[i]) + 1e-6), "n=%lld v[%lld]", (long long)n, (long long)i);
        if (!out) continue;
        if (out_dt == ZR_F32) CHECK(((float *)out)[i] == p[i]);
        uint16_t o = ((uint16_t *)out)[i];
        if (out_dt == ZR_BF16) {
            CHECK_MSG(o == zr_f32_to_bf16(p[i]), "bf16 out[%lld] = %04x, expected %04x", (long long)i, o, zr_f32_to_bf16(p[i]));
            CHECK(fabs(zr_bf16_to_f32(o) - rp[i]) <= fabs(rp[i]) / 256 + 2e-5);
        }
        if (out_dt == ZR_F16) {
            CHECK_MSG(o == zr_f32_to_f16(p[i]), "f16 out[%lld] = %04x, expected %04x", (long long)i, o, zr_f32_to_f16(p[i]));
            CHECK(fabs(zr_f16_to_f32(o) - rp[i]) <= fabs(rp[i]) / 1024 + 2e-5);
        }
    }
    free(p), free(m), free(v), free(g), free(g16), free(rp), free(rm), free(rv), free(mscale), free(out);
}

TEST(adamw_scaled_matches_double_loop) {
    for (int s = 0; s < NSIZES; s++) adamw_case(SIZES[s], ZR_F32, 0, ZR_F32);
}
TEST(adamw_reads_bf16_f16_gradients) {
    for (int s = 0; s < NSIZES; s++) {
        adamw_case(SIZES[s], ZR_BF16, 1, ZR_BF16);
        adamw_case(SIZES[s], ZR_F32, 0, ZR_F16);
    }
}
TEST(adamw_writes_f32_bf16_f16_weights) {
    zr_dtype dts[] = {ZR_F32, ZR_BF16, ZR_F16};
    for (int s = 0; s < NSIZES; s++)
        for (int d = 0; d < 3; d++) adamw_case(SIZES[s], dts[d], 1, ZR_F32);
}

/* Float bit patterns the 16-bit roundings must get right, placed among ordinary values. */
static float special(int k) {
    const float v[] = {0.0f, -0.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,
                       65504.0f, 65520.0f, 1e-8f, 6e-8f, 3e-5f, INFINITY, -INFINITY, NAN, FLT_MAX, 1e-40f, -2.5e-39f};
    return v[k % (int)(sizeof v / sizeof v[0])];
}

TEST(cast_rounds_like_dtype_h) {
    for (int s = 0; s < NSIZES; s++) {
        int64_t n = SIZES[s];
        float *x = fvec(n, 2);
        for (int64_t i = 0, k = 0; i < n; i += 1 + i / 3, k++) x[i] = special((int)k);
        uint16_t *o = malloc((size_t)n * 2);
        float *of = malloc((size_t)n * 4);
        offload_cast_cpu(o, ZR_BF16, x, n);
        for (int64_t i = 0; i < n && !test_failed_flag; i++)
            CHECK_MSG(o[i] == zr_f32_to_bf16(x[i]), "bf16(%g) = %04x, expected %04x", x[i], o[i], zr_f32_to_bf16(x[i]));
        offload_cast_cpu(o, ZR_F16, x, n);
        for (int64_t i = 0; i < n && !test_failed_flag; i++) {
            if (isnan(x[i])) CHECK((o[i] & 0x7c00) == 0x7c00 && (o[i] & 0x3ff));
            else CHECK_MSG(o[i] == zr_f32_to_f16(x[i]), "f16(%g) = %04x, expected %04x", x[i], o[i], zr_f32_to_f16(x[i]));
        }
        offload_cast_cpu(of, ZR_F32, x, n);
        CHECK(memcmp(of, x, (size_t)n * 4) == 0);
        free(x), free(o), free(of);
    }
}

TEST(accumulate_and_fill_match_double_loop) {
    zr_dtype dts[] = {ZR_F32, ZR_BF16, ZR_F16};
    for (int s = 0; s < NSIZES; s++) {
        int64_t n = SIZES[s];
        for (int d = 0; d < 3; d++)
            for (int ow = 0; ow < 2; ow++) {
                float *dst = fvec(n, 5), *sf = fvec(n, 6);
                uint16_t *sh = malloc((size_t)n * 2);
                double *ref = malloc((size_t)n * 8);
                for (int64_t i = 0; i < n; i++) {
                    double sv = sf[i];
                    if (dts[d] == ZR_BF16) sv = zr_bf16_to_f32(sh[i] = zr_f32_to_bf16(sf[i]));
                    if (dts[d] == ZR_F16) sv = zr_f16_to_f32(sh[i] = zr_f32_to_f16(sf[i]));
                    ref[i] = (ow ? 0 : (double)dst[i]) + sv;
                }
                offload_accumulate_cpu(dst, dts[d] == ZR_F32 ? (const void *)sf : sh, dts[d], n, ow);
                for (int64_t i = 0; i < n && !test_failed_flag; i++)
                    CHECK_MSG(fabs(dst[i] - ref[i]) <= 4e-7 * (fabs(ref[i]) + 1), "n=%lld dt %d ow %d: [%lld] %.9g vs %.9g",
                              (long long)n, d, ow, (long long)i, dst[i], ref[i]);
                free(dst), free(sf), free(sh), free(ref);
            }
        float *x = fvec(n, 7);
        offload_fill_cpu(x, n, 0);
        for (int64_t i = 0; i < n; i++) CHECK(x[i] == 0);
        offload_fill_cpu(x, n, 2.5f);
        for (int64_t i = 0; i < n; i++) CHECK(x[i] == 2.5f);
        free(x);
    }
}

/* A 16-bit gradient partition's accumulation: the sum of the widened values computed in double
 * (exact for these inputs) rounded once by dtype.h's conversion, for every source dtype, adding
 * and overwriting; and by hand, bf16 ties around 1 (ulp 2^-7): 1 + 2^-8 rounds to even, 1.0;
 * 1 + 3 x 2^-8 rounds to even, 1 + 2^-6 (one rounding of the sum, not of each step). */
TEST(accumulate16_rounds_each_sum_once) {
    zr_dtype dts[] = {ZR_F32, ZR_BF16, ZR_F16}, dsts[] = {ZR_BF16, ZR_F16};
    for (int s = 0; s < NSIZES; s++) {
        int64_t n = SIZES[s];
        for (int t = 0; t < 2; t++)
            for (int d = 0; d < 3; d++)
                for (int ow = 0; ow < 2 && !test_failed_flag; ow++) {
                    float *a = fvec(n, 5), *sf = fvec(n, 6);
                    uint16_t *dst = malloc((size_t)n * 2), *sh = malloc((size_t)n * 2), *ref = malloc((size_t)n * 2);
                    for (int64_t i = 0; i < n; i++) {
                        dst[i] = dsts[t] == ZR_BF16 ? zr_f32_to_bf16(a[i]) : zr_f32_to_f16(a[i]);
                        double dv = dsts[t] == ZR_BF16 ? zr_bf16_to_f32(dst[i]) : zr_f16_to_f32(dst[i]), sv = sf[i];
                        if (dts[d] == ZR_BF16) sv = zr_bf16_to_f32(sh[i] = zr_f32_to_bf16(sf[i]));
                        if (dts[d] == ZR_F16) sv = zr_f16_to_f32(sh[i] = zr_f32_to_f16(sf[i]));
                        float sum = (float)((ow ? 0 : dv) + sv);
                        ref[i] = dsts[t] == ZR_BF16 ? zr_f32_to_bf16(sum) : zr_f32_to_f16(sum);
                    }
                    offload_accumulate16_cpu(dst, dsts[t], dts[d] == ZR_F32 ? (const void *)sf : sh, dts[d], n, ow);
                    for (int64_t i = 0; i < n && !test_failed_flag; i++)
                        CHECK_MSG(dst[i] == ref[i], "n=%lld into %s from %s ow %d: [%lld] %04x vs %04x", (long long)n,
                                  zr_dtype_name(dsts[t]), zr_dtype_name(dts[d]), ow, (long long)i, dst[i], ref[i]);
                    free(a), free(sf), free(dst), free(sh), free(ref);
                }
    }
    uint16_t d[2] = {0x3f80, 0x3f80}; /* 1.0, 1.0 */
    float src[2] = {0x1p-8f, 3 * 0x1p-8f};
    offload_accumulate16_cpu(d, ZR_BF16, src, ZR_F32, 2, 0);
    CHECK_MSG(d[0] == 0x3f80 && d[1] == 0x3f82, "%04x %04x, expected 3f80 3f82", d[0], d[1]);
}

/* A 1-D f32 (or bf16) CPU tensor holding vals. */
static zr_tensor *vec(int64_t n, const float *vals, zr_dtype dt) {
    zr_tensor *t = zr_tensor_new(dt, zr_cpu(), 1, &n);
    for (int64_t i = 0; i < n; i++) zr_tensor_set(t, i, vals[i]);
    return t;
}

/* Lazy zeroing: segments {0,5} {5,0} {5,3} {8,4} of a 12-element partition. */
TEST(lazy_zero_overwrites_then_adds) {
    int64_t S = 12;
    zr_tensor *gp = zr_tensor_new(ZR_F32, zr_cpu(), 1, &S);
    float *g = zr_tensor_data(gp);
    zr_offload_segment segs[] = {{0, 5, 0}, {5, 0, 0}, {5, 3, 0}, {8, 4, 0}};
    zr_offload *o = zr_offload_new(S, gp, zr_cpu(), ZR_BF16, 4, segs, 16, 0, 1);
    CHECK(o && zr_offload_find(gp) == o);
    if (!o) return;
    double ref[12] = {0};
    for (int i = 0; i < 12; i++) g[i] = 99; /* stale contents from the last step */
    CHECK(zr_offload_grad_zero(o) == ZR_OK);
    float a[5] = {1, 2, 3, 4, 5}, b[3] = {0.5f, -1, 2}, c[3] = {0.25f, 0.25f, -3}, d[2] = {10, 20};
    zr_tensor *ta = vec(5, a, ZR_F32), *tb = vec(3, b, ZR_F32), *tc = vec(3, c, ZR_BF16), *td = vec(2, d, ZR_F32);
    CHECK(zr_offload_grad_add(o, 0, ta, 0) == ZR_OK); /* first into segment 0: overwrite */
    for (int i = 0; i < 5; i++) ref[i] = a[i];
    CHECK(zr_offload_grad_add(o, 5, tb, 0) == ZR_OK); /* first into segment 2: overwrite */
    CHECK(zr_offload_grad_add(o, 5, tc, 0) == ZR_OK); /* second (bf16): add */
    for (int i = 0; i < 3; i++) ref[5 + i] = (double)b[i] + c[i];
    CHECK(zr_offload_grad_add(o, 2, td, 0) == ZR_OK); /* inside segment 0: add */
    ref[2] += d[0], ref[3] += d[1];
    CHECK(zr_offload_grad_sync(o) == ZR_OK); /* segment 3 got nothing: zeros */
    for (int i = 0; i < 12; i++) CHECK_MSG(g[i] == ref[i], "step 1: g[%d] = %g, expected %g", i, g[i], ref[i]);
    double ss = 0, got;
    for (int i = 0; i < 12; i++) ss += ref[i] * ref[i];
    CHECK(zr_offload_sumsq(o, &got) == ZR_OK && fabs(got - ss) < 1e-9);
    /* next step: a range across segments 2 and 3 zeroes both first, then adds */
    for (int i = 0; i < 12; i++) g[i] = 99, ref[i] = 0;
    CHECK(zr_offload_grad_zero(o) == ZR_OK);
    CHECK(zr_offload_grad_add(o, 6, ta, 0) == ZR_OK); /* elements 6..10 */
    zr_tensor *t4 = zr_tensor_narrow_raw(ta, 0, 0, 4);
    CHECK(zr_offload_grad_add(o, 6, t4, 0) == ZR_OK); /* elements 6..9 */
    for (int i = 0; i < 5; i++) ref[6 + i] += a[i];
    for (int i = 0; i < 4; i++) ref[6 + i] += a[i];
    CHECK(zr_offload_grad_sync(o) == ZR_OK);
    for (int i = 0; i < 12; i++) CHECK_MSG(g[i] == ref[i], "step 2: g[%d] = %g, expected %g", i, g[i], ref[i]);
    /* a range outside the partition is refused */
    CHECK(zr_offload_grad_add(o, 10, ta, 0) == ZR_ERR);
    zr_tensor_release(t4);
    zr_tensor_release(ta), zr_tensor_release(tb), zr_tensor_release(tc), zr_tensor_release(td);
    zr_offload_free(o);
    CHECK(zr_offload_find(gp) == NULL);
    zr_tensor_release(gp);
}

/* zr_offload_run: per-segment weight decay and learning rate (parameter groups), and the bf16
 * weights at each segment's offset. */
TEST(offload_adamw_segments) {
    int64_t S = 65537 + 7 + 1;
    zr_tensor *gp = zr_tensor_new(ZR_F32, zr_cpu(), 1, &S);
    float *g = zr_tensor_data(gp), *p = fvec(S, 0), *m = calloc((size_t)S, 4), *v = calloc((size_t)S, 4);
    zr_offload_segment segs[] = {{0, 7, 0.0}, {7, 65537, 0.1}, {65544, 1, 0.5}};
    zr_offload *o = zr_offload_new(S, gp, zr_cpu(), ZR_BF16, 3, segs, S, 0, 1);
    uint16_t *w = malloc((size_t)S * 2);
    CHECK(o != NULL);
    if (!o) return;
    for (int64_t i = 0; i < S; i++) g[i] = (float)val(i, 9);
    double lr[3] = {0.02, 0.02, 0.005}, b1 = 0.8, b2 = 0.9, eps = 1e-8, gs = 0.5, ref[3] = {0};
    zr_adamw_config c = {.beta1 = b1, .beta2 = b2, .eps = eps}, bad = c;
    bad.beta1 = 1.5;
    zr_offload_pass pass = {NULL, p, m, v, 0, gs, 1, &c, lr, w, NULL, NULL, 0, S, 0, NULL, NULL, ZR_F32, ZR_F32};
    CHECK(zr_offload_run(o, &pass) == ZR_OK);
    int64_t probe[3] = {3, 7 + 40000, 65544};
    for (int k = 0; k < 3; k++) {
        int64_t i = probe[k];
        double p0 = (float)val(i, 0), gi = (double)g[i] * gs, mm = (1 - b1) * gi, vv = (1 - b2) * gi * gi;
        ref[k] = p0 * (1 - lr[k] * segs[k].wd) - lr[k] * (mm / (1 - b1)) / (sqrt(vv / (1 - b2)) + eps);
        CHECK_MSG(fabs(p[i] - ref[k]) <= 1e-6, "segment %d: p = %.9g, expected %.9g", k, p[i], ref[k]);
        CHECK(w[i] == zr_f32_to_bf16(p[i]));
    }
    pass.step = 0;
    CHECK(zr_offload_run(o, &pass) == ZR_ERR); /* step counts from 1 */
    pass.step = 2, pass.c = &bad;
    CHECK(zr_offload_run(o, &pass) == ZR_ERR); /* beta1 out of range */
    zr_offload_free(o);
    zr_tensor_release(gp);
    free(p), free(m), free(v), free(w);
}

/* offload_adamw_pieces_cpu: pieces with a gap between them, each its own lr and weight decay, the
 * weights at every alignment of out (0..33 elements past a 64-byte line) and sizes around a line
 * and a block, one thread and several: streamed weights equal dtype.h's rounding of the new p,
 * p/m/v equal those of normal stores (stream 0) and of one offload_adamw_cpu call per piece, bit
 * for bit, and nothing outside the pieces (the gap, guards either side of out) is written. */
TEST(adamw_pieces_streamed_weights) {
    const int64_t sizes[] = {1, 31, 33, 2100, 70001};
    const zr_dtype dts[] = {ZR_BF16, ZR_F16, ZR_F32};
    zr_adamw_config c = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    for (int si = 0; si < 5 && !test_failed_flag; si++)
        for (int d = 0; d < 3 && !test_failed_flag; d++)
            for (int shift = 0; shift <= 33 && !test_failed_flag; shift += si < 3 ? 1 : 11) {
                const int64_t n1 = sizes[si], gap = 5, n2 = sizes[si] / 2 + 3, n = n1 + gap + n2;
                const size_t es = zr_dtype_size(dts[d]), guard = 64;
                offload_adamw_piece pc[2] = {{0, n1, 0.01, 0.1}, {n1 + gap, n2, 0.003, 0.0}};
                float *p[3], *m[3], *v[3];
                unsigned char *ob[3];
                for (int r = 0; r < 3; r++) { /* 0: streamed, 1: normal stores, 2: per-piece calls */
                    p[r] = fvec(n, 2), m[r] = fvec(n, 3), v[r] = fvec(n, 4);
                    for (int64_t i = 0; i < n; i++) v[r][i] = fabsf(v[r][i]);
                    ob[r] = aligned_alloc(64, (guard + (size_t)(n + 34) * es + guard + 63) / 64 * 64);
                    memset(ob[r], 0xab, (guard + (size_t)(n + 34) * es + guard + 63) / 64 * 64);
                }
                float *g = fvec(n, 5);
                for (int r = 0; r < 2; r++)
                    offload_adamw_pieces_cpu(p[r], m[r], v[r], g, ZR_F32, pc, 2, &c, 3, 0.5,
                                             ob[r] + guard + (size_t)shift * es, dts[d], r == 0);
                for (int k = 0; k < 2; k++) {
                    zr_adamw_config s = c;
                    s.lr = pc[k].lr, s.weight_decay = pc[k].wd;
                    int64_t o = pc[k].off;
                    offload_adamw_cpu(p[2] + o, m[2] + o, v[2] + o, g + o, ZR_F32, pc[k].n, &s, 3, 0.5,
                                      ob[2] + guard + (size_t)(shift + o) * es, dts[d]);
                }
                const size_t bytes = (guard + (size_t)(n + 34) * es + guard + 63) / 64 * 64;
                for (int r = 1; r < 3; r++)
                    CHECK_MSG(memcmp(p[0], p[r], (size_t)n * 4) == 0 && memcmp(m[0], m[r], (size_t)n * 4) == 0 &&
                                  memcmp(v[0], v[r], (size_t)n * 4) == 0 && memcmp(ob[0], ob[r], bytes) == 0,
                              "n=%lld %s shift %d: streamed differs from %s", (long long)n, zr_dtype_name(dts[d]),
                              shift, r == 1 ? "normal stores" : "per-piece calls");
                const unsigned char *w = ob[0] + guard + (size_t)shift * es;
                for (int64_t i = 0; i < n && !test_failed_flag; i++) {
                    int in_gap = i >= n1 && i < n1 + gap;
                    if (in_gap) {
                        CHECK_MSG(p[0][i] == (float)val(i, 2) && w[i * es] == 0xab, "gap element %lld written",
                                  (long long)i);
                        continue;
                    }
                    uint32_t got = 0, want;
                    memcpy(&got, w + i * es, es);
                    if (dts[d] == ZR_F32) memcpy(&want, &p[0][i], 4);
                    else want = dts[d] == ZR_BF16 ? zr_f32_to_bf16(p[0][i]) : zr_f32_to_f16(p[0][i]);
                    CHECK_MSG(got == want, "n=%lld %s shift %d: w[%lld] = %x, expected %x", (long long)n,
                              zr_dtype_name(dts[d]), shift, (long long)i, got, want);
                }
                for (size_t b = 0; b < guard + (size_t)shift * es; b++) CHECK(ob[0][b] == 0xab);
                for (size_t b = guard + (size_t)(shift + n) * es; b < bytes; b++) CHECK(ob[0][b] == 0xab);
                for (int r = 0; r < 3; r++) free(p[r]), free(m[r]), free(v[r]), free(ob[r]);
                free(g);
            }
}

/* The sink of the pipeline test: copies each chunk's weights into a host tensor (as the engine
 * uploads them) and counts the calls. */
typedef struct {
    zr_tensor *dst;
    int calls;
    int64_t next; /* chunks arrive in order, covering the range */
} sink_ctx;
static zr_status sink_copy(void *ctx, zr_offload *o, int64_t a, int64_t n, const void *w) {
    sink_ctx *s = ctx;
    if (a != s->next) return zr_error("chunk at %lld, expected %lld", (long long)a, (long long)s->next);
    s->next = a + n, s->calls++;
    int64_t st = 1;
    zr_tensor *d = zr_tensor_as_strided(s->dst, 1, &n, &st, a);
    zr_status r = zr_offload_put(o, d, w, n);
    zr_tensor_release(d);
    return r;
}

/* The chunk pipeline (ZRUN_OFFLOAD_CHUNK elements, cutting segments anywhere) over gradients
 * given as a tensor (f32 or bf16, through the ring) gives bit for bit what one AdamW call per
 * segment gives, also with states that start at the range (pass.base), and its sink receives every
 * chunk once, in order; a cast-only pass writes the rounded master. */
TEST(pipeline_chunks_match_per_segment_adamw) {
    int64_t S = 5000;
    zr_offload_segment segs[] = {{0, 1, 0.0}, {1, 2999, 0.1}, {3000, 0, 0.1}, {3000, 2000, 0.01}};
    double lr[4] = {0.01, 0.02, 0.02, 0.005};
    zr_adamw_config c = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    zr_dtype gdts[2] = {ZR_F32, ZR_BF16};
    const char *chunks[3] = {"777", "1", "100000"};
    for (int d = 0; d < 2; d++)
        for (int ci = 0; ci < 3; ci++) {
            setenv("ZRUN_OFFLOAD_CHUNK", chunks[ci], 1);
            zr_offload *o = zr_offload_new(S, NULL, zr_cpu(), ZR_BF16, 4, segs, S, 0, 0);
            CHECK(o != NULL);
            if (!o) return;
            float *p = fvec(S, 1), *m = calloc((size_t)S, 4), *v = calloc((size_t)S, 4);
            float *rp = fvec(S, 1), *rm = calloc((size_t)S, 4), *rv = calloc((size_t)S, 4);
            zr_tensor *g = zr_tensor_new(gdts[d], zr_cpu(), 1, &S), *w = zr_tensor_new(ZR_BF16, zr_cpu(), 1, &S);
            uint16_t *rw = malloc((size_t)S * 2);
            for (int step = 1; step <= 3; step++) {
                for (int64_t i = 0; i < S; i++) zr_tensor_set(g, i, val(i, step + 5));
                sink_ctx sc = {w, 0, 100};
                /* bf16 gradients: the states hold elements from 100 on (base, as the host part of a
                 * partial offload does) */
                int64_t base = d ? 100 : 0;
                zr_offload_pass pass = {g, p + base, m + base, v + base, base, 0.7, step, &c, lr, NULL, sink_copy, &sc,
                                        100, S, 0, NULL, NULL, ZR_F32, ZR_F32};
                CHECK(zr_offload_run(o, &pass) == ZR_OK);
                CHECK(sc.next == S);
                int64_t C = atoll(chunks[ci]) < S - 100 ? atoll(chunks[ci]) : S - 100;
                CHECK_MSG(sc.calls == (S - 100 + C - 1) / C, "%d sink calls", sc.calls);
                for (int k = 0; k < 4; k++) { /* the reference: whole segments, [100, S) only */
                    int64_t a = segs[k].off > 100 ? segs[k].off : 100, b = segs[k].off + segs[k].n;
                    if (b <= a) continue;
                    zr_adamw_config s = c;
                    s.lr = lr[k], s.weight_decay = segs[k].wd;
                    offload_adamw_cpu(rp + a, rm + a, rv + a, (char *)zr_tensor_data(g) + a * zr_dtype_size(gdts[d]),
                                      gdts[d], b - a, &s, step, 0.7, rw + a, ZR_BF16);
                }
            }
            CHECK(memcmp(p, rp, (size_t)S * 4) == 0 && memcmp(m, rm, (size_t)S * 4) == 0 &&
                  memcmp(v, rv, (size_t)S * 4) == 0);
            CHECK(memcmp((uint16_t *)zr_tensor_data(w) + 100, rw + 100, (size_t)(S - 100) * 2) == 0);
            for (int64_t i = 0; i < 100; i++) CHECK(p[i] == (float)val(i, 1)); /* outside the range: untouched */
            zr_offload_pass cast = {NULL, p, NULL, NULL, 0, 1, 0, NULL, NULL, zr_tensor_data(w), NULL, NULL, 0, S, 0, NULL, NULL, ZR_F32, ZR_F32};
            CHECK(zr_offload_run(o, &cast) == ZR_OK);
            for (int64_t i = 0; i < S; i++) CHECK(((uint16_t *)zr_tensor_data(w))[i] == zr_f32_to_bf16(p[i]));
            zr_offload_free(o);
            zr_tensor_release(g), zr_tensor_release(w);
            free(p), free(m), free(v), free(rp), free(rm), free(rv), free(rw);
        }
    setenv("ZRUN_OFFLOAD_CHUNK", "0", 1);
    CHECK(zr_offload_new(S, NULL, zr_cpu(), ZR_BF16, 4, segs, S, 0, 0) == NULL); /* refused, with the fix */
    CHECK(strstr(zr_last_error_message(), "ZRUN_OFFLOAD_CHUNK") != NULL);
    unsetenv("ZRUN_OFFLOAD_CHUNK");
    setenv("ZRUN_OFFLOAD_STREAM", "yes", 1);
    CHECK(zr_offload_new(S, NULL, zr_cpu(), ZR_BF16, 4, segs, S, 0, 0) == NULL); /* refused, with the fix */
    CHECK(strstr(zr_last_error_message(), "ZRUN_OFFLOAD_STREAM must be 1") != NULL);
    setenv("ZRUN_OFFLOAD_STREAM", "0", 1);
    zr_offload *o0 = zr_offload_new(S, NULL, zr_cpu(), ZR_BF16, 4, segs, S, 0, 0);
    CHECK(o0 != NULL);
    zr_offload_free(o0);
    unsetenv("ZRUN_OFFLOAD_STREAM");
}

int main(void) {
    RUN(sumsq_matches_double_loop);
    RUN(adamw_scaled_matches_double_loop);
    RUN(adamw_reads_bf16_f16_gradients);
    RUN(adamw_writes_f32_bf16_f16_weights);
    RUN(cast_rounds_like_dtype_h);
    RUN(accumulate_and_fill_match_double_loop);
    RUN(accumulate16_rounds_each_sum_once);
    RUN(lazy_zero_overwrites_then_adds);
    RUN(offload_adamw_segments);
    RUN(adamw_pieces_streamed_weights);
    RUN(pipeline_chunks_match_per_segment_adamw);
    return test_summary();
}
