/* Which cuBLASLt algorithm is fastest when the GPU is hot (the H200 at its 700 W cap lowers the SM
 * clock): per product (bench_gemm_algos.h) the heuristic's top N and, with --enum, enumerated
 * configurations, each timed short (blas_plan.c's autotuner: 1 warm-up + best of 3, after an idle
 * pause, i.e. at the boost clock) and sustained (back to back for --secs after the GPU is heated, in
 * two rounds of opposite order), with the SM clock, power and energy per FLOP from NVML where it is.
 * Build (where nvcc is): make build/bench/bench_gemm_algos; run: tests/bench/gemm_algos.sh. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "bench_gemm_algos.h"
#include "bench_gemm_algos_names.h" /* generated from cublasLt.h by the Makefile */

// CK(call): a failed CUDA or cuBLASLt call outside the candidates' own runs ends the program.
static void ck(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "bench_gemm_algos: %s: %s\n", what, cudaGetErrorString(e));
    exit(1);
}
static void ck(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "bench_gemm_algos: %s: %s\n", what, cublasGetStatusString(s));
    exit(1);
}
#define CK(x) ck((x), #x)

static double now_s() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* --- NVML through dlopen (no headers or link-time library needed; absent: no clock/power columns) */
struct Nvml {
    void *dev = NULL;
    int (*clock)(void *, int, unsigned *) = NULL;          // nvmlDeviceGetClockInfo, NVML_CLOCK_SM = 1
    int (*power)(void *, unsigned *) = NULL;               // nvmlDeviceGetPowerUsage (mW)
    int (*energy)(void *, unsigned long long *) = NULL;    // nvmlDeviceGetTotalEnergyConsumption (mJ)
    int (*limit)(void *, unsigned *) = NULL;               // nvmlDeviceGetEnforcedPowerLimit (mW)
} nvml;

static void nvml_open(int cuda_dev) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) lib = dlopen("libnvidia-ml.so", RTLD_NOW);
    int (*init)(void) = lib ? (int (*)(void))dlsym(lib, "nvmlInit_v2") : NULL;
    int (*by_bus)(const char *, void **) =
        lib ? (int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2") : NULL;
    char bus[32];
    if (!init || !by_bus || init() != 0 || cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_dev) != cudaSuccess ||
        by_bus(bus, &nvml.dev) != 0) {
        printf("NVML: not available (%s): no clock, power or energy columns\n", lib ? "no device" : dlerror());
        nvml.dev = NULL;
        return;
    }
    nvml.clock = (int (*)(void *, int, unsigned *))dlsym(lib, "nvmlDeviceGetClockInfo");
    nvml.power = (int (*)(void *, unsigned *))dlsym(lib, "nvmlDeviceGetPowerUsage");
    nvml.energy = (int (*)(void *, unsigned long long *))dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption");
    nvml.limit = (int (*)(void *, unsigned *))dlsym(lib, "nvmlDeviceGetEnforcedPowerLimit");
}

// Sums of the sampled SM clock (MHz) and power (W) over n samples, and the energy used (J).
struct Meter {
    double mhz = 0, w = 0, j = 0;
    int n = 0;
    void sample() {
        unsigned c = 0, p = 0;
        if (nvml.dev && nvml.clock && nvml.power && nvml.clock(nvml.dev, 1, &c) == 0 && nvml.power(nvml.dev, &p) == 0)
            mhz += c, w += p / 1e3, n++;
    }
};

// The board's energy counter (mJ); 0 when NVML or the counter is missing.
static unsigned long long energy_mj() {
    unsigned long long e = 0;
    if (!nvml.dev || !nvml.energy || nvml.energy(nvml.dev, &e) != 0) return 0;
    return e;
}

/* --- one product's cuBLASLt plan, as kernels/cuda/matmul.cu's gemm_plan_init_cuda builds it ------ */
struct Plan {
    const Prod *p = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL; // Lt's A = our B, its B = our A, its C = C
    void *a = NULL, *b = NULL, *c = NULL, *bias = NULL, *aux = NULL;
    float alpha = 1, beta = 0;
};

static __global__ void fill_bf16_kernel(__nv_bfloat16 *x, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
        x[i] = __float2bfloat16((float)(h >> 8) / 8388608.0f - 1.0f); // uniform [-1, 1)
    }
}

