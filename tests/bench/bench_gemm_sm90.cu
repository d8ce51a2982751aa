/* Benchmark of our Hopper GEMMs (kernels/cuda/gemm_sm90.cu: ping-pong 128 x 128 tiles, and
 * gemm_sm90_wide.cu: cooperative 128 x 256) against cuBLASLt (gemm_ex_cuda: the
 * runtime's autotuned plans) on Llama-3.2-1B's products at 2048 tokens (forward Y = X Wᵀ bf16, dX =
 * dY W bf16, dW = dYᵀ X into an f32 gradient with beta 1) and GPT-2's c_fc with bias + GELU(aux).
 * Sustained rates: the GPU heated 2 s first, then per product and implementation the best of 3
 * loops of ~0.2 s (under the power cap, not the boost clock). Prints, per product, cuBLASLt's ms
 * and TFLOP/s and each variant's TFLOP/s with r = cuBLASLt's ms over its ms: ping-pong blocks
 * alone (cl1) and in clusters of 2 sharing B by multicast (cl2, gemm_sm90_cluster), each with rings
 * of 4 and 6 stages (s6, gemm_sm90_stages), the wide kernel alone and in clusters of 2 (wide cl2,
 * gemm_sm90_wide_cluster), and whether every variant gives its kernel's default bits. Then for
 * gate_up fwd, gate_up dW f32+= and c_fc bias+GELU, per variant (and clusters of 2 with the ring
 * at cluster scope, session 16's code: GEMM_SM90_DBG_CLUSTER_SCOPE) µs a tile an SM with all
 * stages and with the main loop alone (-a: every gemm_sm90_debug row). Exits 1 when bits differ.
 * Every step (variant, product, what) is printed as "# ..." before its launches and checked after
 * them: a fault prints "CUDA error ... in <step>" (exit 2), a step stuck 60 s "hang ... in <step>"
 * (exit 3).
 * Usage: bench_gemm_sm90 [-a] [filter]: filter, a substring of the product names ("gate_up", "dW",
 * "c_fc"), runs only those (gate_up: about 40 s).
 * Build and run (H100/H200): make build/bench/bench_gemm_sm90 && build/bench/bench_gemm_sm90 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

#include "kernels/cuda/gemm_sm90.h"
#include "../cuda/cu_check.h"
extern "C" {
#include "kernels/base/error.h"
#include "runtime/cuda/blas_plan.h"
}

/* What runs now, printed ("# ...") and flushed BEFORE its launches, so that a fault or a hang names
 * the variant and product; the alarm (re-armed by every step: 60 s) prints "hang in <step>" and
 * exits 3 when a step never finishes. */
static char step_name[256] = "start";
static void on_alarm(int) {
    printf("hang (no progress in 60 s) in %s\n", step_name);
    fflush(stdout);
    _exit(3);
}
static void step(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(step_name, sizeof step_name, fmt, ap);
    va_end(ap);
    printf("# %s\n", step_name);
    fflush(stdout);
    alarm(60);
}
/* After a step's launches: the launch error and the kernels' own (a fault), with the step's name;
 * exits 2 on either. */
static void settle() {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("CUDA error %s in %s\n", cudaGetErrorString(e), step_name);
        fflush(stdout);
        exit(2);
    }
}

/* Random values in [-scale, scale) as bf16 (dtype bf16) or f32 (n elements at p). */
__global__ void bench_fill_kernel(void *p, size_t n, int f32, uint32_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        const float f = ((h & 0xffffff) / 16777216.f * 2.f - 1.f) * scale;
        if (f32) static_cast<float *>(p)[i] = f;
        else static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(f);
    }
}
static void *dev_random(size_t n, int f32, uint32_t seed, float scale) {
    void *p = nullptr;
    CU(cudaMalloc(&p, n * (f32 ? 4 : 2)));
    bench_fill_kernel<<<1024, 256>>>(p, n, f32, seed, scale);
    CU(cudaGetLastError());
    return p;
}

