/* GPU test of kernels/cuda/gemm_sm90.cu (blocks alone and in clusters of 2, gemm_sm90_cluster; rings
 * of 4 and 6 stages, gemm_sm90_stages) and its cooperative twin gemm_sm90_wide.cu (blocks alone and
 * in clusters of 2, gemm_sm90_wide_cluster); every case runs for all six variants: every layout
 * (ta, tb) and epilogue (bf16, +bias, +bias+GELU with the pre-activation, f32 beta 0 and 1) against
 * a host double reference on every element at awkward sizes, grids of 1, 3 (clusters: 6) and 132
 * blocks giving identical bits, every variant the same bits as its kernel's default (blocks alone,
 * 4 stages), cuBLASLt on the same inputs, the ring's cluster-scope diagnostic giving the same bits,
 * the refusals (the setters' too); each variant's first large product early, its name printed
 * before the launch ("run: ..."); a 20 s watchdog per launch prints "hang in <case>" and exits,
 * and an alarm (120 s without a result) does the same wherever else the process blocks.
 * Build and run (H100/H200): make build/tests/test_gemm_sm90 && build/tests/test_gemm_sm90 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "../c/check.h"
#include "kernels/cuda/gemm_sm90.h"
#include "cu_check.h"
extern "C" {
#include "kernels/base/error.h"
#include "runtime/cuda/blas_plan.h"
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand() { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static double bf(double x) { return (double)__bfloat162float(__float2bfloat16_rn((float)x)); }
static uint16_t bfbits(double x) {
    __nv_bfloat16 b = __float2bfloat16_rn((float)x);
    uint16_t u;
    memcpy(&u, &b, 2);
    return u;
}
static double bfval(uint16_t u) { /* bf16 is f32's upper half */
    const uint32_t w = (uint32_t)u << 16;
    float f;
    memcpy(&f, &w, 4);
    return (double)f;
}
static double gelu(double z) { return 0.5 * z * (1.0 + tanh(0.7978845608028654 * (z + 0.044715 * z * z * z))); }

/* Waits for the stream; after 20 s prints "hang in <what>" and exits (a hung kernel dies with the
 * process). */
static void sync_or_die(const char *what) {
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
        cudaError_t e = cudaStreamQuery(0);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) {
            printf("CUDA error %s in %s\n", cudaGetErrorString(e), what);
            printf("%d passed, %d failed\n", test_n_pass, test_n_fail + 1);
            fflush(stdout);
            _exit(2);
        }
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) {
            printf("hang in %s\n", what);
            printf("%d passed, %d failed\n", test_n_pass, test_n_fail + 1);
            fflush(stdout);
            _exit(3);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
}

static char casebuf[256]; /* the case running (the watchdogs' and failures' name) */

/* The backstop watchdog: SIGALRM after 120 s without a result (a call that blocks outside
 * sync_or_die) prints "hang (no result in 120 s) in <case>" and exits. */
static void on_alarm(int) {
    printf("hang (no result in 120 s) in %s\n%d passed, %d failed\n", casebuf, test_n_pass, test_n_fail + 1);
    fflush(stdout);
    _exit(3);
}

static void result(const std::string &name) {
    alarm(120); /* re-armed: the next case has its own 120 s */
    if (test_failed_flag) {
        test_n_fail++;
        printf("FAIL %s: %s\n", name.c_str(), test_why);
    } else {
        test_n_pass++;
        printf("PASS %s\n", name.c_str());
    }
    fflush(stdout);
    test_failed_flag = 0;
}

/* One problem size: logical A (m, k), B (k, n) (bf16 values), bias (n), C0 (m, n) f32; the exact
 * product P and S = Σ|a||b| per element (the error scale), in double on all host cores. */
