/* Standalone CUDA test of the fused kernels in kernels/cuda (attention, norm, rope, swiglu,
 * cross_entropy, softmax, embedding, adamw): each one, forward and backward, against a plain
 * reference computed here on the host in double from the same (rounded) inputs, at awkward
 * sizes. Outputs are poisoned with NaN before each launch so unwritten elements fail.
 * Build (where nvcc is; the Hopper attention kernels need sm_90a, which the Makefile sets):
 *   make build/tests/test_fused_kernels   (run: make test-cuda, or tests/run_cuda.sh) */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../c/check.h"
#include "cu_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/softmax.h"
#include "kernels/cuda/swiglu.h"
extern "C" {
#include "kernels/base/error.h"
}

typedef std::vector<double> vec;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand() { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static vec randv(size_t n, double scale = 1.0) {
    vec v(n);
    for (auto &x : v) x = urand() * scale;
    return v;
}

static size_t dsize(zr_dtype t) { return t == ZR_F32 ? 4 : 2; }
static double round_to(double x, zr_dtype t) {
    if (t == ZR_BF16) return (double)__bfloat162float(__float2bfloat16_rn((float)x));
    if (t == ZR_F16) return (double)__half2float(__float2half_rn((float)x));
    return (double)(float)x;
}
static void roundv(vec &v, zr_dtype t) {
    for (auto &x : v) x = round_to(x, t);
}

/* Device buffer holding n elements of dtype t; upload rounds v to t in place. */
struct dbuf {
    void *p = nullptr;
    size_t n = 0;
    zr_dtype t = ZR_F32;
    dbuf(size_t n_, zr_dtype t_) : n(n_), t(t_) {
        CU(cudaMalloc(&p, n ? n * dsize(t) : 16));
        poison();
    }
    ~dbuf() { cudaFree(p); }
    void poison() { CU(cudaMemset(p, 0xff, n * dsize(t))); }
    void up(vec &v) {
        roundv(v, t);
        std::vector<unsigned char> h(n * dsize(t));
        for (size_t i = 0; i < n; ++i) {
            if (t == ZR_F32) {
                float f = (float)v[i];
                memcpy(&h[i * 4], &f, 4);
            } else if (t == ZR_BF16) {
                __nv_bfloat16 b = __float2bfloat16_rn((float)v[i]);
                memcpy(&h[i * 2], &b, 2);
            } else {
                __half b = __float2half_rn((float)v[i]);
                memcpy(&h[i * 2], &b, 2);
            }
        }
        CU(cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice));
    }
    vec down() const {
        std::vector<unsigned char> h(n * dsize(t));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(h.data(), p, h.size(), cudaMemcpyDeviceToHost));
        vec v(n);
        for (size_t i = 0; i < n; ++i) {
            if (t == ZR_F32) {
                float f;
                memcpy(&f, &h[i * 4], 4);
                v[i] = f;
            } else if (t == ZR_BF16) {
                __nv_bfloat16 b;
                memcpy(&b, &h[i * 2], 2);
                v[i] = __bfloat162float(b);
            } else {
                __half b;
                memcpy(&b, &h[i * 2], 2);
                v[i] = __half2float(b);
            }
        }
        return v;
    }
    float *f() const { return (float *)p; }
};

/* ||a - b|| / max(||b||, floor); NaN anywhere gives +inf. The floor is the size of a related
 * quantity for references that are exactly 0 in exact arithmetic (attention's dq, dk at T = 1). */
static double relerr(const vec &a, const vec &b, double floor = 1e-30) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i])) return INFINITY;
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return std::sqrt(num) / std::max(std::sqrt(den), floor);
}
static double tol_of(zr_dtype t) { return t == ZR_F32 ? 2e-5 : t == ZR_BF16 ? 1.2e-2 : 2.5e-3; }
static const char *tn(zr_dtype t) { return t == ZR_F32 ? "f32" : t == ZR_BF16 ? "bf16" : "f16"; }

#define CHECK_CLOSE(got, ref, tol, what)                                                           \
    do {                                                                                           \
        double e_ = relerr(got, ref);                                                              \
        CHECK_MSG(e_ <= (tol), "%s: rel err %.3g > %.3g", what, e_, (double)(tol));                \
    } while (0)
#define CHECK_OK(call) CHECK_MSG((call) == 0, "%s failed: %s", #call, zr_last_error())

static const zr_dtype DT[3] = {ZR_F32, ZR_BF16, ZR_F16};

/* ---- rmsnorm / layernorm ------------------------------------------------------------------- */

static void norm_ref(bool ln, const vec &x, const vec &w, const vec &b, int64_t N, int64_t D,
                     double eps, vec &y, vec &mean, vec &rstd) {
    y.assign(N * D, 0), mean.assign(N, 0), rstd.assign(N, 0);
    for (int64_t r = 0; r < N; ++r) {
        double mu = 0, var = 0;
        if (ln) {
            for (int64_t i = 0; i < D; ++i) mu += x[r * D + i];
            mu /= D;
        }
        for (int64_t i = 0; i < D; ++i) var += (x[r * D + i] - mu) * (x[r * D + i] - mu);
        var /= D;
        double rs = 1 / std::sqrt(var + eps);
        mean[r] = mu, rstd[r] = rs;
        for (int64_t i = 0; i < D; ++i)
            y[r * D + i] = (x[r * D + i] - mu) * rs * w[i] + (ln && !b.empty() ? b[i] : 0);
    }
}
static void norm_bwd_ref(bool ln, const vec &dy, const vec &x, const vec &w, int64_t N, int64_t D,
                         double eps, vec &dx, vec &dw, vec &db) {
    dx.assign(N * D, 0), dw.assign(D, 0), db.assign(D, 0);
    vec y, mean, rstd;
    norm_ref(ln, x, w, vec(), N, D, eps, y, mean, rstd);
    for (int64_t r = 0; r < N; ++r) {
        double sg = 0, sgx = 0, rs = rstd[r], mu = mean[r];
        for (int64_t i = 0; i < D; ++i) {
            double xh = (x[r * D + i] - mu) * rs, g = dy[r * D + i] * w[i];
            sg += g, sgx += g * xh;
            dw[i] += dy[r * D + i] * xh;
            db[i] += dy[r * D + i];
        }
        sg /= D, sgx /= D;
        for (int64_t i = 0; i < D; ++i) {
            double xh = (x[r * D + i] - mu) * rs, g = dy[r * D + i] * w[i];
            dx[r * D + i] = rs * (g - (ln ? sg : 0) - xh * sgx);
        }
    }
}

TEST(rmsnorm_forward_backward) {
    /* D = 3000 and 4096: two 16-byte chunks per lane in the backward's register path */
    const int64_t shapes[][2] = {{1, 1}, {7, 5}, {3, 2048}, {5, 1000}, {600, 64}, {9, 3000},
                                 {37, 4096}};
    for (auto &s : shapes)
        for (zr_dtype t : DT) {
            const int64_t N = s[0], D = s[1];
            const double eps = 1e-5;
            vec x = randv(N * D, 2), w = randv(D), res = randv(N * D), dy = randv(N * D),
                dres = randv(N * D);
            dbuf dx_(N * D, t), dw_(D, t), dy_(N * D, t), dres_(N * D, t);
            dx_.up(x), dw_.up(w), dy_.up(dy), dres_.up(dres);
            dbuf y_(N * D, t), h_(N * D, t), rstd_(N, ZR_F32), g_(N * D, t), gw_(D, t);
            char what[96];
            snprintf(what, sizeof what, "rmsnorm %s N=%lld D=%lld", tn(t), (long long)N,
                     (long long)D);
            vec y, mean, rstd;
            norm_ref(false, x, w, vec(), N, D, eps, y, mean, rstd);
            CHECK_OK(rmsnorm_forward_cuda(y_.p, rstd_.f(), dx_.p, dw_.p, N, D, eps, 0.f, t, 0));
            CHECK_CLOSE(y_.down(), y, tol_of(t), what);
            CHECK_CLOSE(rstd_.down(), rstd, 1e-5, what);
            /* backward with dres, dw, at the residual stream h = round(x + res) */
            vec h(N * D);
            for (int64_t i = 0; i < N * D; ++i) h[i] = round_to(x[i] + res[i], t);
            h_.up(h);
            CHECK_OK(rmsnorm_forward_cuda(y_.p, rstd_.f(), h_.p, dw_.p, N, D, eps, 0.f, t, 0));
            vec dxr, dwr, dbr;
            norm_bwd_ref(false, dy, h, w, N, D, eps, dxr, dwr, dbr);
            for (int64_t i = 0; i < N * D; ++i) dxr[i] += dres[i];
            dbuf ws(rmsnorm_backward_workspace_size(N, D) / 4 + 1, ZR_F32);
            CHECK_OK(rmsnorm_backward_cuda(g_.p, gw_.p, dy_.p, h_.p, dw_.p, rstd_.f(), dres_.p,
                                           ws.p, N, D, 0.f, t, 0));
            CHECK_CLOSE(g_.down(), dxr, tol_of(t) * 1.5, what);
            CHECK_CLOSE(gw_.down(), dwr, tol_of(t) * 1.5 + 1e-5, what);
            /* Gemma's norm (w_offset 1): the weight 1 + w; dw is still the gradient of w */
            vec w1(D);
            for (int64_t i = 0; i < D; ++i) w1[i] = 1 + round_to(w[i], t);
            snprintf(what, sizeof what, "rmsnorm (1 + w) %s N=%lld D=%lld", tn(t), (long long)N, (long long)D);
            norm_ref(false, x, w1, vec(), N, D, eps, y, mean, rstd);
            CHECK_OK(rmsnorm_forward_cuda(y_.p, rstd_.f(), dx_.p, dw_.p, N, D, eps, 1.f, t, 0));
            CHECK_CLOSE(y_.down(), y, tol_of(t), what);
            CHECK_OK(rmsnorm_forward_cuda(y_.p, rstd_.f(), h_.p, dw_.p, N, D, eps, 1.f, t, 0));
            norm_bwd_ref(false, dy, h, w1, N, D, eps, dxr, dwr, dbr);
            for (int64_t i = 0; i < N * D; ++i) dxr[i] += dres[i];
            CHECK_OK(rmsnorm_backward_cuda(g_.p, gw_.p, dy_.p, h_.p, dw_.p, rstd_.f(), dres_.p,
                                           ws.p, N, D, 1.f, t, 0));
            CHECK_CLOSE(g_.down(), dxr, tol_of(t) * 1.5, what);
            CHECK_CLOSE(gw_.down(), dwr, tol_of(t) * 1.5 + 1e-5, what);
        }
    CHECK(rmsnorm_forward_cuda(NULL, NULL, NULL, NULL, 2, 4, 1e-5f, 1.f, ZR_BF16, 0) != 0); /* (1 + w) needs w */
    CHECK(strstr(zr_last_error(), "w_offset") != NULL);
}