/* Seconds of back-to-back calls of f: mean ms a call over a loop of ~secs. */
static double loop_ms(const std::function<int()> &f, double secs) {
    cudaEvent_t t0, t1;
    CU(cudaEventCreate(&t0));
    CU(cudaEventCreate(&t1));
    CU(cudaEventRecord(t0));
    if (f()) {
        printf("FAILED: %s\n", zr_last_error());
        exit(2);
    }
    CU(cudaEventRecord(t1));
    CU(cudaEventSynchronize(t1));
    float one = 0;
    CU(cudaEventElapsedTime(&one, t0, t1));
    const int n = std::max(1, (int)(secs * 1e3 / std::max(one, 1e-3f)));
    CU(cudaEventRecord(t0));
    for (int i = 0; i < n; ++i) f();
    CU(cudaEventRecord(t1));
    CU(cudaEventSynchronize(t1));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, t0, t1));
    CU(cudaEventDestroy(t0));
    CU(cudaEventDestroy(t1));
    return ms / n;
}
static double best_ms(const std::function<int()> &f) {
    double best = 1e30;
    for (int r = 0; r < 3; ++r) best = std::min(best, loop_ms(f, 0.2));
    return best;
}

struct prod {
    const char *name;
    int ta, tb;
    int64_t m, n, k;
    int f32_beta1, gelu;
};

/* The descriptor of product p on the bench's buffers. */
static zr_gemm_desc desc_of(const prod &p, void *a, void *b, void *c, void *aux, void *bias) {
    zr_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.ta = p.ta, g.tb = p.tb, g.m = p.m, g.n = p.n, g.k = p.k;
    g.a = a, g.lda = p.ta ? p.m : p.k, g.b = b, g.ldb = p.tb ? p.k : p.n;
    g.c = c, g.ldc = p.n, g.batch = 1, g.alpha = 1, g.beta = p.f32_beta1 ? 1 : 0;
    g.ab_dtype = ZR_BF16, g.c_dtype = p.f32_beta1 ? ZR_F32 : ZR_BF16;
    if (p.gelu) g.bias = bias, g.epilogue = ZR_GEMM_EPI_GELU_AUX, g.aux = aux, g.ld_aux = p.n;
    return g;
}

/* One of our variants: kernel fn with gemm_sm90_cluster(cl), gemm_sm90_stages(st),
 * gemm_sm90_wide_cluster(wcl) and extra debug flags dbg; bm x bn output tiles; base: the variant
 * whose bits it must give (-1: none, it is one). */
struct variant {
    const char *name;
    int (*fn)(const zr_gemm_desc *, int, cudaStream_t);
    int cl, st, wcl, dbg, bm, bn, base;
};
static const variant VARS[] = {
    {"cl1", gemm_sm90, 1, 4, 1, 0, 128, 128, -1},      {"cl1 s6", gemm_sm90, 1, 6, 1, 0, 128, 128, 0},
    {"cl2", gemm_sm90, 2, 4, 1, 0, 128, 128, 0},       {"cl2 s6", gemm_sm90, 2, 6, 1, 0, 128, 128, 0},
    {"wide", gemm_sm90_wide, 1, 4, 1, 0, 128, 256, -1}, {"wide cl2", gemm_sm90_wide, 1, 4, 2, 0, 128, 256, 4},
};
enum { N_VARS = sizeof VARS / sizeof VARS[0] };
/* Diagnostic-only variants: clusters of 2 with session 16's cluster-scope ring. */
static const variant SCOPED[] = {
    {"cl2 scoped", gemm_sm90, 2, 4, 1, GEMM_SM90_DBG_CLUSTER_SCOPE, 128, 128, 0},
    {"wide cl2 scoped", gemm_sm90_wide, 1, 4, 2, GEMM_SM90_DBG_CLUSTER_SCOPE, 128, 256, 4},
};

/* The variant's settings and debug flags dbg | v.dbg for every later call (exits on a refusal);
 * use(nullptr, 0): the defaults. */
