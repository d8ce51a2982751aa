/* The cuBLASLt state behind gemm_cuda (see blas_plan.h): per device a handle and a workspace, per
 * (device, shape, dtypes, flags, pointer alignment) a plan in a small hash table, the autotuning
 * of large shapes; the kernels that build and run a plan are kernels/cuda/matmul.cu. Our own
 * Hopper GEMMs (kernels/cuda/gemm_sm90.h) can join the autotuning (ZRUN_GEMM_SM90=auto) or replace
 * cuBLASLt wherever they take a product (=pingpong, =wide); by default they are not used: on the
 * H200 they win some products timed alone but lose 1% end to end under the power cap
 * (tests/bench/RESULTS.md, session 16). */
#ifdef ZR_HAVE_CUDA
#include "cuda/blas_plan.h"

#include <cublasLt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/device.h" /* the caching allocator for the workspace */
#include "kernels/cuda/gemm_sm90.h"

#define WORKSPACE ((size_t)32 << 20)
#define MAX_DEV 16
#define CACHE 4096 /* padded rows of many lengths make many shapes */
#define PROBE 8
#define TUNE_ALGOS 8

typedef struct {
    int ready;
    cublasLtHandle_t h;
    void *ws;
} dev_ctx;

typedef struct {
    int dev, ta, tb, abdt, cdt, has_bias, al_a, al_b, al_c, epilogue, al_aux;
    int64_t m, n, k, lda, ldb, ldc, sa, sb, sc, batch, ld_aux;
} key;

typedef struct {
    int used;
    int own; /* 0: cuBLASLt; else OWN_KERNELS[own - 1] (faster than every cuBLASLt candidate) */
    int ncand; /* ncand > 0: to be autotuned over cand at its tune_after()-th use, unless its family is mixed */
    int uses;  /* runs while ncand > 0 */
    key k;
    zr_gemm_plan plan;
    cublasLtMatmulAlgo_t cand[TUNE_ALGOS];
} entry;

/* A family: the shapes that differ only in a token count (m or k, rounded up to FAMILY_ROUND), as a
 * padding-free batch of rows or packed sequences, or padded rows of many lengths, make one a micro-batch. A
 * family that has run more than one shape (mixed) is not autotuned: its shapes keep the heuristic's choice.
 * Tuning costs ~32 products, a wait for the GPU and the loading of each candidate's kernel on its first use
 * (cuBLASLt's kernels load lazily, ~6 ms each on the H100); with token counts that vary every micro-batch a
 * tuning falls due at every family's turn all through a run and each winner served only its own family. Measured
 * (session 63, H100, Llama-3.2-1B SFT): padded rows unpadded, 150 steps, 21.3 s with families tuned vs 18.9 s
 * without (steps 50-150: 62.6-75.2k vs 78.2-80.2k tokens/s); bfd-packed 60 steps 28.5 vs 28.3 s (65.0-65.2k vs 64.4-64.6k).
 * A family of one shape (a fixed-shape loop) is tuned at that shape's tune_after()-th run. */
#define FAMILIES 1024
#define FAMILY_ROUND 256
typedef struct {
    int used, mixed;
    int64_t m0, k0; /* the first shape's exact token dimensions */
    key k_round;
} family;

static dev_ctx ctxs[MAX_DEV];
static entry cache[CACHE];
static family fams[FAMILIES];
static pthread_mutex_t mtx = PTHREAD_MUTEX_INITIALIZER;

static zr_device cuda_dev(int i) {
    zr_device d;
    d.type = ZR_CUDA;
    d.index = (int8_t)i;
    return d;
}

static int align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && (a % al))
        al >>= 1;
    return al;
}