static void *alloc_random(size_t elems, size_t es, uint32_t seed) {
    void *p = NULL;
    if (cudaMalloc(&p, elems * es) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    if (es == 2)
        fill_bf16_kernel<<<1024, 256>>>((__nv_bfloat16 *)p, elems, seed);
    else
        CK(cudaMemset(p, 0, elems * es)); // the f32 gradient starts at zero and accumulates
    CK(cudaGetLastError());
    return p;
}

static void plan_free(Plan *q) {
    if (q->op) cublasLtMatmulDescDestroy(q->op);
    if (q->la) cublasLtMatrixLayoutDestroy(q->la);
    if (q->lb) cublasLtMatrixLayoutDestroy(q->lb);
    if (q->lc) cublasLtMatrixLayoutDestroy(q->lc);
    for (void *x : {q->a, q->b, q->c, q->bias, q->aux})
        if (x) cudaFree(x);
    *q = Plan();
}

// Builds q for p with random operands; returns 0, or -1 with a one-line note in *why.
static int plan_init(Plan *q, const Prod *p, std::string *why) {
    *q = Plan();
    q->p = p, q->beta = p->beta;
    cudaDataType_t ct = p->c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    q->a = alloc_random((size_t)(p->ta ? p->k : p->m) * p->lda, 2, 1);
    q->b = alloc_random((size_t)(p->tb ? p->n : p->k) * p->ldb, 2, 2);
    q->c = alloc_random((size_t)p->m * p->ldc, p->c_f32 ? 4 : 2, 3);
    if (p->epi != EPI_NONE && p->epi != EPI_DGELU) q->bias = alloc_random((size_t)p->n, 2, 4);
    if (p->epi == EPI_GELU_AUX_BIAS || p->epi == EPI_DGELU) q->aux = alloc_random((size_t)p->m * p->ld_aux, 2, 5);
    if (!q->a || !q->b || !q->c || (p->epi != EPI_NONE && p->epi != EPI_DGELU && !q->bias) ||
        (p->ld_aux && !q->aux)) {
        *why = "out of GPU memory for the operands";
        plan_free(q);
        return -1;
    }
    CK(cublasLtMatmulDescCreate(&q->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CK(cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (p->epi != EPI_NONE) {
        cublasLtEpilogue_t ep = p->epi == EPI_BIAS            ? CUBLASLT_EPILOGUE_BIAS
                                : p->epi == EPI_GELU_AUX_BIAS ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                              : CUBLASLT_EPILOGUE_DGELU;
        CK(cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
        if (q->bias) {
            CK(cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ct, sizeof ct));
            CK(cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &q->bias, sizeof q->bias));
        }
        if (q->aux) {
            CK(cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &p->ld_aux,
                                              sizeof p->ld_aux));
            CK(cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &q->aux,
                                              sizeof q->aux));
        }
    }
    CK(cublasLtMatrixLayoutCreate(&q->la, CUDA_R_16BF, p->tb ? p->k : p->n, p->tb ? p->n : p->k, p->ldb));
    CK(cublasLtMatrixLayoutCreate(&q->lb, CUDA_R_16BF, p->ta ? p->m : p->k, p->ta ? p->k : p->m, p->lda));
    CK(cublasLtMatrixLayoutCreate(&q->lc, ct, p->n, p->m, p->ldc));
    return 0;
}

/* --- candidates --------------------------------------------------------------------------------- */
struct Cfg {
    int32_t id = -1, splitk = 1;
    uint32_t tile = 0, stages = 0, red = 0, swz = 0, cust = 0;
    uint16_t inner = 0, cluster = 0;
    std::string key() const {
        char b[96];
        snprintf(b, sizeof b, "%d %d %u %u %u %u %u %u %u", id, splitk, tile, stages, red, swz, cust, inner, cluster);
        return b;
    }
};

static Cfg cfg_of(const cublasLtMatmulAlgo_t *a) {
    Cfg c;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &c.id, sizeof c.id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof c.tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof c.stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c.splitk, sizeof c.splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c.red, sizeof c.red, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swz, sizeof c.swz, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.cust, sizeof c.cust, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &c.inner, sizeof c.inner, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster, sizeof c.cluster, &w);
    return c;
}

static const char *name_of(const IdName *t, size_t n, unsigned id, char *buf) {
    for (size_t i = 0; i < n; i++)
        if (t[i].id == (int)id) return t[i].name;
    snprintf(buf, 16, "#%u", id);
    return buf;
}

