/* CUDA backend benchmark and kernel checks, for the GPU machine:
 *   make build/bench/bench_cuda && build/bench/bench_cuda [--quick | --check | --bw]
 *   (--bw: the checks and the memory-bound kernels, no GEMM timing)
 * 1. checks the kernels that Lua cannot reach yet (cuBLASLt GEMM in every transposition, batched,
 *    broadcast, bias epilogue, beta; binary max/min, where, fill_rows, sum_cols) against f64 host
 *    references on random data at awkward shapes, printing PASS/FAIL lines;
 * 2. times cuBLASLt bf16 GEMM at the Llama-3.2-1B shapes (tokens 2048 x hidden 2048 x N) in TFLOP/s,
 *    and the memory-bound kernels in GB/s (bytes read + written) against the ~4.3 TB/s copy rate.
 * Times are medians of CUDA-event-timed repetitions after warm-up, on random (never zero) data.
 * Prints SKIP where there is no GPU or no CUDA in the build. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/random.h"
#include "core/tensor.h"
#include "cuda/device.h"

#ifndef ZR_HAVE_CUDA
int main(void) {
    printf("SKIP bench_cuda: this build has no CUDA\n");
    return 0;
}
#else
#include "cuda/blas_plan.h"
#include "kernels/cpu/kernels.h" /* op codes */
#include "kernels/cuda/copy.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/random.h"
#include "kernels/cuda/reduce.h"

static const zr_device GPU = {ZR_CUDA, 0};
static int n_fail;
static cudaStream_t S;