static uint64_t hash_key(const key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int64_t round_up(int64_t x, int64_t r) { return (x + r - 1) / r * r; }

/* The family of an exact key (its slot, found or taken; evicts the home slot when the probe finds
 * neither), marked mixed once it has run a second shape. */
static family *family_of(const key *k) {
    key f = *k;
    f.m = round_up(k->m, FAMILY_ROUND), f.k = round_up(k->k, FAMILY_ROUND);
    uint64_t h = hash_key(&f);
    family *slot = NULL;
    for (int p = 0; p < PROBE; p++) {
        family *x = &fams[(h + p) % FAMILIES];
        if (x->used && memcmp(&x->k_round, &f, sizeof f) == 0) {
            if (x->m0 != k->m || x->k0 != k->k) x->mixed = 1;
            return x;
        }
        if (!x->used && !slot) slot = x;
    }
    if (!slot) slot = &fams[h % FAMILIES];
    memset(slot, 0, sizeof *slot);
    slot->used = 1, slot->k_round = f, slot->m0 = k->m, slot->k0 = k->k;
    return slot;
}

static void destroy_entry(entry *e) {
    if (!e->used) return;
    gemm_plan_destroy_cuda(&e->plan);
    e->used = 0;
}

// Autotuning: the 8th time a shape of at least 1 GFLOP is run, unless shapes a token count apart have run
// beside it (a mixed family, see `family` above) (ZRUN_GEMM_AUTOTUNE=N: the N-th time;
// 1: at once; 0: never), the heuristic's top candidates run on the real operands into a scratch
// output and the fastest is kept from then on (cuBLASLt's first choice is often not the fastest for
// skinny shapes); until then the heuristic's first choice runs. Timing a shape costs ~32 of its
// products and a wait for the GPU: waiting for a shape to recur keeps that cost to shapes that pay it
// back (a fixed-shape loop tunes in its first step) and away from one-off shapes (padded rows of
// many lengths, where tuning every new shape at once was slower than the training).
// Our own Hopper GEMMs (gemm_sm90: ping-pong 128x128 tiles; gemm_sm90_wide: cooperative 128x256),
// by ZRUN_GEMM_SM90: unset or "0": never; "auto": more autotuning candidates where gemm_sm90_check
// takes the product; "pingpong" or "wide": that kernel wherever it takes the product, at any size
// and without timing (tests and benchmarks). ZRUN_GEMM_TUNE_LOG=1 prints each autotuned shape's
// times to stderr (the fastest candidate, and each of ours); unset or 0: nothing. Other values of
// either are refused when first read (the first plan built).
typedef int (*own_fn)(const zr_gemm_desc *, int, cudaStream_t);
static const own_fn OWN_KERNELS[] = {gemm_sm90, gemm_sm90_wide};
static const char *const OWN_NAMES[] = {"pingpong", "wide"};
#define N_OWN ((int)(sizeof OWN_KERNELS / sizeof OWN_KERNELS[0]))
enum { OWN_OFF = -1, OWN_AUTO = 0 };
/* ZRUN_GEMM_AUTOTUNE: 0 off, else the use that autotunes (default 8); -1 when the value is not one
 * (the default applies, and read_env refuses it). */
static int tune_env(void) {
    static int n = -2;
    if (n == -2) {
        const char *e = getenv("ZRUN_GEMM_AUTOTUNE");
        char *end = NULL;
        long v = e && *e ? strtol(e, &end, 10) : 8;
        n = (end && *end) || v < 0 || v > 1000000 ? -1 : (int)v;
    }
    return n;
}
static int tune_after(void) { return tune_env() < 0 ? 8 : tune_env(); }
static int autotune_on(void) { return tune_after() > 0; }
typedef struct {
    int own; /* OWN_OFF, OWN_AUTO or 1 + the index of the one kernel to use */
    int log; /* ZRUN_GEMM_TUNE_LOG */
} gemm_env;
static int read_env(gemm_env *out) {
    static int read;
    static gemm_env v;
    if (!read) {
        const char *e = getenv("ZRUN_GEMM_SM90");
        v.own = -2;
        if (!e || !*e || strcmp(e, "0") == 0) v.own = OWN_OFF;
        else if (strcmp(e, "auto") == 0) v.own = OWN_AUTO;
        for (int i = 0; v.own == -2 && i < N_OWN; i++)
            if (strcmp(e, OWN_NAMES[i]) == 0) v.own = 1 + i;
        if (v.own == -2)
            return zr_error("ZRUN_GEMM_SM90=%s: use 0 (cuBLASLt only, the default), auto (our Hopper GEMMs "
                            "where the autotuner finds them fastest), pingpong or wide (that kernel wherever "
                            "it takes the product)", e);
        if (v.own == OWN_AUTO && !autotune_on())
            return zr_error("ZRUN_GEMM_SM90=auto with ZRUN_GEMM_AUTOTUNE=0: ours join the autotuning, which "
                            "is off; unset ZRUN_GEMM_AUTOTUNE, or pick a kernel (pingpong, wide)");
        if (tune_env() < 0)
            return zr_error("ZRUN_GEMM_AUTOTUNE=%s: use 0 (no autotuning), 1 (tune each GEMM shape the first time "
                            "it runs) or N (the N-th time; default 8)", getenv("ZRUN_GEMM_AUTOTUNE"));
        const char *l = getenv("ZRUN_GEMM_TUNE_LOG");
        if (l && *l && strcmp(l, "0") != 0 && strcmp(l, "1") != 0)
            return zr_error("ZRUN_GEMM_TUNE_LOG=%s: use 1 (print each autotuned shape's times) or 0", l);
        v.log = l && strcmp(l, "1") == 0;
        read = 1;
    }
    *out = v;
    return 0;
}

// One timed candidate: a cuBLASLt algorithm, or (own > 0) OWN_KERNELS[own - 1]. 0 when it ran.
static int run_candidate(dev_ctx *c, entry *e, const cublasLtMatmulAlgo_t *algo, int own,
                         const zr_gemm_desc *g, void *cs, cudaStream_t stream) {
    if (own) {
        zr_gemm_desc o = *g;
        o.c = cs;
        return OWN_KERNELS[own - 1](&o, 0, stream);
    }
    float af = (float)g->alpha, bf = (float)g->beta;
    return cublasLtMatmul(c->h, e->plan.op, &af, g->b, e->plan.la, g->a, e->plan.lb, &bf, cs,
                          e->plan.lc, cs, e->plan.lc, algo, c->ws, WORKSPACE,
                          stream) == CUBLAS_STATUS_SUCCESS
               ? 0
               : -1;
}

// Median-free quick timing: one warm-up, then the best of 3 (ms); < 0 when the candidate fails.
static float time_algo(dev_ctx *c, entry *e, const cublasLtMatmulAlgo_t *algo, int own,
                       const zr_gemm_desc *g, void *cs, cudaStream_t stream) {
    float best = -1;
    cudaEvent_t t0, t1;
    if (cudaEventCreate(&t0) != cudaSuccess) return -1;
    if (cudaEventCreate(&t1) != cudaSuccess) {
        cudaEventDestroy(t0);
        return -1;
    }
    for (int r = 0; r < 4; r++) {
        cudaEventRecord(t0, stream);
        int rc = run_candidate(c, e, algo, own, g, cs, stream);
        cudaEventRecord(t1, stream);
        float ms = -1;
        if (rc || cudaEventSynchronize(t1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, t0, t1) != cudaSuccess) {
            best = -1;
            break;
        }
        if (r > 0 && (best < 0 || ms < best)) best = ms;
    }
    cudaGetLastError(); /* a failed candidate must not leave an error behind */
    zr_clear_error();
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    return best;
}

// Picks the fastest of the candidates for e (lock held); keeps e->plan.algo when anything fails.
static void autotune(dev_ctx *c, entry *e, const zr_gemm_desc *g, const gemm_env *env, int dev,
                     cudaStream_t stream) {
    const int nres = e->ncand;
    e->ncand = 0;
    size_t es = g->c_dtype == ZR_F64 ? 8 : g->c_dtype == ZR_F32 ? 4 : 2;
    size_t n = g->batch > 1 ? (size_t)(g->stride_c * (g->batch - 1) + g->ldc * g->m)
                            : (size_t)(g->ldc * g->m);
    void *cs = zr_cuda_malloc(cuda_dev(dev), n * es, stream);
    if (!cs) {
        zr_clear_error(); /* no scratch: the heuristic's first choice stays */
        return;
    }
    if (g->bias)
        cublasLtMatmulDescSetAttribute(e->plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                       sizeof g->bias);
    float best = -1;
    for (int i = 0; i < nres; i++) {
        float ms = time_algo(c, e, &e->cand[i], 0, g, cs, stream);
        if (ms >= 0 && (best < 0 || ms < best)) {
            best = ms;
            e->plan.algo = e->cand[i];
        }
    }
    float own[N_OWN];
    const int takes = env->own == OWN_AUTO && gemm_sm90_check(g) == 0;
    for (int i = 0; i < N_OWN; i++) {
        own[i] = takes ? time_algo(c, e, NULL, 1 + i, g, cs, stream) : -1;
        if (own[i] >= 0 && (best < 0 || own[i] < best)) best = own[i], e->own = 1 + i;
    }
    if (env->log) { /* once one of ours beats cuBLASLt's fastest candidate, that one's time is not kept */
        char ours[128] = "";
        for (int i = 0, n = 0; i < N_OWN && n < (int)sizeof ours; i++)
            n += snprintf(ours + n, sizeof ours - n, ", %s %.4f ms", OWN_NAMES[i], own[i]);
        fprintf(stderr, "gemm tune: m=%lld n=%lld k=%lld ta=%d tb=%d %s->%s%s%s%s: best %.4f ms (%s)%s%s\n",
                (long long)g->m, (long long)g->n, (long long)g->k, g->ta, g->tb, zr_dtype_name(g->ab_dtype),
                zr_dtype_name(g->c_dtype), g->beta != 0.0 ? " beta" : "", g->bias ? " bias" : "",
                g->epilogue == ZR_GEMM_EPI_GELU_AUX ? " gelu" : g->epilogue ? " dgelu" : "", best,
                e->own ? OWN_NAMES[e->own - 1] : "cuBLASLt", ours, takes ? "" : " (ours do not take it)");
    }
    zr_cuda_free(cuda_dev(dev), cs);
}

// Builds the plan for k and picks its algorithm (lock held). Returns 0 and fills e.
static int build(entry *e, const key *k, const zr_gemm_desc *g, dev_ctx *c, int dev,
                 cudaStream_t stream) {
    memset(e, 0, sizeof *e);
    if (gemm_plan_init_cuda(&e->plan, g, dev)) return -1;
    cublasStatus_t s;
    cublasLtMatmulPreference_t pref;
    if ((s = cublasLtMatmulPreferenceCreate(&pref))) {
        gemm_plan_destroy_cuda(&e->plan);
        return gemm_lt_error_cuda(s, "preference", g, dev);
    }
    uint64_t wsb = WORKSPACE;
    uint32_t aa = (uint32_t)k->al_b, ab = (uint32_t)k->al_a, ac = (uint32_t)k->al_c;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                         sizeof wsb);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa,
                                         sizeof aa);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab,
                                         sizeof ab);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac,
                                         sizeof ac);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac,
                                         sizeof ac);
    cublasLtMatmulHeuristicResult_t res[TUNE_ALGOS];
    int nres = 0;
    double flops = 2.0 * (double)g->m * (double)g->n * (double)g->k * (double)g->batch;
    int want = autotune_on() && flops >= 1e9 ? TUNE_ALGOS : 1;
    s = cublasLtMatmulAlgoGetHeuristic(c->h, e->plan.op, e->plan.la, e->plan.lb, e->plan.lc,
                                       e->plan.lc, pref, want, res, &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || nres == 0) {
        gemm_plan_destroy_cuda(&e->plan);
        if (s == CUBLAS_STATUS_SUCCESS) s = CUBLAS_STATUS_NOT_SUPPORTED;
        return gemm_lt_error_cuda(
            s, "algorithm search (no cuBLASLt algorithm for these dtypes/layouts)", g, dev);
    }
    e->plan.algo = res[0].algo;
    gemm_env env = {OWN_OFF, 0};
    if (read_env(&env)) {
        gemm_plan_destroy_cuda(&e->plan);
        return -1;
    }
    if (env.own > 0 && gemm_sm90_check(g) == 0) e->own = env.own;
    else if (want > 1 && (nres > 1 || env.own == OWN_AUTO)) {
        for (int i = 0; i < nres; i++) e->cand[i] = res[i].algo;
        e->ncand = nres;
        if (tune_after() <= 1) autotune(c, e, g, &env, dev, stream);
    }
    zr_clear_error(); /* gemm_sm90_check's refusal is an answer, not a failure */
    e->k = *k;
    e->used = 1;
    return 0;
}

