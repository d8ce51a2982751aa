/* CPU kernels for ZeRO optimizer offload (see offload.h): sum of squares, fused AdamW with the
 * gradient scale and a 16-bit weight output (streamed past the caches), accumulate/overwrite
 * (into f32, or into a 16-bit gradient partition), fill and cast, over one flat fp32 partition.
 * Each kernel splits [0, n) into one contiguous chunk per OpenMP thread and runs a plain loop on it; those loops are cloned for x86-64-v4 (AVX-512) and the build's baseline,
 * picked at load time, and need -fno-math-errno (Makefile) for a vector sqrt. fp32 only: the f64
 * build of kernels/cpu (ZR_REAL_F64) compiles nothing from this file. Lion, Adagrad and SGD
 * (optim_step_cpu) and Lamb (lamb_sums_cpu, lamb_apply_cpu) are plain per-element loops over
 * partition segments: the CPU references of kernels/cuda/optim.cu's optim_step_cuda and
 * lamb_*_cuda, used for CPU runs and optimizer offload alike. */
#include "offload.h"

#ifndef ZR_REAL_F64

#include <math.h>
#include <omp.h>
#include <string.h>
#include <stdint.h>
#if defined(__F16C__) || defined(__x86_64__)
#include <immintrin.h>
#endif

#define PAR_N 65536      /* below this, threads cost more than they save */
#define MAX_THREADS 1024 /* per-thread partial sums live on the stack */

/* (not under ThreadSanitizer: the clones' ifunc resolvers run, instrumented, before it starts) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define CLONES
#endif

/* This thread's chunk [lo, hi) of [0, n): equal parts, cut at multiples of 16 elements (64 B). */
static void chunk_of(int64_t n, int64_t *lo, int64_t *hi) {
    int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t b = ((n + T - 1) / T + 15) & ~(int64_t)15;
    *lo = t * b < n ? t * b : n;
    *hi = *lo + b < n ? *lo + b : n;
}