TEST(layernorm_forward_backward) { /* 300 x 768 (GPT-2's width) and 40 x 320 (f32): the register
                                    * path's rows of three chunks a lane, many rows a block */
    const int64_t shapes[][2] = {{1, 1}, {7, 5}, {3, 2048}, {9, 777}, {300, 768}, {40, 320}};
    for (auto &s : shapes)
        for (zr_dtype t : DT) {
            const int64_t N = s[0], D = s[1];
            const double eps = 1e-5;
            vec x = randv(N * D, 2), w = randv(D), b = randv(D), dy = randv(N * D);
            for (auto &v : x) v += 3; /* a mean far from 0 */
            dbuf x_(N * D, t), w_(D, t), b_(D, t), dy_(N * D, t), y_(N * D, t), mean_(N, ZR_F32),
                rstd_(N, ZR_F32), dx_(N * D, t), gw_(D, t), gb_(D, t);
            x_.up(x), w_.up(w), b_.up(b), dy_.up(dy);
            char what[96];
            snprintf(what, sizeof what, "layernorm %s N=%lld D=%lld", tn(t), (long long)N,
                     (long long)D);
            vec y, mean, rstd, dxr, dwr, dbr;
            norm_ref(true, x, w, b, N, D, eps, y, mean, rstd);
            CHECK_OK(layernorm_forward_cuda(y_.p, mean_.f(), rstd_.f(), x_.p, w_.p, b_.p, N, D,
                                            eps, t, 0));
            CHECK_CLOSE(y_.down(), y, tol_of(t), what);
            CHECK_CLOSE(mean_.down(), mean, 1e-5, what);
            CHECK_CLOSE(rstd_.down(), rstd, 1e-4, what);
            norm_bwd_ref(true, dy, x, w, N, D, eps, dxr, dwr, dbr);
            dbuf ws(layernorm_backward_workspace_size(N, D) / 4 + 1, ZR_F32);
            CHECK_OK(layernorm_backward_cuda(dx_.p, gw_.p, gb_.p, dy_.p, x_.p, w_.p, mean_.f(),
                                             rstd_.f(), NULL, ws.p, N, D, t, 0));
            /* D=1: dx is exactly 0 in exact math; compare absolutely there. */
            if (D == 1) {
                vec g = dx_.down();
                CHECK_MSG(std::fabs(g[0]) < 1e-3, "%s: dx %g", what, g[0]);
            } else {
                CHECK_CLOSE(dx_.down(), dxr, tol_of(t) * 2, what);
                /* a gradient already in dx is added in the same pass (dres aliasing dx) */
                vec prev = randv(N * D), sum(N * D);
                dbuf acc_(N * D, t);
                acc_.up(prev);
                CHECK_OK(layernorm_backward_cuda(acc_.p, NULL, NULL, dy_.p, x_.p, w_.p, mean_.f(),
                                                 rstd_.f(), acc_.p, ws.p, N, D, t, 0));
                for (int64_t i = 0; i < N * D; ++i) sum[i] = dxr[i] + prev[i];
                char w3[128];
                snprintf(w3, sizeof w3, "%s dx + dres in place", what);
                CHECK_CLOSE(acc_.down(), sum, tol_of(t) * 3, w3);
            }
            CHECK_CLOSE(gw_.down(), dwr, tol_of(t) * 2 + 1e-5, what);
            CHECK_CLOSE(gb_.down(), dbr, tol_of(t) + 1e-5, what);
            /* f32 gradients (a ZeRO partition): dw written over poison, db added to what is there */
            vec gb0 = randv(D), dbsum(D);
            dbuf fw_(D, ZR_F32), fb_(D, ZR_F32);
            fb_.up(gb0);
            CHECK_OK(layernorm_backward_acc_cuda(dx_.p, fw_.p, ZR_F32, 0, fb_.p, ZR_F32, 1, dy_.p, x_.p, w_.p,
                                                 mean_.f(), rstd_.f(), NULL, ws.p, N, D, t, 0));
            for (int64_t i = 0; i < D; ++i) dbsum[i] = gb0[i] + dbr[i];
            char w4[160];
            snprintf(w4, sizeof w4, "%s f32 dw written, db added", what);
            CHECK_CLOSE(fw_.down(), dwr, 2e-5 + (t == ZR_F32 ? 0 : 1e-3), w4);
            CHECK_CLOSE(fb_.down(), dbsum, 2e-5 + (t == ZR_F32 ? 0 : 1e-3), w4);
        }
}

/* The residual add fused into the LayerNorm forward: h = round(x + res) exactly, y and the
 * statistics of h as the plain forward's. 777 and 2050 take the unvectorised kernel, 16392 (16-bit)
 * the block-per-row one; the last pass writes h over x (h may alias x). */
TEST(add_layernorm_forward) {
    const int64_t shapes[][2] = {{1, 1}, {7, 5}, {5, 768}, {9, 777}, {3, 2050}, {4, 2048}, {2, 16392}};
    for (auto &s : shapes)
        for (zr_dtype t : DT) {
            const int64_t N = s[0], D = s[1];
            const double eps = 1e-5;
            vec x = randv(N * D, 2), res = randv(N * D), w = randv(D), b = randv(D);
            for (auto &v : x) v += 3; /* a mean far from 0 */
            dbuf x_(N * D, t), res_(N * D, t), w_(D, t), b_(D, t), h_(N * D, t), y_(N * D, t),
                mean_(N, ZR_F32), rstd_(N, ZR_F32);
            x_.up(x), res_.up(res), w_.up(w), b_.up(b);
            char what[96];
            snprintf(what, sizeof what, "add_layernorm %s N=%lld D=%lld", tn(t), (long long)N,
                     (long long)D);
            vec h(N * D), y, mean, rstd;
            for (int64_t i = 0; i < N * D; ++i) h[i] = round_to(x[i] + res[i], t);
            norm_ref(true, h, w, b, N, D, eps, y, mean, rstd);
            CHECK_OK(add_layernorm_forward_cuda(y_.p, h_.p, mean_.f(), rstd_.f(), x_.p, res_.p,
                                                w_.p, b_.p, N, D, eps, t, 0));
            CHECK_CLOSE(h_.down(), h, 0, what);
            CHECK_CLOSE(y_.down(), y, tol_of(t), what);
            CHECK_CLOSE(mean_.down(), mean, 1e-5, what);
            CHECK_CLOSE(rstd_.down(), rstd, 1e-4, what);
            y_.poison();
            CHECK_OK(add_layernorm_forward_cuda(y_.p, x_.p, NULL, NULL, x_.p, res_.p, w_.p, NULL,
                                                N, D, eps, t, 0));
            vec yb;
            norm_ref(true, h, w, vec(), N, D, eps, yb, mean, rstd);
            char w2[160];
            snprintf(w2, sizeof w2, "%s h over x, no bias, no statistics", what);
            CHECK_CLOSE(x_.down(), h, 0, w2);
            CHECK_CLOSE(y_.down(), yb, tol_of(t), w2);
        }
}

/* ---- rope ------------------------------------------------------------------------------------ */

TEST(rope_forward_backward) {
    const int64_t shapes[][5] = {{1, 1, 1, 1, 2}, {2, 4, 2, 37, 6}, {1, 3, 1, 5, 64},
                                 {2, 4, 2, 33, 128}};
    for (auto &s : shapes)
        for (zr_dtype t : DT)
            for (int layout = 0; layout < 2; ++layout) {
                const int64_t B = s[0], Hq = s[1], Hkv = s[2], T = s[3], Dh = s[4], hf = Dh / 2;
                vec cs(T * hf), sn(T * hf);
                for (int64_t p = 0; p < T; ++p)
                    for (int64_t i = 0; i < hf; ++i) {
                        double a = p * std::pow(10000.0, -2.0 * i / Dh);
                        cs[p * hf + i] = (float)std::cos(a), sn[p * hf + i] = (float)std::sin(a);
                    }
                dbuf cos_(T * hf, ZR_F32), sin_(T * hf, ZR_F32);
                cos_.up(cs), sin_.up(sn);
                char what[96];
                snprintf(what, sizeof what, "rope %s layout %d B%lld Hq%lld T%lld Dh%lld", tn(t),
                         layout, (long long)B, (long long)Hq, (long long)T, (long long)Dh);
                for (int side = 0; side < 2; ++side) (void)side;
                vec q = randv(B * Hq * T * Dh), k = randv(B * Hkv * T * Dh);
                dbuf q_(q.size(), t), k_(k.size(), t), qo_(q.size(), t), ko_(k.size(), t),
                    dq_(q.size(), t), dk_(k.size(), t);
                q_.up(q), k_.up(k);
                /* reference: index of (b,h,t,i) in the x-side layout */
                auto xi = [&](int64_t H, int64_t b, int64_t h, int64_t p, int64_t i) {
                    return layout == ZR_ROPE_BTHD ? ((b * T + p) * H + h) * Dh + i
                                                  : ((b * H + h) * T + p) * Dh + i;
                };
                auto rot = [&](const vec &x, int64_t H, double sgn, bool fwd) {
                    vec y(x.size());
                    for (int64_t b = 0; b < B; ++b)
                        for (int64_t h = 0; h < H; ++h)
                            for (int64_t p = 0; p < T; ++p)
                                for (int64_t i = 0; i < hf; ++i) {
                                    int64_t xo = xi(H, b, h, p, 0), yo = ((b * H + h) * T + p) * Dh;
                                    int64_t io = fwd ? xo : yo, oo = fwd ? yo : xo;
                                    double c = cs[p * hf + i], s_ = sgn * sn[p * hf + i];
                                    double x1 = x[io + i], x2 = x[io + i + hf];
                                    y[oo + i] = x1 * c - x2 * s_;
                                    y[oo + i + hf] = x2 * c + x1 * s_;
                                }
                    return y;
                };
                CHECK_OK(rope_forward_cuda(qo_.p, ko_.p, q_.p, k_.p, cos_.f(), sin_.f(), B, Hq,
                                           Hkv, T, Dh, layout, t, 0));
                CHECK_CLOSE(qo_.down(), rot(q, Hq, 1, true), tol_of(t), what);
                CHECK_CLOSE(ko_.down(), rot(k, Hkv, 1, true), tol_of(t), what);
                /* backward: dq_out = q (random, BHTD), expect the transpose of the rotation */
                CHECK_OK(rope_backward_cuda(dq_.p, dk_.p, q_.p, k_.p, cos_.f(), sin_.f(), B, Hq,
                                            Hkv, T, Dh, layout, t, 0));
                CHECK_CLOSE(dq_.down(), rot(q, Hq, -1, false), tol_of(t), what);
                CHECK_CLOSE(dk_.down(), rot(k, Hkv, -1, false), tol_of(t), what);
                if (layout == ZR_ROPE_BHTD) { /* in place */
                    CHECK_OK(rope_forward_cuda(q_.p, k_.p, q_.p, k_.p, cos_.f(), sin_.f(), B, Hq,
                                               Hkv, T, Dh, layout, t, 0));
                    CHECK_CLOSE(q_.down(), rot(q, Hq, 1, true), tol_of(t), what);
                }
            }
}