static int get_ctx(int dev, cudaStream_t stream, dev_ctx **out, const zr_gemm_desc *g) {
    if (dev < 0 || dev >= MAX_DEV) return zr_error("matmul (cuda): bad device %d", dev);
    dev_ctx *c = &ctxs[dev];
    if (!c->ready) {
        cublasStatus_t s = cublasLtCreate(&c->h);
        if (s != CUBLAS_STATUS_SUCCESS) return gemm_lt_error_cuda(s, "cublasLtCreate", g, dev);
        c->ws = zr_cuda_malloc(cuda_dev(dev), WORKSPACE, stream);
        if (!c->ws) {
            cublasLtDestroy(c->h);
            zr_error_prefix("matmul (cuda): workspace: ");
            return -1;
        }
        c->ready = 1;
    }
    *out = c;
    return 0;
}

int gemm_ex_cuda(const zr_gemm_desc *g, cudaStream_t stream) {
    int dev = 0;
    cudaGetDevice(&dev);
    if (g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 0)
        return zr_error("matmul (cuda): negative size m=%lld n=%lld k=%lld", (long long)g->m,
                        (long long)g->n, (long long)g->k);
    if (g->m == 0 || g->n == 0 || g->batch == 0) return 0;
    if (g->k == 0) return gemm_k0_cuda(g, stream);
    if (g->batch > 0x7fffffff)
        return zr_error("matmul (cuda): batch %lld is too large", (long long)g->batch);
    key k;
    memset(&k, 0, sizeof k);
    k.dev = dev, k.ta = !!g->ta, k.tb = !!g->tb, k.abdt = g->ab_dtype, k.cdt = g->c_dtype,
    k.has_bias = g->bias != NULL;
    k.epilogue = g->epilogue, k.al_aux = g->epilogue ? align_of(g->aux) : 0, k.ld_aux = g->ld_aux;
    k.al_a = align_of(g->a), k.al_b = align_of(g->b), k.al_c = align_of(g->c);
    k.m = g->m, k.n = g->n, k.k = g->k, k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc;
    k.batch = g->batch;
    if (g->batch > 1) k.sa = g->stride_a, k.sb = g->stride_b, k.sc = g->stride_c;
    pthread_mutex_lock(&mtx);
    dev_ctx *c = NULL;
    if (get_ctx(dev, stream, &c, g)) {
        pthread_mutex_unlock(&mtx);
        return -1;
    }
    uint64_t h = hash_key(&k);
    entry *e = NULL, *slot = NULL;
    for (int p = 0; p < PROBE && !e; p++) {
        entry *x = &cache[(h + p) % CACHE];
        if (x->used && memcmp(&x->k, &k, sizeof k) == 0)
            e = x;
        else if (!x->used && !slot)
            slot = x;
    }
    if (!e) {
        if (!slot) {
            slot = &cache[h % CACHE]; /* evict the home slot */
            destroy_entry(slot);
        }
        if (build(slot, &k, g, c, dev, stream)) {
            pthread_mutex_unlock(&mtx);
            return -1;
        }
        e = slot;
    }
    if (e->ncand) { /* not tuned yet: tuned at its turn, unless its family is mixed (the heuristic's choice stays) */
        if (family_of(&k)->mixed) {
            e->ncand = 0;
        } else if (++e->uses >= tune_after()) {
            gemm_env env = {OWN_OFF, 0};
            if (read_env(&env)) { /* read once already, when the entry was built */
                pthread_mutex_unlock(&mtx);
                return -1;
            }
            autotune(c, e, g, &env, dev, stream);
            zr_clear_error();
        }
    }
    int rc;
    if (e->own && gemm_sm90_check(g) == 0) { /* the key does not hold the bias's alignment */
        rc = OWN_KERNELS[e->own - 1](g, 0, stream);
    } else {
        if (e->own) zr_clear_error();
        rc = gemm_plan_run_cuda(c->h, &e->plan, g, c->ws, WORKSPACE, dev, stream);
    }
    pthread_mutex_unlock(&mtx);
    return rc;
}