#define DIE_IF(x)                                                                                  \
    do {                                                                                           \
        if (x) {                                                                                   \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, zr_last_error_message());      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Random tensor of dtype dt on the GPU, and its exact values as host doubles. */
static zr_tensor *rand_dev(zr_dtype dt, int64_t n, double **host) {
    zr_tensor *t = zr_tensor_new(dt, GPU, 1, &n);
    DIE_IF(!t || zr_tensor_normal_(t, 0, 1));
    if (host) DIE_IF(!(*host = zr_tensor_to_doubles(t)));
    return t;
}

static void report(const char *name, double err, double tol) {
    int ok = err <= tol && err == err;
    if (!ok) n_fail++;
    printf("%s %s (rel err %.2e, tol %.0e)\n", ok ? "PASS" : "FAIL", name, err, tol);
}

static double rel_err(const double *got, const double *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double tol_for(zr_dtype ab, zr_dtype c) {
    if (c == ZR_F64) return 1e-12;
    if (c == ZR_F32) return ab == ZR_F32 ? 1e-5 : 2e-6;
    return 1e-2;
}

typedef struct {
    int64_t m, n, k;
    int ta, tb, pad, batch, bcast_b, bias;
    double alpha, beta;
    zr_dtype ab, c;
} gemm_case;

static void check_gemm(const gemm_case *gc) {
    int64_t ar = gc->ta ? gc->k : gc->m, ac = gc->ta ? gc->m : gc->k;
    int64_t br = gc->tb ? gc->n : gc->k, bc = gc->tb ? gc->k : gc->n;
    int64_t lda = ac + gc->pad, ldb = bc + gc->pad, ldc = gc->n + gc->pad;
    int64_t sa = ar * lda, sb = gc->bcast_b ? 0 : br * ldb, sc = gc->m * ldc;
    double *ha, *hb, *hc, *hbias = NULL;
    zr_tensor *a = rand_dev(gc->ab, sa * gc->batch, &ha);
    zr_tensor *b = rand_dev(gc->ab, (gc->bcast_b ? br * ldb : sb * gc->batch), &hb);
    zr_tensor *c = rand_dev(gc->c, sc * gc->batch, &hc);
    zr_tensor *bias = gc->bias ? rand_dev(gc->c, gc->n, &hbias) : NULL;
    int64_t nc = sc * gc->batch;
    double *ref = malloc((size_t)nc * sizeof *ref);
    memcpy(ref, hc, (size_t)nc * sizeof *ref);
    for (int64_t bi = 0; bi < gc->batch; bi++)
        for (int64_t i = 0; i < gc->m; i++)
            for (int64_t j = 0; j < gc->n; j++) {
                double s = 0;
                for (int64_t p = 0; p < gc->k; p++) {
                    double x = gc->ta ? ha[bi * sa + p * lda + i] : ha[bi * sa + i * lda + p];
                    double y = gc->tb ? hb[bi * sb + j * ldb + p] : hb[bi * sb + p * ldb + j];
                    s += x * y;
                }
                double *o = &ref[bi * sc + i * ldc + j];
                *o = gc->alpha * s + (gc->beta != 0 ? gc->beta * *o : 0) + (hbias ? hbias[j] : 0);
            }
    zr_gemm_desc g = {gc->ta, gc->tb, gc->m, gc->n, gc->k, zr_tensor_data(a), lda, sa, zr_tensor_data(b),
                      ldb, sb, zr_tensor_data(c), ldc, sc, gc->batch, bias ? zr_tensor_data(bias) : NULL,
                      gc->alpha, gc->beta, gc->ab, gc->c, ZR_GEMM_EPI_NONE, NULL, 0};
    char name[200];
    snprintf(name, sizeof name, "gemm %s->%s m=%lld n=%lld k=%lld ta=%d tb=%d pad=%d batch=%d%s%s beta=%g",
             zr_dtype_name(gc->ab), zr_dtype_name(gc->c), (long long)gc->m, (long long)gc->n, (long long)gc->k,
             gc->ta, gc->tb, gc->pad, gc->batch, gc->bcast_b ? " bcastB" : "", gc->bias ? " bias" : "", gc->beta);
    double *got = NULL;
    if (gemm_ex_cuda(&g, S)) {
        printf("FAIL %s: %s\n", name, zr_last_error_message());
        n_fail++;
        goto out;
    }
    got = zr_tensor_to_doubles(c);
    DIE_IF(!got);
    /* padding columns must be untouched */
    for (int64_t bi = 0; bi < gc->batch; bi++)
        for (int64_t i = 0; i < gc->m; i++)
            for (int64_t j = gc->n; j < ldc; j++) ref[bi * sc + i * ldc + j] = hc[bi * sc + i * ldc + j];
    report(name, rel_err(got, ref, nc), tol_for(gc->ab, gc->c));
out:
    free(ha), free(hb), free(hc), free(hbias), free(ref), free(got);
    zr_tensor_release(a), zr_tensor_release(b), zr_tensor_release(c), zr_tensor_release(bias);
}

/* linear_forward/backward_cuda against host loops (f32, awkward sizes). */
static void check_linear(int64_t rows, int64_t in, int64_t out) {
    double *hx, *hw, *hb, *hg, *hdw0;
    zr_tensor *x = rand_dev(ZR_F32, rows * in, &hx), *w = rand_dev(ZR_F32, out * in, &hw);
    zr_tensor *b = rand_dev(ZR_F32, out, &hb), *g = rand_dev(ZR_F32, rows * out, &hg);
    zr_tensor *y = rand_dev(ZR_F32, rows * out, NULL), *dx = rand_dev(ZR_F32, rows * in, NULL);
    zr_tensor *dw = rand_dev(ZR_F32, out * in, &hdw0), *db = rand_dev(ZR_F32, out, NULL);
    DIE_IF(linear_forward_cuda(zr_tensor_data(y), zr_tensor_data(x), zr_tensor_data(w), zr_tensor_data(b), rows, in,
                               out, ZR_F32, S));
    DIE_IF(linear_backward_cuda(zr_tensor_data(dx), zr_tensor_data(dw), zr_tensor_data(db), zr_tensor_data(g),
                                zr_tensor_data(x), zr_tensor_data(w), rows, in, out, 1, ZR_F32, S));
    double *ry = calloc((size_t)(rows * out), sizeof(double)), *rdx = calloc((size_t)(rows * in), sizeof(double));
    double *rdw = malloc((size_t)(out * in) * sizeof(double)), *rdb = calloc((size_t)out, sizeof(double));
    memcpy(rdw, hdw0, (size_t)(out * in) * sizeof(double)); /* accumulate = 1 */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out; o++) {
            double s = hb[o];
            for (int64_t i = 0; i < in; i++) {
                s += hx[r * in + i] * hw[o * in + i];
                rdx[r * in + i] += hg[r * out + o] * hw[o * in + i];
                rdw[o * in + i] += hg[r * out + o] * hx[r * in + i];
            }
            ry[r * out + o] = s;
            rdb[o] += hg[r * out + o];
        }
    double *gy = zr_tensor_to_doubles(y), *gdx = zr_tensor_to_doubles(dx), *gdw = zr_tensor_to_doubles(dw);
    double *gdb = zr_tensor_to_doubles(db);
    char name[96];
    snprintf(name, sizeof name, "linear %lldx%lld -> %lld: forward with bias", (long long)rows, (long long)in, (long long)out);
    report(name, rel_err(gy, ry, rows * out), 1e-5);
    report("linear backward dx", rel_err(gdx, rdx, rows * in), 1e-5);
    report("linear backward dw (accumulated)", rel_err(gdw, rdw, out * in), 1e-5);
    report("linear backward db", rel_err(gdb, rdb, out), 1e-5);
    free(hx), free(hw), free(hb), free(hg), free(hdw0), free(ry), free(rdx), free(rdw), free(rdb);
    free(gy), free(gdx), free(gdw), free(gdb);
    zr_tensor *ts[] = {x, w, b, g, y, dx, dw, db};
    for (int i = 0; i < 8; i++) zr_tensor_release(ts[i]);
}

static void checks(void) {
    check_linear(37, 29, 13);
    check_linear(1, 1, 1);
    const zr_dtype dts[] = {ZR_F32, ZR_BF16, ZR_F16, ZR_F64};
    const int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {127, 33, 65}, {64, 96, 128}};
    for (int d = 0; d < 4; d++)
        for (int s = 0; s < 4; s++)
            for (int t = 0; t < 4; t++) {
                gemm_case gc = {shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, (s & 1) ? 3 : 0,
                                1, 0, 0, 1.0, 0.0, dts[d], dts[d]};
                if (dts[d] != ZR_F32 && dts[d] != ZR_F64) gc.pad = (s & 1) ? 8 : 0; /* 16-byte rows */
                check_gemm(&gc);
            }
    gemm_case extra[] = {
        {33, 40, 24, 0, 1, 0, 3, 0, 0, 1.0, 0.0, ZR_BF16, ZR_BF16},  /* batched */
        {33, 40, 24, 1, 0, 0, 4, 1, 0, 1.0, 0.0, ZR_F32, ZR_F32},    /* batched, B broadcast */
        {64, 72, 48, 0, 1, 0, 1, 0, 1, 1.0, 0.0, ZR_BF16, ZR_BF16},  /* bias epilogue */
        {64, 72, 48, 0, 1, 0, 1, 0, 1, 1.0, 0.0, ZR_F32, ZR_F32},    /* bias epilogue f32 */
        {31, 17, 9, 1, 1, 0, 1, 0, 0, 0.5, 1.0, ZR_F32, ZR_F32},     /* beta = 1 accumulates */
        {64, 48, 80, 0, 0, 0, 1, 0, 0, 1.0, 0.0, ZR_BF16, ZR_F32},   /* bf16 in, f32 out */
        {5, 6, 0, 0, 0, 0, 1, 0, 1, 1.0, 1.0, ZR_F32, ZR_F32},       /* k = 0 */
    };
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) check_gemm(&extra[i]);

    /* binary max/min (contiguous and broadcast) and where, against host loops */
    int64_t R = 37, C = 129, n = R * C, one = 1, cs = C;
    double *ha, *hb;
    zr_tensor *a = rand_dev(ZR_F32, n, &ha), *b = rand_dev(ZR_F32, C, &hb), *o = zr_tensor_new(ZR_F32, GPU, 1, &n);
    for (int op = ZR_BIN_MAX; op <= ZR_BIN_MIN; op++) {
        int64_t shape[2] = {R, C}, as[2] = {C, 1}, bs[2] = {0, 1};
        DIE_IF(binary_forward_cuda(zr_tensor_data(o), zr_tensor_data(a), as, zr_tensor_data(b), bs, 2, shape, op,
                                   ZR_F32, S));
        double *got = zr_tensor_to_doubles(o), *ref = malloc((size_t)n * sizeof *ref);
        for (int64_t i = 0; i < n; i++) {
            double x = ha[i], y = hb[i % C];
            ref[i] = op == ZR_BIN_MAX ? (x > y ? x : y) : (x < y ? x : y);
        }
        report(op == ZR_BIN_MAX ? "binary maximum, broadcast row" : "binary minimum, broadcast row",
               rel_err(got, ref, n), 0);
        free(got), free(ref);
    }
    {
        zr_tensor *cond = zr_tensor_new(ZR_U8, GPU, 1, &cs);
        DIE_IF(zr_tensor_bernoulli_(cond, 0.5));
        double *hcnd = zr_tensor_to_doubles(cond);
        int64_t shape[2] = {R, C}, cst[2] = {0, 1}, ast[2] = {1, R}, bst[2] = {0, 1}; /* a read transposed */
        DIE_IF(where_forward_cuda(zr_tensor_data(o), zr_tensor_data(cond), cst, zr_tensor_data(a), ast,
                                  zr_tensor_data(b), bst, 2, shape, ZR_F32, S));
        double *got = zr_tensor_to_doubles(o), *ref = malloc((size_t)n * sizeof *ref);
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) ref[i * C + j] = hcnd[j] ? ha[j * R + i] : hb[j];
        report("where, strided and broadcast", rel_err(got, ref, n), 0);
        free(got), free(ref), free(hcnd);
        zr_tensor_release(cond);
    }
    {
        DIE_IF(fill_rows_cuda(zr_tensor_data(o), zr_tensor_data(b), R, C, ZR_F32, S));
        double *got = zr_tensor_to_doubles(o), *ref = malloc((size_t)n * sizeof *ref);
        for (int64_t i = 0; i < n; i++) ref[i] = hb[i % C];
        report("fill_rows", rel_err(got, ref, n), 0);
        free(got), free(ref);
        zr_tensor *sc = zr_tensor_new(ZR_F32, GPU, 1, &cs);
        DIE_IF(linear_bias_grad_cuda(zr_tensor_data(sc), zr_tensor_data(a), R, C, ZR_F32, S));
        got = zr_tensor_to_doubles(sc);
        ref = calloc((size_t)C, sizeof *ref);
        for (int64_t i = 0; i < n; i++) ref[i % C] += ha[i];
        report("sum_cols (bias gradient)", rel_err(got, ref, C), 1e-6);
        free(got), free(ref);
        zr_tensor_release(sc);
    }
    { /* max with argmax, many long rows (the warp-per-row path): ties, -inf rows, NaN */
        const zr_dtype mdt[] = {ZR_BF16, ZR_F32};
        for (int d = 0; d < 2; d++) {
            int64_t mr = 1100, mc = 1032, mn = mr * mc;
            double *hx;
            zr_tensor *mx = rand_dev(mdt[d], mn, &hx);
            for (int64_t i = 0; i < mc; i++) hx[5 * mc + i] = -INFINITY;              /* row 5 */
            hx[7 * mc + 3] = hx[7 * mc + 900] = 50;                                 /* tie */
            hx[9 * mc + 1000] = NAN, hx[9 * mc + 1001] = NAN, hx[9 * mc + 2] = 60;  /* NaN wins */
            zr_tensor *hxt = zr_tensor_new(ZR_F64, zr_cpu(), 1, &mn);
            DIE_IF(!hxt);
            memcpy(zr_tensor_data(hxt), hx, (size_t)mn * sizeof(double));
            zr_tensor_release(mx);
            mx = zr_tensor_to_raw(hxt, mdt[d], GPU);
            DIE_IF(!mx);
            zr_tensor *mo = zr_tensor_new(mdt[d], GPU, 1, &mr), *mi = zr_tensor_new(ZR_I64, GPU, 1, &mr);
            DIE_IF(reduce_max_rows_cuda(zr_tensor_data(mo), zr_tensor_data(mi), zr_tensor_data(mx), mr, mc, mdt[d], S));
            double *gv = zr_tensor_to_doubles(mo), *gi = zr_tensor_to_doubles(mi);
            int bad = 0;
            for (int64_t r = 0; r < mr && !bad; r++) {
                int64_t bi = 0;
                for (int64_t c = 1; c < mc; c++) {
                    double v = hx[r * mc + c], bv = hx[r * mc + bi];
                    if ((v != v && bv == bv) || v > bv) bi = c;
                }
                double want = hx[r * mc + bi];
                if (gi[r] != (double)bi || !(gv[r] == want || (gv[r] != gv[r] && want != want))) {
                    printf("  row %lld: got %g at %g, want %g at %lld\n", (long long)r, gv[r], gi[r], want, (long long)bi);
                    bad = 1;
                }
            }
            report(d == 0 ? "max rows bf16 with argmax (1100, 1032): ties, -inf, NaN" : "max rows f32 with argmax (1100, 1032)",
                   bad, 0);
            free(hx), free(gv), free(gi);
            zr_tensor_release(mx), zr_tensor_release(hxt), zr_tensor_release(mo), zr_tensor_release(mi);
        }
    }
    (void)one;
    free(ha), free(hb);
    zr_tensor_release(a), zr_tensor_release(b), zr_tensor_release(o);
}

