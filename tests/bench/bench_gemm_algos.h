/* bench_gemm_algos, the host side: the GEMMs to measure (Llama-3.2-1B and GPT-2 124M products as
 * zrun's linear/conv1d/mlp_gelu issue them to gemm_ex_cuda), the command line and the FLOP-weighted
 * micro-batch mix. No CUDA here: `bench_gemm_algos --list` runs it on a machine without a GPU. */
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

enum { EPI_NONE, EPI_BIAS, EPI_GELU_AUX_BIAS, EPI_DGELU };
static const char *const epi_names[] = {"none", "bias", "gelu_aux_bias", "dgelu"};

// One product in zr_gemm_desc's terms: C (m, n) row-major = op(A) op(B) with A (m, k) (stored (k, m)
// when ta) and B (k, n) (stored (n, k) when tb); bf16 A and B, f32 compute; C bf16, or f32 (dW into
// the fp32 gradient, beta 1). count: how many a micro-batch runs (layers).
struct Prod {
    std::string set, name, pass;
    int64_t m, n, k, lda, ldb, ldc, ld_aux;
    int ta, tb, c_f32, epi, count;
    float beta;
    double flops() const { return 2.0 * (double)m * (double)n * (double)k; }
};

enum { DW_F32_ACC, DW_BF16_NEW }; // dW into the fp32 gradient with beta 1, or a new bf16 tensor

// fwd, dX and dW of y (M, out) = x (M, in) · wᵀ as runtime/ops/matmul.c issues them: linear's w is
// (out, in) (in_out 0), conv1d's (in, out) (in_out 1); both are read in place through the
// transposition flags (operand_prepare/gemm_layout), so the flags and leading dimensions differ.
static Prod mk(const char *set, const char *name, const char *pass, int64_t m, int64_t n, int64_t k, int ta,
              int tb, int64_t lda, int64_t ldb, int64_t ldc, int count) {
    Prod p;
    p.set = set, p.name = name, p.pass = pass, p.m = m, p.n = n, p.k = k, p.ta = ta, p.tb = tb;
    p.lda = lda, p.ldb = ldb, p.ldc = ldc, p.ld_aux = 0, p.c_f32 = 0, p.epi = EPI_NONE, p.count = count;
    p.beta = 0;
    return p;
}

// fwd, dX and dW of y (M, out) = x (M, in) · wᵀ as runtime/ops/matmul.c issues them: linear's w is
// (out, in) (in_out 0), conv1d's (in, out) (in_out 1); both are read in place through the
// transposition flags (operand_prepare/gemm_layout), so the flags and leading dimensions differ.
// An epilogue with an aux matrix (GELU's pre-activation) has it (M, n) contiguous.
static void add_linear(std::vector<Prod> &v, const char *set, const char *name, int64_t M, int64_t in,
                       int64_t out, int count, int in_out, int fwd_epi, int dx_epi, int dw_kind) {
    // fwd: y (M, out) = x (M, in) · wᵀ; wᵀ is w's transposed view (linear) or w itself (conv1d)
    Prod f = mk(set, name, "fwd", M, out, in, 0, in_out ? 0 : 1, in, in_out ? out : in, out, count);
    // dX (M, in) = g (M, out) · wv (out, in); wv is w (linear) or conv1d's transposed view
    Prod x = mk(set, name, "dX", M, in, out, 0, in_out ? 1 : 0, out, in_out ? out : in, in, count);
    // dW: linear (out, in) = gᵀ · x; conv1d (in, out) = xᵀ · g; k = M tokens
    Prod w = in_out ? mk(set, name, "dW", in, out, M, 1, 0, in, out, out, count)
                    : mk(set, name, "dW", out, in, M, 1, 0, out, in, in, count);
    f.epi = fwd_epi, x.epi = dx_epi;
    if (f.epi == EPI_GELU_AUX_BIAS) f.ld_aux = f.n;
    if (x.epi == EPI_DGELU) x.ld_aux = x.n;
    w.c_f32 = dw_kind == DW_F32_ACC, w.beta = dw_kind == DW_F32_ACC ? 1.0f : 0.0f;
    v.push_back(f), v.push_back(x), v.push_back(w);
}