static inline uint16_t bf16_rne(float f) { /* zr_f32_to_bf16, written as a select */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

/* --- sum of squares --- */

CLONES static double sumsq_chunk(const float *restrict x, int64_t n) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

/* bf16/f16: widened a block at a time (as AdamW reads them), then the f32 loop. */
static void widen_bf16(float *restrict d, const uint16_t *restrict s, int64_t n);
static void widen_f16(float *restrict d, const uint16_t *restrict s, int64_t n);
static double sumsq_any(const void *x, zr_dtype dt, int64_t n) {
    if (dt == ZR_F32) return sumsq_chunk(x, n);
    float buf[2048];
    double s = 0;
    for (int64_t b = 0; b < n; b += 2048) {
        int64_t k = n - b < 2048 ? n - b : 2048;
        if (dt == ZR_BF16) widen_bf16(buf, (const uint16_t *)x + b, k);
        else widen_f16(buf, (const uint16_t *)x + b, k);
        s += sumsq_chunk(buf, k);
    }
    return s;
}

double offload_sumsq_cpu(const void *x, zr_dtype dt, int64_t n) {
    double part[MAX_THREADS];
    int T = omp_get_max_threads();
    if (T > MAX_THREADS) T = MAX_THREADS;
    if (n <= PAR_N) T = 1;
    for (int t = 0; t < T; t++) part[t] = 0;
#pragma omp parallel num_threads(T) if (T > 1)
    {
        int64_t lo, hi;
        chunk_of(n, &lo, &hi);
        part[omp_get_thread_num()] = sumsq_any((const char *)x + (size_t)lo * zr_dtype_size(dt), dt, hi - lo);
    }
    double s = 0;
    for (int t = 0; t < T; t++) s += part[t]; /* fixed order: same bits for the same thread count */
    return s;
}

/* --- AdamW --- */

#define ADAMW_LOOP(STORE)                                                                          \
    for (int64_t i = 0; i < n; i++) {                                                              \
        float gi = g[i] * gs;                                                                      \
        float mi = m[i] + omb1 * (gi - m[i]);                                                      \
        float vi = b2 * v[i] + omb2 * gi * gi;                                                     \
        m[i] = mi;                                                                                 \
        v[i] = vi;                                                                                 \
        float pi = p[i] * dec - ss * mi / (sqrtf(vi) / bc2 + ep);                                  \
        p[i] = pi;                                                                                 \
        STORE;                                                                                     \
    }
/* The per-step scalars of one call, rounded to f32 from double. */
typedef struct {
    float grad_scale, decay, omb1, beta2, omb2, eps, step_size, bc2_sqrt;
} offload_adamw_args;

#define ADAMW_SCALARS                                                                              \
    const float gs = a->grad_scale, dec = a->decay, omb1 = a->omb1, b2 = a->beta2;                  \
    const float omb2 = a->omb2, ep = a->eps, ss = a->step_size, bc2 = a->bc2_sqrt

CLONES static void adamw_chunk(float *restrict p, float *restrict m, float *restrict v, const float *restrict g,
                               int64_t n, const offload_adamw_args *a) {
    ADAMW_SCALARS;
    ADAMW_LOOP((void)0)
}
CLONES static void adamw_chunk_f32(float *restrict p, float *restrict m, float *restrict v, const float *restrict g,
                                   int64_t n, const offload_adamw_args *a, float *restrict o) {
    ADAMW_SCALARS;
    ADAMW_LOOP(o[i] = pi)
}
CLONES static void adamw_chunk_bf16(float *restrict p, float *restrict m, float *restrict v, const float *restrict g,
                                    int64_t n, const offload_adamw_args *a, uint16_t *restrict o) {
    ADAMW_SCALARS;
    ADAMW_LOOP(o[i] = bf16_rne(pi))
}

/* f32 -> f16 bit patterns, round to nearest even (F16C when the build has it). */
static void cast_f16_chunk(uint16_t *restrict o, const float *restrict x, int64_t n) {
    int64_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(o + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) o[i] = zr_f32_to_f16(x[i]);
}

/* --- streaming stores for the 16-bit (or f32) weights ---
 * Nobody on the CPU reads the new weights soon (a DMA takes them to the GPU, or the next forward
 * long after the update has swept the caches), so they bypass the caches: a normal store first
 * reads the line it fills (read-for-ownership), 4 B of traffic for every 2 B written. Streaming
 * stores are weakly ordered: the writer runs stream_fence before anyone else may read them. */

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_STREAM 1
__attribute__((target("avx512f"))) static void stream_lines_avx512(char *d, const char *s, size_t lines) {
    for (size_t i = 0; i < lines; i++)
        _mm512_stream_si512((__m512i *)(d + 64 * i), _mm512_loadu_si512((const void *)(s + 64 * i)));
}
__attribute__((target("avx2"))) static void stream_lines_avx2(char *d, const char *s, size_t lines) {
    for (size_t i = 0; i < lines; i++) {
        _mm256_stream_si256((__m256i *)(d + 64 * i), _mm256_loadu_si256((const __m256i *)(s + 64 * i)));
        _mm256_stream_si256((__m256i *)(d + 64 * i + 32), _mm256_loadu_si256((const __m256i *)(s + 64 * i + 32)));
    }
}
static void stream_lines_sse2(char *d, const char *s, size_t lines) { /* every x86-64 has SSE2 */
    for (size_t i = 0; i < 4 * lines; i++)
        _mm_stream_si128((__m128i *)(d + 16 * i), _mm_loadu_si128((const __m128i *)(s + 16 * i)));
}
static void stream_fence(void) { _mm_sfence(); }
#else
#define HAVE_STREAM 0
static void stream_fence(void) {}
#endif

/* dst[0 : bytes) = src[...]: the whole 64-byte lines of dst with streaming stores (AVX-512, AVX2
 * or SSE2, picked at run time), the partial lines at either end with normal ones. */
static void stream_copy(void *dst, const void *src, size_t bytes) {
#if HAVE_STREAM
    char *d = dst;
    const char *s = src;
    size_t head = (64 - ((uintptr_t)d & 63)) & 63;
    if (head >= bytes) {
        memcpy(d, s, bytes);
        return;
    }
    memcpy(d, s, head);
    size_t lines = (bytes - head) / 64;
    if (__builtin_cpu_supports("avx512f")) stream_lines_avx512(d + head, s + head, lines);
    else if (__builtin_cpu_supports("avx2")) stream_lines_avx2(d + head, s + head, lines);
    else stream_lines_sse2(d + head, s + head, lines);
    memcpy(d + head + 64 * lines, s + head + 64 * lines, bytes - head - 64 * lines);
#else
    memcpy(dst, src, bytes);
#endif
}

static void adamw_chunk_any(float *p, float *m, float *v, const float *g, int64_t n, const offload_adamw_args *a,
                            void *out, zr_dtype dt) {
    if (!out) adamw_chunk(p, m, v, g, n, a);
    else if (dt == ZR_BF16) adamw_chunk_bf16(p, m, v, g, n, a, out);
    else if (dt == ZR_F32) adamw_chunk_f32(p, m, v, g, n, a, out);
    else /* f16: update a block, then convert it while it is still in L1 */
        for (int64_t b = 0; b < n; b += 2048) {
            int64_t k = n - b < 2048 ? n - b : 2048;
            adamw_chunk(p + b, m + b, v + b, g + b, k, a);
            cast_f16_chunk((uint16_t *)out + b, p + b, k);
        }
}

/* bf16/f16 gradients: widened a block at a time into an L1 buffer, then the f32 loop. */
#define WIDEN_BLOCK 2048
CLONES static void widen_bf16(float *restrict d, const uint16_t *restrict s, int64_t n) { /* exact */
    for (int64_t i = 0; i < n; i++) d[i] = zr_bf16_to_f32(s[i]);
}
static void widen_f16(float *restrict d, const uint16_t *restrict s, int64_t n) {
    int64_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
    for (; i < n; i++) d[i] = zr_f16_to_f32(s[i]);
}

static void adamw_chunk_grad(float *p, float *m, float *v, const void *g, zr_dtype g_dt, int64_t n,
                             const offload_adamw_args *a, void *out, zr_dtype dt) {
    if (g_dt == ZR_F32) {
        adamw_chunk_any(p, m, v, g, n, a, out, dt);
        return;
    }
    float buf[WIDEN_BLOCK];
    size_t es = dt == ZR_F32 ? 4 : 2;
    for (int64_t b = 0; b < n; b += WIDEN_BLOCK) {
        int64_t k = n - b < WIDEN_BLOCK ? n - b : WIDEN_BLOCK;
        if (g_dt == ZR_BF16) widen_bf16(buf, (const uint16_t *)g + b, k);
        else widen_f16(buf, (const uint16_t *)g + b, k);
        adamw_chunk_any(p + b, m + b, v + b, buf, k, a, out ? (char *)out + (size_t)b * es : NULL, dt);
    }
}

/* The update of n elements with the new weights in out (or none): straight from the loop, or
 * (stream) a block at a time into an L1 buffer, then streamed out. The blocks after the first start
 * on a 64-byte line of out, so only the two ends of the range are written with normal stores. */
static void adamw_range(float *p, float *m, float *v, const void *g, zr_dtype g_dt, int64_t n,
                        const offload_adamw_args *a, void *out, zr_dtype dt, int stream) {
    if (!out || !stream) {
        adamw_chunk_grad(p, m, v, g, g_dt, n, a, out, dt);
        return;
    }
    _Alignas(64) union {
        float f[WIDEN_BLOCK];
        uint16_t h[WIDEN_BLOCK];
    } buf;
    const size_t es = dt == ZR_F32 ? 4 : 2, ge = zr_dtype_size(g_dt);
    const int64_t head = (int64_t)(((64 - ((uintptr_t)out & 63)) & 63) / es);
    for (int64_t b = 0; b < n;) {
        int64_t k = b == 0 && head ? head : WIDEN_BLOCK;
        if (k > n - b) k = n - b;
        adamw_chunk_grad(p + b, m + b, v + b, (const char *)g + (size_t)b * ge, g_dt, k, a, &buf, dt);
        stream_copy((char *)out + (size_t)b * es, &buf, (size_t)k * es);
        b += k;
    }
}

/* The per-step scalars of one piece (lr and weight decay), in double, rounded to f32 once. */
static offload_adamw_args adamw_args(const zr_adamw_config *c, double lr, double wd, int64_t step, double grad_scale) {
    double bc1 = 1 - pow(c->beta1, (double)step), bc2 = 1 - pow(c->beta2, (double)step);
    return (offload_adamw_args){(float)grad_scale, (float)(1 - lr * wd), (float)(1 - c->beta1), (float)c->beta2,
                                (float)(1 - c->beta2), (float)c->eps, (float)(lr / bc1), (float)sqrt(bc2)};
}

/* One call of offload_adamw_pieces_cpu or offload_adamw_lp_pieces_cpu: the arrays, their dtypes and
 * the step's arguments (lp: the bf16-state arithmetic below, on p_dt / s_dt arrays). */
typedef struct {
    void *p, *m, *v, *out;
    const void *g;
    zr_dtype g_dt, p_dt, s_dt, out_dt;
    const zr_adamw_config *c;
    int64_t step;
    double grad_scale;
    int stream, lp;
} adamw_job;

static void adamw_lp_piece(const adamw_job *j, const offload_adamw_piece *pc, size_t i, int64_t n);

/* Every piece in one parallel region: thread t takes [lo, hi) of the pieces laid end to end. */
static void adamw_pieces_run(const adamw_job *j, const offload_adamw_piece *pc, int npc) {
    int64_t total = 0;
    for (int k = 0; k < npc; k++) total += pc[k].n;
    const size_t es = j->out_dt == ZR_F32 ? 4 : 2, ge = zr_dtype_size(j->g_dt);
#pragma omp parallel if (total > PAR_N)
    {
        int64_t lo, hi, at = 0;
        chunk_of(total, &lo, &hi);
        for (int k = 0; k < npc && at < hi; at += pc[k].n, k++) {
            int64_t x = lo > at ? lo - at : 0, y = hi - at < pc[k].n ? hi - at : pc[k].n; /* within piece k */
            if (y <= x) continue;
            int64_t i = pc[k].off + x;
            if (j->lp) {
                adamw_lp_piece(j, &pc[k], (size_t)i, y - x);
                continue;
            }
            offload_adamw_args args = adamw_args(j->c, pc[k].lr, pc[k].wd, j->step, j->grad_scale);
            adamw_range((float *)j->p + i, (float *)j->m + i, (float *)j->v + i, (const char *)j->g + (size_t)i * ge,
                        j->g_dt, y - x, &args, j->out ? (char *)j->out + (size_t)i * es : NULL, j->out_dt, j->stream);
        }
        if (j->stream) stream_fence(); /* before the join: whoever reads out next sees every store */
    }
}

void offload_adamw_pieces_cpu(float *p, float *m, float *v, const void *g, zr_dtype g_dt,
                              const offload_adamw_piece *pc, int npc, const zr_adamw_config *c, int64_t step,
                              double grad_scale, void *out, zr_dtype out_dt, int stream) {
    adamw_job j = {p, m, v, out, g, g_dt, ZR_F32, ZR_F32, out_dt, c, step, grad_scale, stream && out && HAVE_STREAM, 0};
    adamw_pieces_run(&j, pc, npc);
}

void offload_adamw_cpu(float *p, float *m, float *v, const void *g, zr_dtype g_dt, int64_t n,
                       const zr_adamw_config *c, int64_t step, double grad_scale, void *out, zr_dtype out_dt) {
    offload_adamw_piece one = {0, n, c->lr, c->weight_decay};
    offload_adamw_pieces_cpu(p, m, v, g, g_dt, &one, 1, c, step, grad_scale, out, out_dt, 1);
}

/* --- AdamW with a bf16 master and/or bf16 moments (DeepSpeed's bf16_master_weights_and_grads,
 * bf16_optimizer_states): DeepSpeed's FusedAdam arithmetic (csrc/adam/multi_tensor_adam.cu,
 * ADAM_MODE_1) op by op in f32, never contracted into FMAs, so that it is the same on every CPU and
 * in the CUDA twin; each bf16 state rounded to nearest even once, when stored. --- */

typedef struct {
    float gs, b1, omb1, b2, omb2, bc1, bc2, eps, lr, wd;
} adamw_lp_args;

/* FusedAdam's host scalars: the hyper-parameters as f32, bias corrections 1 - beta^t from the f32
 * beta in double, rounded once; 1 - beta is computed in f32, as its kernel does. */
static adamw_lp_args adamw_lp_scalars(const zr_adamw_config *c, double lr, double wd, int64_t step, double gs) {
    const float b1 = (float)c->beta1, b2 = (float)c->beta2;
    return (adamw_lp_args){(float)gs, b1, 1.0f - b1, b2, 1.0f - b2, (float)(1 - pow((double)b1, (double)step)),
                           (float)(1 - pow((double)b2, (double)step)), (float)c->eps, (float)lr, (float)wd};
}

static inline float lp_load(const void *x, zr_dtype dt, size_t i) {
    return dt == ZR_F32 ? ((const float *)x)[i] : zr_bf16_to_f32(((const uint16_t *)x)[i]);
}
static inline void lp_store(void *x, zr_dtype dt, size_t i, float f) {
    if (dt == ZR_F32) ((float *)x)[i] = f;
    else ((uint16_t *)x)[i] = bf16_rne(f);
}

/* n elements from element 0 of each array. g (g_dt) is scaled first and, when bf16, rounded back to
 * bf16: DeepSpeed multiplies the bf16 gradient partition in place (unscale_and_clip_grads). */
__attribute__((optimize("fp-contract=off"))) static void adamw_lp_range(void *p, zr_dtype p_dt, void *m, void *v,
                                                                         zr_dtype s_dt, const void *g, zr_dtype g_dt,
                                                                         int64_t n, const adamw_lp_args *a, void *out) {
    for (int64_t k = 0; k < n; k++) {
        const size_t i = (size_t)k;
        float gi = (g_dt == ZR_F16 ? zr_f16_to_f32(((const uint16_t *)g)[i]) : lp_load(g, g_dt, i)) * a->gs;
        if (g_dt == ZR_BF16) gi = zr_bf16_to_f32(bf16_rne(gi));
        const float pi = lp_load(p, p_dt, i);
        const float mi = a->b1 * lp_load(m, s_dt, i) + a->omb1 * gi;
        const float vi = a->b2 * lp_load(v, s_dt, i) + a->omb2 * gi * gi;
        const float denom = sqrtf(vi / a->bc2) + a->eps;
        const float update = (mi / a->bc1) / denom + a->wd * pi;
        const float pn = pi - a->lr * update;
        lp_store(m, s_dt, i, mi);
        lp_store(v, s_dt, i, vi);
        lp_store(p, p_dt, i, pn);
        if (out) lp_store(out, p_dt, i, pn);
    }
}

static void adamw_lp_piece(const adamw_job *j, const offload_adamw_piece *pc, size_t i, int64_t n) {
    const size_t pe = zr_dtype_size(j->p_dt), se = zr_dtype_size(j->s_dt), ge = zr_dtype_size(j->g_dt);
    adamw_lp_args args = adamw_lp_scalars(j->c, pc->lr, pc->wd, j->step, j->grad_scale);
    adamw_lp_range((char *)j->p + i * pe, j->p_dt, (char *)j->m + i * se, (char *)j->v + i * se, j->s_dt,
                   (const char *)j->g + i * ge, j->g_dt, n, &args, j->out ? (char *)j->out + i * pe : NULL);
}

int offload_adamw_lp_pieces_cpu(void *p, zr_dtype p_dt, void *m, void *v, zr_dtype s_dt, const void *g,
                                zr_dtype g_dt, const offload_adamw_piece *pc, int npc, const zr_adamw_config *c,
                                int64_t step, double grad_scale, void *out) {
    if ((p_dt != ZR_F32 && p_dt != ZR_BF16) || (s_dt != ZR_F32 && s_dt != ZR_BF16)) return -1;
    adamw_job j = {p, m, v, out, g, g_dt, p_dt, s_dt, p_dt, c, step, grad_scale, 0, 1};
    adamw_pieces_run(&j, pc, npc);
    return 0;
}

/* --- accumulate, fill, cast --- */

CLONES static void add_f32(float *restrict d, const float *restrict s, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] += s[i];
}
CLONES static void add_bf16(float *restrict d, const uint16_t *restrict s, int64_t n, int overwrite) {
    if (overwrite)
        for (int64_t i = 0; i < n; i++) d[i] = zr_bf16_to_f32(s[i]);
    else
        for (int64_t i = 0; i < n; i++) d[i] += zr_bf16_to_f32(s[i]);
}
static void add_f16(float *restrict d, const uint16_t *restrict s, int64_t n, int overwrite) {
    for (int64_t i = 0; i < n; i++) d[i] = (overwrite ? 0.0f : d[i]) + zr_f16_to_f32(s[i]);
}