struct problem {
    int m, n, k;
    std::vector<double> A, B, bias, C0, P, S;
    problem(int m_, int n_, int k_) : m(m_), n(n_), k(k_) {
        A.resize((size_t)m * k), B.resize((size_t)k * n), bias.resize(n), C0.resize((size_t)m * n);
        for (auto &x : A) x = bf(urand());
        for (auto &x : B) x = bf(urand());
        for (auto &x : bias) x = bf(urand());
        for (auto &x : C0) x = (double)(float)(urand() * 4);
        P.assign((size_t)m * n, 0), S.assign((size_t)m * n, 0);
        const int nth = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
        std::vector<std::thread> th;
        for (int w = 0; w < nth; ++w)
            th.emplace_back([this, w, nth]() {
                std::vector<double> p(n), s(n);
                for (int i = w; i < m; i += nth) {
                    std::fill(p.begin(), p.end(), 0.0), std::fill(s.begin(), s.end(), 0.0);
                    for (int kk = 0; kk < k; ++kk) {
                        const double a = A[(size_t)i * k + kk], aa = fabs(a);
                        const double *b = &B[(size_t)kk * n];
                        for (int j = 0; j < n; ++j) p[j] += a * b[j], s[j] += aa * fabs(b[j]);
                    }
                    std::copy(p.begin(), p.end(), &P[(size_t)i * n]);
                    std::copy(s.begin(), s.end(), &S[(size_t)i * n]);
                }
            });
        for (auto &t : th) t.join();
    }
};

enum { E_NONE, E_BIAS, E_GELU, E_F32_B0, E_F32_B1, E_COUNT };
static const char *ename[E_COUNT] = {"bf16", "bias", "bias+gelu_aux", "f32_beta0", "f32_beta1"};

/* The implementations under test: every case runs for each, after gemm_sm90_cluster(cluster),
 * gemm_sm90_stages(stages) (the ping-pong kernel's) and gemm_sm90_wide_cluster(wcluster) (the wide
 * kernel's). grids: the grids whose bits must equal grid 0's (clusters of 2: grid 1 and 6 are one
 * and three clusters); same: -1, or the implementation whose bits it must equal (its kernel's
 * default, run before it). */
static const struct impl {
    const char *name;
    int (*fn)(const zr_gemm_desc *, int, cudaStream_t);
    int cluster, stages, wcluster, grids[3], same;
} impls[] = {{"gemm_sm90", gemm_sm90, 1, 4, 1, {1, 3, 132}, -1},
             {"gemm_sm90 cluster 2", gemm_sm90, 2, 4, 1, {1, 6, 132}, 0},
             {"gemm_sm90 stages 6", gemm_sm90, 1, 6, 1, {1, 3, 132}, 0},
             {"gemm_sm90 cluster 2 stages 6", gemm_sm90, 2, 6, 1, {1, 6, 132}, 0},
             {"gemm_sm90_wide", gemm_sm90_wide, 1, 4, 1, {1, 3, 132}, -1},
             {"gemm_sm90_wide cluster 2", gemm_sm90_wide, 1, 4, 2, {1, 6, 132}, 4}};
enum { N_IMPL = sizeof impls / sizeof impls[0] };

/* The variant's settings; a refusal is a failure of the case. */
static void use(const impl &im) {
    CHECK_MSG(gemm_sm90_cluster(im.cluster) == 0, "gemm_sm90_cluster(%d): %s", im.cluster, zr_last_error());
    CHECK_MSG(gemm_sm90_stages(im.stages) == 0, "gemm_sm90_stages(%d): %s", im.stages, zr_last_error());
    CHECK_MSG(gemm_sm90_wide_cluster(im.wcluster) == 0, "gemm_sm90_wide_cluster(%d): %s", im.wcluster,
              zr_last_error());
}
/* The defaults back: blocks alone, 4 stages. */
static void use_defaults() {
    gemm_sm90_cluster(1), gemm_sm90_stages(4), gemm_sm90_wide_cluster(1);
}

/* Device copies of one problem in one layout, and the outputs (rows padded by `pad` elements that
 * must stay untouched). */