/* ---- swiglu ---------------------------------------------------------------------------------- */

/* act(g) and act'(g) in double: silu, torch's tanh GELU and exact GELU (Gemma's GeGLU) */
static double glu_ref(zr_glu_act a, double g, double *grad) {
    if (a == ZR_GLU_SILU) {
        const double s = 1 / (1 + std::exp(-g));
        *grad = s + g * s * (1 - s);
        return g * s;
    }
    if (a == ZR_GLU_GELU_TANH) {
        const double c = std::sqrt(2 / M_PI), u = c * (g + 0.044715 * g * g * g), th = std::tanh(u);
        *grad = 0.5 * (1 + th) + 0.5 * g * (1 - th * th) * c * (1 + 3 * 0.044715 * g * g);
        return 0.5 * g * (1 + th);
    }
    const double cdf = 0.5 * (1 + std::erf(g / std::sqrt(2.0)));
    *grad = cdf + g * std::exp(-0.5 * g * g) / std::sqrt(2 * M_PI);
    return g * cdf;
}

TEST(swiglu_forward_backward) { /* and GeGLU: the same kernels with the GELU activations */
    const int64_t shapes[][2] = {{1, 1}, {3, 5}, {17, 1024}, {4, 1000}};
    for (zr_glu_act act : {ZR_GLU_SILU, ZR_GLU_GELU_TANH, ZR_GLU_GELU})
    for (auto &s : shapes)
        for (zr_dtype t : DT)
            for (int fused = 0; fused < 2; ++fused) {
                const int64_t M = s[0], F = s[1], ld = fused ? 2 * F : F;
                vec gu = randv(M * ld * (fused ? 1 : 2), 3), dh = randv(M * F);
                dbuf gu_(gu.size(), t), dh_(M * F, t), h_(M * F, t), dgu_(gu.size(), t);
                gu_.up(gu), dh_.up(dh);
                const size_t uoff = fused ? F : M * F;
                vec h(M * F), dgu(gu.size(), 0);
                for (int64_t r = 0; r < M; ++r)
                    for (int64_t c = 0; c < F; ++c) {
                        double g = gu[r * ld + c], u = gu[uoff + r * ld + c], da;
                        const double a = glu_ref(act, g, &da);
                        h[r * F + c] = a * u;
                        dgu[r * ld + c] = dh[r * F + c] * u * da;
                        dgu[uoff + r * ld + c] = dh[r * F + c] * a;
                    }
                char what[96];
                snprintf(what, sizeof what, "glu act %d %s M%lld F%lld ld%lld", (int)act, tn(t), (long long)M,
                         (long long)F, (long long)ld);
                const int esz = (int)dsize(t);
                CHECK_OK(glu_forward_cuda(h_.p, gu_.p, (char *)gu_.p + uoff * esz, M, F, ld, act, t, 0));
                CHECK_CLOSE(h_.down(), h, tol_of(t), what);
                if (fused) CHECK_OK(cudaMemset(dgu_.p, 0, gu.size() * esz)); /* gaps: none */
                CHECK_OK(glu_backward_cuda(dgu_.p, (char *)dgu_.p + uoff * esz, dh_.p, gu_.p,
                                           (char *)gu_.p + uoff * esz, M, F, ld, act, t, 0));
                CHECK_CLOSE(dgu_.down(), dgu, tol_of(t), what);
            }
}

/* ---- cross entropy --------------------------------------------------------------------------- */

/* eps: label smoothing (0: the plain loss), each on the same logits and targets. With eps the
 * reference loss is lse - (1 - eps) x[t] - eps/V sum_j x[j] and the gradient subtracts
 * (1 - eps) onehot + eps/V; its losses (at V = 1: 0 up to rounding) are judged against at least 1. */
TEST(cross_entropy_forward_backward) {
    /* vocabularies: Llama 2 / Mistral (32000), GPT-2 padded (50304), Llama 3 (128256) */
    const int64_t shapes[][2] = {{1, 1}, {5, 7}, {6, 1000}, {3, 32000}, {3, 50304}, {3, 128256}};
    for (auto &s : shapes)
        for (zr_dtype t : DT) {
            const int64_t N = s[0], V = s[1];
            vec x = randv(N * V, 4);
            std::vector<int64_t> tg(N);
            for (int64_t r = 0; r < N; ++r)
                tg[r] = (r % 3 == 1) ? -100 : (int64_t)((urand() + 1) / 2 * V) % V;
            dbuf x_(N * V, t), loss_(N, ZR_F32), lse_(N, ZR_F32), mean_(1, ZR_F32),
                nv_(1, ZR_F32), dl_(N * V, t), g_(1, ZR_F32);
            int64_t *tg_;
            CU(cudaMalloc(&tg_, N * 8));
            CU(cudaMemcpy(tg_, tg.data(), N * 8, cudaMemcpyHostToDevice));
            for (const float epsf : {0.f, 0.1f, 0.3f}) {
                const double eps = epsf;
                x_.up(x);
                vec loss(N), lse(N), dl(N * V, 0);
                double sum = 0, cnt = 0;
                for (int64_t r = 0; r < N; ++r) {
                    if (tg[r] == -100) continue;
                    double m = -INFINITY, z = 0, tot = 0;
                    for (int64_t j = 0; j < V; ++j) m = std::max(m, x[r * V + j]);
                    for (int64_t j = 0; j < V; ++j) z += std::exp(x[r * V + j] - m), tot += x[r * V + j];
                    lse[r] = m + std::log(z);
                    loss[r] = lse[r] - (1 - eps) * x[r * V + tg[r]] - eps / V * tot;
                    sum += loss[r], cnt += 1;
                }
                const double gscale = 0.7 / cnt;
                for (int64_t r = 0; r < N; ++r)
                    if (tg[r] != -100)
                        for (int64_t j = 0; j < V; ++j)
                            dl[r * V + j] = (std::exp(x[r * V + j] - lse[r]) - eps / V -
                                             (j == tg[r] ? 1 - eps : 0)) * gscale;
                char what[96];
                snprintf(what, sizeof what, "cross_entropy %s N%lld V%lld eps %g", tn(t), (long long)N,
                         (long long)V, eps);
                auto check_loss = [&](const vec &got, const vec &ref) {
                    const double e = relerr(got, ref, eps != 0 ? 1 : 1e-30);
                    CHECK_MSG(e <= 2e-5, "%s: loss rel err %.3g > 2e-5", what, e);
                };
                loss_.poison(), lse_.poison(), mean_.poison(), nv_.poison();
                CHECK_OK(cross_entropy_forward_cuda(loss_.f(), lse_.f(), mean_.f(), nv_.f(), x_.p,
                                                    tg_, N, V, -100, epsf, t, 0));
                check_loss(loss_.down(), loss);
                CHECK_CLOSE(lse_.down(), lse, 2e-6, what);
                vec mn = mean_.down(), nv = nv_.down();
                if (cnt > 0) check_loss(mn, vec(1, sum / cnt));
                else CHECK_MSG(std::isnan(mn[0]), "%s: mean of no rows should be NaN", what);
                CHECK_MSG(nv[0] == cnt, "%s: n_valid %g, expected %g", what, nv[0], cnt);
                vec gv(1, gscale);
                g_.up(gv);
                dl_.poison();
                CHECK_OK(cross_entropy_backward_cuda(dl_.p, x_.p, tg_, lse_.f(), g_.f(), 0, N, V,
                                                     -100, epsf, t, 0));
                if (cnt > 0) CHECK_CLOSE(dl_.down(), dl, tol_of(t) + 1e-5, what);
                /* in place over the logits */
                CHECK_OK(cross_entropy_backward_cuda(x_.p, x_.p, tg_, lse_.f(), g_.f(), 0, N, V,
                                                     -100, epsf, t, 0));
                if (cnt > 0) CHECK_CLOSE(x_.down(), dl, tol_of(t) + 1e-5, what);
                /* loss and gradient in one pass, in place over the logits (the mean: seed 0.7 / count) */
                x_.up(x);
                loss_.poison(), lse_.poison(), mean_.poison();
                unsigned *cnt_;
                CU(cudaMalloc(&cnt_, sizeof *cnt_));
                CHECK_OK(cross_entropy_fused_cuda(loss_.f(), lse_.f(), mean_.f(), nv_.f(), x_.p, x_.p, tg_,
                                                  cnt_, 0.7f, N, V, -100, epsf, t, 0));
                check_loss(loss_.down(), loss);
                CHECK_CLOSE(lse_.down(), lse, 2e-6, what);
                check_loss(mean_.down(), vec(1, sum / cnt));
                vec fused = x_.down();
                CHECK_CLOSE(fused, dl, tol_of(t) + 1e-5, what);
                /* rescaled for another seed (1.4: twice), then the same seed again (nothing written) */
                dbuf seed_(1, ZR_F32), baked_(1, ZR_F32);
                vec s14(1, 1.4), s07(1, 0.7);
                seed_.up(s14);
                baked_.up(s07);
                CHECK_OK(cross_entropy_rescale_cuda(x_.p, N * V, seed_.f(), baked_.f(), t, 0));
                vec dl2(dl);
                for (double &v : dl2) v *= 2;
                CHECK_CLOSE(x_.down(), dl2, tol_of(t) + 1e-5, what);
                CHECK_MSG(baked_.down()[0] == (float)1.4, "%s: the rescale records the new seed", what);
                vec before = x_.down();
                CHECK_OK(cross_entropy_rescale_cuda(x_.p, N * V, seed_.f(), baked_.f(), t, 0));
                CHECK_MSG(x_.down() == before, "%s: the same seed again rewrote the gradient", what);
                cudaFree(cnt_);
            }
            cudaFree(tg_);
        }
}

/* ---- softmax --------------------------------------------------------------------------------- */