// The sets: Llama-3.2-1B (hidden 2048, q/k/v fused to 2048 + 2·512, gate/up fused to 2·8192, tied
// head over 128256, no biases, 16 layers) at one micro-batch of 4x512 and of 4x2048 (= 16x512)
// tokens; GPT-2 124M (768, Conv1D weights (in, out) with biases, c_fc's GELU and c_proj's dGELU in
// the epilogues (zr.mlp_gelu), the head on the padded 50304-row copy of wte: bias epilogue, and a dW
// into that copy's new bf16 gradient, 12 layers) at llm.c's 64x1024 tokens.
static std::vector<Prod> all_products() {
    std::vector<Prod> v;
    const char *ll[2] = {"llama2k", "llama8k"};
    for (int s = 0; s < 2; s++) {
        int64_t M = s ? 8192 : 2048;
        add_linear(v, ll[s], "q/k/v", M, 2048, 3072, 16, 0, EPI_NONE, EPI_NONE, DW_F32_ACC);
        add_linear(v, ll[s], "o", M, 2048, 2048, 16, 0, EPI_NONE, EPI_NONE, DW_F32_ACC);
        add_linear(v, ll[s], "gate/up", M, 2048, 16384, 16, 0, EPI_NONE, EPI_NONE, DW_F32_ACC);
        add_linear(v, ll[s], "down", M, 8192, 2048, 16, 0, EPI_NONE, EPI_NONE, DW_F32_ACC);
        add_linear(v, ll[s], "lm_head", M, 2048, 128256, 1, 0, EPI_NONE, EPI_NONE, DW_F32_ACC);
    }
    const int64_t M = 65536;
    add_linear(v, "gpt2", "c_attn", M, 768, 2304, 12, 1, EPI_BIAS, EPI_NONE, DW_F32_ACC);
    add_linear(v, "gpt2", "attn_proj", M, 768, 768, 12, 1, EPI_BIAS, EPI_NONE, DW_F32_ACC);
    add_linear(v, "gpt2", "c_fc", M, 768, 3072, 12, 1, EPI_GELU_AUX_BIAS, EPI_NONE, DW_F32_ACC);
    add_linear(v, "gpt2", "c_proj", M, 3072, 768, 12, 1, EPI_BIAS, EPI_DGELU, DW_F32_ACC);
    add_linear(v, "gpt2", "lm_head", M, 768, 50304, 1, 0, EPI_BIAS, EPI_NONE, DW_BF16_NEW);
    return v;
}

struct Opts {
    std::vector<std::string> sets{"llama2k"}, only, passes;
    int top = 8, enum_cap = 0, list = 0;
    double secs = 1.0, heat = 3.0, reheat = 0.5, idle_ms = 200;
    size_t ws_mb = 32; // blas_plan.c's WORKSPACE
};

static const char *usage =
    "usage: bench_gemm_algos [--set llama2k,llama8k,gpt2] [--only NAME,..] [--pass fwd,dX,dW]\n"
    "  [--top N (1-64, default 8)] [--enum CAP (0-1000, default 0: off)] [--secs S (sustained seconds\n"
    "  per candidate, both rounds, default 1)] [--heat S (default 3)] [--reheat S (default 0.5)]\n"
    "  [--idle MS (idle before the short timings, default 200)] [--ws MB (default 32)] [--list]\n";

static std::vector<std::string> split_list(const char *s) {
    std::vector<std::string> out;
    std::string cur;
    for (const char *p = s;; p++) {
        if (*p == ',' || !*p) {
            if (!cur.empty()) out.push_back(cur);
            cur.clear();
            if (!*p) break;
        } else
            cur += *p;
    }
    return out;
}

static int contains(const std::vector<std::string> &v, const std::string &s) {
    for (const std::string &x : v)
        if (x == s) return 1;
    return 0;
}

static int parse_num(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end = NULL;
    double x = s ? strtod(s, &end) : 0;
    if (!s || end == s || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "bench_gemm_algos: %s needs a number from %g to %g, got '%s'\n", opt, lo, hi,
                s ? s : "");
        return -1;
    }
    *out = x;
    return 0;
}

