/* Benchmark of our Hopper GEMMs (kernels/cuda/gemm_sm90.cu: ping-pong 128 x 128 tiles, and
 * gemm_sm90_wide.cu: cooperative 128 x 256) against cuBLASLt (gemm_ex_cuda: the
 * runtime's autotuned plans) on Llama-3.2-1B's products at 2048 tokens (forward Y = X Wᵀ bf16, dX =
 * dY W bf16, dW = dYᵀ X into an f32 gradient with beta 1) and GPT-2's c_fc with bias + GELU(aux).
 * Sustained rates: the GPU heated 2 s first, then per product and implementation the best of 5
 * loops of ~0.3 s (under the power cap, not the boost clock). Prints ms and TFLOP/s side by side:
 * the ping-pong kernel with blocks alone (cl1) and in clusters of 2 sharing B by multicast (cl2,
 * gemm_sm90_cluster), the wide kernel, cuBLASLt, cuBLASLt's ms over each of ours, and whether cl2
 * gives cl1's bits. Then, for three of them, each of ours (cl1, cl2, wide) with stages left out
 * (gemm_sm90_debug): where a tile's time goes. Exits 1 when cl2's bits differ from cl1's.
 * Build and run (H100/H200): make build/bench/bench_gemm_sm90 && build/bench/bench_gemm_sm90 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/cuda/gemm_sm90.h"
#include "../cuda/cu_check.h"
extern "C" {
#include "kernels/base/error.h"
#include "runtime/cuda/blas_plan.h"
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
    for (int r = 0; r < 5; ++r) best = std::min(best, loop_ms(f, 0.3));
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

/* Clusters of cl blocks for every later gemm_sm90 call (exits on a refusal). */
static void set_cluster(int cl) {
    if (gemm_sm90_cluster(cl)) {
        fprintf(stderr, "%s\n", zr_last_error());
        exit(1);
    }
}

/* Whether ours gives the same output bytes (c, and aux with the GELU) in clusters of 2 as alone:
 * one call each on the same inputs (C refilled for beta 1). A difference is a bug, not noise. */
static bool same_bits(const prod &p, const zr_gemm_desc &g, void *c, void *aux) {
    const size_t cb = (size_t)(p.m * p.n) * (p.f32_beta1 ? 4 : 2), ab = p.gelu ? (size_t)(p.m * p.n) * 2 : 0;
    std::vector<uint8_t> h[2];
    for (int cl = 1; cl <= 2; ++cl) {
        set_cluster(cl);
        if (p.f32_beta1) bench_fill_kernel<<<1024, 256>>>(c, (size_t)(p.m * p.n), 1, 7, 1.f);
        if (gemm_sm90(&g, 0, 0)) {
            printf("FAILED: %s\n", zr_last_error());
            exit(2);
        }
        std::vector<uint8_t> &v = h[cl - 1];
        v.resize(cb + ab);
        CU(cudaMemcpy(v.data(), c, cb, cudaMemcpyDeviceToHost));
        if (ab) CU(cudaMemcpy(v.data() + cb, aux, ab, cudaMemcpyDeviceToHost));
    }
    set_cluster(1);
    return h[0] == h[1];
}

/* Where a tile's time goes: one of ours (fn, bm x bn output tiles; gemm_sm90 in clusters of cl
 * blocks) with stages left out (gemm_sm90_debug; the results are wrong), as ms and µs a tile an SM
 * (tiles / SMs of them run one after another on each SM). The wide kernel has no ping-pong: no
 * SERIAL row. */
