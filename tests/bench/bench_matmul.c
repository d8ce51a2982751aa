/* matmul throughput: raw OpenBLAS cblas_sgemm against zr_matmul (and zr_linear, which reads
 * Wᵀ in place) on f32 square matrices, default 2048^3. One warm-up, then the best of 5 runs;
 * the order of the three calls rotates every run so machine drift and BLAS thread wake-up hit
 * all of them alike. Exits 1 when zr_matmul is below 90% of sgemm.
 * Usage: build/bench/bench_matmul [n [runs]] */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef ZR_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include "core/tensor.h"
#include "ops/matmul.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static zr_tensor *filled(int64_t n, unsigned seed) { /* (n, n) f32, values in [-1, 1) */
    zr_tensor *t = zr_tensor_new(ZR_F32, zr_cpu(), 2, (int64_t[]){n, n});
    if (!t) return NULL;
    float *p = zr_tensor_data(t);
    for (int64_t i = 0; i < n * n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) / (float)(1u << 23) - 1.0f;
    }
    return t;
}

static zr_tensor *a, *b, *c;

/* Runs implementation k once; returns seconds, or -1 on error. */
static double run(int k, int64_t n) {
    double t0 = now();
    zr_tensor *y = NULL;
    switch (k) {
    case 0:
#ifdef ZR_HAVE_OPENBLAS
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f,
                    zr_tensor_data(a), (int)n, zr_tensor_data(b), (int)n, 0.0f, zr_tensor_data(c), (int)n);
#endif
        return now() - t0;
    case 1: y = zr_matmul(a, b); break;
    default: y = zr_linear(a, b, NULL); break; /* a · bᵀ: b read transposed, never copied */
    }
    double t = now() - t0;
    if (!y) return -1;
    zr_tensor_release(y);
    return t;
}

static void row(const char *name, int64_t n, double s) {
    printf("| %-24s | %6lld^3 | %9.2f | %8.1f |\n", name, (long long)n, s * 1e3,
           2.0 * (double)n * (double)n * (double)n / s / 1e9);
}

int main(int argc, char **argv) {
    int64_t n = argc > 1 ? atoll(argv[1]) : 2048;
    int runs = argc > 2 ? atoi(argv[2]) : 5;
    a = filled(n, 1), b = filled(n, 2), c = zr_tensor_new(ZR_F32, zr_cpu(), 2, (int64_t[]){n, n});
    if (!a || !b || !c) {
        fprintf(stderr, "bench_matmul: %s\n", zr_last_error());
        return 1;
    }
    double best[3] = {1e30, 1e30, 1e30};
    for (int rep = 0; rep <= runs; rep++) { /* rep 0 is the warm-up */
        for (int j = 0; j < 3; j++) {
            int k = (rep + j) % 3;
            double t = run(k, n);
            if (t < 0) {
                fprintf(stderr, "bench_matmul: %s\n", zr_last_error());
                return 1;
            }
            if (rep && t < best[k]) best[k] = t;
        }
    }
    printf("| %-24s | %-8s | %9s | %8s |\n", "f32, best of runs", "m=n=k", "ms", "GFLOP/s");
    printf("|--------------------------|----------|-----------|----------|\n");
#ifdef ZR_HAVE_OPENBLAS
    row("raw cblas_sgemm", n, best[0]);
#else
    printf("| %-24s | %6lld^3 | %9s | %8s |\n", "raw sgemm: no OpenBLAS", (long long)n, "-", "-");
#endif
    row("zr_matmul", n, best[1]);
    row("zr_linear (x W^T)", n, best[2]);
    int status = 0;
#ifdef ZR_HAVE_OPENBLAS
    double ratio = best[0] / best[1];
    printf("zr_matmul / sgemm = %.1f%% (required >= 90%%): %s\n", 100 * ratio,
           ratio >= 0.9 ? "ok" : "TOO SLOW");
    status = ratio >= 0.9 ? 0 : 1;
#endif
    zr_tensor_release(a);
    zr_tensor_release(b);
    zr_tensor_release(c);
    return status;
}