// The configuration in full (the tables) or short (the summary lines: a<id> tile stages c<cluster>
// k<split-K> s<swizzle>).
static std::string cfg_str(const Cfg &c, int brief = 0) {
    char b1[16], b2[16], b3[16], s[160];
    const char *t = name_of(tile_names, sizeof tile_names / sizeof *tile_names, c.tile, b1);
    const char *st = name_of(stages_names, sizeof stages_names / sizeof *stages_names, c.stages, b2);
    const char *cl = name_of(cluster_names, sizeof cluster_names / sizeof *cluster_names, c.cluster, b3);
    if (brief)
        snprintf(s, sizeof s, "a%d %s %s c%s k%d s%u", c.id, t, st, cl, c.splitk, c.swz);
    else
        snprintf(s, sizeof s, "algo %2d tile %-8s stages %-8s cluster %-6s splitK %2d red %u swz %u cust %u", c.id,
                 t, st, cl, c.splitk, c.red, c.swz, c.cust);
    return s;
}

struct Cand {
    cublasLtMatmulAlgo_t algo;
    std::string src, note;     // "h3" (heuristic rank 3) or "e12" (enumerated); note: why skipped
    double short_ms = -1, tf = 0, tf_r[2] = {0, 0}, runs = 0, wall = 0;
    Meter m;
};

struct Ctx {
    cublasLtHandle_t h;
    void *ws;
    size_t ws_bytes;
    cudaStream_t st;
};

static cublasStatus_t run1(Ctx &x, Plan &q, const cublasLtMatmulAlgo_t *algo) {
    return cublasLtMatmul(x.h, q.op, &q.alpha, q.b, q.la, q.a, q.lb, &q.beta, q.c, q.lc, q.c, q.lc, algo, x.ws,
                          x.ws_bytes, x.st);
}