struct run {
    const problem &P;
    int ta, tb, pad;
    int64_t lda, ldb, ldc;
    void *a = nullptr, *b = nullptr, *bias = nullptr, *c = nullptr, *aux = nullptr;
    run(const problem &p, int ta_, int tb_, int pad_) : P(p), ta(ta_), tb(tb_), pad(pad_) {
        lda = (ta ? p.m : p.k) + pad, ldb = (tb ? p.k : p.n) + pad, ldc = p.n + pad;
        std::vector<uint16_t> ha((size_t)lda * (ta ? p.k : p.m), 0), hb((size_t)ldb * (tb ? p.n : p.k), 0);
        for (int i = 0; i < p.m; ++i)
            for (int kk = 0; kk < p.k; ++kk)
                ha[ta ? (size_t)kk * lda + i : (size_t)i * lda + kk] = bfbits(p.A[(size_t)i * p.k + kk]);
        for (int kk = 0; kk < p.k; ++kk)
            for (int j = 0; j < p.n; ++j)
                hb[tb ? (size_t)j * ldb + kk : (size_t)kk * ldb + j] = bfbits(p.B[(size_t)kk * p.n + j]);
        std::vector<uint16_t> hbias(p.n);
        for (int j = 0; j < p.n; ++j) hbias[j] = bfbits(p.bias[j]);
        CU(cudaMalloc(&a, ha.size() * 2));
        CU(cudaMalloc(&b, hb.size() * 2));
        CU(cudaMalloc(&bias, hbias.size() * 2));
        CU(cudaMalloc(&c, (size_t)p.m * ldc * 4));
        CU(cudaMalloc(&aux, (size_t)p.m * ldc * 2));
        CU(cudaMemcpy(a, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(b, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(bias, hbias.data(), hbias.size() * 2, cudaMemcpyHostToDevice));
    }
    ~run() {
        cudaFree(a), cudaFree(b), cudaFree(bias), cudaFree(c), cudaFree(aux);
    }
    zr_gemm_desc desc(int e) const {
        zr_gemm_desc g;
        memset(&g, 0, sizeof g);
        g.ta = ta, g.tb = tb, g.m = P.m, g.n = P.n, g.k = P.k, g.a = a, g.lda = lda, g.b = b, g.ldb = ldb;
        g.c = c, g.ldc = ldc, g.batch = 1, g.alpha = 1, g.beta = e == E_F32_B1 ? 1 : 0;
        g.ab_dtype = ZR_BF16, g.c_dtype = e >= E_F32_B0 ? ZR_F32 : ZR_BF16;
        g.bias = e == E_BIAS || e == E_GELU ? bias : nullptr;
        g.epilogue = e == E_GELU ? ZR_GEMM_EPI_GELU_AUX : ZR_GEMM_EPI_NONE;
        g.aux = e == E_GELU ? aux : nullptr, g.ld_aux = e == E_GELU ? ldc : 0;
        return g;
    }
    /* Poisons c and aux (0xff bytes: NaN), or loads C0 into c for beta 1 (padding poisoned). */
    void prepare(int e) const {
        CU(cudaMemset(c, 0xff, (size_t)P.m * ldc * 4));
        CU(cudaMemset(aux, 0xff, (size_t)P.m * ldc * 2));
        if (e == E_F32_B1) {
            std::vector<float> h((size_t)P.m * ldc);
            memset(h.data(), 0xff, h.size() * 4);
            for (int i = 0; i < P.m; ++i)
                for (int j = 0; j < P.n; ++j) h[(size_t)i * ldc + j] = (float)P.C0[(size_t)i * P.n + j];
            CU(cudaMemcpy(c, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        }
    }
    /* The outputs' raw bytes: c (m rows of ldc, 2 or 4 bytes an element), then aux. */
    std::vector<uint8_t> bytes(int e) const {
        const size_t cb = (size_t)P.m * ldc * (e >= E_F32_B0 ? 4 : 2), ab = e == E_GELU ? (size_t)P.m * ldc * 2 : 0;
        std::vector<uint8_t> h(cb + ab);
        CU(cudaMemcpy(h.data(), c, cb, cudaMemcpyDeviceToHost));
        if (ab) CU(cudaMemcpy(h.data() + cb, aux, ab, cudaMemcpyDeviceToHost));
        return h;
    }
};

/* Element o (row-major over m rows of ldc) of raw output bytes h of epilogue e: c and, for the
 * GELU, aux. */
static void decode(const run &r, int e, const std::vector<uint8_t> &h, size_t o, double &c, double &aux) {
    uint16_t u;
    if (e >= E_F32_B0) {
        float f;
        memcpy(&f, &h[o * 4], 4);
        c = f;
        return;
    }
    memcpy(&u, &h[o * 2], 2);
    c = bfval(u);
    if (e == E_GELU) {
        memcpy(&u, &h[(size_t)r.P.m * r.ldc * 2 + o * 2], 2);
        aux = bfval(u);
    }
}

/* Checks raw output bytes h of epilogue e against the reference: every element within
 * rtol·|ref| + stol·S (+ the beta-1 term's own rounding), the padding columns untouched. With alt
 * (another implementation's bytes), h against alt instead, within twice that. A failure names the
 * count of wrong elements and the first (also printed, so that a later check of the case still
 * reports). Returns the worst error over tolerance. */
static double check_out(const run &r, int e, const std::vector<uint8_t> &h, const char *who,
                        const std::vector<uint8_t> *alt = nullptr) {
    const problem &P = r.P;
    const bool f32 = e >= E_F32_B0;
    const double rtol = f32 ? 1e-6 : 1.0 / 256, stol = 1e-4, scale = alt ? 2 : 1;
    double worst = 0;
    size_t bad = 0;
    char first[300] = "";
    auto expect = [&](bool ok, int i, int j, const char *what, double got, double ref, double tol) {
        if (ok) return;
        if (!bad++) snprintf(first, sizeof first, "%s (%d, %d) = %.7g, expected %.7g (tol %.3g)", what, i, j, got, ref, tol);
    };
    for (int i = 0; i < P.m; ++i)
        for (int j = 0; j < (int)r.ldc; ++j) {
            const size_t o = (size_t)i * r.ldc + j, q = (size_t)i * P.n + j;
            double got, gaux = 0, altc = 0, altaux = 0;
            decode(r, e, h, o, got, gaux);
            if (alt) decode(r, e, *alt, o, altc, altaux);
            if (j >= P.n) { /* padding: still the 0xff poison (NaN) */
                expect(std::isnan(got), i, j, "padding written: c", got, NAN, 0);
                if (e == E_GELU) expect(std::isnan(gaux), i, j, "padding written: aux", gaux, NAN, 0);
                continue;
            }
            double ref = P.P[q], s = P.S[q];
            if (e == E_BIAS || e == E_GELU) ref += P.bias[j], s += fabs(P.bias[j]);
            double tol = (rtol * fabs(ref) + stol * s + 1e-6) * scale;
            if (e == E_GELU) {
                const double want = alt ? altaux : ref;
                const double err = std::isfinite(gaux) ? fabs(gaux - want) : INFINITY;
                worst = std::max(worst, err / tol);
                expect(err <= tol, i, j, "aux", gaux, want, tol);
                ref = gelu(ref);
                tol = (rtol * fabs(ref) + 1.2 * stol * s + 1e-3 / 256) * scale;
            }
            if (e == E_F32_B1) ref += P.C0[q], tol += 1e-6 * fabs(P.C0[q]) * scale;
            const double want = alt ? altc : ref;
            const double err = std::isfinite(got) ? fabs(got - want) : INFINITY;
            worst = std::max(worst, err / tol);
            expect(err <= tol, i, j, "c", got, want, tol);
        }
    if (bad) {
        printf("  %s: %s: %zu of %lld elements wrong, first %s\n", casebuf, who, bad, (long long)P.m * r.ldc, first);
        CHECK_MSG(false, "%s: %zu of %lld elements wrong, first %s", who, bad, (long long)P.m * r.ldc, first);
    }
    return worst;
}

/* Every epilogue of one layout of one problem, for each implementation: ours (grid 0: as many
 * blocks or clusters as fit) against the host reference and, for clusters of 2, bit for bit
 * against blocks alone; with grids, its grids (1, 3 or 6, 132) against grid 0 bit for bit; with lt,
 * cuBLASLt (gemm_ex_cuda, run once an epilogue) against the reference and against ours. */
static void run_layout(const problem &P, int ta, int tb, int pad, bool grids, bool lt) {
    run r(P, ta, tb, pad);
    for (int e = 0; e < E_COUNT; ++e) {
        const zr_gemm_desc g = r.desc(e);
        std::vector<uint8_t> theirs; /* cuBLASLt's bytes, once it ran */
        std::vector<uint8_t> got[N_IMPL]; /* each implementation's grid-0 bytes, once it ran */
        bool lt_ran = false;
        for (int ii = 0; ii < N_IMPL; ++ii) {
            const impl &im = impls[ii];
            snprintf(casebuf, sizeof casebuf, "%s m%d n%d k%d ta%d tb%d pad%d %s", im.name, P.m, P.n, P.k, ta,
                     tb, pad, ename[e]);
            char ltnote[96] = "";
            use(im);
            r.prepare(e);
            int rc = im.fn(&g, 0, 0);
            CHECK_MSG(rc == 0, "%s refused: %s", im.name, zr_last_error());
            sync_or_die(casebuf);
            const std::vector<uint8_t> ours = r.bytes(e);
            const double w = rc == 0 ? check_out(r, e, ours, "ours") : 0;
            if (rc == 0) got[ii] = ours;
            if (rc == 0 && im.same >= 0 && !got[im.same].empty())
                CHECK_MSG(ours == got[im.same], "bits differ from %s's", impls[im.same].name);
            if (grids && rc == 0) {
                for (int grid : im.grids) {
                    char what[300];
                    snprintf(what, sizeof what, "%s grid %d", casebuf, grid);
                    r.prepare(e);
                    CHECK(im.fn(&g, grid, 0) == 0);
                    sync_or_die(what);
                    CHECK_MSG(r.bytes(e) == ours, "grid %d: bits differ from grid 0's", grid);
                }
            }
            if (lt && rc == 0 && !lt_ran) {
                lt_ran = true;
                r.prepare(e);
                const int lrc = gemm_ex_cuda(&g, 0);
                CHECK_MSG(lrc == 0, "cuBLASLt: %s", zr_last_error());
                char what[300];
                snprintf(what, sizeof what, "%s cublasLt", casebuf);
                sync_or_die(what);
                if (lrc == 0) {
                    theirs = r.bytes(e);
                    check_out(r, e, theirs, "cuBLASLt");
                }
            }
            if (!theirs.empty() && rc == 0) {
                check_out(r, e, ours, "ours against cuBLASLt", &theirs);
                size_t diff = 0;
                for (size_t i = 0; i < ours.size(); ++i) diff += ours[i] != theirs[i];
                snprintf(ltnote, sizeof ltnote, " +cuBLASLt (%zu of %zu bytes differ)", diff, ours.size());
            }
            char gnote[40] = "", snote[64] = "", name[500];
            if (grids) snprintf(gnote, sizeof gnote, " grids %d/%d/%d", im.grids[0], im.grids[1], im.grids[2]);
            if (im.same >= 0) snprintf(snote, sizeof snote, " (bits of %s)", impls[im.same].name);
            snprintf(name, sizeof name, "%s%s%s%s (worst err/tol %.3f)", casebuf, gnote, snote, ltnote, w);
            result(name);
        }
    }
    use_defaults();
}

/* The debug flags act in every implementation (clusters of 2 too): NO_STORE leaves the output
 * untouched; the wide kernel refuses SERIAL (it has no ping-pong), writing nothing, with a message
 * naming the flag; gemm_sm90_debug refuses unknown bits. Flags reset to 0 after. */
static void test_debug_flags(const run &r, const zr_gemm_desc &plain) {
    auto untouched = [&r]() {
        bool u = true;
        for (uint8_t x : r.bytes(E_NONE)) u &= x == 0xff;
        return u;
    };
    for (const impl &im : impls) {
        snprintf(casebuf, sizeof casebuf, "debug: %s with GEMM_SM90_DBG_NO_STORE writes nothing", im.name);
        CHECK(gemm_sm90_debug(GEMM_SM90_DBG_NO_STORE) == 0);
        use(im);
        r.prepare(E_NONE);
        const int rc = im.fn(&plain, 0, 0);
        sync_or_die(casebuf);
        CHECK_MSG(rc == 0, "%s: %s", im.name, zr_last_error());
        CHECK_MSG(untouched(), "output written");
        gemm_sm90_debug(0);
        use_defaults();
        result(casebuf);
    }
    snprintf(casebuf, sizeof casebuf, "debug: gemm_sm90_wide refuses GEMM_SM90_DBG_SERIAL");
    CHECK(gemm_sm90_debug(GEMM_SM90_DBG_SERIAL) == 0);
    r.prepare(E_NONE);
    zr_clear_error();
    const int rc = gemm_sm90_wide(&plain, 0, 0);
    sync_or_die(casebuf);
    const std::string msg = zr_last_error_message() ? zr_last_error_message() : "";
    CHECK_MSG(rc == -1 && msg.find("SERIAL") != std::string::npos, "rc %d, message '%s'", rc, msg.c_str());
    CHECK_MSG(untouched(), "output written");
    gemm_sm90_debug(0);
    result(casebuf);
    snprintf(casebuf, sizeof casebuf, "debug: gemm_sm90_debug refuses bit 64");
    CHECK(gemm_sm90_debug(64) == -1);
    result(casebuf);
}

/* Each variant's first large product, early and named before its launch ("run: <case>", flushed:
 * a fault or a hang then names it even before the PASS/FAIL line): 16 k blocks (the ring refilled
 * 2-4 times, the producer waiting on every stage's releases), more tiles than blocks (ping-pong
 * 13 x 33, wide 13 x 17: blocks run several, both warpgroups' turns carry over; 13 m tiles: a
 * cluster's last tile wholly past m), n past a tile by 8; the bench's forward (bias) and gradient
 * (f32 beta 1, A and B transposed) layouts; against the reference and its kernel's default bits. */
static void test_large_first() {
    problem P(1544, 4104, 1024);
    const struct {
        int ta, tb, e;
    } cases[] = {{0, 1, E_BIAS}, {1, 0, E_F32_B1}};
    for (const auto &c : cases) {
        run r(P, c.ta, c.tb, 0);
        const zr_gemm_desc g = r.desc(c.e);
        std::vector<uint8_t> got[N_IMPL];
        for (int ii = 0; ii < N_IMPL; ++ii) {
            const impl &im = impls[ii];
            snprintf(casebuf, sizeof casebuf, "large first: %s m%d n%d k%d ta%d tb%d %s", im.name, P.m, P.n, P.k,
                     c.ta, c.tb, ename[c.e]);
            printf("run: %s\n", casebuf);
            fflush(stdout);
            use(im);
            r.prepare(c.e);
            const int rc = im.fn(&g, 0, 0);
            CHECK_MSG(rc == 0, "%s refused: %s", im.name, zr_last_error());
            sync_or_die(casebuf);
            double w = 0;
            if (rc == 0) {
                got[ii] = r.bytes(c.e);
                w = check_out(r, c.e, got[ii], "ours");
                if (im.same >= 0 && !got[im.same].empty())
                    CHECK_MSG(got[ii] == got[im.same], "bits differ from %s's", impls[im.same].name);
            }
            use_defaults();
            char name[400];
            snprintf(name, sizeof name, "%s, %d blocks (worst err/tol %.3f)", casebuf, gemm_sm90_last_blocks(), w);
            result(name);
        }
    }
}

/* GEMM_SM90_DBG_CLUSTER_SCOPE (the ring's releases and waits at cluster scope) changes no bit: every
 * variant, with and without it, on a product of 16 k blocks (every stage refilled, the producers
 * waiting on releases), against the reference too. */
static void test_cluster_scope() {
    problem P(264, 392, 1024);
    run r(P, 0, 1, 0);
    const zr_gemm_desc g = r.desc(E_BIAS);
    for (const impl &im : impls) {
        snprintf(casebuf, sizeof casebuf, "debug: %s with GEMM_SM90_DBG_CLUSTER_SCOPE gives the same bits", im.name);
        std::vector<uint8_t> h[2];
        for (int f = 0; f < 2; ++f) {
            CHECK(gemm_sm90_debug(f ? GEMM_SM90_DBG_CLUSTER_SCOPE : 0) == 0);
            use(im);
            r.prepare(E_BIAS);
            const int rc = im.fn(&g, 0, 0);
            sync_or_die(casebuf);
            CHECK_MSG(rc == 0, "%s: %s", im.name, zr_last_error());
            h[f] = r.bytes(E_BIAS);
        }
        gemm_sm90_debug(0);
        use_defaults();
        check_out(r, E_BIAS, h[1], "with the flag");
        CHECK_MSG(h[0] == h[1], "bits differ with the flag");
        result(casebuf);
    }
}

/* Descriptors it must refuse, each with a message naming gemm_sm90 and the fallback (the shape
 * checks need no GPU: on a machine without one they run alone); on a GPU also gemm_sm90 itself,
 * which must write nothing. */
static void test_refusals(bool gpu) {
    problem P(64, 64, 64);
    run *r = gpu ? new run(P, 0, 1, 0) : nullptr;
    struct bad {
        const char *what;
        void (*edit)(zr_gemm_desc &, void *bias, void *aux);
    } cases[] = {
        {"m not a multiple of 8", [](zr_gemm_desc &g, void *, void *) { g.m = 60; }},
        {"n not a multiple of 8", [](zr_gemm_desc &g, void *, void *) { g.n = 63; }},
        {"k not a multiple of 8", [](zr_gemm_desc &g, void *, void *) { g.k = 20; }},
        {"k = 0", [](zr_gemm_desc &g, void *, void *) { g.k = 0; }},
        {"f16 inputs", [](zr_gemm_desc &g, void *, void *) { g.ab_dtype = ZR_F16; }},
        {"f32 inputs", [](zr_gemm_desc &g, void *, void *) { g.ab_dtype = ZR_F32; }},
        {"batch 2", [](zr_gemm_desc &g, void *, void *) { g.batch = 2; }},
        {"alpha 2", [](zr_gemm_desc &g, void *, void *) { g.alpha = 2; }},
        {"lda 68", [](zr_gemm_desc &g, void *, void *) { g.lda = 68; }},
        {"ldb below the row", [](zr_gemm_desc &g, void *, void *) { g.ldb = 56; }},
        {"ldc 66", [](zr_gemm_desc &g, void *, void *) { g.ldc = 66; }},
        {"a misaligned", [](zr_gemm_desc &g, void *, void *) { g.a = (const char *)g.a + 2; }},
        {"c misaligned", [](zr_gemm_desc &g, void *, void *) { g.c = (char *)g.c + 8; }},
        {"bf16 beta 1", [](zr_gemm_desc &g, void *, void *) { g.beta = 1; }},
        {"f32 beta 0.5", [](zr_gemm_desc &g, void *, void *) { g.c_dtype = ZR_F32, g.beta = 0.5; }},
        {"f32 with bias", [](zr_gemm_desc &g, void *bias, void *) { g.c_dtype = ZR_F32, g.bias = bias; }},
        {"f16 output", [](zr_gemm_desc &g, void *, void *) { g.c_dtype = ZR_F16; }},
        {"dGELU epilogue", [](zr_gemm_desc &g, void *, void *aux) { g.epilogue = ZR_GEMM_EPI_DGELU, g.aux = aux, g.ld_aux = 64; }},
        {"GELU without aux", [](zr_gemm_desc &g, void *, void *) { g.epilogue = ZR_GEMM_EPI_GELU_AUX; }},
        {"GELU ld_aux below n", [](zr_gemm_desc &g, void *, void *aux) { g.epilogue = ZR_GEMM_EPI_GELU_AUX, g.aux = aux, g.ld_aux = 56; }},
    };
    zr_gemm_desc plain;
    memset(&plain, 0, sizeof plain);
    if (r) {
        plain = r->desc(E_NONE);
    } else { /* aligned addresses never dereferenced: the checks only look at them */
        plain.m = plain.n = plain.k = 64, plain.lda = plain.ldb = plain.ldc = 64, plain.ta = 0, plain.tb = 1;
        plain.a = (void *)0x100000, plain.b = (void *)0x200000, plain.c = (void *)0x300000;
        plain.batch = 1, plain.alpha = 1, plain.ab_dtype = plain.c_dtype = ZR_BF16;
    }
    void *bias = r ? r->bias : (void *)0x400000, *aux = r ? r->aux : (void *)0x500000;
    for (auto &c : cases) {
        zr_gemm_desc g = plain;
        c.edit(g, bias, aux);
        snprintf(casebuf, sizeof casebuf, "refusal: %s", c.what);
        zr_clear_error();
        int rc = gemm_sm90_check(&g);
        const std::string msg = zr_last_error_message() ? zr_last_error_message() : "";
        CHECK_MSG(rc == -1, "gemm_sm90_check took it (rc %d)", rc);
        CHECK_MSG(msg.find("gemm_sm90") != std::string::npos && msg.find("cuBLASLt") != std::string::npos,
                  "message: '%s'", msg.c_str());
        for (const impl &im : impls) {
            if (!r) break;
            use(im);
            r->prepare(E_NONE);
            rc = im.fn(&g, 0, 0);
            sync_or_die(casebuf);
            CHECK_MSG(rc == -1, "%s took it (rc %d)", im.name, rc);
            bool untouched = true;
            for (uint8_t x : r->bytes(E_NONE)) untouched &= x == 0xff;
            CHECK_MSG(untouched, "%s: output written", im.name);
        }
        use_defaults();
        char name[600];
        snprintf(name, sizeof name, "%s (%s)", casebuf, msg.c_str());
        result(name);
    }
    /* the cluster switch: 1 and 2 only */
    for (int n : {0, 3, -1}) {
        snprintf(casebuf, sizeof casebuf, "refusal: gemm_sm90_cluster(%d)", n);
        zr_clear_error();
        const int rc = gemm_sm90_cluster(n);
        const std::string msg = zr_last_error_message() ? zr_last_error_message() : "";
        CHECK_MSG(rc == -1, "taken (rc %d)", rc);
        CHECK_MSG(msg.find("gemm_sm90_cluster") != std::string::npos, "message: '%s'", msg.c_str());
        char name[600];
        snprintf(name, sizeof name, "%s (%s)", casebuf, msg.c_str());
        result(name);
    }
    CHECK_MSG(gemm_sm90_cluster(2) == 0 && gemm_sm90_cluster(1) == 0, "1 or 2 refused: %s", zr_last_error());
    result("gemm_sm90_cluster(1) and (2) taken");
    /* the stage and wide-cluster switches: 4 and 6, 1 and 2 only */
    struct sw {
        const char *fn;
        int (*set)(int);
        int bad[3], good[2];
    } sws[] = {{"gemm_sm90_stages", gemm_sm90_stages, {5, 0, 8}, {6, 4}},
               {"gemm_sm90_wide_cluster", gemm_sm90_wide_cluster, {0, 3, -1}, {2, 1}}};
    for (const sw &w : sws) {
        for (int n : w.bad) {
            snprintf(casebuf, sizeof casebuf, "refusal: %s(%d)", w.fn, n);
            zr_clear_error();
            const int rc = w.set(n);
            const std::string msg = zr_last_error_message() ? zr_last_error_message() : "";
            CHECK_MSG(rc == -1, "taken (rc %d)", rc);
            CHECK_MSG(msg.find(w.fn) != std::string::npos, "message: '%s'", msg.c_str());
            char name[600];
            snprintf(name, sizeof name, "%s (%s)", casebuf, msg.c_str());
            result(name);
        }
        snprintf(casebuf, sizeof casebuf, "%s(%d) and (%d) taken", w.fn, w.good[0], w.good[1]);
        CHECK_MSG(w.set(w.good[0]) == 0 && w.set(w.good[1]) == 0, "refused: %s", zr_last_error());
        result(casebuf);
    }
    /* the unedited descriptor is taken (on a GPU): the refusals are not blanket */
    CHECK_MSG(gemm_sm90_check(&plain) == 0, "the plain descriptor refused: %s", zr_last_error());
    result("refusal: the plain descriptor is taken");
    if (r) test_debug_flags(*r, plain);
    delete r;
}

int main(void) {
    signal(SIGALRM, on_alarm); /* before result() first arms it */
    alarm(120);
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess || major != 9 ||
        minor != 0) {
        cudaGetLastError();
        test_refusals(false);
        printf("FAIL no compute capability 9.0 device (%d.%d): only the refusals ran\n", major, minor);
        printf("%d passed, %d failed\n", test_n_pass, test_n_fail + 1);
        return 1;
    }
    test_refusals(true);
    test_large_first();
    test_cluster_scope();
    /* sizes: one tile and one k block; boxes larger than the matrices; partial m, n tiles and a
     * partial k block; a long k; more tiles (17 x 9 = 153) than 132 blocks, so blocks run several
     * and both warpgroups' turns carry over; Llama-like k at small m. For the wide kernel's 128 x
     * 256 tiles: n past a 256 tile by 8 (264, 1032), 72 (328), 136 (136, 392), so B [k][n] loads
     * 1, 2, 3 of its four 64-wide boxes; m past a tile by 8 (136: warpgroup 1's rows all out);
     * 17 x 9 = 153 wide tiles (2056 x 2056), more than 132 blocks. Clusters of 2: m tiles odd
     * (1, 3, 9, 17: the last pair's second tile wholly past m) and even (2 partial, 4 whole), n's
     * last tile with its second 64 columns wholly past n (16, 136, 264, 392, 520, 1032); the wide
     * kernel's second 128 columns (rank 1's half) wholly past n (8, 16, 72, 264, 328, 520, 1032,
     * 2056) or partly (136, 392: B [k][n] box 2 in, box 3 past) */
    struct sz {
        int m, n, k, pad;
        bool grids, lt;
    } sizes[] = {
        {128, 128, 64, 0, true, true},   {8, 16, 8, 0, true, false},     {200, 136, 72, 8, true, true},
        {264, 392, 4096, 0, false, true}, {2056, 1032, 520, 16, true, true}, {136, 2048, 2048, 0, false, false},
        {1032, 264, 136, 0, true, false}, {136, 328, 264, 0, true, false}, {2056, 2056, 72, 0, true, false},
        {512, 520, 192, 0, true, false},
    };
    for (const sz &s : sizes) {
        problem P(s.m, s.n, s.k);
        for (int ta = 0; ta < 2; ++ta)
            for (int tb = 0; tb < 2; ++tb) run_layout(P, ta, tb, s.pad, s.grids, s.lt);
    }
    printf("%d passed, %d failed\n", test_n_pass, test_n_fail);
    return test_n_fail ? 1 : 0;
}