void offload_accumulate_cpu(float *dst, const void *src, zr_dtype src_dt, int64_t n, int overwrite) {
#pragma omp parallel if (n > PAR_N)
    {
        int64_t lo, hi;
        chunk_of(n, &lo, &hi);
        if (hi > lo) {
            if (src_dt == ZR_F32 && overwrite) memcpy(dst + lo, (const float *)src + lo, (size_t)(hi - lo) * 4);
            else if (src_dt == ZR_F32) add_f32(dst + lo, (const float *)src + lo, hi - lo);
            else if (src_dt == ZR_BF16) add_bf16(dst + lo, (const uint16_t *)src + lo, hi - lo, overwrite);
            else add_f16(dst + lo, (const uint16_t *)src + lo, hi - lo, overwrite);
        }
    }
}

void offload_accumulate16_cpu(uint16_t *dst, zr_dtype dst_dt, const void *src, zr_dtype src_dt, int64_t n,
                              int overwrite) {
#pragma omp parallel for schedule(static) if (n > PAR_N)
    for (int64_t i = 0; i < n; i++) {
        float s = src_dt == ZR_F32    ? ((const float *)src)[i]
                  : src_dt == ZR_BF16 ? zr_bf16_to_f32(((const uint16_t *)src)[i])
                                      : zr_f16_to_f32(((const uint16_t *)src)[i]);
        if (!overwrite) s = (dst_dt == ZR_BF16 ? zr_bf16_to_f32(dst[i]) : zr_f16_to_f32(dst[i])) + s;
        dst[i] = dst_dt == ZR_BF16 ? bf16_rne(s) : zr_f32_to_f16(s);
    }
}