// The heuristic's top n with blas_plan.c's preferences (workspace, 256-byte alignment: cudaMalloc's).
static std::vector<Cand> heuristic(Ctx &x, Plan &q, int n) {
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = x.ws_bytes;
    uint32_t al = 256;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    for (cublasLtMatmulPreferenceAttributes_t at :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        CK(cublasLtMatmulPreferenceSetAttribute(pref, at, &al, sizeof al));
    std::vector<cublasLtMatmulHeuristicResult_t> res(n);
    int nres = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(x.h, q.op, q.la, q.lb, q.lc, q.lc, pref, n, res.data(), &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    std::vector<Cand> out;
    if (s != CUBLAS_STATUS_SUCCESS) nres = 0;
    for (int i = 0; i < nres; i++) {
        Cand c;
        c.algo = res[i].algo;
        c.src = "h" + std::to_string(i);
        out.push_back(c);
    }
    return out;
}

static double time_short(Ctx &x, Plan &q, struct Cand &c, int timed = 3);

// Configurations from AlgoGetIds x the caps (tiles, stages, split-K 1/2/4, swizzle) x a few cluster
// shapes that AlgoCheck accepts within the workspace, minus those in have; at most cap, spread evenly.
static std::vector<Cand> enumerate(Ctx &x, Plan &q, int cap, const std::vector<Cand> &have) {
    cudaDataType_t ct = q.p->c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    int ids[256], nid = 0;
    std::vector<Cand> valid;
    if (cublasLtMatmulAlgoGetIds(x.h, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, ct, ct, 256, ids,
                                 &nid) != CUBLAS_STATUS_SUCCESS)
        nid = 0;
    const uint16_t clusters[] = {0, 2, 3, 5, 4, 8, 6}; // auto, 1x1x1, 2x1x1, 1x2x1, 4x1x1, 1x4x1, 2x2x1
    // AlgoCheck budget: 40000 a product, shared among the ids, 4 shares for an id the heuristic
    // proposed (its neighbours are the likeliest winners); an id with more combinations than its
    // budget is sampled at random (the enum order puts the smallest tiles first).
    long checked = 0, limit = 40000;
    std::set<int> hids;
    std::set<std::string> seen;
    for (const Cand &c : have) seen.insert(cfg_of(&c.algo).key()), hids.insert(cfg_of(&c.algo).id);
    long shares = 0;
    for (int i = 0; i < nid; i++) shares += hids.count(ids[i]) ? 4 : 1;
    double t0 = now_s();
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < nid; i++) {
        cublasLtMatmulAlgo_t a;
        if (cublasLtMatmulAlgoInit(x.h, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, ct, ct, ids[i], &a))
            continue;
        size_t w = 0;
        std::vector<uint32_t> tiles(1, 0), stages(1, 0);
        if (!cublasLtMatmulAlgoCapGetAttribute(&a, CUBLASLT_ALGO_CAP_TILE_IDS, NULL, 0, &w) && w >= 4) {
            tiles.resize(w / 4);
            cublasLtMatmulAlgoCapGetAttribute(&a, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), tiles.size() * 4, &w);
        }
        if (!cublasLtMatmulAlgoCapGetAttribute(&a, CUBLASLT_ALGO_CAP_STAGES_IDS, NULL, 0, &w) && w >= 4) {
            stages.resize(w / 4);
            cublasLtMatmulAlgoCapGetAttribute(&a, CUBLASLT_ALGO_CAP_STAGES_IDS, stages.data(), stages.size() * 4, &w);
        }
        int32_t splitk_ok = 0;
        uint32_t red_mask = 0, swz_ok = 0;
        cublasLtMatmulAlgoCapGetAttribute(&a, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok, sizeof splitk_ok, &w);
        cublasLtMatmulAlgoCapGetAttribute(&a, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &red_mask, sizeof red_mask, &w);
        cublasLtMatmulAlgoCapGetAttribute(&a, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz_ok, sizeof swz_ok, &w);
        // split-K needs a reduction: in place where allowed, else in the compute type, else the output's
        uint32_t red = red_mask & 1 ? 1 : red_mask & 2 ? 2 : red_mask & 4 ? 4 : 0;
        const int32_t splits[] = {1, 2, 4};
        uint64_t nsk = splitk_ok && red ? 3 : 1, nsw = swz_ok ? 2 : 1, ncl = sizeof clusters / sizeof *clusters;
        uint64_t total = tiles.size() * stages.size() * ncl * nsk * nsw;
        uint64_t budget = (uint64_t)(limit * (hids.count(ids[i]) ? 4 : 1) / std::max(shares, 1L));
        uint64_t n = std::min(total, budget);
        for (uint64_t j = 0; j < n; j++) {
            uint64_t idx = j;
            if (total > budget) { // splitmix64
                uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
                z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull, z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
                idx = (z ^ (z >> 31)) % total;
            }
            uint32_t sw = (uint32_t)(idx % nsw);
            idx /= nsw;
            int32_t sk = splits[idx % nsk];
            idx /= nsk;
            uint16_t cl = clusters[idx % ncl];
            idx /= ncl;
            uint32_t sg = stages[idx % stages.size()], t = tiles[idx / stages.size()];
            uint32_t r = sk > 1 ? red : 0;
            checked++;
            cublasLtMatmulAlgo_t b = a;
            if (cublasLtMatmulAlgoConfigSetAttribute(&b, CUBLASLT_ALGO_CONFIG_TILE_ID, &t, sizeof t) ||
                cublasLtMatmulAlgoConfigSetAttribute(&b, CUBLASLT_ALGO_CONFIG_STAGES_ID, &sg, sizeof sg) ||
                cublasLtMatmulAlgoConfigSetAttribute(&b, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl, sizeof cl) ||
                cublasLtMatmulAlgoConfigSetAttribute(&b, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk) ||
                cublasLtMatmulAlgoConfigSetAttribute(&b, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &r, sizeof r) ||
                cublasLtMatmulAlgoConfigSetAttribute(&b, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &sw, sizeof sw))
                continue;
            cublasLtMatmulHeuristicResult_t res;
            if (cublasLtMatmulAlgoCheck(x.h, q.op, q.la, q.lb, q.lc, q.lc, &b, &res) ||
                res.workspaceSize > x.ws_bytes)
                continue;
            if (!seen.insert(cfg_of(&b).key()).second) continue;
            Cand k;
            k.algo = b;
            valid.push_back(k);
        }
    }
    double t_check = now_s() - t0;
    // screen: at most 16 x cap of them (spread evenly) within 5 s, one timed run each; the cap
    // fastest stay.
    // This only drops the hopeless (8x8 tiles, needless split-K); the ranking is the sustained one.
    size_t ns = std::min(valid.size(), (size_t)cap * 16);
    std::vector<Cand> scr;
    double t1 = now_s();
    for (size_t i = 0; i < ns; i++) {
        if (now_s() - t1 > 5) { // a slow configuration can take 100 ms a run on the big products
            ns = i;
            break;
        }
        Cand c = valid[i * valid.size() / ns];
        if ((c.short_ms = time_short(x, q, c, 1)) >= 0) scr.push_back(c);
    }
    std::stable_sort(scr.begin(), scr.end(), [](const Cand &a, const Cand &b) { return a.short_ms < b.short_ms; });
    if (scr.size() > (size_t)cap) scr.resize(cap);
    for (size_t i = 0; i < scr.size(); i++) scr[i].src = "e" + std::to_string(i), scr[i].short_ms = -1;
    printf("  enumeration: %d algorithm ids, %ld configurations checked in %.1f s, %zu valid and new, %zu screened "
           "(one run each), the %zu fastest timed\n",
           nid, checked, t_check, valid.size(), ns, scr.size());
    return scr;
}