static void diagnose(const prod &p, void *a, void *b, void *c, void *aux, void *bias, const char *who,
                     int (*fn)(const zr_gemm_desc *, int, cudaStream_t), int bm, int bn, int cl) {
    static const struct {
        int flags;
        const char *what;
    } vs[] = {
        {0, "all stages"},
        {GEMM_SM90_DBG_NO_STORE, "no stores"},
        {GEMM_SM90_DBG_NO_CLOAD, "no C/bias loads"},
        {GEMM_SM90_DBG_NO_STORE | GEMM_SM90_DBG_NO_CLOAD, "main loop only"},
        {GEMM_SM90_DBG_NO_GELU, "no GELU math"},
        {GEMM_SM90_DBG_SERIAL, "serial (no ping-pong)"},
        {GEMM_SM90_DBG_NO_MMA, "no main loop (epilogue)"},
        {GEMM_SM90_DBG_NO_MMA | GEMM_SM90_DBG_NO_STORE, "no main loop, no stores"},
    };
    int sms = 0;
    CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const double tiles = (double)((p.m + bm - 1) / bm) * ((p.n + bn - 1) / bn), fl = 2.0 * p.m * p.n * p.k;
    const zr_gemm_desc g = desc_of(p, a, b, c, aux, bias);
    set_cluster(cl);
    for (const auto &v : vs) {
        if ((v.flags & GEMM_SM90_DBG_NO_GELU) && !p.gelu) continue;
        if ((v.flags & GEMM_SM90_DBG_SERIAL) && fn == gemm_sm90_wide) continue;
        if (gemm_sm90_debug(v.flags)) {
            fprintf(stderr, "%s\n", zr_last_error());
            exit(1);
        }
        const double ms = best_ms([&] { return fn(&g, 0, 0); });
        printf("  %-14s %-20s %-26s flags %2d | %9.3f ms %8.1f TFLOP/s | %6.2f us a tile an SM\n", who, p.name,
               v.what, v.flags, ms, fl / ms * 1e-9, ms * 1e3 / (tiles / sms));
        fflush(stdout);
    }
    gemm_sm90_debug(0);
    set_cluster(1);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
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
    prod ps[32];
    int np = 0;
    static char names[32][64];
    for (const shape &s : llama) {
        snprintf(names[np], 64, "%s fwd", s.name);
        ps[np] = {names[np], 0, 1, s.t, s.out, s.in, 0, 0}, np++;
        snprintf(names[np], 64, "%s dX", s.name);
        ps[np] = {names[np], 0, 0, s.t, s.in, s.out, 0, 0}, np++;
        snprintf(names[np], 64, "%s dW f32+=", s.name);
        ps[np] = {names[np], 1, 0, s.out, s.in, s.t, 1, 0}, np++;
    }
    /* GPT-2 c_fc: 64 x 1024 tokens, 768 -> 3072, Conv1D's weight (in, out) (tb 0) */
    ps[np++] = {"gpt2 c_fc bias+gelu", 0, 0, 65536, 3072, 768, 0, 1};

    size_t max_a = 0, max_b = 0, max_c = 0;
    for (int i = 0; i < np; ++i) {
        max_a = std::max(max_a, (size_t)(ps[i].m * ps[i].k));
        max_b = std::max(max_b, (size_t)(ps[i].k * ps[i].n));
        max_c = std::max(max_c, (size_t)(ps[i].m * ps[i].n));
    }
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
        const auto t0 = std::chrono::steady_clock::now();
        while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) loop_ms([&] { return gemm_sm90(&g, 0, 0); }, 0.1);
    }

    /* r: cuBLASLt ms / ours (above 1: ours faster); cl1, cl2: gemm_sm90 with blocks alone, in
     * clusters of 2; wide: gemm_sm90_wide */
    printf("%-22s %7s %7s %7s | %9s %8s | %9s %8s | %9s %8s | %9s %8s | %6s %6s %6s | %s\n", "product", "M", "N",
           "K", "cl1 ms", "TFLOP/s", "cl2 ms", "TFLOP/s", "wide ms", "TFLOP/s", "cuBLASLt", "TFLOP/s", "r cl1",
           "r cl2", "r wide", "cl2 bits");
    int bad = 0;
    for (int i = 0; i < np; ++i) {
        const prod &p = ps[i];
        const zr_gemm_desc g = desc_of(p, a, b, c, aux, bias);
        const bool same = same_bits(p, g, c, aux);
        double ours[2];
        for (int cl = 1; cl <= 2; ++cl) {
            set_cluster(cl);
            ours[cl - 1] = best_ms([&] { return gemm_sm90(&g, 0, 0); });
        }
        set_cluster(1);
        const double wide = best_ms([&] { return gemm_sm90_wide(&g, 0, 0); });
        const double lt = best_ms([&] { return gemm_ex_cuda(&g, 0); });
        const double fl = 2.0 * p.m * p.n * p.k;
        printf("%-22s %7lld %7lld %7lld | %9.3f %8.1f | %9.3f %8.1f | %9.3f %8.1f | %9.3f %8.1f | %6.3f %6.3f %6.3f | "
               "%s\n",
               p.name, (long long)p.m, (long long)p.n, (long long)p.k, ours[0], fl / ours[0] * 1e-9, ours[1],
               fl / ours[1] * 1e-9, wide, fl / wide * 1e-9, lt, fl / lt * 1e-9, lt / ours[0], lt / ours[1],
               lt / wide, same ? "same" : "DIFFER");
        bad += !same;
        fflush(stdout);
    }
    if (bad) printf("%d products: clusters of 2 give other bits than blocks alone (a bug)\n", bad);
    { /* the grids the launches chose (clusters of 2: as many as cudaOccupancyMaxActiveClusters allows) */
        const zr_gemm_desc g = desc_of(ps[0], a, b, c, aux, bias);
        int blk[3];
        for (int cl = 1; cl <= 2; ++cl) {
            set_cluster(cl);
            blk[cl - 1] = gemm_sm90(&g, 0, 0) ? -1 : gemm_sm90_last_blocks();
        }
        set_cluster(1);
        blk[2] = gemm_sm90_wide(&g, 0, 0) ? -1 : gemm_sm90_last_blocks();
        CU(cudaDeviceSynchronize());
        printf("\nblocks launched for %s: gemm_sm90 cl1 %d, cl2 %d, wide %d\n", ps[0].name, blk[0], blk[1], blk[2]);
    }
    /* diagnostics: a plain bf16 forward, an f32 beta-1 gradient, the bias+GELU epilogue */
    printf("\nwhere ours spends a tile (stages left out; results wrong):\n");
    for (int i = 0; i < np; ++i)
        if (!strcmp(ps[i].name, "gate_up fwd") || !strcmp(ps[i].name, "gate_up dW f32+=") ||
            !strcmp(ps[i].name, "gpt2 c_fc bias+gelu")) {
            if (ps[i].f32_beta1) bench_fill_kernel<<<1024, 256>>>(c, (size_t)(ps[i].m * ps[i].n), 1, 7, 1.f);
            diagnose(ps[i], a, b, c, aux, bias, "gemm_sm90 cl1", gemm_sm90, 128, 128, 1);
            diagnose(ps[i], a, b, c, aux, bias, "gemm_sm90 cl2", gemm_sm90, 128, 128, 2);
            diagnose(ps[i], a, b, c, aux, bias, "gemm_sm90_wide", gemm_sm90_wide, 128, 256, 1);
        }
    return bad ? 1 : 0;
}