int gemm_cuda(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const void *a,
              int64_t lda, const void *b, int64_t ldb, double beta, void *c, int64_t ldc,
              zr_dtype dt, cudaStream_t stream) {
    zr_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k, g.a = a, g.lda = lda, g.b = b, g.ldb = ldb,
    g.c = c, g.ldc = ldc;
    g.batch = 1, g.alpha = alpha, g.beta = beta, g.ab_dtype = dt, g.c_dtype = dt;
    return gemm_ex_cuda(&g, stream);
}

int linear_bias_grad_cuda(void *db, const void *g, int64_t rows, int64_t cols, zr_dtype dt,
                          cudaStream_t stream) {
    size_t n = sum_cols_workspace_size(rows, cols);
    int dev = 0;
    cudaGetDevice(&dev);
    void *ws = n ? zr_cuda_malloc(cuda_dev(dev), n, stream) : NULL;
    if (n && !ws) return -1;
    int rc = sum_cols_cuda(db, g, rows, cols, dt, ws, stream);
    if (ws) zr_cuda_free(cuda_dev(dev), ws);
    return rc;
}

int linear_forward_cuda(void *y, const void *x, const void *w, const void *bias, int64_t rows,
                        int64_t in, int64_t out, zr_dtype dt, cudaStream_t stream) {
    zr_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.ta = 0, g.tb = 1, g.m = rows, g.n = out, g.k = in;
    g.a = x, g.lda = in > 1 ? in : 1, g.b = w, g.ldb = in > 1 ? in : 1, g.c = y,
    g.ldc = out > 1 ? out : 1;
    g.batch = 1, g.bias = bias, g.alpha = 1, g.beta = 0, g.ab_dtype = dt, g.c_dtype = dt;
    return gemm_ex_cuda(&g, stream);
}