TEST(softmax_forward_backward) {
    const int64_t shapes[][2] = {{1, 1}, {7, 5}, {3, 1000}, {2, 4096}, {100, 33}};
    for (auto &s : shapes)
        for (zr_dtype t : DT) {
            const int64_t N = s[0], D = s[1];
            vec x = randv(N * D, 5), dy = randv(N * D);
            dbuf x_(N * D, t), y_(N * D, t), dy_(N * D, t), dx_(N * D, t);
            x_.up(x), dy_.up(dy);
            CHECK_OK(softmax_forward_cuda(y_.p, x_.p, N, D, t, 0));
            vec y(N * D), dx(N * D);
            for (int64_t r = 0; r < N; ++r) {
                double m = -INFINITY, z = 0;
                for (int64_t i = 0; i < D; ++i) m = std::max(m, x[r * D + i]);
                for (int64_t i = 0; i < D; ++i) z += std::exp(x[r * D + i] - m);
                for (int64_t i = 0; i < D; ++i) y[r * D + i] = std::exp(x[r * D + i] - m) / z;
            }
            char what[96];
            snprintf(what, sizeof what, "softmax %s N%lld D%lld", tn(t), (long long)N,
                     (long long)D);
            CHECK_CLOSE(y_.down(), y, tol_of(t), what);
            vec yr = y; /* backward from the rounded y the kernel reads */
            dbuf yy_(N * D, t);
            yy_.up(yr);
            for (int64_t r = 0; r < N; ++r) {
                double sdot = 0;
                for (int64_t i = 0; i < D; ++i) sdot += dy[r * D + i] * yr[r * D + i];
                for (int64_t i = 0; i < D; ++i) dx[r * D + i] = yr[r * D + i] * (dy[r * D + i] - sdot);
            }
            CHECK_OK(softmax_backward_cuda(dx_.p, dy_.p, yy_.p, N, D, t, 0));
            if (D > 1) CHECK_CLOSE(dx_.down(), dx, tol_of(t) * 2, what);
            else CHECK_MSG(std::fabs(dx_.down()[0]) < 1e-6, "%s: dx of a 1-wide softmax", what);
        }
}

/* ---- embedding ------------------------------------------------------------------------------- */

TEST(embedding_forward_backward) {
    const int64_t shapes[][3] = {{1, 1, 1}, {13, 7, 5}, {300, 50, 64}, {2048, 1000, 136}};
    for (auto &s : shapes)
        for (zr_dtype t : DT) {
            const int64_t N = s[0], V = s[1], D = s[2];
            vec w = randv(V * D), dout = randv(N * D), w0 = randv(V * D);
            std::vector<int64_t> ids(N);
            for (int64_t i = 0; i < N; ++i) ids[i] = (int64_t)((urand() + 1) / 2 * V / 3) % V;
            dbuf w_(V * D, t), out_(N * D, t), do_(N * D, t), dw_(V * D, t), dw2_(V * D, t);
            w_.up(w), do_.up(dout);
            int64_t *ids_;
            CU(cudaMalloc(&ids_, N * 8));
            CU(cudaMemcpy(ids_, ids.data(), N * 8, cudaMemcpyHostToDevice));
            char what[96];
            snprintf(what, sizeof what, "embedding %s N%lld V%lld D%lld", tn(t), (long long)N,
                     (long long)V, (long long)D);
            CHECK_OK(embedding_forward_cuda(out_.p, w_.p, ids_, N, V, D, t, 0));
            vec out(N * D), dw(V * D, 0);
            for (int64_t n = 0; n < N; ++n)
                for (int64_t i = 0; i < D; ++i) {
                    out[n * D + i] = w[ids[n] * D + i];
                    dw[ids[n] * D + i] += dout[n * D + i];
                }
            CHECK_CLOSE(out_.down(), out, 0, what);
            dbuf ws(embedding_backward_workspace_size(N, V) / 4 + 1, ZR_F32);
            CHECK_OK(embedding_backward_cuda(dw_.p, do_.p, ids_, ws.p, N, V, D, 0, t, 0));
            vec g1 = dw_.down();
            CHECK_CLOSE(g1, dw, tol_of(t), what);
            CHECK_OK(embedding_backward_cuda(dw2_.p, do_.p, ids_, ws.p, N, V, D, 0, t, 0));
            CHECK_MSG(dw2_.down() == g1, "%s: two runs differ (not deterministic)", what);
            /* accumulate onto w0 */
            dw_.up(w0);
            CHECK_OK(embedding_backward_cuda(dw_.p, do_.p, ids_, ws.p, N, V, D, 1, t, 0));
            for (int64_t i = 0; i < V * D; ++i) dw[i] += w0[i];
            CHECK_CLOSE(dw_.down(), dw, tol_of(t), what);
            cudaFree(ids_);
        }
}

/* ---- adamw ----------------------------------------------------------------------------------- */

TEST(adamw_step) {
    /* three tensors in one flat buffer with a gap, one without decay, one with its own learning
     * rate (a second parameter group); 70 segments to force two launches */
    for (zr_dtype gt : DT) {
        std::vector<zr_adamw_segment> segs = {{0, 5, 0.1f, 1e-2f}, {8, 4099, 0.0f, 1e-2f}, {4200, 1, 0.1f, 3e-3f}};
        for (int i = 0; i < 67; ++i) segs.push_back({(int64_t)4201 + i * 3, 2, 0.05f, 1e-2f});
        const int64_t n = 4201 + 67 * 3 + 4;
        vec p = randv(n), m(n, 0), v(n, 0);
        dbuf p_(n, ZR_F32), m_(n, ZR_F32), v_(n, ZR_F32), g_(n, gt), lp_(n, ZR_BF16),
            sc_(1, ZR_F32);
        p_.up(p), m_.up(m), v_.up(v);
        vec sc(1, 0.5);
        sc_.up(sc);
        const double b1 = 0.9, b2 = 0.95, eps = 1e-8;
        vec inseg(n, -1), lrs(n, 0);
        for (auto &s : segs)
            for (int64_t i = s.offset; i < s.offset + s.n; ++i) inseg[i] = s.weight_decay, lrs[i] = s.lr;
        for (int step = 1; step <= 3; ++step) {
            vec g = randv(n);
            g_.up(g);
            const zr_adamw_config cfg = {0, b1, b2, eps, 0}; /* lr, wd: per segment */
            CHECK_OK(adamw_step_cuda(p_.f(), m_.f(), v_.f(), lp_.p, ZR_BF16, g_.p, gt, segs.data(),
                                     (int)segs.size(), &cfg, step, sc_.f(), 0));
            for (int64_t i = 0; i < n; ++i) {
                if (inseg[i] < 0) continue;
                double gi = g[i] * 0.5, lr = lrs[i];
                p[i] *= 1 - lr * inseg[i];
                m[i] = b1 * m[i] + (1 - b1) * gi;
                v[i] = b2 * v[i] + (1 - b2) * gi * gi;
                double mh = m[i] / (1 - std::pow(b1, step)), vh = v[i] / (1 - std::pow(b2, step));
                p[i] -= lr * mh / (std::sqrt(vh) + eps);
            }
        }
        vec pg = p_.down(), lp = lp_.down(), pr = p, lpr = p;
        /* elements outside segments must be untouched (still the poison NaN): drop them */
        vec a, b, c, d;
        for (int64_t i = 0; i < n; ++i)
            if (inseg[i] >= 0) a.push_back(pg[i]), b.push_back(pr[i]), c.push_back(lp[i]);
        d = b;
        roundv(d, ZR_BF16);
        char what[64];
        snprintf(what, sizeof what, "adamw grad %s", tn(gt));
        CHECK_CLOSE(a, b, 1e-5, what);
        CHECK_CLOSE(c, d, 8e-3, what);
        CHECK_CLOSE(m_.down().size() ? vec(1, 0) : vec(1, 0), vec(1, 0), 0, what);
    }
}


/* ---- lion / adagrad / sgd (optim_step_cuda) vs a double reference of the documented formulas -- */

TEST(optim_step) {
    /* the AdamW test's layout: a gap, per-segment lr and decay, 70 segments (two launches) */
    std::vector<zr_adamw_segment> segs = {{0, 5, 0.1f, 1e-2f}, {8, 4099, 0.0f, 1e-2f}, {4200, 1, 0.1f, 3e-3f}};
    for (int i = 0; i < 67; ++i) segs.push_back({(int64_t)4201 + i * 3, 2, 0.05f, 1e-2f});
    const int64_t n = 4201 + 67 * 3 + 4;
    vec inseg(n, -1), lrs(n, 0);
    for (auto &s : segs)
        for (int64_t i = s.offset; i < s.offset + s.n; ++i) inseg[i] = s.weight_decay, lrs[i] = s.lr;
    struct kase {
        int kind;
        double b1, b2, eps, mo, damp, lr_decay;
        int nesterov, has_state;
        const char *name;
    } cases[] = {{ZR_OPTIM_LION, 0.9, 0.99, 0, 0, 0, 0, 0, 1, "lion"},
                 {ZR_OPTIM_ADAGRAD, 0, 0, 1e-10, 0, 0, 0.01, 0, 1, "adagrad"},
                 {ZR_OPTIM_SGD, 0, 0, 0, 0.9, 0.1, 0, 0, 1, "sgd momentum"},
                 {ZR_OPTIM_SGD, 0, 0, 0, 0.9, 0, 0, 1, 1, "sgd nesterov"},
                 {ZR_OPTIM_SGD, 0, 0, 0, 0, 0, 0, 0, 0, "sgd"}};
    for (const kase &k : cases)
        for (zr_dtype gt : DT) {
            vec p = randv(n), s(n, 0);
            if (k.kind == ZR_OPTIM_ADAGRAD)
                for (auto &x : s) x = 0.1;
            dbuf p_(n, ZR_F32), s_(n, ZR_F32), g_(n, gt), lp_(n, ZR_BF16), sc_(1, ZR_F32);
            p_.up(p), s_.up(s);
            vec sc(1, 0.5);
            sc_.up(sc);
            zr_adamw_config cfg = {};
            cfg.beta1 = k.b1, cfg.beta2 = k.b2, cfg.eps = k.eps, cfg.kind = k.kind, cfg.momentum = k.mo;
            cfg.dampening = k.damp, cfg.lr_decay = k.lr_decay, cfg.nesterov = k.nesterov;
            for (int step = 1; step <= 3; ++step) {
                vec g = randv(n);
                g_.up(g);
                CHECK_OK(optim_step_cuda(p_.f(), k.has_state ? s_.f() : nullptr, lp_.p, ZR_BF16, g_.p, gt,
                                         segs.data(), (int)segs.size(), &cfg, step, sc_.f(), 0));
                /* Lion's sign of an interpolation within f32's rounding of zero (bf16 gradients take few
                 * values, so such near-ties turn up) may go either way: there the device's step is taken
                 * if it is one of the formula's three, and the reference goes on from it */
                const vec pd = k.kind == ZR_OPTIM_LION ? p_.down() : vec();
                for (int64_t i = 0; i < n; ++i) {
                    if (inseg[i] < 0) continue;
                    double gi = g[i] * 0.5, lr = lrs[i], wd = inseg[i];
                    if (k.kind == ZR_OPTIM_LION) {
                        double c = k.b1 * s[i] + (1 - k.b1) * gi;
                        const double kept = p[i] * (1 - lr * wd);
                        p[i] = kept - lr * ((c > 0) - (c < 0));
                        if (std::fabs(c) <= 1e-6 * (k.b1 * std::fabs(s[i]) + (1 - k.b1) * std::fabs(gi)))
                            for (double sg : {-1.0, 0.0, 1.0})
                                if (std::fabs(pd[i] - (kept - lr * sg)) <= 1e-6 * (1 + std::fabs(kept))) p[i] = pd[i];
                        s[i] = k.b2 * s[i] + (1 - k.b2) * gi;
                    } else if (k.kind == ZR_OPTIM_ADAGRAD) {
                        gi += wd * p[i];
                        s[i] += gi * gi;
                        p[i] -= lr / (1 + (step - 1) * k.lr_decay) * gi / (std::sqrt(s[i]) + k.eps);
                    } else {
                        double d = gi + wd * p[i];
                        if (k.has_state) {
                            s[i] = step == 1 ? d : k.mo * s[i] + (1 - k.damp) * d;
                            d = k.nesterov ? d + k.mo * s[i] : s[i];
                        }
                        p[i] -= lr * d;
                    }
                }
            }
            vec pg = p_.down(), lp = lp_.down(), sg = s_.down();
            /* elements outside segments are untouched (the poison NaN): drop them */
            vec a, b, c, d, e, f;
            for (int64_t i = 0; i < n; ++i)
                if (inseg[i] >= 0) a.push_back(pg[i]), b.push_back(p[i]), c.push_back(lp[i]), e.push_back(sg[i]),
                                   f.push_back(s[i]);
            d = b;
            roundv(d, ZR_BF16);
            char what[64];
            snprintf(what, sizeof what, "%s grad %s", k.name, tn(gt));
            CHECK_CLOSE(a, b, 1e-5, what);
            CHECK_CLOSE(c, d, 8e-3, what);
            if (k.has_state) CHECK_CLOSE(e, f, 1e-5, what);
        }
}