/* --- timing --- */

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef int (*bench_fn)(void *ctx);

/* Median milliseconds of reps event-timed calls after warm warm-up calls. */
static double time_ms(bench_fn fn, void *ctx, int warm, int reps) {
    for (int i = 0; i < warm; i++) DIE_IF(fn(ctx));
    cudaEvent_t e0 = zr_cuda_event_new(1), e1 = zr_cuda_event_new(1);
    float t[64];
    if (reps > 64) reps = 64;
    for (int i = 0; i < reps; i++) {
        DIE_IF(zr_cuda_event_record(e0, S));
        DIE_IF(fn(ctx));
        DIE_IF(zr_cuda_event_record(e1, S));
        DIE_IF(zr_cuda_event_sync(e1));
        t[i] = zr_cuda_event_elapsed_ms(e0, e1);
    }
    zr_cuda_event_free(e0), zr_cuda_event_free(e1);
    qsort(t, (size_t)reps, sizeof t[0], cmp_f);
    return t[reps / 2];
}

static int gemm_fn(void *ctx) { return gemm_ex_cuda((const zr_gemm_desc *)ctx, S); }

static void bench_gemm(int quick) {
    const int64_t T = 2048, H = 2048, Ns[] = {2048, 512, 8192, 128256};
    printf("\n== cuBLASLt bf16 GEMM, f32 accumulate (tokens %lld x hidden %lld x N) ==\n", (long long)T, (long long)H);
    printf("%-34s %10s %10s\n", "shape", "ms", "TFLOP/s");
    {   /* the ceiling this card gives a large square product */
        int64_t N = 8192, nn = N * N;
        zr_tensor *a = rand_dev(ZR_BF16, nn, NULL), *b = rand_dev(ZR_BF16, nn, NULL), *c = rand_dev(ZR_BF16, nn, NULL);
        zr_gemm_desc g = {0, 0, N, N, N, zr_tensor_data(a), N, 0, zr_tensor_data(b), N, 0, zr_tensor_data(c), N, 0,
                          1, NULL, 1.0, 0.0, ZR_BF16, ZR_BF16, ZR_GEMM_EPI_NONE, NULL, 0};
        double ms = time_ms(gemm_fn, &g, 3, quick ? 5 : 20);
        printf("%-34s %10.3f %10.1f\n", "8192 x 8192 x 8192 (ceiling)", ms, 2.0 * N * N * N / (ms * 1e-3) / 1e12);
        zr_tensor_release(a), zr_tensor_release(b), zr_tensor_release(c);
    }
    for (int i = 0; i < 4; i++) {
        int64_t N = Ns[i];
        zr_tensor *x = rand_dev(ZR_BF16, T * H, NULL), *w = rand_dev(ZR_BF16, N * H, NULL);
        zr_tensor *y = rand_dev(ZR_BF16, T * N, NULL), *dx = rand_dev(ZR_BF16, T * H, NULL);
        zr_tensor *dw = rand_dev(ZR_BF16, N * H, NULL), *bias = rand_dev(ZR_BF16, N, NULL);
        zr_gemm_desc fwd = {0, 1, T, N, H, zr_tensor_data(x), H, 0, zr_tensor_data(w), H, 0, zr_tensor_data(y), N, 0,
                            1, NULL, 1.0, 0.0, ZR_BF16, ZR_BF16, ZR_GEMM_EPI_NONE, NULL, 0};
        zr_gemm_desc fwdb = fwd;
        fwdb.bias = zr_tensor_data(bias);
        zr_gemm_desc dgrad = {0, 0, T, H, N, zr_tensor_data(y), N, 0, zr_tensor_data(w), H, 0, zr_tensor_data(dx), H, 0,
                              1, NULL, 1.0, 0.0, ZR_BF16, ZR_BF16, ZR_GEMM_EPI_NONE, NULL, 0};
        zr_gemm_desc wgrad = {1, 0, N, H, T, zr_tensor_data(y), N, 0, zr_tensor_data(x), H, 0, zr_tensor_data(dw), H, 0,
                              1, NULL, 1.0, 0.0, ZR_BF16, ZR_BF16, ZR_GEMM_EPI_NONE, NULL, 0};
        /* what training runs: dW added into the fp32 gradient partition (beta 1, f32 output) */
        zr_tensor *dw32 = rand_dev(ZR_F32, N * H, NULL);
        zr_gemm_desc wgrad32 = wgrad;
        wgrad32.c = zr_tensor_data(dw32);
        wgrad32.beta = 1.0;
        wgrad32.c_dtype = ZR_F32;
        double flops = 2.0 * T * H * N;
        const char *names[] = {"fwd  Y = X W^T", "fwd  Y = X W^T + b (epilogue)", "dX = dY W", "dW = dY^T X",
                               "dW += dY^T X (f32 partition)"};
        zr_gemm_desc *gs[] = {&fwd, &fwdb, &dgrad, &wgrad, &wgrad32};
        for (int j = 0; j < 5; j++) {
            double ms = time_ms(gemm_fn, gs[j], 3, quick ? 5 : 20);
            char lbl[96];
            snprintf(lbl, sizeof lbl, "N=%-6lld %s", (long long)N, names[j]);
            printf("%-40s %10.3f %10.1f\n", lbl, ms, flops / (ms * 1e-3) / 1e12);
        }
        zr_tensor_release(x), zr_tensor_release(w), zr_tensor_release(y), zr_tensor_release(dx);
        zr_tensor_release(dw), zr_tensor_release(bias), zr_tensor_release(dw32);
    }
}