static void use(const variant *v, int dbg) {
    const int cl = v ? v->cl : 1, st = v ? v->st : 4, wcl = v ? v->wcl : 1;
    if (gemm_sm90_cluster(cl) || gemm_sm90_stages(st) || gemm_sm90_wide_cluster(wcl) ||
        gemm_sm90_debug(dbg | (v ? v->dbg : 0))) {
        fprintf(stderr, "%s\n", zr_last_error());
        exit(1);
    }
}

/* The output bytes (c, and aux with the GELU) of one call of variant v (C refilled for beta 1). */
static std::vector<uint8_t> output_of(const variant &v, const prod &p, const zr_gemm_desc &g, void *c, void *aux) {
    const size_t cb = (size_t)(p.m * p.n) * (p.f32_beta1 ? 4 : 2), ab = p.gelu ? (size_t)(p.m * p.n) * 2 : 0;
    use(&v, 0);
    if (p.f32_beta1) bench_fill_kernel<<<1024, 256>>>(c, (size_t)(p.m * p.n), 1, 7, 1.f);
    step("%s %s: bits", v.name, p.name);
    if (v.fn(&g, 0, 0)) {
        printf("FAILED: %s %s: %s\n", v.name, p.name, zr_last_error());
        exit(2);
    }
    settle();
    std::vector<uint8_t> h(cb + ab);
    CU(cudaMemcpy(h.data(), c, cb, cudaMemcpyDeviceToHost));
    if (ab) CU(cudaMemcpy(h.data() + cb, aux, ab, cudaMemcpyDeviceToHost));
    use(nullptr, 0);
    return h;
}

/* Where a tile's time goes: variant v with stages left out (gemm_sm90_debug; the results are wrong),
 * as ms and µs a tile an SM (tiles / SMs of them run one after another on each SM): all stages and
 * the main loop alone, or with all_rows every flag (the wide kernel has no ping-pong: no SERIAL
 * row). */
static void diagnose(const prod &p, void *a, void *b, void *c, void *aux, void *bias, const variant &v,
                     bool all_rows) {
    static const struct {
        int flags;
        bool always;
        const char *what;
    } vs[] = {
        {0, true, "all stages"},
        {GEMM_SM90_DBG_NO_STORE, false, "no stores"},
        {GEMM_SM90_DBG_NO_CLOAD, false, "no C/bias loads"},
        {GEMM_SM90_DBG_NO_STORE | GEMM_SM90_DBG_NO_CLOAD, true, "main loop only"},
        {GEMM_SM90_DBG_NO_GELU, false, "no GELU math"},
        {GEMM_SM90_DBG_SERIAL, false, "serial (no ping-pong)"},
        {GEMM_SM90_DBG_NO_MMA, false, "no main loop (epilogue)"},
        {GEMM_SM90_DBG_NO_MMA | GEMM_SM90_DBG_NO_STORE, false, "no main loop, no stores"},
    };
    int sms = 0;
    CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const double tiles = (double)((p.m + v.bm - 1) / v.bm) * ((p.n + v.bn - 1) / v.bn), fl = 2.0 * p.m * p.n * p.k;
    const zr_gemm_desc g = desc_of(p, a, b, c, aux, bias);
    for (const auto &r : vs) {
        if (!r.always && !all_rows) continue;
        if ((r.flags & GEMM_SM90_DBG_NO_GELU) && !p.gelu) continue;
        if ((r.flags & GEMM_SM90_DBG_SERIAL) && v.fn == gemm_sm90_wide) continue;
        use(&v, r.flags);
        step("%s %s: %s (flags %d)", v.name, p.name, r.what, r.flags | v.dbg);
        const double ms = best_ms([&] { return v.fn(&g, 0, 0); });
        settle();
        printf("  %-16s %-20s %-26s flags %2d | %9.3f ms %8.1f TFLOP/s | %6.2f us a tile an SM\n", v.name, p.name,
               r.what, r.flags | v.dbg, ms, fl / ms * 1e-9, ms * 1e3 / (tiles / sms));
        fflush(stdout);
    }
    use(nullptr, 0);
}