// Fills o from argv; returns 0, 1 for --help (usage printed), -1 after a one-line error.
static int parse_opts(int argc, char **argv, Opts *o) {
    std::vector<Prod> all = all_products();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 1;
        } else if (!strcmp(a, "--list")) {
            o->list = 1;
            continue;
        } else if (!strcmp(a, "--set") || !strcmp(a, "--only") || !strcmp(a, "--pass")) {
            if (!v) {
                fprintf(stderr, "bench_gemm_algos: %s needs a comma-separated list\n", a);
                return -1;
            }
            std::vector<std::string> l = split_list(v);
            for (const std::string &s : l) {
                int ok = 0;
                for (const Prod &p : all)
                    ok |= (a[2] == 's' ? p.set : a[2] == 'o' ? p.name : p.pass) == s;
                if (!ok || l.empty()) {
                    fprintf(stderr, "bench_gemm_algos: %s: no %s '%s' (--list shows them)\n", a, a + 2,
                            s.c_str());
                    return -1;
                }
            }
            (a[2] == 's' ? o->sets : a[2] == 'o' ? o->only : o->passes) = l;
        } else if (!strcmp(a, "--top")) {
            if (parse_num(a, v, 1, 64, &x)) return -1;
            o->top = (int)x;
        } else if (!strcmp(a, "--enum")) {
            if (parse_num(a, v, 0, 1000, &x)) return -1;
            o->enum_cap = (int)x;
        } else if (!strcmp(a, "--secs")) {
            if (parse_num(a, v, 0.01, 60, &o->secs)) return -1;
        } else if (!strcmp(a, "--heat")) {
            if (parse_num(a, v, 0, 60, &o->heat)) return -1;
        } else if (!strcmp(a, "--reheat")) {
            if (parse_num(a, v, 0, 60, &o->reheat)) return -1;
        } else if (!strcmp(a, "--idle")) {
            if (parse_num(a, v, 0, 10000, &o->idle_ms)) return -1;
        } else if (!strcmp(a, "--ws")) {
            if (parse_num(a, v, 0, 4096, &x)) return -1;
            o->ws_mb = (size_t)x;
        } else {
            fprintf(stderr, "bench_gemm_algos: unknown option '%s' (--help lists them)\n", a);
            return -1;
        }
        i++; // the option's value
    }
    return 0;
}

// The products the options select, in table order (sets in the order given).
static std::vector<Prod> selected(const Opts &o) {
    std::vector<Prod> all = all_products(), out;
    for (const std::string &s : o.sets)
        for (const Prod &p : all)
            if (p.set == s && (o.only.empty() || contains(o.only, p.name)) &&
                (o.passes.empty() || contains(o.passes, p.pass)))
                out.push_back(p);
    return out;
}

// The set's micro-batch GEMM time (ms) at the rates tf[i] (TFLOP/s) of ps[i], count-weighted.
// Products with no rate (tf <= 0) are left out; *covered gets how many were counted.
static double mix_ms(const std::vector<Prod> &ps, const std::vector<double> &tf, const std::string &set,
                     double *tflop, int *covered) {
    double ms = 0, fl = 0;
    int c = 0;
    for (size_t i = 0; i < ps.size(); i++)
        if (ps[i].set == set && tf[i] > 0) {
            ms += ps[i].count * ps[i].flops() / (tf[i] * 1e12) * 1e3;
            fl += ps[i].count * ps[i].flops();
            c++;
        }
    if (tflop) *tflop = fl / 1e12;
    if (covered) *covered = c;
    return ms;
}

// Seconds the run will take, roughly: heat per set, then per product the idle pause, the reheat,
// each candidate's sustained time (the enumeration's only when --enum is on) and the head-to-head
// rerun of three of them (the enumeration's checks and screen, up to ~6 s a product, are not counted).
static double estimate_s(const Opts &o, size_t nprod) {
    return o.heat * (double)o.sets.size() +
           (double)nprod * (o.reheat + o.idle_ms / 1e3 + (o.top + o.enum_cap + 3) * (o.secs + 0.01));
}

static void print_list(const Opts &o, const std::vector<Prod> &ps) {
    printf("%-8s %-10s %-4s %6s %6s %6s %2s %2s %6s %6s %6s %-4s %4s %-13s %5s %9s\n", "set", "product",
           "pass", "m", "n", "k", "ta", "tb", "lda", "ldb", "ldc", "C", "beta", "epilogue", "count",
           "GFLOP");
    for (const Prod &p : ps)
        printf("%-8s %-10s %-4s %6lld %6lld %6lld %2d %2d %6lld %6lld %6lld %-4s %4.0f %-13s %5d %9.1f\n",
               p.set.c_str(), p.name.c_str(), p.pass.c_str(), (long long)p.m, (long long)p.n,
               (long long)p.k, p.ta, p.tb, (long long)p.lda, (long long)p.ldb, (long long)p.ldc,
               p.c_f32 ? "f32" : "bf16", p.beta, epi_names[p.epi], p.count, p.flops() / 1e9);
    for (const std::string &s : o.sets) {
        double tflop = 0;
        int c = 0;
        mix_ms(ps, std::vector<double>(ps.size(), 1.0), s, &tflop, &c);
        printf("%s: %d products, %.2f TFLOP per micro-batch\n", s.c_str(), c, tflop);
    }
    printf("estimated run time: %.0f s\n", estimate_s(o, ps.size()));
}
