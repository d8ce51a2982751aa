/* Benchmark of the fused CUDA kernels on one GPU: achieved GB/s of each memory-bound kernel
 * (bytes = each input read once + each output written once) against the measured device-to-device
 * copy rate, and causal GQA flash attention forward/backward TFLOP/s (FLOPs: forward 4·B·Hq·T²·Dh/2,
 * backward 2.5× forward, the FlashAttention convention; compare bench_attention_torch.py).
 * Times are medians of 20 event-timed runs after 3 warm-ups, on random (not zero) data. Each
 * memory-bound row also gives its rate against a copy of the same number of bytes.
 * `bench_fused attention` runs the attention rows alone (`--sustained`: each shape after 2 s of
 * forward + backward, timed over windows of 0.25 s or more: the power cap's rate, as in training),
 * `bench_fused varlen` attention over packed sequences against the same tokens in causal rows,
 * `bench_fused cross_entropy` the copy ceiling and the cross-entropy rows; `bench_fused norm` the copy
 * ceiling and the RMSNorm, LayerNorm and softmax rows; `bench_fused bias` the copy ceiling and the
 * bias-gradient column sums. BENCH_ATTN_FWD_ROWS and _TAIL pick the head_dim-64 forward's variants,
 * BENCH_ATTN_DH one head_dim's attention rows (attn_knobs).
 * Build (where nvcc is): make build/bench/bench_fused */
#include <cuda_bf16.h>
#include <cuda_runtime.h>


#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "../cuda/cu_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda/qkv_rope.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/softmax.h"
#include "kernels/cuda/swiglu.h"
extern "C" {
#include "kernels/base/error.h"
#include "kernels/cpu/kernels.h" /* ZR_BIN_ADD */
}

#define OK(x)                                                                                      \
    do {                                                                                           \
        if ((x) != 0) {                                                                            \
            printf("FAILED %s: %s\n", #x, zr_last_error());                                        \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

__global__ void fill_kernel(uint16_t *p, size_t n, uint32_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        float f = ((h & 0xffffff) / 16777216.f * 2.f - 1.f) * scale;
        __nv_bfloat16 b = __float2bfloat16_rn(f);
        p[i] = *reinterpret_cast<uint16_t *>(&b);
    }
}
__global__ void fillf_kernel(float *p, size_t n, uint32_t seed, float scale, float off) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = ((h & 0xffffff) / 16777216.f * 2.f - 1.f) * scale + off;
    }
}
static void *bf(size_t n, float scale = 1.f) { /* random bf16 buffer */
    void *p;
    CU(cudaMalloc(&p, n * 2));
    fill_kernel<<<4096, 256>>>((uint16_t *)p, n, (uint32_t)n * 7919u + 17u, scale);
    return p;
}
static float *f32(size_t n, float scale = 1.f, float off = 0.f) {
    float *p;
    CU(cudaMalloc(&p, n * 4));
    fillf_kernel<<<4096, 256>>>(p, n, (uint32_t)n * 104729u + 3u, scale, off);
    return p;
}

static const zr_dtype BF = ZR_BF16;

/* GPU time of n back-to-back calls of f, ms (events around them). */
static float window_ms(const std::function<void()> &f, int n) {
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    CU(cudaEventRecord(a));
    for (int i = 0; i < n; ++i) f();
    CU(cudaEventRecord(b));
    CU(cudaEventSynchronize(b));
    float ms;
    CU(cudaEventElapsedTime(&ms, a, b));
    CU(cudaEventDestroy(a));
    CU(cudaEventDestroy(b));
    return ms;
}
/* Sustained time of f, ms a call (`bench_fused attention --sustained`): f back to back in windows
 * of at least 0.25 s (the call count doubled until one is), the median of 3 windows. After
 * heat(): the rate the GPU keeps at its power cap, as in training, instead of the boost clock's of a
 * short burst (session 35). */
static float sustained_ms(const std::function<void()> &f) {
    int n = 1;
    while (window_ms(f, n) < 250.f) n *= 2;
    float t[3];
    for (float &x : t) x = window_ms(f, n) / n;
    std::sort(t, t + 3);
    return t[1];
}
/* f back to back for about `ms` milliseconds: the GPU brought to the clock its power cap leaves. */
static void heat(const std::function<void()> &f, float ms = 2000.f) {
    float done = 0.f;
    for (int n = 1; done < ms; n *= 2) done += window_ms(f, n);
}