/* --- timing ------------------------------------------------------------------------------------- */
// blas_plan.c's time_algo: one warm-up, then the best of `timed` (3) event-timed runs (ms); < 0 on
// failure, with c.note saying why.
static double time_short(Ctx &x, Plan &q, Cand &c, int timed) {
    cudaEvent_t t0, t1;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    double best = -1;
    for (int r = 0; r <= timed; r++) {
        CK(cudaEventRecord(t0, x.st));
        cublasStatus_t s = run1(x, q, &c.algo);
        CK(cudaEventRecord(t1, x.st));
        float ms = -1;
        if (s != CUBLAS_STATUS_SUCCESS) {
            c.note = std::string("cublasLtMatmul: ") + cublasGetStatusString(s);
            best = -1;
            break;
        }
        cudaError_t e = cudaEventSynchronize(t1);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, t0, t1);
        if (e != cudaSuccess) {
            c.note = std::string("run: ") + cudaGetErrorString(e);
            best = -1;
            break;
        }
        if (r > 0 && (best < 0 || ms < best)) best = ms;
    }
    cudaGetLastError();
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    return best;
}

// Runs c back to back for secs: batches of ~4 ms, two in flight (no idle gap between them); adds
// the runs and the wall time to c and returns this stretch's TFLOP/s (< 0 on failure).
static double time_sustained(Ctx &x, Plan &q, Cand &c, double secs) {
    int per = (int)std::min(10000.0, std::max(1.0, 4.0 / std::max(c.short_ms, 1e-3)));
    cudaEvent_t ev[2];
    CK(cudaEventCreateWithFlags(&ev[0], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&ev[1], cudaEventDisableTiming));
    double t0 = now_s(), runs = 0;
    for (long i = 0;; i++) {
        for (int r = 0; r < per; r++) {
            cublasStatus_t s = run1(x, q, &c.algo);
            if (s != CUBLAS_STATUS_SUCCESS) {
                c.note = std::string("cublasLtMatmul (sustained): ") + cublasGetStatusString(s);
                cudaStreamSynchronize(x.st);
                cudaEventDestroy(ev[0]);
                cudaEventDestroy(ev[1]);
                return -1;
            }
        }
        CK(cudaEventRecord(ev[i & 1], x.st));
        runs += per;
        if (i > 0) CK(cudaEventSynchronize(ev[(i - 1) & 1]));
        c.m.sample();
        if (now_s() - t0 >= secs) break;
    }
    CK(cudaStreamSynchronize(x.st));
    double wall = now_s() - t0;
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    c.runs += runs, c.wall += wall;
    return q.p->flops() * runs / wall / 1e12;
}

/* --- a check that the plan computes the product the table says (layouts transcribed right) ---- */
static float bf16_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// count elements, element i at p + i * stride elements (bf16), to the host as floats
static std::vector<float> fetch_bf16(const void *p, int64_t count, int64_t stride) {
    std::vector<uint16_t> h(count);
    CK(cudaMemcpy2D(h.data(), 2, p, (size_t)stride * 2, 2, (size_t)count, cudaMemcpyDeviceToHost));
    std::vector<float> f(count);
    for (int64_t i = 0; i < count; i++) f[i] = bf16_f(h[i]);
    return f;
}