void offload_fill_cpu(float *dst, int64_t n, float v) {
#pragma omp parallel if (n > PAR_N)
    {
        int64_t lo, hi;
        chunk_of(n, &lo, &hi);
        if (v == 0) memset(dst + lo, 0, (size_t)(hi - lo) * 4);
        else
            for (int64_t i = lo; i < hi; i++) dst[i] = v;
    }
}

CLONES static void cast_bf16_chunk(uint16_t *restrict o, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) o[i] = bf16_rne(x[i]);
}

void offload_cast_cpu(void *dst, zr_dtype dst_dt, const float *src, int64_t n) {
#pragma omp parallel if (n > PAR_N)
    {
        int64_t lo, hi;
        chunk_of(n, &lo, &hi);
        if (hi > lo) {
            if (dst_dt == ZR_F32) memcpy((float *)dst + lo, src + lo, (size_t)(hi - lo) * 4);
            else if (dst_dt == ZR_BF16) cast_bf16_chunk((uint16_t *)dst + lo, src + lo, hi - lo);
            else cast_f16_chunk((uint16_t *)dst + lo, src + lo, hi - lo);
        }
    }
}


/* --- Lion, Adagrad, SGD over partition segments (optim_step_cpu) --- */

static inline float grad_at(const void *g, zr_dtype dt, int64_t i) {
    return dt == ZR_F32 ? ((const float *)g)[i]
           : dt == ZR_BF16 ? zr_bf16_to_f32(((const uint16_t *)g)[i])
                           : zr_f16_to_f32(((const uint16_t *)g)[i]);
}