typedef struct {
    int kind;
    void *o, *a, *b, *ws;
    int64_t n, rows, cols;
    zr_dtype dt, dt2;
} bw_ctx;

enum { K_COPY, K_CAST, K_SILU, K_ADD, K_ADD_ROW, K_AFFINE, K_AXPY, K_TRANSPOSE, K_SUM, K_MAX, K_RANDN, K_FILL,
       K_SILU_BWD };

static int bw_fn(void *p) {
    bw_ctx *c = p;
    int64_t one_st[1] = {1};
    switch (c->kind) {
    case K_COPY:
    case K_CAST: return copy_strided_cuda(c->o, c->dt2, one_st, c->a, c->dt, one_st, 1, &c->n, S);
    case K_SILU: return unary_forward_cuda(c->o, c->a, c->n, ZR_UN_SILU, 0, c->dt, S);
    case K_SILU_BWD: return unary_backward_cuda(c->o, c->a, c->b, NULL, c->n, ZR_UN_SILU, 0, c->dt, S);
    case K_ADD: {
        int64_t s1[1] = {1};
        return binary_forward_cuda(c->o, c->a, s1, c->b, s1, 1, &c->n, ZR_BIN_ADD, c->dt, S);
    }
    case K_ADD_ROW: {
        int64_t shape[2] = {c->rows, c->cols}, as[2] = {c->cols, 1}, bs[2] = {0, 1};
        return binary_forward_cuda(c->o, c->a, as, c->b, bs, 2, shape, ZR_BIN_ADD, c->dt, S);
    }
    case K_AFFINE: return affine_forward_cuda(c->o, c->a, c->n, 2.0, 1.0, c->dt, S);
    case K_AXPY: return axpy_cuda(c->o, c->a, c->n, 0.5, c->dt, S);
    case K_TRANSPOSE: {
        int64_t shape[2] = {c->rows, c->cols}, os[2] = {c->cols, 1}, is[2] = {1, c->rows};
        return copy_strided_cuda(c->o, c->dt, os, c->a, c->dt, is, 2, shape, S);
    }
    case K_SUM: return reduce_sum_rows_cuda(c->o, c->a, c->rows, c->cols, 1.0, c->ws, c->dt, S);
    case K_MAX: return reduce_max_rows_cuda(c->o, (int64_t *)c->b, c->a, c->rows, c->cols, c->dt, S);
    case K_RANDN: return random_fill_cuda(c->o, c->dt, c->n, 1, 0, 1, 42, 0, S);
    case K_FILL: return fill_strided_cuda(c->o, c->dt, one_st, 1, &c->n, 1.5, S);
    default: return -1;
    }
}