// Runs the heuristic's first choice once on a zeroed C and compares 8 sampled elements of C with a
// host product (double) of the same row of op(A) and column of op(B), through the epilogue (bias,
// tanh GELU, or the tanh GELU's derivative at aux). Returns the worst |error| / tolerance (<= 1: ok),
// or -1 when the algorithm does not run.
static double check_product(Ctx &x, Plan &q, const Cand &c0) {
    const Prod &p = *q.p;
    size_t es = p.c_f32 ? 4 : 2;
    CK(cudaMemset(q.c, 0, (size_t)p.m * p.ldc * es));
    Cand c = c0;
    if (run1(x, q, &c.algo) != CUBLAS_STATUS_SUCCESS) return -1;
    CK(cudaStreamSynchronize(x.st));
    const char *a = (const char *)q.a, *b = (const char *)q.b;
    double worst = 0;
    for (int s = 0; s < 8; s++) {
        int64_t i = (s * 7919 + 13) % p.m, j = (s * 104729 + 7) % p.n;
        // row i of op(A): A (m, k) row-major, or stored (k, m) when ta; column j of op(B) likewise
        std::vector<float> ar = p.ta ? fetch_bf16(a + 2 * i, p.k, p.lda) : fetch_bf16(a + 2 * i * p.lda, p.k, 1);
        std::vector<float> bc = p.tb ? fetch_bf16(b + 2 * j * p.ldb, p.k, 1) : fetch_bf16(b + 2 * j, p.k, p.ldb);
        double acc = 0, l1 = 0;
        for (int64_t t = 0; t < p.k; t++) acc += (double)ar[t] * bc[t], l1 += fabs((double)ar[t] * bc[t]);
        double ref = acc, k0 = 0.7978845608028654, k1 = 0.044715;
        if (q.bias) ref += fetch_bf16((const char *)q.bias + 2 * j, 1, 1)[0];
        if (p.epi == EPI_GELU_AUX_BIAS) ref = 0.5 * ref * (1 + tanh(k0 * (ref + k1 * ref * ref * ref)));
        if (p.epi == EPI_DGELU) {
            double z = fetch_bf16((const char *)q.aux + 2 * (i * p.ld_aux + j), 1, 1)[0];
            double t = tanh(k0 * (z + k1 * z * z * z));
            ref = acc * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k0 * (1 + 3 * k1 * z * z));
        }
        double got;
        if (p.c_f32) {
            float f;
            CK(cudaMemcpy(&f, (const char *)q.c + 4 * (i * p.ldc + j), 4, cudaMemcpyDeviceToHost));
            got = f;
        } else
            got = fetch_bf16((const char *)q.c + 2 * (i * p.ldc + j), 1, 1)[0];
        // bf16 output rounding (2^-8 relative), the f32 accumulation, the epilogue's arithmetic
        double tol = 1e-2 * fabs(ref) + 1e-4 * l1 + 1e-3;
        worst = std::max(worst, fabs(got - ref) / tol);
    }
    return worst;
}

/* --- one product -------------------------------------------------------------------------------- */
struct Result {
    double first = 0, pick = 0, best = 0;
};