int linear_gelu_forward_cuda(void *y, void *pre, const void *x, const void *wt, int wt_trans,
                             int64_t ldwt, const void *bias, int64_t rows, int64_t in, int64_t out,
                             zr_dtype dt, cudaStream_t stream) {
    zr_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.ta = 0, g.tb = wt_trans, g.m = rows, g.n = out, g.k = in;
    g.a = x, g.lda = in, g.b = wt, g.ldb = ldwt, g.c = y, g.ldc = out;
    g.batch = 1, g.bias = bias, g.alpha = 1, g.beta = 0, g.ab_dtype = dt, g.c_dtype = dt;
    g.epilogue = ZR_GEMM_EPI_GELU_AUX, g.aux = pre, g.ld_aux = out;
    return gemm_ex_cuda(&g, stream);
}

int linear_dgelu_cuda(void *dpre, const void *g, const void *w, int w_trans, int64_t ldw,
                      const void *pre, int64_t rows, int64_t in, int64_t out, zr_dtype dt,
                      cudaStream_t stream) {
    zr_gemm_desc d;
    memset(&d, 0, sizeof d);
    d.ta = 0, d.tb = w_trans, d.m = rows, d.n = in, d.k = out;
    d.a = g, d.lda = out, d.b = w, d.ldb = ldw, d.c = dpre, d.ldc = in;
    d.batch = 1, d.alpha = 1, d.beta = 0, d.ab_dtype = dt, d.c_dtype = dt;
    d.epilogue = ZR_GEMM_EPI_DGELU, d.aux = (void *)pre, d.ld_aux = in;
    return gemm_ex_cuda(&d, stream);
}