/* Median of reps event-timed calls of f, after warm untimed ones. */
static float time_ms(const std::function<void()> &f, int warm = 3, int reps = 20) {
    for (int i = 0; i < warm; ++i) f();
    CU(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) t.push_back(window_ms(f, 1));
    CU(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

static double copy_gbs;
/* GB/s of a device-to-device copy moving `bytes` (half read, half written): small kernels pay the
 * same launch and ramp-up costs, so this is the fairer ceiling for them. */
static double same_size_copy_gbs(double bytes) {
    const size_t n = ((size_t)(bytes / 2) + 255) & ~(size_t)255;
    void *a, *b;
    CU(cudaMalloc(&a, n));
    CU(cudaMalloc(&b, n));
    CU(cudaMemset(a, 1, n));
    const float ms = time_ms([&] { CU(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice)); });
    CU(cudaFree(a));
    CU(cudaFree(b));
    return 2.0 * n / (ms * 1e-3) / 1e9;
}
static void row(const char *name, const char *shape, double bytes, float ms) {
    double gbs = bytes / (ms * 1e-3) / 1e9;
    printf("%-28s %-34s %9.3f ms %8.0f GB/s %5.0f%% of copy %5.0f%% of same-size copy\n", name,
           shape, ms, gbs, 100 * gbs / copy_gbs, 100 * gbs / same_size_copy_gbs(bytes));
}

static int attn_dh_only; /* BENCH_ATTN_DH (attn_knobs): the attention rows of that head_dim alone (0: all) */

/* Causal flash attention rows: issue 18's GQA shapes (B=4, 32 query / 8 kv heads) at T = 512,
 * 2048, 8192, and GPT-2 124M's (B=64, 12 heads, T=1024, MHA) at head_dim 64; then head_dim 128
 * (Qwen3-0.6B's 16 / 8 heads at B4 T512, Llama-3-8B's 32 / 8 at B4 T2048 and B1 T8192) with the
 * Hopper kernels and with the mma.sync ones (attn_sm90_force(0, 0)); then Phi-3-mini's head_dim 96
 * (32 heads, MHA, its 4k context at B2; the 128-wide Hopper kernels reading it in place). */
static void attention_rows(bool sustained) {
    const char *title = sustained ? "attention (causal, bf16, sustained)" : "attention (causal, bf16)";
    printf("\n%-34s %10s %10s %10s %8s %8s %8s\n", title, "fwd ms", "bwd ms", "f+b ms", "fwd TF/s",
           "bwd TF/s", "f+b TF/s");
    const int64_t shapes[][5] = {{4, 32, 8, 512, 64},   {4, 32, 8, 2048, 64},  {4, 32, 8, 8192, 64},
                                 {64, 12, 12, 1024, 64}, {4, 16, 8, 512, 128}, {4, 32, 8, 2048, 128},
                                 {1, 32, 8, 8192, 128}, {2, 32, 32, 4096, 96}};
    /* the Hopper kernels' default grid (a block per SM, looping over tiles), then a block per tile;
     * mode 2: head_dim 128 on the mma.sync kernels */
    for (int mode : {0, 1, 2})
    for (auto &s : shapes) {
        const int grid = mode == 1 ? -1 : 0;
        if ((sustained && mode == 1) || (mode == 2 && s[4] != 128) || (attn_dh_only && s[4] != attn_dh_only))
            continue;
        attn_sm90_grid(grid, grid);
        attn_sm90_force(mode == 2 ? 0 : -1, mode == 2 ? 0 : -1);
        const int64_t B = s[0], Hq = s[1], Hkv = s[2], T = s[3], Dh = s[4];
        const int64_t nq = B * Hq * T * Dh, nk = B * Hkv * T * Dh;
        void *q = bf(nq), *k = bf(nk), *v = bf(nk), *o = bf(nq), *dO = bf(nq), *dq = bf(nq),
             *dk = bf(nk), *dv = bf(nk);
        float *lse = f32(B * Hq * T);
        void *ws;
        CU(cudaMalloc(&ws, attention_backward_workspace_size(B, Hq, Hkv, T, Dh)));
        auto fwd = [&] {
            OK(attention_forward_cuda(o, lse, q, k, v, NULL, B, Hq, Hkv, T, Dh, 0.f, BF, 0));
        };
        auto bwd = [&] {
            OK(attention_backward_cuda(dq, dk, dv, dO, q, k, v, o, lse, ws, NULL, B, Hq, Hkv, T, Dh,
                                       0.f, BF, 0));
        };
        auto both = [&] { fwd(), bwd(); };
        auto timed = [&](const std::function<void()> &f) {
            return sustained ? sustained_ms(f) : time_ms(f);
        };
        if (sustained) heat(both);
        const float f = timed(fwd), bw = timed(bwd), fb = timed(both);
        const double ff = 4.0 * B * Hq * T * T * Dh / 2, fbw = 2.5 * ff;
        char shape[64];
        snprintf(shape, sizeof shape, "B%lld T%lld H%lld/%lld Dh%lld%s", (long long)B, (long long)T,
                 (long long)Hq, (long long)Hkv, (long long)Dh,
                 mode == 1 ? " tile/block" : mode == 2 ? " mma.sync" : "");
        printf("%-34s %10.3f %10.3f %10.3f %8.1f %8.1f %8.1f\n", shape, f, bw, fb,
               ff / (f * 1e-3) / 1e12, fbw / (bw * 1e-3) / 1e12,
               (ff + fbw) / (fb * 1e-3) / 1e12);
        for (void *p : {q, k, v, o, dO, dq, dk, dv, ws}) cudaFree(p);
        cudaFree(lse);
    }
    attn_sm90_grid(0, 0);
    attn_sm90_force(-1, -1);
}

/* Packed-sequence rows (zr_attn_layout.seg): 8192 tokens as one row of sequences of 20..619 tokens
 * (a fixed pseudo-random draw, the last cut to fit: WikiText paragraphs' range, what TRL's bfd blocks
 * hold), against the same tokens as 8 causal rows of 1024 (wrapped blocks) and as one causal row;
 * B H32/8 at head_dim 64 and 128 (the Hopper kernels). TFLOP/s count the attention each
 * layout computes: the sequences' own causal products (sum of L²/2), the rows' for the others. */
static void varlen_rows() {
    const int64_t N = 8192, Hq = 32, Hkv = 8;
    std::vector<int32_t> lens;
    uint32_t x = 12345;
    for (int64_t at = 0; at < N;) {
        x = x * 1664525u + 1013904223u;
        int32_t n = 20 + (int32_t)((x >> 8) % 600);
        if (at + n > N) n = (int32_t)(N - at);
        lens.push_back(n);
        at += n;
    }
    std::vector<int32_t> seg(2 * N);
    double pairs = 0;
    for (int64_t at = 0, i = 0; i < (int64_t)lens.size(); at += lens[i++]) {
        for (int64_t t = at; t < at + lens[i]; ++t) seg[t] = (int32_t)at, seg[N + t] = (int32_t)(at + lens[i]);
        pairs += (double)lens[i] * lens[i] / 2;
    }
    int32_t *segd;
    CU(cudaMalloc(&segd, seg.size() * 4));
    CU(cudaMemcpy(segd, seg.data(), seg.size() * 4, cudaMemcpyHostToDevice));
    printf("\n%-44s %10s %10s %10s %8s\n", "attention over 8192 tokens (bf16)", "fwd ms", "bwd ms", "f+b ms",
           "f+b TF/s");
    for (int64_t Dh : {64, 128}) {
        const struct {
            const char *name;
            int64_t B, T;
            bool packed;
        } cases[] = {{"packed (%zu sequences)", 1, N, true}, {"wrapped (8 x 1024)", 8, 1024, false},
                     {"one causal row", 1, N, false}};
        for (auto &c : cases) {
            const int64_t B = c.B, T = c.T, nq = B * Hq * T * Dh, nk = B * Hkv * T * Dh;
            void *q = bf(nq), *k = bf(nk), *v = bf(nk), *o = bf(nq), *dO = bf(nq), *dq = bf(nq),
                 *dk = bf(nk), *dv = bf(nk);
            float *lse = f32(B * Hq * T);
            void *ws;
            CU(cudaMalloc(&ws, attention_backward_workspace_size(B, Hq, Hkv, T, Dh)));
            const zr_attn_strides sq = {Hq * T * Dh, T * Dh, Dh}, sk = {Hkv * T * Dh, T * Dh, Dh};
            const zr_attn_layout L = {sq, sk, sk, sq, sq, sq, sk, sk, c.packed ? segd : nullptr};
            auto fwd = [&] { OK(attention_forward_cuda(o, lse, q, k, v, &L, B, Hq, Hkv, T, Dh, 0.f, BF, 0)); };
            auto bwd = [&] {
                OK(attention_backward_cuda(dq, dk, dv, dO, q, k, v, o, lse, ws, &L, B, Hq, Hkv, T, Dh, 0.f, BF, 0));
            };
            const float f = time_ms(fwd), bw = time_ms(bwd), fb = time_ms([&] { fwd(), bwd(); });
            const double work = c.packed ? pairs : (double)B * T * T / 2;
            const double flops = 3.5 * 4.0 * Hq * work * Dh; /* forward 4·pairs·Dh a head, backward 2.5× */
            char name[64], label[96];
            snprintf(name, sizeof name, c.name, lens.size());
            snprintf(label, sizeof label, "%s, Dh%lld", name, (long long)Dh);
            printf("%-44s %10.3f %10.3f %10.3f %8.1f\n", label, f, bw, fb, flops / (fb * 1e-3) / 1e12);
            for (void *p : {q, k, v, o, dO, dq, dk, dv, ws}) cudaFree(p);
            cudaFree(lse);
        }
    }
    cudaFree(segd);
}

/* Cross-entropy rows: Llama 3's vocabulary (N=8192 tokens, V=128256), GPT-2's padded one (a
 * 64 x 1024 batch, V=50304) and a 32k one (Llama 2, Mistral, TinyLlama; N=16384): forward,
 * backward to a buffer, and loss + gradient in place. Bytes: the logits read once (+ the gradient
 * written once). */
static void cross_entropy_rows() {
    const int64_t shapes[][2] = {{8192, 128256}, {65536, 50304}, {16384, 32000}};
    for (auto &sh : shapes) {
        const int64_t N = sh[0], V = sh[1];
        char d[48];
        snprintf(d, sizeof d, "bf16 N=%lld V=%lld", (long long)N, (long long)V);
        void *x = bf(N * V, 8), *dl = bf(N * V);
        float *loss = f32(N), *lse = f32(N), *mean = f32(1), *nv = f32(1), *g = f32(1, 0, 1e-4f);
        std::vector<int64_t> tg(N);
        for (int64_t i = 0; i < N; ++i) tg[i] = (i * 7919) % V;
        int64_t *tg_;
        CU(cudaMalloc(&tg_, N * 8));
        CU(cudaMemcpy(tg_, tg.data(), N * 8, cudaMemcpyHostToDevice));
        const double e = 2.0 * N * V;
        row("cross_entropy fwd", d, e, time_ms([&] {
                OK(cross_entropy_forward_cuda(loss, lse, mean, nv, x, tg_, N, V, -100, 0.f, BF, 0));
            }));
        row("cross_entropy bwd to buffer", d, 2 * e, time_ms([&] {
                OK(cross_entropy_backward_cuda(dl, x, tg_, lse, g, 0, N, V, -100, 0.f, BF, 0));
            }));
        unsigned *cnt;
        CU(cudaMalloc(&cnt, sizeof *cnt));
        CU(cudaMemcpy(dl, x, N * V * 2, cudaMemcpyDeviceToDevice)); /* logits the fused pass overwrites */
        row("cross_entropy fused in place", d, 2 * e, time_ms([&] {
                OK(cross_entropy_fused_cuda(loss, lse, mean, nv, dl, dl, tg_, cnt, 1.f, N, V, -100, 0.f, BF, 0));
            }));
        CU(cudaMemcpy(dl, x, N * V * 2, cudaMemcpyDeviceToDevice));
        row("  with label smoothing 0.1", d, 2 * e, time_ms([&] {
                OK(cross_entropy_fused_cuda(loss, lse, mean, nv, dl, dl, tg_, cnt, 1.f, N, V, -100, 0.1f, BF, 0));
            }));
        cudaFree(cnt);
        cudaFree(x), cudaFree(dl), cudaFree(loss), cudaFree(lse), cudaFree(mean), cudaFree(nv);
        cudaFree(g), cudaFree(tg_);
    }
}

/* RMSNorm, LayerNorm and softmax rows of N rows of D (bf16). */
static void norms(int64_t N, int64_t D) {
    char sh[64];
    snprintf(sh, sizeof sh, "bf16 N=%lld D=%lld", (long long)N, (long long)D);
    void *x = bf(N * D), *r = bf(N * D), *w = bf(D), *y = bf(N * D), *h = bf(N * D),
         *dy = bf(N * D), *dx = bf(N * D), *dw = bf(D), *b = bf(D);
    float *rstd = f32(N), *mean = f32(N);
    void *ws;
    CU(cudaMalloc(&ws, rmsnorm_backward_workspace_size(N, D)));
    const double e = 2.0 * N * D;
    row("rmsnorm fwd", sh,
        2 * e, time_ms([&] { OK(rmsnorm_forward_cuda(y, rstd, x, w, N, D, 1e-5f, 0.f, BF, 0)); }));
    /* the residual add then the norm (Llama before zr.add_rms_norm: two kernels, h written
     * then read back) against the fused kernel (x and r read once, h and y written) */
    const int64_t one = 1, shp = N * D;
    row("add + rmsnorm fwd (2 kernels)", sh, 5 * e, time_ms([&] {
            OK(binary_forward_cuda(h, x, &one, r, &one, 1, &shp, ZR_BIN_ADD, BF, 0));
            OK(rmsnorm_forward_cuda(y, rstd, h, w, N, D, 1e-5f, 0.f, BF, 0));
        }));
    row("add_rmsnorm fwd (fused)", sh, 4 * e, time_ms([&] {
            OK(add_rmsnorm_forward_cuda(y, h, rstd, x, r, w, N, D, 1e-5f, 0.f, BF, 0));
        }));
    row("rmsnorm bwd (+dres, dw)", sh, 4 * e, time_ms([&] {
            OK(rmsnorm_backward_cuda(dx, dw, dy, x, w, rstd, r, ws, N, D, 0.f, BF, 0));
        }));
    row("layernorm fwd", sh, 2 * e, time_ms([&] {
            OK(layernorm_forward_cuda(y, mean, rstd, x, w, b, N, D, 1e-5f, BF, 0));
        }));
    /* GPT-2's residual add then ln_1 / ln_2 / ln_f, and the fused kernel (zr.add_layer_norm) */
    row("add + layernorm fwd (2 kernels)", sh, 5 * e, time_ms([&] {
            OK(binary_forward_cuda(h, x, &one, r, &one, 1, &shp, ZR_BIN_ADD, BF, 0));
            OK(layernorm_forward_cuda(y, mean, rstd, h, w, b, N, D, 1e-5f, BF, 0));
        }));
    row("add_layernorm fwd (fused)", sh, 4 * e, time_ms([&] {
            OK(add_layernorm_forward_cuda(y, h, mean, rstd, x, r, w, b, N, D, 1e-5f, BF, 0));
        }));
    row("layernorm bwd (dw, db)", sh, 3 * e, time_ms([&] {
            OK(layernorm_backward_cuda(dx, dw, b, dy, x, w, mean, rstd, NULL, ws, N, D, BF, 0));
        }));
    /* GPT-2's: the gradient arriving at the residual stream added (dres) */
    row("layernorm bwd (+dres, dw, db)", sh, 4 * e, time_ms([&] {
            OK(layernorm_backward_cuda(dx, dw, b, dy, x, w, mean, rstd, r, ws, N, D, BF, 0));
        }));
    row("softmax fwd", sh, 2 * e,
        time_ms([&] { OK(softmax_forward_cuda(y, x, N, D, BF, 0)); }));
    row("softmax bwd", sh, 3 * e,
        time_ms([&] { OK(softmax_backward_cuda(dx, dy, y, N, D, BF, 0)); }));
    for (void *p : {x, r, w, y, h, dy, dx, dw, b, ws}) cudaFree(p);
    cudaFree(rstd), cudaFree(mean);
}

/* The norm rows: Llama-3.2-1B's micro-batch; N=16384 tokens (B=8, T=2048), D=2048; N=65536, D=4096
 * (512 MB each way: the kernels' steady-state rate, where a copy of the same size reaches the 4 GiB
 * rate); GPT-2 124M's. */
static void norm_rows() {
    norms(2048, 2048); /* Llama-3.2-1B's micro-batch (B=4, T=512): 8 MB tensors */
    norms(16384, 2048);
    norms(65536, 4096);
    norms(65536, 768); /* GPT-2 124M at B=64 T=1024 */
}

/* The bias gradients (column sums, sum_cols_cuda with its workspace) of GPT-2 124M at B=64 T=1024:
 * c_attn (2304 columns), c_fc (3072) and the two projections (768), bf16. */
static void bias_rows() {
    const int64_t N = 65536;
    for (int64_t C : {768, 2304, 3072}) {
        char sh[64];
        snprintf(sh, sizeof sh, "bf16 N=%lld C=%lld", (long long)N, (long long)C);
        void *g = bf(N * C), *db = bf(C), *ws = NULL;
        const size_t wsb = sum_cols_workspace_size(N, C);
        if (wsb) CU(cudaMalloc(&ws, wsb));
        row("bias grad (sum_cols)", sh, 2.0 * N * C,
            time_ms([&] { OK(sum_cols_cuda(db, g, N, C, BF, ws, 0)); }));
        for (void *p : {g, db, ws}) cudaFree(p);
    }
}

/* The subcommands that run a group of rows alone (after the copy ceiling; attention without it). */
static const struct {
    const char *name;
    void (*rows)();
} parts[] = {{"cross_entropy", cross_entropy_rows}, {"norm", norm_rows}, {"bias", bias_rows}};

static int set_attn_dh(int dh) {
    attn_dh_only = dh;
    return 0;
}
/* The attention rows' knobs, from the environment (each printed when set): the head_dim-64 Hopper
 * forward's variants, BENCH_ATTN_FWD_ROWS=128|192|0 (attn_sm90_fwd_rows: queries a tile; 0 by T) and
 * BENCH_ATTN_FWD_TAIL=0|1 (attn_sm90_fwd_tail: tiles from row 0, or before it as by default); and
 * BENCH_ATTN_DH=64|96|128, that head_dim's rows alone (an A/B of one kernel in half the time: a
 * --sustained round of every row is ~55 s on an H100). False, with a line, on another value. */
static bool attn_knobs() {
    const struct {
        const char *env;
        std::vector<const char *> values;
        int (*set)(int);
    } knobs[] = {{"BENCH_ATTN_FWD_ROWS", {"128", "192", "0"}, attn_sm90_fwd_rows},
                 {"BENCH_ATTN_FWD_TAIL", {"0", "1"}, attn_sm90_fwd_tail},
                 {"BENCH_ATTN_DH", {"64", "96", "128"}, set_attn_dh}};
    for (auto &k : knobs) {
        const char *r = getenv(k.env);
        if (!r) continue;
        bool ok = false;
        for (const char *v : k.values) ok = ok || strcmp(r, v) == 0;
        if (!ok) {
            fprintf(stderr, "bench_fused: %s=%s: give one of", k.env, r);
            for (const char *v : k.values) fprintf(stderr, " %s", v);
            fprintf(stderr, "\n");
            return false;
        }
        k.set(atoi(r));
        printf("attention: %s=%s\n", k.env, r);
    }
    return true;
}

int main(int argc, char **argv) {
    const bool attention = argc > 1 && strcmp(argv[1], "attention") == 0,
               sustained = attention && argc == 3 && strcmp(argv[2], "--sustained") == 0,
               varlen = argc == 2 && strcmp(argv[1], "varlen") == 0;
    void (*part)() = NULL;
    for (auto &p : parts)
        if (argc == 2 && strcmp(argv[1], p.name) == 0) part = p.rows;
    if (argc > 1 && !part && !varlen && !(attention && (argc == 2 || sustained))) {
        fprintf(stderr, "usage: bench_fused [attention [--sustained] | varlen | cross_entropy | norm | bias] (got '%s%s%s')\n",
                argv[1], argc > 2 ? " " : "", argc > 2 ? argv[2] : "");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* each row as it is measured: a run cut off at a limit keeps them */
    if (!attn_knobs()) return 2;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP bench_fused: no CUDA device visible\n");
        return 0;
    }
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20);
    if (attention) { /* `bench_fused attention`: those rows alone */
        attention_rows(sustained);
        return 0;
    }
    if (varlen) { /* `bench_fused varlen`: the packed-sequence rows alone */
        varlen_rows();
        return 0;
    }

    { /* copy ceiling: 4 GiB device-to-device, bytes read + written */
        size_t n = (size_t)4 << 30;
        void *a, *b;
        CU(cudaMalloc(&a, n));
        CU(cudaMalloc(&b, n));
        CU(cudaMemset(a, 1, n));
        float ms = time_ms([&] { CU(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice)); });
        copy_gbs = 2.0 * n / (ms * 1e-3) / 1e9;
        printf("%-28s %-34s %9.3f ms %8.0f GB/s\n", "copy (D2D)", "4 GiB", ms, copy_gbs);
        CU(cudaFree(a));
        CU(cudaFree(b));
    }
    if (part) { /* the copy ceiling, then those rows alone */
        part();
        return 0;
    }
    norm_rows();
    bias_rows();
    /* rope: 32/8 heads, Dh=64, B=4 T=2048; then B=16 T=4096 (1.3 GB moved), where launch and
     * tail costs, which hold a copy of the 84 MB of the first shape to ~73% of the 4 GiB rate, no
     * longer dominate */
    auto rope = [&](int64_t B, int64_t T) {
        const int64_t Hq = 32, Hkv = 8, Dh = 64;
        const int64_t nq = B * Hq * T * Dh, nk = B * Hkv * T * Dh;
        void *q = bf(nq), *k = bf(nk), *qo = bf(nq), *ko = bf(nk);
        float *cs = f32(T * Dh / 2), *sn = f32(T * Dh / 2);
        const double bytes = 2.0 * 2 * (nq + nk) + 2.0 * T * Dh / 2 * 4;
        char sh[64];
        snprintf(sh, sizeof sh, "bf16 B%lld T%lld H32/8 Dh64", (long long)B, (long long)T);
        row("rope fwd q+k (BHTD)", sh, bytes, time_ms([&] {
                OK(rope_forward_cuda(qo, ko, q, k, cs, sn, B, Hq, Hkv, T, Dh, ZR_ROPE_BHTD, BF, 0));
            }));
        row("rope fwd q+k (BTHD->BHTD)", sh, bytes, time_ms([&] {
                OK(rope_forward_cuda(qo, ko, q, k, cs, sn, B, Hq, Hkv, T, Dh, ZR_ROPE_BTHD, BF, 0));
            }));
        row("rope bwd q+k (BHTD)", sh, bytes, time_ms([&] {
                OK(rope_backward_cuda(q, k, qo, ko, cs, sn, B, Hq, Hkv, T, Dh, ZR_ROPE_BHTD, BF, 0));
            }));
        for (void *p : {q, k, qo, ko}) cudaFree(p);
        cudaFree(cs), cudaFree(sn);
    };
    rope(4, 2048);
    rope(16, 4096);
    /* qkv_rope: the packed (B, T, (32 + 2·8)·64) product to q, k (rotated) and v as transposed
     * head slices of one (B, T, 48, 64) buffer (the Hopper attention layout), and back: the
     * Llama-3.2-1B micro-batch B=4 T=512, then B=4 T=2048 */
    auto qkv_rope = [&](int64_t B, int64_t T) {
        const int64_t H = 32, KV = 8, Dh = 64, W = (H + 2 * KV) * Dh, n = B * T * W;
        void *x = bf(n), *y = bf(n);
        float *cs = f32(T * Dh), *sn = f32(T * Dh);
        char *yc = (char *)y;
        zr_qkv_layout L = {T * W, W, {{T * W, Dh, W}, {T * W, Dh, W}, {T * W, Dh, W}}};
        const double bytes = 2.0 * 2 * n + 2.0 * T * Dh * 4;
        char sh[64];
        snprintf(sh, sizeof sh, "bf16 B%lld T%lld H32/8 Dh64", (long long)B, (long long)T);
        row("qkv_rope fwd (packed->BTHD)", sh, bytes, time_ms([&] {
                OK(qkv_rope_forward_cuda(yc, yc + 2 * H * Dh, yc + 2 * (H + KV) * Dh, x, cs, sn, &L, B, T,
                                         H, KV, Dh, BF, 0));
            }));
        row("qkv_rope bwd (BTHD->packed)", sh, bytes, time_ms([&] {
                OK(qkv_rope_backward_cuda(x, yc, yc + 2 * H * Dh, yc + 2 * (H + KV) * Dh, cs, sn, &L, B,
                                          T, H, KV, Dh, 0, BF, 0));
            }));
        for (void *p : {x, y}) cudaFree(p);
        cudaFree(cs), cudaFree(sn);
    };
    qkv_rope(4, 512);
    qkv_rope(4, 2048);
    { /* swiglu: M=16384 tokens, F=8192 */
        const int64_t M = 16384, F = 8192;
        void *g = bf(M * F, 3), *u = bf(M * F), *hh = bf(M * F), *dh = bf(M * F),
             *dg = bf(M * F), *du = bf(M * F);
        const double e = 2.0 * M * F;
        row("swiglu fwd", "bf16 M=16384 F=8192", 3 * e,
            time_ms([&] { OK(glu_forward_cuda(hh, g, u, M, F, F, ZR_GLU_SILU, BF, 0)); }));
        row("swiglu bwd", "bf16 M=16384 F=8192", 5 * e,
            time_ms([&] { OK(glu_backward_cuda(dg, du, dh, g, u, M, F, F, ZR_GLU_SILU, BF, 0)); }));
        for (void *p : {g, u, hh, dh, dg, du}) cudaFree(p);
    }
    cross_entropy_rows();
    /* embedding: N=16384 ids into V=128256 × D=2048, then N=65536 × D=4096 (steady state) */
    auto embedding = [&](int64_t N, int64_t D) {
        const int64_t V = 128256;
        char sh[64];
        snprintf(sh, sizeof sh, "bf16 N=%lld V=%lld D=%lld", (long long)N, (long long)V, (long long)D);
        void *w = bf(V * D), *out = bf(N * D), *dW = bf(V * D);
        std::vector<int64_t> ids(N);
        for (int64_t i = 0; i < N; ++i) ids[i] = (i * 104729 + 7) % V;
        int64_t *ids_;
        CU(cudaMalloc(&ids_, N * 8));
        CU(cudaMemcpy(ids_, ids.data(), N * 8, cudaMemcpyHostToDevice));
        void *ws;
        CU(cudaMalloc(&ws, embedding_backward_workspace_size(N, V)));
        row("embedding fwd", sh, 2.0 * 2 * N * D,
            time_ms([&] { OK(embedding_forward_cuda(out, w, ids_, N, V, D, BF, 0)); }));
        row("embedding bwd (accumulate)", sh, 3.0 * 2 * N * D,
            time_ms([&] {
                OK(embedding_backward_cuda(dW, out, ids_, ws, N, V, D, 1, BF, 0));
            }));
        { /* 30% of the ids one token (a long run), the rest as above */
            std::vector<int64_t> sk(ids);
            for (int64_t i = 0; i < N; i += 10)
                for (int64_t j = i; j < i + 3 && j < N; ++j) sk[j] = 4242;
            int64_t *sk_;
            CU(cudaMalloc(&sk_, N * 8));
            CU(cudaMemcpy(sk_, sk.data(), N * 8, cudaMemcpyHostToDevice));
            row("embedding bwd (30% one id)", sh, 3.0 * 2 * N * D,
                time_ms([&] {
                    OK(embedding_backward_cuda(dW, out, sk_, ws, N, V, D, 1, BF, 0));
                }));
            cudaFree(sk_);
        }
        cudaFree(w), cudaFree(out), cudaFree(dW), cudaFree(ids_), cudaFree(ws);
    };
    embedding(16384, 2048);
    embedding(65536, 4096);
    { /* adamw: 256M params, bf16 grads, bf16 param copy; 3 segments */
        const int64_t n = (int64_t)256 << 20;
        float *p = f32(n), *m = f32(n, 0.01f), *v = f32(n, 0.001f, 0.002f);
        void *g = bf(n), *lp = bf(n);
        zr_adamw_segment segs[3] = {{0, n / 2, 0.1f, 1e-4f}, {n / 2, 1000, 0.f, 1e-4f}, {n / 2 + 1000, n / 2 - 1000, 0.1f, 1e-4f}};
        const zr_adamw_config adam = {1e-4, 0.9, 0.95, 1e-8, 0.1}; /* lr, wd: per segment */
        int step = 1;
        row("adamw (f32 p,m,v; bf16 g, copy)", "256M params", 28.0 * n, time_ms([&] {
                OK(adamw_step_cuda(p, m, v, lp, BF, g, BF, segs, 3, &adam, step++, NULL, 0));
            }));
        cudaFree(p), cudaFree(m), cudaFree(v), cudaFree(g), cudaFree(lp);
    }
    attention_rows(false);
    return 0;
}