/* ---- attention ------------------------------------------------------------------------------- */

/* lo: NULL (causal), or packed sequences: query i of row b attends to keys lo[b·T + i] .. i. */
static void attn_ref(const vec &q, const vec &k, const vec &v, const vec &dO, int64_t B,
                     int64_t Hq, int64_t Hkv, int64_t T, int64_t Dh, vec &o, vec &lse, vec &dq,
                     vec &dk, vec &dv, const int32_t *lo = nullptr) {
    const double sc = 1 / std::sqrt((double)Dh);
    const int64_t G = Hq / Hkv;
    o.assign(B * Hq * T * Dh, 0), lse.assign(B * Hq * T, 0), dq.assign(o.size(), 0);
    dk.assign(B * Hkv * T * Dh, 0), dv.assign(dk.size(), 0);
    vec p(T), dp(T);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h) {
            const int64_t kh = h / G;
            const double *Q = &q[(b * Hq + h) * T * Dh], *K = &k[(b * Hkv + kh) * T * Dh],
                         *Vv = &v[(b * Hkv + kh) * T * Dh], *DO = &dO[(b * Hq + h) * T * Dh];
            double *O = &o[(b * Hq + h) * T * Dh], *DQ = &dq[(b * Hq + h) * T * Dh],
                   *DK = &dk[(b * Hkv + kh) * T * Dh], *DV = &dv[(b * Hkv + kh) * T * Dh];
            for (int64_t i = 0; i < T; ++i) {
                const int64_t j0 = lo ? lo[b * T + i] : 0;
                double m = -INFINITY;
                for (int64_t j = j0; j <= i; ++j) {
                    double s = 0;
                    for (int64_t d = 0; d < Dh; ++d) s += Q[i * Dh + d] * K[j * Dh + d];
                    p[j] = s * sc;
                    m = std::max(m, p[j]);
                }
                double z = 0;
                for (int64_t j = j0; j <= i; ++j) z += (p[j] = std::exp(p[j] - m));
                for (int64_t j = j0; j <= i; ++j) p[j] /= z;
                lse[(b * Hq + h) * T + i] = m + std::log(z);
                for (int64_t j = j0; j <= i; ++j)
                    for (int64_t d = 0; d < Dh; ++d) O[i * Dh + d] += p[j] * Vv[j * Dh + d];
                double Di = 0;
                for (int64_t d = 0; d < Dh; ++d) Di += DO[i * Dh + d] * O[i * Dh + d];
                for (int64_t j = j0; j <= i; ++j) {
                    double s = 0;
                    for (int64_t d = 0; d < Dh; ++d) s += DO[i * Dh + d] * Vv[j * Dh + d];
                    double ds = p[j] * (s - Di) * sc;
                    for (int64_t d = 0; d < Dh; ++d) {
                        DV[j * Dh + d] += p[j] * DO[i * Dh + d];
                        DQ[i * Dh + d] += ds * K[j * Dh + d];
                        DK[j * Dh + d] += ds * Q[i * Dh + d];
                    }
                }
            }
        }
}

/* q (B, Hq, T, Dh), k, v (B, Hkv, T, Dh) and dO as a fused projection's layout: f (B, T, Hq + 2 Hkv,
 * Dh) holding q, k, v head slices side by side, dob (B, T, Hq, Dh); back() turns a (B, T, H, Dh)
 * result into (B, H, T, Dh). */
struct fused_qkv {
    int64_t B, T, Dh;
    vec f, dob;
    int64_t bthd(int64_t b, int64_t h, int64_t i, int64_t H) const { return ((b * T + i) * H + h) * Dh; }
    int64_t bhtd(int64_t b, int64_t h, int64_t i, int64_t H) const { return ((b * H + h) * T + i) * Dh; }
    fused_qkv(const vec &q, const vec &k, const vec &v, const vec &dO, int64_t B_, int64_t Hq,
              int64_t Hkv, int64_t T_, int64_t Dh_)
        : B(B_), T(T_), Dh(Dh_), f(B_ * T_ * (Hq + 2 * Hkv) * Dh_), dob(dO.size()) {
        const int64_t Hf = Hq + 2 * Hkv;
        for (int64_t b = 0; b < B; ++b)
            for (int64_t i = 0; i < T; ++i)
                for (int64_t d = 0; d < Dh; ++d) {
                    for (int64_t h = 0; h < Hq; ++h) {
                        f[bthd(b, h, i, Hf) + d] = q[bhtd(b, h, i, Hq) + d];
                        dob[bthd(b, h, i, Hq) + d] = dO[bhtd(b, h, i, Hq) + d];
                    }
                    for (int64_t h = 0; h < Hkv; ++h) {
                        f[bthd(b, Hq + h, i, Hf) + d] = k[bhtd(b, h, i, Hkv) + d];
                        f[bthd(b, Hq + Hkv + h, i, Hf) + d] = v[bhtd(b, h, i, Hkv) + d];
                    }
                }
    }
    vec back(const vec &x, int64_t H) const {
        vec y(x.size());
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t i = 0; i < T; ++i)
                    for (int64_t d = 0; d < Dh; ++d)
                        y[bhtd(b, h, i, H) + d] = x[bthd(b, h, i, H) + d];
        return y;
    }
};

/* The head_dim-64 Hopper forward at both tile heights (attn_sm90_fwd_rows: 128 and 192 queries),
 * its tiles from row 0 and shifted before it (attn_sm90_fwd_tail), gives the bits of the call fwd
 * just made into o_, lse_ (each row meets the same key tiles in the same order); the buffers
 * poisoned before each call, so every row must be written again. */
template <typename F>
static void check_fwd_rows(F &&fwd, dbuf &o_, dbuf &lse_, const char *what) {
    const vec og = o_.down(), lg = lse_.down();
    for (int rows : {128, 192})
        for (int tail : {0, 1}) {
            const int was = attn_sm90_fwd_rows(rows), was_tail = attn_sm90_fwd_tail(tail);
            o_.poison(), lse_.poison();
            fwd();
            CHECK_MSG(o_.down() == og && lse_.down() == lg, "%s: %d-query tiles%s give other bits",
                      what, rows, tail ? " before row 0" : "");
            attn_sm90_fwd_rows(was), attn_sm90_fwd_tail(was_tail);
        }
}

/* Every case runs on the Hopper kernels where they run (compute capability 9.0: forward and backward
 * at Dh 64, 128 and the narrow 80, 96, 112, read in place by the 128-wide tiles) and on the mma.sync
 * fallback (attn_sm90_force(0, 0); a narrow Dh refused there). The narrow shapes run split (GQA on
 * small grids: dk, dv from 128-wide f32 partials) and unsplit (stored W columns a row; in the strided
 * layout a column past W would land in the next head's slice). At Dh 128, T = 300 and
 * 550 wrap the forward's two-stage K and V rings and the backward's (64 queries a step: up to 27
 * steps an item at T = 550 with Hq/Hkv 3, unsplit, its query head changing within the item; T = 192
 * ends on a half key tile, its last query tile whole). The Hq/Hkv = 3 shapes are never split (odd group):
 * blocks of up to 9 iterations, so the backward's rings and buffers wrap several times and its
 * query head changes within a block; T = 550 gives the forward 5 key tiles, so its 4-stage ring
 * wraps, and a last query tile whose second warpgroup has no row before T. B2 H8/2 T550 on 3
 * blocks runs both phases of the backward's schedule (ws_sched: 16 heads of 5 tiles, 30 pairs
 * then 20 single tiles, an odd tile count). */