int linear_backward_cuda(void *dx, void *dw, void *db, const void *g, const void *x, const void *w,
                         int64_t rows, int64_t in, int64_t out, int accumulate, zr_dtype dt,
                         cudaStream_t stream) {
    int64_t ldi = in > 1 ? in : 1, ldo = out > 1 ? out : 1;
    if (dx && gemm_cuda(0, 0, rows, in, out, 1.0, g, ldo, w, ldi, 0.0, dx, ldi, dt, stream))
        return -1;
    if (dw && gemm_cuda(1, 0, out, in, rows, 1.0, g, ldo, x, ldi, accumulate ? 1.0 : 0.0, dw, ldi,
                        dt, stream))
        return -1;
    if (db && linear_bias_grad_cuda(db, g, rows, out, dt, stream)) return -1;
    return 0;
}

void zr_matmul_cuda_release(void) {
    pthread_mutex_lock(&mtx);
    for (int i = 0; i < CACHE; i++)
        destroy_entry(&cache[i]);
    for (int d = 0; d < MAX_DEV; d++)
        if (ctxs[d].ready) {
            cublasLtDestroy(ctxs[d].h);
            zr_cuda_free(cuda_dev(d), ctxs[d].ws);
            ctxs[d].ready = 0;
        }
    pthread_mutex_unlock(&mtx);
}
#endif