int main(int argc, char **argv) {
    signal(SIGALRM, on_alarm);
    bool all_rows = false;
    const char *filter = nullptr;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "-a")) all_rows = true;
        else if (!filter && argv[i][0] != '-') filter = argv[i];
        else {
            fprintf(stderr, "usage: bench_gemm_sm90 [-a] [filter]: %s not understood\n", argv[i]);
            return 1;
        }
    }
    /* Llama-3.2-1B, 2048 tokens (M x N x K of the forward: tokens x out x in): q/k/v fused
     * 2048x3072x2048, o 2048x2048x2048, gate/up fused 2048x16384x2048, down 2048x2048x8192, LM head
     * 2048x128256x2048; dX = dY W is (tokens x in x out), dW = dYᵀ X (out x in x tokens) into f32. */
    struct shape {
        const char *name;
        int64_t t, out, in;
    } llama[] = {{"qkv", 2048, 3072, 2048},
                 {"o", 2048, 2048, 2048},
                 {"gate_up", 2048, 16384, 2048},
                 {"down", 2048, 2048, 8192},
                 {"lm_head", 2048, 128256, 2048}};
    prod all[32];
    int na = 0;
    static char names[32][64];
    for (const shape &s : llama) {
        snprintf(names[na], 64, "%s fwd", s.name);
        all[na] = {names[na], 0, 1, s.t, s.out, s.in, 0, 0}, na++;
        snprintf(names[na], 64, "%s dX", s.name);
        all[na] = {names[na], 0, 0, s.t, s.in, s.out, 0, 0}, na++;
        snprintf(names[na], 64, "%s dW f32+=", s.name);
        all[na] = {names[na], 1, 0, s.out, s.in, s.t, 1, 0}, na++;
    }
    /* GPT-2 c_fc: 64 x 1024 tokens, 768 -> 3072, Conv1D's weight (in, out) (tb 0) */
    all[na++] = {"gpt2 c_fc bias+gelu", 0, 0, 65536, 3072, 768, 0, 1};
    prod ps[32];
    int np = 0;
    for (int i = 0; i < na; ++i)
        if (!filter || strstr(all[i].name, filter)) ps[np++] = all[i];
    if (!np) {
        fprintf(stderr, "bench_gemm_sm90: no product name contains '%s'; the names:", filter);
        for (int i = 0; i < na; ++i) fprintf(stderr, " '%s'", all[i].name);
        fprintf(stderr, "\n");
        return 1;
    }

    size_t max_a = 0, max_b = 0, max_c = 0;
    for (int i = 0; i < np; ++i) {
        max_a = std::max(max_a, (size_t)(ps[i].m * ps[i].k));
        max_b = std::max(max_b, (size_t)(ps[i].k * ps[i].n));
        max_c = std::max(max_c, (size_t)(ps[i].m * ps[i].n));
    }
    max_a = std::max(max_a, (size_t)2048 * 2048), max_b = std::max(max_b, (size_t)2048 * 16384); /* the heat */
    max_c = std::max(max_c, (size_t)2048 * 16384);
    void *a = dev_random(max_a, 0, 1, 1.f), *b = dev_random(max_b, 0, 2, 1.f);
    void *c = dev_random(max_c, 1, 3, 1.f), *aux = dev_random(max_c, 0, 4, 1.f);
    void *bias = dev_random(65536, 0, 5, 1.f);
    CU(cudaDeviceSynchronize());

    /* heat: 2 s of the largest forward product (ours) */
    {
        zr_gemm_desc g;
        memset(&g, 0, sizeof g);
        g.ta = 0, g.tb = 1, g.m = 2048, g.n = 16384, g.k = 2048, g.a = a, g.lda = 2048, g.b = b;
        g.ldb = 2048, g.c = c, g.ldc = 16384, g.batch = 1, g.alpha = 1, g.ab_dtype = g.c_dtype = ZR_BF16;
        step("heat: gemm_sm90 (cl1, 4 stages) 2048x16384x2048 for 2 s");
        const auto t0 = std::chrono::steady_clock::now();
        while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) loop_ms([&] { return gemm_sm90(&g, 0, 0); }, 0.1);
        settle();
    }

    /* per product: cuBLASLt, then each variant's TFLOP/s and r = cuBLASLt ms / its ms (above 1: ours
     * faster) */
    printf("%-20s %6s %6s %6s | %8s %6s |", "product", "M", "N", "K", "Lt ms", "TFLOP/s");
    for (const variant &v : VARS) printf(" %9s %5s |", v.name, "r");
    printf(" bits\n");
    int bad = 0;
    for (int i = 0; i < np; ++i) {
        const prod &p = ps[i];
        const zr_gemm_desc g = desc_of(p, a, b, c, aux, bias);
        std::vector<uint8_t> out[N_VARS];
        std::string differ;
        for (int v = 0; v < N_VARS; ++v) {
            out[v] = output_of(VARS[v], p, g, c, aux);
            if (VARS[v].base >= 0 && out[v] != out[VARS[v].base])
                differ += std::string(differ.empty() ? "" : ",") + VARS[v].name;
        }
        step("cuBLASLt %s: timing", p.name);
        const double lt = best_ms([&] { return gemm_ex_cuda(&g, 0); });
        settle();
        const double fl = 2.0 * p.m * p.n * p.k;
        double ms[N_VARS];
        for (int v = 0; v < N_VARS; ++v) {
            use(&VARS[v], 0);
            step("%s %s: timing", VARS[v].name, p.name);
            ms[v] = best_ms([&] { return VARS[v].fn(&g, 0, 0); });
            settle();
        }
        use(nullptr, 0);
        printf("%-20s %6lld %6lld %6lld | %8.3f %6.1f |", p.name, (long long)p.m, (long long)p.n, (long long)p.k, lt,
               fl / lt * 1e-9);
        for (int v = 0; v < N_VARS; ++v) printf(" %9.1f %5.3f |", fl / ms[v] * 1e-9, lt / ms[v]);
        printf(" %s%s\n", differ.empty() ? "same" : "DIFFER: ", differ.c_str());
        bad += !differ.empty();
        fflush(stdout);
    }
    if (bad) printf("%d products: a variant gives other bits than its kernel's default (a bug)\n", bad);
    { /* the grids the launches chose (clusters of 2: as many as cudaOccupancyMaxActiveClusters allows) */
        const zr_gemm_desc g = desc_of(ps[0], a, b, c, aux, bias);
        int blocks[N_VARS];
        for (int v = 0; v < N_VARS; ++v) {
            use(&VARS[v], 0);
            step("%s %s: blocks launched", VARS[v].name, ps[0].name);
            blocks[v] = VARS[v].fn(&g, 0, 0) ? -1 : gemm_sm90_last_blocks();
            settle();
        }
        use(nullptr, 0);
        printf("\nblocks launched for %s:", ps[0].name);
        for (int v = 0; v < N_VARS; ++v) printf(" %s %d%s", VARS[v].name, blocks[v], v == N_VARS - 1 ? "\n" : ",");
    }
    /* diagnostics: a plain bf16 forward, an f32 beta-1 gradient, the bias+GELU epilogue */
    printf("\nwhere ours spends a tile (stages left out; results wrong):\n");
    for (int i = 0; i < np; ++i)
        if (!strcmp(ps[i].name, "gate_up fwd") || !strcmp(ps[i].name, "gate_up dW f32+=") ||
            !strcmp(ps[i].name, "gpt2 c_fc bias+gelu")) {
            if (ps[i].f32_beta1) bench_fill_kernel<<<1024, 256>>>(c, (size_t)(ps[i].m * ps[i].n), 1, 7, 1.f);
            for (const variant &v : VARS) diagnose(ps[i], a, b, c, aux, bias, v, all_rows);
            for (const variant &v : SCOPED) diagnose(ps[i], a, b, c, aux, bias, v, all_rows);
        }
    alarm(0);
    return bad ? 1 : 0;
}