TEST(attention_forward_backward) {
    const int64_t shapes[][5] = {/* B, Hq, Hkv, T, Dh */
                                 {1, 1, 1, 1, 64},   {2, 4, 2, 37, 64},  {1, 2, 2, 64, 64},
                                 {1, 8, 2, 130, 64}, {2, 2, 1, 77, 128}, {1, 4, 1, 200, 64},
                                 {1, 6, 2, 300, 64}, {1, 3, 1, 550, 64}, {2, 8, 2, 550, 64},
                                 {1, 8, 2, 300, 128}, {2, 4, 1, 550, 128}, {1, 3, 1, 550, 128},
                                 {1, 2, 2, 192, 128}, {2, 4, 2, 200, 96},  {1, 3, 1, 300, 80},
                                 {1, 2, 2, 130, 112}, {2, 8, 2, 550, 96},  {2, 4, 1, 200, 256},
                                 {1, 2, 2, 130, 256}, {1, 3, 1, 300, 256}};
    const zr_dtype dts[2] = {ZR_BF16, ZR_F16};
    /* modes: the Hopper kernels with their default grid (one block per SM), with 3 blocks (each
     * runs many tiles: rings, barriers and the ping-pong carry over tiles), with a block per tile;
     * then the mma.sync fallback */
    const int grids[3] = {0, 3, -1};
    const char *gname[3] = {"", " (3 blocks)", " (block per tile)"};
    for (int mode = 0; mode < 4; ++mode)
    for (auto &s : shapes)
        for (zr_dtype t : dts) {
            const int fallback = mode == 3;
            attn_sm90_force(fallback ? 0 : -1, fallback ? 0 : -1);
            attn_sm90_grid(fallback ? 0 : grids[mode], fallback ? 0 : grids[mode]);
            const int64_t B = s[0], Hq = s[1], Hkv = s[2], T = s[3], Dh = s[4];
            const int64_t nq = B * Hq * T * Dh, nk = B * Hkv * T * Dh;
            if (Dh != 64 && Dh != 128 && Dh != 256 && (fallback || !attention_strided_ok(Dh, t))) {
                /* a narrow head_dim (80, 96, 112) is the Hopper kernels' alone: refused elsewhere,
                 * in one line naming the head_dims that run */
                CHECK(attention_forward_cuda(NULL, NULL, NULL, NULL, NULL, NULL, B, Hq, Hkv, T, Dh,
                                             0.f, t, 0) != 0);
                CHECK(strstr(zr_last_error(), "compute capability 9.0") != NULL);
                continue;
            }
            vec q = randv(nq, 1.5), k = randv(nk, 1.5), v = randv(nk), dO = randv(nq);
            dbuf q_(nq, t), k_(nk, t), v_(nk, t), do_(nq, t), o_(nq, t), lse_(B * Hq * T, ZR_F32),
                dq_(nq, t), dk_(nk, t), dv_(nk, t);
            q_.up(q), k_.up(k), v_.up(v), do_.up(dO);
            vec o, lse, dq, dk, dv;
            attn_ref(q, k, v, dO, B, Hq, Hkv, T, Dh, o, lse, dq, dk, dv);
            char what[112];
            snprintf(what, sizeof what, "attention%s %s B%lld Hq%lld Hkv%lld T%lld Dh%lld",
                     fallback ? " (mma.sync)" : gname[mode], tn(t),
                     (long long)B, (long long)Hq, (long long)Hkv, (long long)T, (long long)Dh);
            CHECK_OK(attention_forward_cuda(o_.p, lse_.f(), q_.p, k_.p, v_.p, NULL, B, Hq, Hkv, T,
                                            Dh, 0.f, t, 0));
            CHECK_CLOSE(o_.down(), o, tol_of(t), what);
            CHECK_CLOSE(lse_.down(), lse, 1e-5, what);
            if (!fallback && Dh == 64)
                check_fwd_rows([&] {
                    CHECK_OK(attention_forward_cuda(o_.p, lse_.f(), q_.p, k_.p, v_.p, NULL, B, Hq,
                                                    Hkv, T, Dh, 0.f, t, 0));
                }, o_, lse_, what);
            size_t wsb = attention_backward_workspace_size(B, Hq, Hkv, T, Dh);
            dbuf ws(wsb / 4 + 4, ZR_F32);
            CHECK_OK(attention_backward_cuda(dq_.p, dk_.p, dv_.p, do_.p, q_.p, k_.p, v_.p, o_.p,
                                             lse_.f(), ws.p, NULL, B, Hq, Hkv, T, Dh, 0.f, t, 0));
            const double bt = t == ZR_BF16 ? 2.5e-2 : 6e-3;
            char w2[128];
            double dvn = 0;
            for (double x : dv) dvn += x * x;
            dvn = 0.1 * std::sqrt(dvn);
            double e1 = relerr(dq_.down(), dq, dvn), e2 = relerr(dk_.down(), dk, dvn);
            CHECK_MSG(e1 <= bt, "%s dq: rel err %.3g > %.3g", what, e1, bt);
            CHECK_MSG(e2 <= bt, "%s dk: rel err %.3g > %.3g", what, e2, bt);
            printf("  %s: o %.2g dq %.2g dk %.2g dv %.2g\n", what, relerr(o_.down(), o), e1, e2,
                   relerr(dv_.down(), dv));
            snprintf(w2, sizeof w2, "%s dv", what);
            CHECK_CLOSE(dv_.down(), dv, bt, w2);
            if (!fallback) { /* the other backward instance (dK/dV epilogue): the same dk, dv
                              * bits (dq's reduce-adds from several blocks may round in another order) */
                dbuf dq3(nq, t), dk3(nk, t), dv3(nk, t);
                const int64_t rows_t = attn_sm90_dkv_rows_max_t(0);
                CHECK_OK(attention_backward_cuda(dq3.p, dk3.p, dv3.p, do_.p, q_.p, k_.p, v_.p,
                                                 o_.p, lse_.f(), ws.p, NULL, B, Hq, Hkv, T, Dh,
                                                 0.f, t, 0));
                attn_sm90_dkv_rows_max_t(rows_t);
                CHECK_MSG(dk3.down() == dk_.down() && dv3.down() == dv_.down(),
                          "%s: the two dK/dV epilogues differ", what);
            }
            if (!attention_strided_ok(Dh, t)) continue;
            /* Strided: q, k, v as head slices of one (B, T, Hq + 2 Hkv, Dh) buffer (a fused
             * projection), o, dO, dq, dk, dv in (B, T, H, Dh) memory. */
            const int64_t Hf = Hq + 2 * Hkv;
            fused_qkv fz(q, k, v, dO, B, Hq, Hkv, T, Dh);
            vec &f = fz.f, &dob = fz.dob;
            auto back = [&](const vec &x, int64_t H) { return fz.back(x, H); };
            dbuf f_(f.size(), t), o2(nq, t), do2(nq, t), dq2(nq, t), dk2(nk, t), dv2(nk, t),
                lse2(B * Hq * T, ZR_F32);
            f_.up(f), do2.up(dob);
            const zr_attn_strides sf = {T * Hf * Dh, Dh, Hf * Dh}, sq = {T * Hq * Dh, Dh, Hq * Dh},
                                  sk = {T * Hkv * Dh, Dh, Hkv * Dh};
            const zr_attn_layout L = {sf, sf, sf, sq, sq, sq, sk, sk};
            const char *fp = (const char *)f_.p;
            const void *qp = fp, *kp = fp + Hq * Dh * 2, *vp = fp + (Hq + Hkv) * Dh * 2;
            CHECK_OK(attention_forward_cuda(o2.p, lse2.f(), qp, kp, vp, &L, B, Hq, Hkv, T, Dh, 0.f,
                                            t, 0));
            snprintf(w2, sizeof w2, "%s strided o", what);
            CHECK_CLOSE(back(o2.down(), Hq), o, tol_of(t), w2);
            CHECK_CLOSE(lse2.down(), lse, 1e-5, w2);
            if (Dh == 64)
                check_fwd_rows([&] {
                    CHECK_OK(attention_forward_cuda(o2.p, lse2.f(), qp, kp, vp, &L, B, Hq, Hkv, T,
                                                    Dh, 0.f, t, 0));
                }, o2, lse2, w2);
            CHECK_OK(attention_backward_cuda(dq2.p, dk2.p, dv2.p, do2.p, qp, kp, vp, o2.p, lse2.f(),
                                             ws.p, &L, B, Hq, Hkv, T, Dh, 0.f, t, 0));
            e1 = relerr(back(dq2.down(), Hq), dq, dvn), e2 = relerr(back(dk2.down(), Hkv), dk, dvn);
            CHECK_MSG(e1 <= bt, "%s strided dq: rel err %.3g > %.3g", what, e1, bt);
            CHECK_MSG(e2 <= bt, "%s strided dk: rel err %.3g > %.3g", what, e2, bt);
            snprintf(w2, sizeof w2, "%s strided dv", what);
            CHECK_CLOSE(back(dv2.down(), Hkv), dv, bt, w2);
        }
    attn_sm90_force(-1, -1);
    attn_sm90_grid(0, 0);
    /* argument checks */
    CHECK(attention_forward_cuda(NULL, NULL, NULL, NULL, NULL, NULL, 1, 3, 2, 8, 64, 0.f, ZR_BF16,
                                 0) != 0);
    CHECK(attention_forward_cuda(NULL, NULL, NULL, NULL, NULL, NULL, 1, 2, 2, 8, 72, 0.f, ZR_BF16,
                                 0) != 0);
    CHECK(strstr(zr_last_error(), "attention_forward_cuda") != NULL);
}

/* attention_backward_rope_cuda (zr_qkv_rope_sdpa's backward): dq and dk through the transpose of a
 * rope with arbitrary tables (not a rotation: a cos/sin entry taken from the wrong half of the pair
 * shows), against the host reference's gradients turned the same way. Dense, and on the Hopper
 * kernels dq, dk, dv written into one packed (B, T, Hq + 2 Hkv, Dh) gradient, poisoned first (NaN:
 * an element left unwritten fails). Split shapes (GQA on small grids: dk, dv from the f32
 * partials) and unsplit ones (MHA, and Hq/Hkv = 3, an odd group: dk turned in place). */