/* param_lp[i] = p as lp_dtype (f32, bf16 or f16), rounded to nearest even. */
static inline void store_lp(void *param_lp, zr_dtype lp_dtype, int64_t i, float p) {
    if (lp_dtype == ZR_F32) ((float *)param_lp)[i] = p;
    else if (lp_dtype == ZR_BF16) ((uint16_t *)param_lp)[i] = bf16_rne(p);
    else ((uint16_t *)param_lp)[i] = zr_f32_to_f16(p);
}

/* One element: p and its state s (NULL-free: SGD without momentum passes a dummy), g already
 * scaled. The formulas of kernels/cuda/optim.cu's optim_elem, in the same order. */
static inline float optim_elem_cpu(int kind, float g, float p, float *s, float lr, float wd, float b1, float b2,
                                   float eps, float mo, float damp1, int nesterov, int first, int has_buf) {
    if (kind == ZR_OPTIM_LION) {
        const float c = b1 * *s + (1.f - b1) * g;
        p = p * (1.f - lr * wd) - lr * (float)((c > 0.f) - (c < 0.f));
        *s = b2 * *s + (1.f - b2) * g;
    } else if (kind == ZR_OPTIM_ADAGRAD) {
        g += wd * p;
        *s += g * g;
        p -= lr * g / (sqrtf(*s) + eps);
    } else { /* SGD */
        const float d = g + wd * p;
        if (has_buf) {
            const float b = first ? d : mo * *s + damp1 * d;
            *s = b;
            p -= lr * (nesterov ? d + mo * b : b);
        } else
            p -= lr * d;
    }
    return p;
}