static void bench_bandwidth(int quick) {
    int64_t N = quick ? (int64_t)1 << 26 : (int64_t)1 << 28; /* 1 GiB of f32 per buffer */
    printf("\n== memory-bound kernels, %lld elements (GB/s counts bytes read + written; copy ceiling ~4300) ==\n",
           (long long)N);
    printf("%-44s %10s %10s %8s\n", "kernel", "ms", "GB/s", "% 4.3T");
    zr_tensor *a = rand_dev(ZR_F32, N, NULL), *b = rand_dev(ZR_F32, N, NULL), *o = rand_dev(ZR_F32, N, NULL);
    zr_tensor *ah = rand_dev(ZR_BF16, N, NULL), *bh = rand_dev(ZR_BF16, N, NULL), *oh = rand_dev(ZR_BF16, N, NULL);
    int64_t rows = N / 4096, cols = 4096, nidx = rows;
    zr_tensor *idx = zr_tensor_new(ZR_I64, GPU, 1, &nidx);
    int64_t wsz = (int64_t)reduce_sum_rows_cuda_workspace(1, N);
    zr_tensor *ws = zr_tensor_new(ZR_U8, GPU, 1, &wsz);
    DIE_IF(!idx || !ws);
    void *F = zr_tensor_data(a), *G = zr_tensor_data(b), *O = zr_tensor_data(o);
    void *FH = zr_tensor_data(ah), *GH = zr_tensor_data(bh), *OH = zr_tensor_data(oh);
    int64_t side = (int64_t)sqrt((double)N);
    struct {
        const char *name;
        bw_ctx c;
        double bytes_per;
    } rows_[] = {
        {"copy f32 (cudaMemcpyAsync D2D)", {K_COPY, O, F, NULL, NULL, N, 0, 0, ZR_F32, ZR_F32}, 8},
        {"cast f32 -> bf16", {K_CAST, OH, F, NULL, NULL, N, 0, 0, ZR_F32, ZR_BF16}, 6},
        {"cast bf16 -> f32", {K_CAST, O, FH, NULL, NULL, N, 0, 0, ZR_BF16, ZR_F32}, 6},
        {"silu f32", {K_SILU, O, F, NULL, NULL, N, 0, 0, ZR_F32, ZR_F32}, 8},
        {"silu bf16", {K_SILU, OH, FH, NULL, NULL, N, 0, 0, ZR_BF16, ZR_BF16}, 4},
        {"silu backward bf16", {K_SILU_BWD, OH, FH, GH, NULL, N, 0, 0, ZR_BF16, ZR_BF16}, 6},
        {"add f32", {K_ADD, O, F, G, NULL, N, 0, 0, ZR_F32, ZR_F32}, 12},
        {"add bf16", {K_ADD, OH, FH, GH, NULL, N, 0, 0, ZR_BF16, ZR_BF16}, 6},
        {"add f32 (rows, 4096) + (4096) broadcast", {K_ADD_ROW, O, F, G, NULL, N, rows, cols, ZR_F32, ZR_F32}, 8},
        {"affine f32 (2x+1)", {K_AFFINE, O, F, NULL, NULL, N, 0, 0, ZR_F32, ZR_F32}, 8},
        {"axpy bf16 (y += 0.5 x)", {K_AXPY, OH, FH, NULL, NULL, N, 0, 0, ZR_BF16, ZR_BF16}, 6},
        {"transpose copy f32 (square)", {K_TRANSPOSE, O, F, NULL, NULL, side * side, side, side, ZR_F32, ZR_F32}, 8},
        {"sum rows f32 (rows, 4096)", {K_SUM, O, F, NULL, NULL, N, rows, cols, ZR_F32, ZR_F32}, 4},
        {"sum f32 one row (split, 2 passes)", {K_SUM, O, F, NULL, zr_tensor_data(ws), N, 1, N, ZR_F32, ZR_F32}, 4},
        {"max rows bf16 with argmax (rows, 4096)", {K_MAX, OH, FH, zr_tensor_data(idx), NULL, N, rows, cols, ZR_BF16, ZR_BF16}, 2},
        {"randn fill f32 (Philox)", {K_RANDN, O, NULL, NULL, NULL, N, 0, 0, ZR_F32, ZR_F32}, 4},
        {"fill f32 (1.5)", {K_FILL, O, NULL, NULL, NULL, N, 0, 0, ZR_F32, ZR_F32}, 4},
    };
    for (size_t i = 0; i < sizeof rows_ / sizeof rows_[0]; i++) {
        double ms = time_ms(bw_fn, &rows_[i].c, 2, quick ? 5 : 15);
        double n = (double)(rows_[i].c.kind == K_TRANSPOSE ? rows_[i].c.n : N);
        double gbs = rows_[i].bytes_per * n / (ms * 1e-3) / 1e9;
        printf("%-44s %10.3f %10.0f %7.0f%%\n", rows_[i].name, ms, gbs, 100 * gbs / 4300);
    }
    zr_tensor_release(a), zr_tensor_release(b), zr_tensor_release(o), zr_tensor_release(ah);
    zr_tensor_release(bh), zr_tensor_release(oh), zr_tensor_release(idx), zr_tensor_release(ws);
}

int main(int argc, char **argv) {
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int only_check = argc > 1 && strcmp(argv[1], "--check") == 0;
    int bw_only = argc > 1 && strcmp(argv[1], "--bw") == 0;
    zr_cuda_install();
    if (!zr_cuda_is_available()) {
        printf("SKIP bench_cuda: no CUDA device (%s)\n", zr_cuda_unavailable_reason());
        return 0;
    }
    char name[256];
    int sms = 0;
    int64_t mem = 0;
    DIE_IF(zr_cuda_device_info(0, name, &sms, &mem));
    printf("device: %s, %d SMs, %.1f GiB\n", name, sms, (double)mem / (1 << 30));
    S = zr_cuda_stream(GPU);
    zr_manual_seed(2024);
    checks();
    if (!only_check) {
        if (!bw_only) bench_gemm(quick);
        bench_bandwidth(quick);
    }
    DIE_IF(zr_cuda_synchronize(0));
    printf("\n%d checks failed\n", n_fail);
    return n_fail ? 1 : 0;
}
#endif