static Result bench_product(Ctx &x, const Opts &o, const Prod &p) {
    Result r;
    printf("\n== %s %s %s: m %lld n %lld k %lld ta %d tb %d lda %lld ldb %lld ldc %lld, C %s beta %g, epilogue %s, "
           "%.1f GFLOP x %d\n",
           p.set.c_str(), p.name.c_str(), p.pass.c_str(), (long long)p.m, (long long)p.n, (long long)p.k, p.ta, p.tb,
           (long long)p.lda, (long long)p.ldb, (long long)p.ldc, p.c_f32 ? "f32" : "bf16", p.beta, epi_names[p.epi],
           p.flops() / 1e9, p.count);
    Plan q;
    std::string why;
    if (plan_init(&q, &p, &why)) {
        printf("  skipped: %s\n", why.c_str());
        return r;
    }
    std::vector<Cand> cs = heuristic(x, q, o.top);
    if (cs.empty()) {
        printf("  skipped: the heuristic has no algorithm for this product\n");
        plan_free(&q);
        return r;
    }
    double chk = check_product(x, q, cs[0]);
    if (chk > 1)
        printf("  CHECK FAILED: h0's result is off a host product by %.3g x the tolerance: this plan computes "
               "another product than the table says (layouts?); the timings below are of that product\n", chk);
    else if (chk < 0)
        printf("  check: not made (h0 does not run)\n");
    else
        printf("  check: h0 agrees with a host product at 8 elements (worst error %.2f x the tolerance)\n", chk);
    if (o.enum_cap > 0) {
        std::vector<Cand> e = enumerate(x, q, o.enum_cap, cs);
        cs.insert(cs.end(), e.begin(), e.end());
    }
    // short timings after an idle pause: the autotuner's view of a cool GPU at the boost clock
    CK(cudaDeviceSynchronize());
    usleep((useconds_t)(o.idle_ms * 1e3));
    Meter cool;
    for (Cand &c : cs) c.short_ms = time_short(x, q, c);
    cool.sample();
    int pick = -1; // blas_plan.c keeps the fastest short timing of the heuristic's first 8
    for (int i = 0; i < (int)cs.size() && i < 8 && cs[i].src[0] == 'h'; i++)
        if (cs[i].short_ms >= 0 && (pick < 0 || cs[i].short_ms < cs[pick].short_ms)) pick = i;
    if (cool.n) printf("  short timings after %.0f ms idle; at their end %.0f MHz, %.0f W\n", o.idle_ms, cool.mhz, cool.w);
    // reheat with the first working candidate, then two rounds of opposite order
    std::vector<int> ok;
    for (int i = 0; i < (int)cs.size(); i++)
        if (cs[i].short_ms >= 0) ok.push_back(i);
    if (!ok.empty() && o.reheat > 0) {
        Cand h = cs[ok[0]];
        time_sustained(x, q, h, o.reheat);
    }
    for (int round = 0; round < 2; round++)
        for (size_t j = 0; j < ok.size(); j++) {
            Cand &c = cs[ok[round ? ok.size() - 1 - j : j]];
            if (!c.note.empty()) continue;
            unsigned long long e0 = energy_mj();
            c.tf_r[round] = time_sustained(x, q, c, o.secs / 2);
            unsigned long long e1 = energy_mj();
            if (e0 && e1 >= e0) c.m.j += (double)(e1 - e0) / 1e3;
        }
    for (Cand &c : cs)
        if (c.note.empty() && c.wall > 0) c.tf = p.flops() * c.runs / c.wall / 1e12;
    std::vector<int> order(cs.size());
    for (size_t i = 0; i < cs.size(); i++) order[i] = (int)i;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return cs[a].tf > cs[b].tf; });
    printf("  %-4s %-3s %-80s %8s %7s %7s %7s %7s %6s %5s %7s\n", "src", "", "configuration", "short us", "shortTF",
           "sustTF", "round1", "round2", "MHz", "W", "pJ/FLOP");
    for (int i : order) {
        Cand &c = cs[i];
        std::string mark = std::string(i == 0 ? "F" : "") + (i == pick ? "P" : "") + (i == order[0] && c.tf > 0 ? "B" : "");
        if (!c.note.empty()) {
            printf("  %-4s %-3s %-80s skipped: %s\n", c.src.c_str(), "", cfg_str(cfg_of(&c.algo)).c_str(), c.note.c_str());
            continue;
        }
        printf("  %-4s %-3s %-80s %8.1f %7.0f %7.0f %7.0f %7.0f", c.src.c_str(), mark.c_str(),
               cfg_str(cfg_of(&c.algo)).c_str(), c.short_ms * 1e3, p.flops() / (c.short_ms * 1e-3) / 1e12, c.tf,
               c.tf_r[0], c.tf_r[1]);
        if (c.m.n)
            printf(" %6.0f %5.0f %7.3f", c.m.mhz / c.m.n, c.m.w / c.m.n,
                   c.m.j > 0 ? c.m.j / (p.flops() * c.runs) * 1e12 : 0.0);
        printf("\n");
    }
    // The best of many noisy rates is biased up (the winner's curse): F, P and B run again head to
    // head, fresh (F P B, then B P F), and those rates are the summary's.
    std::vector<int> trio;
    for (int i : {0, pick, order[0]})
        if (i >= 0 && cs[i].tf > 0 && std::find(trio.begin(), trio.end(), i) == trio.end()) trio.push_back(i);
    std::vector<Cand> again;
    for (int i : trio) {
        Cand c;
        c.algo = cs[i].algo, c.short_ms = cs[i].short_ms;
        again.push_back(c);
    }
    for (int round = 0; round < 2 && trio.size() > 1; round++)
        for (size_t j = 0; j < again.size(); j++) {
            Cand &c = again[round ? again.size() - 1 - j : j];
            if (c.note.empty()) time_sustained(x, q, c, o.secs / 2);
        }
    auto confirmed = [&](int i) {
        size_t j = std::find(trio.begin(), trio.end(), i) - trio.begin();
        if (j == trio.size()) return 0.0;
        if (trio.size() == 1) return cs[i].tf;
        return again[j].note.empty() && again[j].wall > 0 ? p.flops() * again[j].runs / again[j].wall / 1e12 : 0.0;
    };
    r.first = confirmed(0), r.pick = pick >= 0 ? confirmed(pick) : 0, r.best = confirmed(order[0]);
    if (trio.size() > 1)
        printf("  head to head again (%.2f s each): F %.0f, P %.0f, B %.0f TFLOP/s\n", o.secs, r.first, r.pick,
               r.best);
    printf("summary: %-7s %-9s %-3s F %4.0f P %4.0f (%-3s) B %4.0f (%-3s %s) B/F %.3f P/F %.3f%s\n",
           p.set.c_str(), p.name.c_str(), p.pass.c_str(), r.first, r.pick, pick >= 0 ? cs[pick].src.c_str() : "-",
           r.best, cs[order[0]].src.c_str(), cfg_str(cfg_of(&cs[order[0]].algo), 1).c_str(),
           r.first > 0 ? r.best / r.first : 0, r.first > 0 ? r.pick / r.first : 0, chk > 1 ? " CHECK FAILED" : "");
    plan_free(&q);
    return r;
}