void optim_step_cpu(float *param, float *state, void *param_lp, zr_dtype lp_dtype, const void *grad,
                    zr_dtype grad_dtype, const zr_adamw_segment *segs, int nsegs, const zr_adamw_config *c,
                    int64_t step, const float *grad_scale) {
    const int kind = c->kind, nesterov = c->nesterov, first = step == 1, has_buf = state != NULL;
    const float b1 = (float)c->beta1, b2 = (float)c->beta2, eps = (float)c->eps, mo = (float)c->momentum;
    const float damp1 = (float)(1 - c->dampening), gs = grad_scale ? *grad_scale : 1.f;
    /* Adagrad's lr_decay: lr / (1 + (step - 1) * lr_decay), as torch computes clr */
    const double decay = kind == ZR_OPTIM_ADAGRAD ? 1 + (double)(step - 1) * c->lr_decay : 1;
    for (int k = 0; k < nsegs; k++) {
        const int64_t off = segs[k].offset, n = segs[k].n;
        const float lr = (float)(segs[k].lr / decay), wd = segs[k].weight_decay;
#pragma omp parallel for schedule(static) if (n > PAR_N)
        for (int64_t j = 0; j < n; j++) {
            const int64_t i = off + j;
            float dummy = 0.f;
            float *s = has_buf ? state + i : &dummy;
            const float p = optim_elem_cpu(kind, grad_at(grad, grad_dtype, i) * gs, param[i], s, lr, wd, b1, b2,
                                           eps, mo, damp1, nesterov, first, has_buf);
            param[i] = p;
            if (param_lp) store_lp(param_lp, lp_dtype, i, p);
        }
    }
}

