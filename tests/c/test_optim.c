/* C tests for runtime/ops/optim.c: the flat AdamW step (the ZeRO engine's entry point) with f32 and
 * bf16 gradients against a double-precision loop of torch's AdamW formula, at awkward sizes
 * (1, 7, 100003 — above the OpenMP threshold), and its argument checks. */
#include <stdlib.h>

#include "check.h"
#include "kernels/base/dtype.h"
#include "ops/optim.h"

/* Deterministic values in [-2, 2]. */
static double val(int64_t i, int k) { return 2.0 * sin(0.37 * (double)i + 1.3 * k) * cos(0.011 * (double)i * (k + 1)); }

static int run_case(int64_t n, int bf16) {
    zr_adamw_config c = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-6, .weight_decay = 0.1};
    float *p = malloc(sizeof(float) * (size_t)n), *m = calloc((size_t)n, sizeof(float)),
          *v = calloc((size_t)n, sizeof(float)), *gf = malloc(sizeof(float) * (size_t)n);
    uint16_t *gb = malloc(sizeof(uint16_t) * (size_t)n);
    double *rp = malloc(sizeof(double) * (size_t)n), *rm = calloc((size_t)n, sizeof(double)),
           *rv = calloc((size_t)n, sizeof(double));
    int ok = 1;
    for (int64_t i = 0; i < n; i++) rp[i] = p[i] = (float)val(i, 0);
    for (int step = 1; step <= 3 && ok; step++) {
        for (int64_t i = 0; i < n; i++) {
            gf[i] = (float)val(i, step);
            gb[i] = zr_f32_to_bf16(gf[i]);
            if (bf16) gf[i] = zr_bf16_to_f32(gb[i]); /* the reference sees the rounded gradient */
        }
        if (zr_adamw_step_flat(p, bf16 ? (const void *)gb : gf, bf16 ? ZR_BF16 : ZR_F32, m, v, n, step, &c)) {
            CHECK_MSG(0, "step failed: %s", zr_last_error());
            ok = 0;
            break;
        }
        double bc1 = 1 - pow(c.beta1, step), bc2 = 1 - pow(c.beta2, step);
        for (int64_t i = 0; i < n; i++) {
            double g = gf[i];
            rp[i] -= c.lr * c.weight_decay * rp[i];
            rm[i] = c.beta1 * rm[i] + (1 - c.beta1) * g;
            rv[i] = c.beta2 * rv[i] + (1 - c.beta2) * g * g;
            rp[i] -= c.lr * (rm[i] / bc1) / (sqrt(rv[i] / bc2) + c.eps);
        }
        for (int64_t i = 0; i < n && ok; i++) {
            double tol = 1e-6 + 1e-5 * fabs(rp[i]);
            if (fabs(p[i] - rp[i]) > tol || fabs(m[i] - rm[i]) > 1e-6 || fabs(v[i] - rv[i]) > 1e-6) {
                CHECK_MSG(0, "n %lld step %d element %lld: p %.9g vs %.9g, m %.9g vs %.9g, v %.9g vs %.9g",
                          (long long)n, step, (long long)i, p[i], rp[i], m[i], rm[i], v[i], rv[i]);
                ok = 0;
            }
        }
    }
    free(p), free(m), free(v), free(gf), free(gb), free(rp), free(rm), free(rv);
    return ok;
}

TEST(adamw_flat_f32) {
    run_case(1, 0);
    run_case(7, 0);
    run_case(100003, 0);
}

TEST(adamw_flat_bf16_grads) {
    run_case(7, 1);
    run_case(100003, 1);
}

TEST(adamw_flat_errors) {
    float x[2] = {0}, y[2] = {0}, z[2] = {0}, w[2] = {0};
    zr_adamw_config c = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0};
    CHECK(zr_adamw_step_flat(x, y, ZR_F32, z, w, 2, 0, &c) != ZR_OK);
    CHECK(zr_adamw_step_flat(x, y, ZR_F16, z, w, 2, 1, &c) != ZR_OK);
    CHECK(strstr(zr_last_error(), "f32 or bf16") != NULL);
    c.beta2 = 1.0;
    CHECK(zr_adamw_step_flat(x, y, ZR_F32, z, w, 2, 1, &c) != ZR_OK);
    CHECK(strstr(zr_last_error(), "betas[2]") != NULL);
    c.beta2 = 0.999;
    c.lr = -1;
    CHECK(zr_adamw_step_flat(x, y, ZR_F32, z, w, 2, 1, &c) != ZR_OK);
    CHECK(strstr(zr_last_error(), "lr must be >= 0") != NULL);
}

int main(void) {
    RUN(adamw_flat_f32);
    RUN(adamw_flat_bf16_grads);
    RUN(adamw_flat_errors);
    return test_summary();
}