TEST(attention_backward_rope) {
    const int64_t shapes[][5] = {/* B, Hq, Hkv, T, Dh */
                                 {1, 8, 2, 57, 64}, {3, 4, 4, 200, 64}, {1, 3, 1, 130, 64},
                                 {3, 8, 2, 200, 64}, {1, 1, 1, 1, 64},  {2, 2, 1, 77, 128},
                                 {3, 8, 2, 200, 96}, {1, 3, 1, 130, 96}, {2, 4, 4, 77, 80},
                                 {2, 4, 1, 130, 256}};
    const int grids[2] = {0, 3};
    for (int mode = 0; mode < 3; ++mode) /* Hopper (default grid, 3 blocks), then mma.sync */
        for (auto &s : shapes)
            for (zr_dtype t : {ZR_BF16, ZR_F16}) {
                const int fallback = mode == 2;
                attn_sm90_force(fallback ? 0 : -1, fallback ? 0 : -1);
                attn_sm90_grid(fallback ? 0 : grids[mode], fallback ? 0 : grids[mode]);
                const int64_t B = s[0], Hq = s[1], Hkv = s[2], T = s[3], Dh = s[4], half = Dh / 2;
                const int64_t nq = B * Hq * T * Dh, nk = B * Hkv * T * Dh;
                if (Dh != 64 && Dh != 128 && Dh != 256 && (fallback || !attention_strided_ok(Dh, t))) continue;
                vec q = randv(nq, 1.5), k = randv(nk, 1.5), v = randv(nk), dO = randv(nq);
                vec cs = randv(T * Dh), sn = randv(T * Dh);
                dbuf q_(nq, t), k_(nk, t), v_(nk, t), do_(nq, t), o_(nq, t),
                    lse_(B * Hq * T, ZR_F32), dq_(nq, t), dk_(nk, t), dv_(nk, t), cs_(T * Dh, ZR_F32),
                    sn_(T * Dh, ZR_F32);
                q_.up(q), k_.up(k), v_.up(v), do_.up(dO), cs_.up(cs), sn_.up(sn);
                vec o, lse, dq, dk, dv;
                attn_ref(q, k, v, dO, B, Hq, Hkv, T, Dh, o, lse, dq, dk, dv);
                auto turn = [&](const vec &x) { /* rows (.., t, Dh): the rope's transpose */
                    vec y(x.size());
                    for (size_t r = 0; r < x.size() / Dh; ++r) {
                        const double *a = &x[r * Dh], *c = &cs[(r % T) * Dh], *sv = &sn[(r % T) * Dh];
                        for (int64_t i = 0; i < half; ++i) {
                            y[r * Dh + i] = a[i] * c[i] + a[i + half] * sv[i + half];
                            y[r * Dh + i + half] = a[i + half] * c[i + half] - a[i] * sv[i];
                        }
                    }
                    return y;
                };
                const vec rq = turn(dq), rk = turn(dk);
                char what[112];
                snprintf(what, sizeof what, "attention rope bwd%s %s B%lld Hq%lld Hkv%lld T%lld Dh%lld",
                         fallback ? " (mma.sync)" : mode ? " (3 blocks)" : "", tn(t), (long long)B,
                         (long long)Hq, (long long)Hkv, (long long)T, (long long)Dh);
                CHECK_OK(attention_forward_cuda(o_.p, lse_.f(), q_.p, k_.p, v_.p, NULL, B, Hq, Hkv,
                                                T, Dh, 0.f, t, 0));
                size_t wsb = attention_backward_workspace_size(B, Hq, Hkv, T, Dh);
                dbuf ws(wsb / 4 + 4, ZR_F32);
                CHECK_OK(attention_backward_rope_cuda(dq_.p, dk_.p, dv_.p, do_.p, q_.p, k_.p, v_.p,
                                                      o_.p, lse_.f(), ws.p, NULL, B, Hq, Hkv, T, Dh,
                                                      0.f, cs_.f(), sn_.f(), t, 0));
                const double bt = t == ZR_BF16 ? 2.5e-2 : 6e-3;
                double dvn = 0;
                for (double x : dv) dvn += x * x;
                dvn = 0.1 * std::sqrt(dvn);
                double e1 = relerr(dq_.down(), rq, dvn), e2 = relerr(dk_.down(), rk, dvn),
                       e3 = relerr(dv_.down(), dv, dvn);
                printf("  %s: dq %.2g dk %.2g dv %.2g\n", what, e1, e2, e3);
                CHECK_MSG(e1 <= bt && e2 <= bt && e3 <= bt, "%s: rel err dq %.3g dk %.3g dv %.3g > %.3g",
                          what, e1, e2, e3, bt);
                if (fallback || !attention_strided_ok(Dh, t)) continue;
                /* dq, dk, dv as head slices of one packed gradient */
                const int64_t Hf = Hq + 2 * Hkv;
                dbuf g_(B * T * Hf * Dh, t); /* poisoned */
                const zr_attn_strides sq = {Hq * T * Dh, T * Dh, Dh}, sk = {Hkv * T * Dh, T * Dh, Dh},
                                      sg = {T * Hf * Dh, Dh, Hf * Dh};
                const zr_attn_layout L = {sq, sk, sk, sq, sq, sg, sg, sg};
                char *gp = (char *)g_.p;
                CHECK_OK(attention_backward_rope_cuda(gp, gp + Hq * Dh * 2, gp + (Hq + Hkv) * Dh * 2,
                                                      do_.p, q_.p, k_.p, v_.p, o_.p, lse_.f(), ws.p,
                                                      &L, B, Hq, Hkv, T, Dh, 0.f, cs_.f(), sn_.f(),
                                                      t, 0));
                const vec g = g_.down();
                vec gq(nq), gk(nk), gv(nk);
                for (int64_t b = 0; b < B; ++b)
                    for (int64_t i = 0; i < T; ++i)
                        for (int64_t j = 0; j < Hf; ++j)
                            for (int64_t d = 0; d < Dh; ++d) {
                                const double x = g[((b * T + i) * Hf + j) * Dh + d];
                                if (j < Hq) gq[((b * Hq + j) * T + i) * Dh + d] = x;
                                else if (j < Hq + Hkv) gk[((b * Hkv + j - Hq) * T + i) * Dh + d] = x;
                                else gv[((b * Hkv + j - Hq - Hkv) * T + i) * Dh + d] = x;
                            }
                e1 = relerr(gq, rq, dvn), e2 = relerr(gk, rk, dvn), e3 = relerr(gv, dv, dvn);
                CHECK_MSG(e1 <= bt && e2 <= bt && e3 <= bt,
                          "%s packed: rel err dq %.3g dk %.3g dv %.3g > %.3g", what, e1, e2, e3, bt);
            }
    attn_sm90_force(-1, -1);
    attn_sm90_grid(0, 0);
    CHECK(attention_backward_rope_cuda(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                       NULL, 1, 2, 2, 8, 64, 0.f, NULL, NULL, ZR_BF16, 0) != 0);
    CHECK(strstr(zr_last_error(), "attention_backward_rope_cuda") != NULL);
}

/* The persistent forward with more work tiles than blocks: B1 Hq24 Hkv6 T650 is 144 query tiles of
 * 128, so the default grid (a block per SM, 132 on an H200) gives 12 blocks a second, lightest, tile
 * (in tiles of 192 queries: 96 tiles, the last of each head 74 rows, its third warpgroup idle; with
 * the tiles 64 rows before row 0, the first tile's first warpgroup idle instead). Under every grid,
 * both tile heights and both starts the output matches the host reference and has the same
 * bits as 128-query tiles with a block per tile (a row's arithmetic does not depend on the block
 * that runs it, on what it ran before, nor on the rows beside it). */
TEST(attention_forward_persistent) {
    const int64_t B = 1, Hq = 24, Hkv = 6, T = 650, Dh = 64;
    const int64_t nq = B * Hq * T * Dh, nk = B * Hkv * T * Dh;
    const int grids[4] = {-1, 0, 3, 7};
    for (zr_dtype t : {ZR_BF16, ZR_F16}) {
        vec q = randv(nq, 1.5), k = randv(nk, 1.5), v = randv(nk), dO = randv(nq);
        dbuf q_(nq, t), k_(nk, t), v_(nk, t);
        q_.up(q), k_.up(k), v_.up(v);
        vec o, lse, dq, dk, dv, o1, lse1;
        attn_ref(q, k, v, dO, B, Hq, Hkv, T, Dh, o, lse, dq, dk, dv);
        for (int gi = 0; gi < 12; ++gi) { /* each grid with 128-, 192-query tiles, then those before row 0 */
            attn_sm90_grid(grids[gi % 4], 0);
            attn_sm90_fwd_rows(gi < 4 ? 128 : 192);
            attn_sm90_fwd_tail(gi >= 8);
            dbuf o_(nq, t), lse_(B * Hq * T, ZR_F32);
            CHECK_OK(attention_forward_cuda(o_.p, lse_.f(), q_.p, k_.p, v_.p, NULL, B, Hq, Hkv, T,
                                            Dh, 0.f, t, 0));
            char what[96];
            snprintf(what, sizeof what, "attention forward, grid %d, %d-query tiles%s, %s B1 Hq24 Hkv6 T650",
                     grids[gi % 4], gi < 4 ? 128 : 192, gi >= 8 ? " before row 0" : "", tn(t));
            const vec og = o_.down(), lg = lse_.down();
            CHECK_CLOSE(og, o, tol_of(t), what);
            CHECK_CLOSE(lg, lse, 1e-5, what);
            if (gi == 0) o1 = og, lse1 = lg;
            else
                CHECK_MSG(og == o1 && lg == lse1,
                          "%s: not the bits of 128-query tiles, a block per tile", what);
        }
    }
    attn_sm90_grid(0, 0);
    attn_sm90_fwd_rows(0);
    attn_sm90_fwd_tail(1);
}

/* A row's running maximum that grows at the last key tile the forward takes: keys 0..15 made to
 * score high against every query (q = u + noise, k = 4u + noise there, u = 0.5 everywhere: ~11 in
 * log2 units above the other keys' ~1.6), and the forward takes key tiles from the diagonal back to
 * 0, so a query tile past the first meets them last: O and l, summed under a lower maximum, must be
 * rescaled (an online softmax that skips small rises of the maximum must still take this one). */
TEST(attention_forward_late_maximum) {
    const int64_t B = 1, Hq = 2, Hkv = 1, T = 600, Dh = 64;
    const int64_t nq = B * Hq * T * Dh, nk = B * Hkv * T * Dh;
    for (zr_dtype t : {ZR_BF16, ZR_F16}) {
        vec q = randv(nq), k = randv(nk), v = randv(nk), dO = randv(nq);
        for (auto &x : q) x += 0.5;
        for (int64_t j = 0; j < 16; ++j)
            for (int64_t d = 0; d < Dh; ++d) k[j * Dh + d] = 2.0 + 0.3 * k[j * Dh + d];
        dbuf q_(nq, t), k_(nk, t), v_(nk, t), o_(nq, t), lse_(B * Hq * T, ZR_F32);
        q_.up(q), k_.up(k), v_.up(v);
        vec o, lse, dq, dk, dv;
        attn_ref(q_.down(), k_.down(), v_.down(), dO, B, Hq, Hkv, T, Dh, o, lse, dq, dk, dv);
        CHECK_OK(attention_forward_cuda(o_.p, lse_.f(), q_.p, k_.p, v_.p, NULL, B, Hq, Hkv, T, Dh,
                                        0.f, t, 0));
        char what[96];
        snprintf(what, sizeof what, "attention forward, a late maximum, %s B1 Hq2 Hkv1 T600", tn(t));
        CHECK_CLOSE(o_.down(), o, tol_of(t), what);
        CHECK_CLOSE(lse_.down(), lse, 1e-5, what);
        if (attention_strided_ok(Dh, t))
            check_fwd_rows([&] {
                CHECK_OK(attention_forward_cuda(o_.p, lse_.f(), q_.p, k_.p, v_.p, NULL, B, Hq, Hkv,
                                                T, Dh, 0.f, t, 0));
            }, o_, lse_, what);
    }
}