// The GPU at its sustained state: a big square product for secs, reported like a candidate.
static void heat(Ctx &x, double secs, const std::string &set) {
    if (secs <= 0) return;
    Prod p = mk("heat", "8192^3", "fwd", 8192, 8192, 8192, 0, 1, 8192, 8192, 8192, 1);
    Plan q;
    std::string why;
    if (plan_init(&q, &p, &why)) {
        printf("heat: skipped (%s)\n", why.c_str());
        return;
    }
    std::vector<Cand> cs = heuristic(x, q, 1);
    if (!cs.empty() && (cs[0].short_ms = time_short(x, q, cs[0])) >= 0) {
        double tf = time_sustained(x, q, cs[0], secs);
        printf("heat: %s, %.1f s of 8192^3 at %.0f TFLOP/s", set.c_str(), cs[0].wall, tf);
        if (cs[0].m.n) printf(", %.0f MHz, %.0f W", cs[0].m.mhz / cs[0].m.n, cs[0].m.w / cs[0].m.n);
        printf("\n");
    }
    plan_free(&q);
}

int main(int argc, char **argv) {
    Opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    std::vector<Prod> ps = selected(o);
    if (o.list) {
        print_list(o, ps);
        return 0;
    }
    if (ps.empty()) {
        fprintf(stderr, "bench_gemm_algos: no product matches --set/--only/--pass (--list shows them)\n");
        return 2;
    }
    int dev = 0, ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "bench_gemm_algos: no CUDA device (run it on the GPU machine; --list works anywhere)\n");
        return 1;
    }
    CK(cudaSetDevice(dev));
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, dev));
    Ctx x;
    CK(cublasLtCreate(&x.h));
    x.ws_bytes = o.ws_mb << 20;
    x.ws = NULL;
    if (x.ws_bytes) CK(cudaMalloc(&x.ws, x.ws_bytes));
    CK(cudaStreamCreate(&x.st));
    nvml_open(dev);
    printf("device: %s, cuBLASLt %zu, workspace %zu MB, top %d, enum %d, %.2f s sustained per candidate, heat %.1f s, "
           "estimated %.0f s", pr.name, cublasLtGetVersion(), o.ws_mb, o.top, o.enum_cap, o.secs, o.heat,
           estimate_s(o, ps.size()));
    unsigned lim = 0;
    if (nvml.dev && nvml.limit && nvml.limit(nvml.dev, &lim) == 0) printf(", power limit %.0f W", lim / 1e3);
    printf("\n");
    std::vector<double> tf_first(ps.size(), 0), tf_pick(ps.size(), 0), tf_best(ps.size(), 0);
    std::string last;
    for (size_t i = 0; i < ps.size(); i++) {
        if (ps[i].set != last) heat(x, o.heat, ps[i].set), last = ps[i].set;
        Result r = bench_product(x, o, ps[i]);
        tf_first[i] = r.first, tf_pick[i] = r.pick, tf_best[i] = r.best;
    }
    printf("\n== micro-batch mix (count-weighted GEMM time at the sustained rates; products measured in all three)\n");
    for (const std::string &s : o.sets) {
        std::vector<double> f = tf_first, pk = tf_pick, b = tf_best;
        for (size_t i = 0; i < ps.size(); i++)
            if (!(f[i] > 0 && pk[i] > 0 && b[i] > 0)) f[i] = pk[i] = b[i] = 0;
        double tflop = 0;
        int n = 0;
        double mf = mix_ms(ps, f, s, &tflop, &n), mp = mix_ms(ps, pk, s, NULL, NULL), mb = mix_ms(ps, b, s, NULL, NULL);
        if (!n) continue;
        printf("mix: %s (%d products, %.2f TFLOP): first %.2f ms (%.0f TFLOP/s), autotuner %.2f ms (%.0f), sustained best "
               "%.2f ms (%.0f): best saves %.2f ms (%.1f%%) against first, %.2f ms (%.1f%%) against the autotuner\n",
               s.c_str(), n, tflop, mf, tflop / mf * 1e3, mp, tflop / mp * 1e3, mb, tflop / mb * 1e3, mf - mb,
               100 * (mf - mb) / mf, mp - mb, 100 * (mp - mb) / mp);
    }
    cublasLtDestroy(x.h);
    return 0;
}