/* --- Lamb over partition segments (lamb_sums_cpu, then lamb_apply_cpu) --- */

void lamb_sums_cpu(const float *param, float *m, float *v, const void *grad, zr_dtype grad_dtype,
                   const zr_adamw_segment *segs, int nsegs, const zr_adamw_config *c, const float *grad_scale,
                   double *sums) {
    const float b1 = (float)c->beta1, b2 = (float)c->beta2, eps = (float)c->eps, gs = grad_scale ? *grad_scale : 1.f;
    const int inside = c->eps_inside_sqrt;
    for (int k = 0; k < nsegs; k++) {
        const int64_t off = segs[k].offset, n = segs[k].n;
        const float wd = segs[k].weight_decay;
        double psq = 0, usq = 0;
#pragma omp parallel for schedule(static) reduction(+ : psq, usq) if (n > PAR_N)
        for (int64_t j = 0; j < n; j++) {
            const int64_t i = off + j;
            const float g = grad_at(grad, grad_dtype, i) * gs, p = param[i];
            const float mi = b1 * m[i] + (1.f - b1) * g, vi = b2 * v[i] + (1.f - b2) * g * g;
            m[i] = mi;
            v[i] = vi;
            const float u = zr_lamb_u(mi, vi, p, eps, wd, inside);
            psq += (double)p * p;
            usq += (double)u * u;
        }
        sums[2 * k] = psq;
        sums[2 * k + 1] = usq;
    }
}

void lamb_apply_cpu(float *param, const float *m, const float *v, void *param_lp, zr_dtype lp_dtype,
                    const zr_adamw_segment *segs, int nsegs, const zr_adamw_config *c, int64_t step,
                    const double *sums) {
    const float eps = (float)c->eps;
    const int inside = c->eps_inside_sqrt;
    for (int k = 0; k < nsegs; k++) {
        const int64_t off = segs[k].offset, n = segs[k].n;
        const float wd = segs[k].weight_decay;
        const double ratio = zr_lamb_ratio(sums[2 * k], sums[2 * k + 1], c->max_coeff, c->min_coeff);
        const float f = (float)(zr_lamb_step_size(c, segs[k].lr, step) * ratio); /* bias correction in it */
#pragma omp parallel for schedule(static) if (n > PAR_N)
        for (int64_t j = 0; j < n; j++) {
            const int64_t i = off + j;
            const float p = param[i] - f * zr_lamb_u(m[i], v[i], param[i], eps, wd, inside);
            param[i] = p;
            if (param_lp) store_lp(param_lp, lp_dtype, i, p);
        }
    }
}

#else
typedef int zr_offload_kernels_are_f32_only; /* keeps the f64 translation unit non-empty */
#endif