/* Packed sequences (zr_attn_layout.seg): rows of several sequences, each query attending to its own
 * sequence's keys only, against the host reference with the same per-token bounds. On the Hopper
 * kernels (head_dim 64) q, k, v as head slices of one (B, T, Hq + 2 Hkv, Dh) buffer (Llama's fused
 * projection, the layout the models hand them), on the mma.sync kernels (head_dim 128, and 64 with
 * the Hopper ones switched off) contiguous with seg in a dense layout, as the op layer passes them.
 * Sequences of 1 token, of exactly a tile, crossing tiles and shorter than one, a row that is one
 * sequence; GQA (the backward split over the query group on small grids) and MHA (unsplit: the
 * Hopper dK/dV epilogue through shared memory); the Hopper grids of one block per SM, 3 blocks
 * and a block per tile. The call without seg on the same operands must differ (the masks do
 * something). */
TEST(attention_varlen) {
    CHECK(attention_varlen_ok(64, ZR_BF16) && attention_varlen_ok(128, ZR_F16) && attention_varlen_ok(256, ZR_BF16) &&
          !attention_varlen_ok(72, ZR_BF16) && !attention_varlen_ok(64, ZR_F32) && !attention_varlen_ok(192, ZR_BF16));
    /* a narrow head_dim (80, 96, 112) where the Hopper kernels read it, and nowhere else */
    CHECK(attention_varlen_ok(96, ZR_BF16) == attention_strided_ok(96, ZR_BF16));
    attn_sm90_force(0, 0);
    CHECK(!attention_varlen_ok(96, ZR_BF16));
    attn_sm90_force(-1, -1);
    /* each row's sequence lengths (summing to T) */
    const std::vector<std::vector<int>> rows_a = {{1, 5, 130, 127, 128, 64, 200, 45},
                                                  {700}};
    const std::vector<std::vector<int>> rows_b = {{300, 1, 1, 129, 269}};
    struct cfg { const std::vector<std::vector<int>> *rows; int64_t Hq, Hkv; };
    const cfg cases[3] = {{&rows_a, 8, 2}, {&rows_a, 4, 4}, {&rows_b, 6, 2}};
    /* modes: the Hopper kernels on grids 0, 3, -1 (head_dim 64; where they run); the mma.sync
     * kernels at head_dim 64, 128 and 256 */
    const int grids[3] = {0, 3, -1};
    for (const cfg &c : cases)
        for (int mode = 0; mode < 6; ++mode)
            for (zr_dtype t : {ZR_BF16, ZR_F16}) {
                const bool mma = mode >= 3;
                const int64_t Dh = mode == 5 ? 256 : mode == 4 ? 128 : 64;
                if (!mma && !attention_strided_ok(64, t)) continue;
                attn_sm90_force(mma ? 0 : -1, mma ? 0 : -1);
                attn_sm90_grid(mma ? 0 : grids[mode], mma ? 0 : grids[mode]);
                const int64_t B = (int64_t)c.rows->size(), Hq = c.Hq, Hkv = c.Hkv;
                int64_t T = 0;
                for (int n : (*c.rows)[0]) T += n;
                std::vector<int32_t> seg(2 * B * T);
                for (int64_t b = 0; b < B; ++b) {
                    int64_t at = 0;
                    for (int n : (*c.rows)[b]) {
                        for (int64_t i = at; i < at + n; ++i)
                            seg[b * T + i] = (int32_t)at, seg[B * T + b * T + i] = (int32_t)(at + n);
                        at += n;
                    }
                    CHECK(at == T);
                }
                const int64_t nq = B * Hq * T * Dh, nk = B * Hkv * T * Dh, Hf = Hq + 2 * Hkv;
                vec q = randv(nq, 1.5), k = randv(nk, 1.5), v = randv(nk), dO = randv(nq);
                roundv(q, t), roundv(k, t), roundv(v, t), roundv(dO, t); /* the operands the GPU reads */
                vec o, lse, dq, dk, dv;
                attn_ref(q, k, v, dO, B, Hq, Hkv, T, Dh, o, lse, dq, dk, dv, seg.data());
                fused_qkv fz(q, k, v, dO, B, Hq, Hkv, T, Dh);
                vec &f = fz.f, &dob = fz.dob;
                auto back = [&](const vec &x, int64_t H) { return fz.back(x, H); };
                int32_t *segd = nullptr;
                CU(cudaMalloc(&segd, seg.size() * 4));
                CU(cudaMemcpy(segd, seg.data(), seg.size() * 4, cudaMemcpyHostToDevice));
                dbuf f_(f.size(), t), o2(nq, t), do2(nq, t), dq2(nq, t), dk2(nk, t), dv2(nk, t),
                    lse2(B * Hq * T, ZR_F32);
                f_.up(f), do2.up(dob);
                const zr_attn_strides sf = {T * Hf * Dh, Dh, Hf * Dh},
                                      sq = {T * Hq * Dh, Dh, Hq * Dh},
                                      sk = {T * Hkv * Dh, Dh, Hkv * Dh};
                zr_attn_layout L = {sf, sf, sf, sq, sq, sq, sk, sk, segd};
                const char *fp = (const char *)f_.p;
                const void *qp = fp, *kp = fp + Hq * Dh * 2, *vp = fp + (Hq + Hkv) * Dh * 2;
                /* the mma.sync kernels: contiguous (B, H, T, Dh) operands, the layout dense */
                dbuf qc(nq, t), kc(nk, t), vc(nk, t), doc(nq, t);
                if (mma) {
                    qc.up(q), kc.up(k), vc.up(v), doc.up(dO);
                    const zr_attn_strides dq_ = {Hq * T * Dh, T * Dh, Dh}, dk_ = {Hkv * T * Dh, T * Dh, Dh};
                    L = {dq_, dk_, dk_, dq_, dq_, dq_, dk_, dk_, segd};
                    qp = qc.p, kp = kc.p, vp = vc.p;
                }
                auto out = [&](const vec &x, int64_t H) { return mma ? x : back(x, H); };
                char what[128], w2[160];
                snprintf(what, sizeof what, "attention varlen, %s %d, %s B%lld Hq%lld Hkv%lld T%lld Dh%lld",
                         mma ? "mma.sync" : "grid", mma ? 0 : grids[mode], tn(t), (long long)B,
                         (long long)Hq, (long long)Hkv, (long long)T, (long long)Dh);
                CHECK_OK(attention_forward_cuda(o2.p, lse2.f(), qp, kp, vp, &L, B, Hq, Hkv, T, Dh,
                                                0.f, t, 0));
                CHECK_CLOSE(out(o2.down(), Hq), o, tol_of(t), what);
                CHECK_CLOSE(lse2.down(), lse, 1e-5, what);
                if (!mma)
                    check_fwd_rows([&] {
                        CHECK_OK(attention_forward_cuda(o2.p, lse2.f(), qp, kp, vp, &L, B, Hq, Hkv,
                                                        T, Dh, 0.f, t, 0));
                    }, o2, lse2, what);
                size_t wsb = attention_backward_workspace_size(B, Hq, Hkv, T, Dh);
                dbuf ws(wsb / 4 + 4, ZR_F32);
                CHECK_OK(attention_backward_cuda(dq2.p, dk2.p, dv2.p, mma ? doc.p : do2.p, qp, kp, vp,
                                                 o2.p, lse2.f(), ws.p, &L, B, Hq, Hkv, T, Dh, 0.f, t,
                                                 0));
                const double bt = t == ZR_BF16 ? 2.5e-2 : 6e-3;
                double dvn = 0;
                for (double x : dv) dvn += x * x;
                dvn = 0.1 * std::sqrt(dvn);
                const double e1 = relerr(out(dq2.down(), Hq), dq, dvn),
                             e2 = relerr(out(dk2.down(), Hkv), dk, dvn);
                CHECK_MSG(e1 <= bt, "%s dq: rel err %.3g > %.3g", what, e1, bt);
                CHECK_MSG(e2 <= bt, "%s dk: rel err %.3g > %.3g", what, e2, bt);
                snprintf(w2, sizeof w2, "%s dv", what);
                CHECK_CLOSE(out(dv2.down(), Hkv), dv, bt, w2);
                printf("  %s: o %.2g dq %.2g dk %.2g dv %.2g\n", what,
                       relerr(out(o2.down(), Hq), o), e1, e2, relerr(out(dv2.down(), Hkv), dv));
                /* without seg: plain causal attention over the rows, which must not match */
                L.seg = nullptr;
                CHECK_OK(attention_forward_cuda(o2.p, lse2.f(), qp, kp, vp, &L, B, Hq, Hkv, T, Dh,
                                                0.f, t, 0));
                CHECK_MSG(relerr(out(o2.down(), Hq), o) > 0.1,
                          "%s: causal attention without seg gives the packed result", what);
                CU(cudaFree(segd));
            }
    attn_sm90_grid(0, 0);
    attn_sm90_force(-1, -1);
}

/* test_fused_kernels [PART]: every test, or those whose name contains PART */
int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
#define RUN_IF(name)                                                                               \
    if (!only || strstr(#name, only)) RUN(name)
    int dev = 0;
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, dev));
    printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
    RUN_IF(rmsnorm_forward_backward);
    RUN_IF(layernorm_forward_backward);
    RUN_IF(add_layernorm_forward);
    RUN_IF(rope_forward_backward);
    RUN_IF(swiglu_forward_backward);
    RUN_IF(cross_entropy_forward_backward);
    RUN_IF(softmax_forward_backward);
    RUN_IF(embedding_forward_backward);
    RUN_IF(adamw_step);
    RUN_IF(optim_step);
    RUN_IF(attention_forward_backward);
    RUN_IF(attention_forward_persistent);
    RUN_IF(attention_forward_late_maximum);
    RUN_IF(attention_backward_rope);
    RUN_IF(attention_varlen);
    if (only && test_n_pass + test_n_fail == 0) {
        fprintf(stderr, "test_fused_kernels: no test's name contains '%s'\n", only);
        return 2;
    }
    printf("%d passed, %d failed\n", test_n_pass, test_n_fail);
    return test_summary();
}
