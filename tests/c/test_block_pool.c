/* The block pool (runtime/core/block_pool.c) over a fake device: segment sizes, splitting and
 * merging, best fit, streams kept apart, the fallback to exact segments and out-of-memory, a random
 * workload against the invariants (with each live block's bytes checked untouched by the others),
 * and what it reserves under the token counts of unpadded fine-tuning against a fixed-shape loop.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/block_pool.h"

#define MIB ((size_t)1 << 20)

typedef struct {
    size_t limit, in_use; /* bytes the fake device has, bytes taken */
    int real;             /* segments are host memory (else addresses only, never touched) */
    uintptr_t next_fake;
    int64_t outstanding;
    size_t sizes[4096]; /* fake segments' sizes by slot, to give the bytes back */
    uintptr_t addrs[4096];
    int n;
} fake_device;

static void *fake_take(void *ctx, size_t size) {
    fake_device *d = ctx;
    if (d->in_use + size > d->limit || d->n == 4096) return NULL;
    void *p;
    if (d->real) {
        p = malloc(size);
        if (!p) return NULL;
    } else {
        p = (void *)d->next_fake;
        d->next_fake += size + 4096;
    }
    d->sizes[d->n] = size;
    d->addrs[d->n++] = (uintptr_t)p;
    d->in_use += size;
    d->outstanding++;
    return p;
}
static void fake_give_back(void *ctx, void *ptr) {
    fake_device *d = ctx;
    for (int i = 0; i < d->n; i++)
        if (d->addrs[i] == (uintptr_t)ptr) {
            d->in_use -= d->sizes[i];
            d->sizes[i] = d->sizes[d->n - 1];
            d->addrs[i] = d->addrs[--d->n];
            d->outstanding--;
            if (d->real) free(ptr);
            return;
        }
    abort(); /* not a segment the pool took */
}

static fake_device *new_device(size_t limit, int real) {
    fake_device *d = calloc(1, sizeof *d);
    d->limit = limit;
    d->real = real;
    d->next_fake = (uintptr_t)1 << 40;
    return d;
}
static void new_pool(zr_block_pool *p, fake_device *d) {
    zr_pool_init(p, (zr_pool_source){fake_take, fake_give_back, d});
}
static void check_pool(const zr_block_pool *p) {
    char why[256];
    const int bad = zr_pool_check(p, why, sizeof why);
    CHECK_MSG(!bad, "pool invariant: %s", why);
}
static void *alloc_ok(zr_block_pool *p, size_t n, uintptr_t stream) {
    void *ptr = NULL;
    const int rc = zr_pool_alloc(p, n, stream, &ptr, NULL);
    CHECK_MSG(rc == ZR_POOL_OK && ptr, "alloc of %zu bytes: rc %d", n, rc);
    return ptr;
}

TEST(segment_sizes_follow_the_policy) {
    CHECK(zr_pool_segment_size(0) == 2 * MIB);
    CHECK(zr_pool_segment_size(1) == 2 * MIB);
    CHECK(zr_pool_segment_size(MIB) == 2 * MIB);
    CHECK(zr_pool_segment_size(MIB + 1) == 20 * MIB);
    CHECK(zr_pool_segment_size(10 * MIB) == 20 * MIB);
    CHECK(zr_pool_segment_size(10 * MIB + 1) == 12 * MIB); /* 8 MiB's quarter: 2 MiB steps */
    CHECK(zr_pool_segment_size(256 * MIB) == 256 * MIB);
    CHECK(zr_pool_segment_size(256 * MIB + 1) == 320 * MIB);
    CHECK(zr_pool_segment_size(300 * MIB) == 320 * MIB);
    CHECK(zr_pool_segment_size((size_t)5 << 30) == (size_t)5 << 30); /* 4 GiB: 1 GiB steps */
    CHECK(zr_pool_segment_size(((size_t)5 << 30) + 1) == (size_t)6 << 30);
}

TEST(small_blocks_share_a_segment_and_merge_back) {
    fake_device *d = new_device((size_t)1 << 30, 1);
    zr_block_pool p;
    new_pool(&p, d);
    char *a = alloc_ok(&p, 1000, 0), *b = alloc_ok(&p, 1000, 0), *c = alloc_ok(&p, 512, 0);
    CHECK(p.st.n_take == 1 && d->in_use == 2 * MIB);
    CHECK(b == a + 1024 && c == b + 1024);
    CHECK(p.st.allocated == 2560 && p.st.reserved == (int64_t)(2 * MIB));
    check_pool(&p);
    CHECK(zr_pool_free(&p, b) == 1024);
    check_pool(&p);
    CHECK(zr_pool_release(&p) == 0); /* the segment still has a and c */
    char *b2 = alloc_ok(&p, 700, 0); /* best fit: b's 1024-byte hole, not the segment's tail */
    CHECK(b2 == b);
    zr_pool_free(&p, a);
    zr_pool_free(&p, b2);
    zr_pool_free(&p, c);
    check_pool(&p);
    CHECK(p.n_free == 1 && p.st.allocated == 0);
    CHECK(zr_pool_release(&p) == 2 * MIB && d->outstanding == 0 && p.st.reserved == 0);
    CHECK(zr_pool_free(&p, a) == 0); /* not handed out any more: nothing done */
    zr_pool_destroy(&p);
    free(d);
}

TEST(large_blocks_split_and_merge_both_ways) {
    fake_device *d = new_device((size_t)1 << 30, 1);
    zr_block_pool p;
    new_pool(&p, d);
    char *a = alloc_ok(&p, 3 * MIB, 0), *b = alloc_ok(&p, 4 * MIB, 0),
         *c = alloc_ok(&p, 5 * MIB, 0);
    CHECK(p.st.n_take == 1 &&
          d->in_use == 20 * MIB); /* one 20 MiB segment for requests up to 10 MiB */
    CHECK(b == a + 3 * MIB && c == b + 4 * MIB);
    char *e = alloc_ok(&p, (size_t)7.5 * MIB, 0); /* 8 MiB left: no split for 0.5 MiB */
    CHECK(p.st.n_take == 1 && p.st.allocated == (int64_t)(20 * MIB) && p.n_free == 0);
    zr_pool_free(&p, b);
    zr_pool_free(&p, c); /* merges into b's hole */
    check_pool(&p);
    CHECK(p.n_free == 1);
    zr_pool_free(&p, a); /* and a with it: 12 MiB free in front of e */
    check_pool(&p);
    CHECK(p.n_free == 1 && p.st.allocated == (int64_t)(8 * MIB));
    char *f = alloc_ok(&p, 11 * MIB, 0); /* fits the 12 MiB hole (no split: 1 MiB left) */
    CHECK(f == a && p.st.n_take == 1);
    zr_pool_free(&p, e);
    zr_pool_free(&p, f);
    check_pool(&p);
    CHECK(zr_pool_release(&p) == 20 * MIB && d->outstanding == 0);
    zr_pool_destroy(&p);
    free(d);
}

TEST(streams_and_small_large_kept_apart) {
    fake_device *d = new_device((size_t)1 << 30, 0);
    zr_block_pool p;
    new_pool(&p, d);
    void *a = alloc_ok(&p, 4 * MIB, 1);
    zr_pool_free(&p, a);
    void *b = alloc_ok(&p, 4 * MIB, 2); /* stream 1's free segment is not stream 2's */
    CHECK(b != a && p.st.n_take == 2);
    void *s = alloc_ok(&p, 4096, 1); /* a small request does not split the large free segment */
    CHECK(p.st.n_take == 3 && s != a);
    void *c = alloc_ok(&p, 4 * MIB, 1);
    CHECK(c == a && p.st.n_take == 3);
    check_pool(&p);
    zr_pool_destroy(&p);
    CHECK(d->outstanding == 0);
    free(d);
}

TEST(exact_segment_when_the_rounded_one_does_not_fit_then_out_of_memory) {
    fake_device *d = new_device(310 * MIB, 0);
    zr_block_pool p;
    new_pool(&p, d);
    void *a = NULL;
    size_t got = 0;
    CHECK(zr_pool_alloc(&p, 300 * MIB, 0, &a, &got) == ZR_POOL_OK); /* 320 MiB refused, 300 taken */
    CHECK(a && got == 300 * MIB && d->in_use == 300 * MIB);
    void *b = NULL;
    CHECK(zr_pool_alloc(&p, 20 * MIB, 0, &b, NULL) == ZR_POOL_NO_DEVICE_MEMORY && !b);
    zr_pool_free(&p, a);
    CHECK(zr_pool_alloc(&p, 20 * MIB, 0, &b, &got) == ZR_POOL_OK && b == a && got == 20 * MIB);
    void *c = NULL; /* 280 MiB left of the segment; a request over that cannot be served */
    CHECK(zr_pool_alloc(&p, 290 * MIB, 0, &c, NULL) == ZR_POOL_NO_DEVICE_MEMORY);
    zr_pool_free(&p, b);
    CHECK(zr_pool_release(&p) == 300 * MIB);
    CHECK(zr_pool_alloc(&p, 290 * MIB, 0, &c, NULL) == ZR_POOL_OK);
    check_pool(&p);
    zr_pool_destroy(&p);
    CHECK(d->outstanding == 0);
    free(d);
}

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

TEST(random_workload_keeps_the_invariants_and_the_bytes) {
    fake_device *d = new_device((size_t)512 * MIB, 1);
    zr_block_pool p;
    new_pool(&p, d);
    enum { SLOTS = 200 };
    unsigned char *ptr[SLOTS] = {0};
    size_t len[SLOTS] = {0};
    int ooms = 0;
    for (int op = 0; op < 20000 && !test_failed_flag; op++) {
        const int k = (int)(rnd() % SLOTS);
        if (ptr[k]) { /* its bytes still hold its pattern: no other block overlapped it */
            const unsigned char tag = (unsigned char)k;
            for (size_t i = 0; i < len[k]; i += 1 + len[k] / 64)
                CHECK_MSG(ptr[k][i] == tag, "slot %d clobbered", k);
            CHECK(ptr[k][len[k] - 1] == tag);
            CHECK(zr_pool_free(&p, ptr[k]) >= len[k]);
            ptr[k] = NULL;
        } else {
            const uint64_t r = rnd();
            len[k] =
                r % 8 == 0 ? 1 + (size_t)(rnd() % (40 * MIB)) : 1 + (size_t)(rnd() % (600 * 1024));
            void *q = NULL;
            const int rc = zr_pool_alloc(&p, len[k], rnd() % 8 == 0 ? 7 : 0, &q, NULL);
            if (rc == ZR_POOL_NO_DEVICE_MEMORY) {
                ooms++;
                zr_pool_release(&p);
                continue;
            }
            CHECK(rc == ZR_POOL_OK);
            ptr[k] = q; /* its pattern at the positions checked at its free */
            for (size_t i = 0; i < len[k]; i += 1 + len[k] / 64)
                ptr[k][i] = (unsigned char)k;
            ptr[k][len[k] - 1] = (unsigned char)k;
        }
        if (op % 97 == 0) check_pool(&p);
        if (op % 1000 == 999) zr_pool_release(&p);
    }
    check_pool(&p);
    CHECK(p.st.n_take > 10 && p.st.n_cache_hits > p.st.n_alloc / 2);
    (void)ooms;
    zr_pool_destroy(&p);
    CHECK(d->outstanding == 0 && d->in_use == 0);
    free(d);
}

/* Unpadded fine-tuning: each micro-batch a new token count T and ~160 per-token activations of a
 * Llama-3.2-1B layer stack (T x 2048 and T x 8192 bf16, a few f32), made in order and freed in
 * reverse, beside weights made once. What the pool reserves against the largest micro-batch's bytes
 * (its segments stay: only an out-of-memory releases them), and when it last needs a segment; then
 * a fixed shape repeated. Without the weights in front, exact 2 MiB-step segments (PyTorch's
 * default) reserve 3.8x over T in 300..4000 at this model, this pool 1.8x. */
static size_t act_bytes(int i, size_t t) {
    switch (i % 4) {
    case 0:
        return t * 2048 * 2;
    case 1:
        return t * 8192 * 2;
    case 2:
        return t * 512 * 2;
    default:
        return t * 4;
    }
}
static void token_counts(size_t lo, size_t hi, double max_over) {
    fake_device *d = new_device((size_t)1 << 40, 0);
    zr_block_pool p;
    new_pool(&p, d);
    void *w[40], *act[160];
    for (int i = 0; i < 40; i++)
        w[i] = alloc_ok(&p, (size_t)(i % 3 + 1) * 64 * MIB + 4096 * (size_t)i, 0);
    const int64_t weights = p.st.allocated;
    int64_t largest = 0, last_take_step = -1;
    for (int step = 0; step < 400; step++) {
        const size_t t = lo + (size_t)(rnd() % (hi - lo + 1));
        const int64_t takes = p.st.n_take;
        for (int i = 0; i < 160; i++)
            act[i] = alloc_ok(&p, act_bytes(i, t), 0);
        if (p.st.allocated - weights > largest) largest = p.st.allocated - weights;
        for (int i = 159; i >= 0; i--)
            zr_pool_free(&p, act[i]);
        if (p.st.n_take != takes) last_take_step = step;
    }
    check_pool(&p);
    const double over = (double)(p.st.reserved - weights) / (double)largest;
    CHECK_MSG(over < max_over,
              "T %zu..%zu: reserved %.3fx the largest micro-batch's activations (want < %.2f)", lo,
              hi, over, max_over);
    CHECK_MSG(last_take_step < 20, "T %zu..%zu: a segment taken at micro-batch %lld of 400", lo, hi,
              (long long)last_take_step);
    for (int i = 0; i < 40; i++)
        CHECK(zr_pool_free(&p, w[i]) > 0);
    check_pool(&p);
    zr_pool_destroy(&p);
    CHECK(d->outstanding == 0);
    free(d);
}
TEST(varying_token_counts_reserve_little_over_the_largest_step) {
    token_counts(
        300, 1000,
        1.4); /* ~ SFT rows of WikiText-2, 4-8 a micro-batch: 1.29x, the last segment at the 2nd */
    token_counts(300, 4000, 1.25); /* a range 13x wide: 1.11x, the last at the 5th */
}
TEST(a_fixed_shape_takes_segments_once) {
    fake_device *d = new_device((size_t)1 << 40, 0);
    zr_block_pool p;
    new_pool(&p, d);
    void *act[160];
    for (int step = 0; step < 20; step++) {
        const int64_t takes = p.st.n_take;
        for (int i = 0; i < 160; i++)
            act[i] = alloc_ok(&p, act_bytes(i, 2048), 0);
        for (int i = 159; i >= 0; i--)
            zr_pool_free(&p, act[i]);
        CHECK_MSG(step == 0 || p.st.n_take == takes, "a segment taken at step %d", step);
    }
    const double fixed = (double)p.st.reserved / (double)p.st.peak_allocated;
    CHECK_MSG(fixed < 1.05, "reserved %.3fx its peak (want < 1.05)", fixed);
    zr_pool_destroy(&p);
    CHECK(d->outstanding == 0);
    free(d);
}

/* tests/cuda/test_cuda.lua's varying-token-count step on the GPU, modelled: 8 tensors of t x (2048,
 * 8192, 512, 1) bf16, then per tensor its negation, two scalars and a reduction's 64 KiB scratch, all
 * freed at the step's end; the largest step (t 4000) first, then 40 token counts. Returns the
 * segments taken after the largest step, and in *smallest the least mean size of the segments one
 * step took (2 MiB: only small ones). */
static int64_t gpu_test_step_segments(int64_t lo, int64_t span, size_t *smallest) {
    fake_device *d = new_device((size_t)1 << 40, 0);
    zr_block_pool p;
    new_pool(&p, d);
    static const int64_t width[4] = {2048, 8192, 512, 1};
    void *live[48];
    int64_t t = 4000, after_largest = 0, seed = 3999;
    *smallest = SIZE_MAX;
    for (int step = 0; step <= 40; step++) {
        const int64_t takes = p.st.n_take, reserved = p.st.reserved;
        int n = 0;
        for (int i = 0; i < 8; i++)
            live[n++] = alloc_ok(&p, (size_t)(t * width[i % 4] * 2), 0);
        for (int i = 0; i < 8; i++) {
            live[n++] = alloc_ok(&p, (size_t)(t * width[i % 4] * 2), 0);
            for (int r = 0; r < 2; r++)
                live[n++] = alloc_ok(&p, 2, 0), live[n++] = alloc_ok(&p, 65536, 0);
        }
        for (int i = 0; i < n; i++)
            zr_pool_free(&p, live[i]);
        check_pool(&p);
        if (step > 0 && p.st.n_take > takes) {
            after_largest += p.st.n_take - takes;
            const size_t seg = (size_t)((p.st.reserved - reserved) / (p.st.n_take - takes));
            if (seg < *smallest) *smallest = seg;
        }
        seed = lo + (seed * 7919) % span, t = seed;
    }
    zr_pool_destroy(&p);
    free(d);
    return after_largest;
}
TEST(the_gpu_tests_token_counts_take_no_segment_after_the_largest) {
    size_t smallest = 0;
    /* t 1100..3999: every tensor stays in its class (t x 512 bf16 > 1 MiB, t x 1 < 1 MiB) */
    const int64_t within = gpu_test_step_segments(1100, 2900, &smallest);
    CHECK_MSG(within == 0, "%lld segments taken after the largest step (want 0)", (long long)within);
    /* t 300..3999: t x 512 of 1024 tokens or fewer is a small request, for 2 MiB segments of its own
     * (what the H100 showed: 2 more cudaMalloc) */
    const int64_t across = gpu_test_step_segments(300, 3700, &smallest);
    CHECK_MSG(across > 0 && across <= 4 && smallest == 2 * MIB,
              "t 300..3999: %lld segments after the largest step, the smallest %zu B (want 1-4 small ones)",
              (long long)across, smallest);
}

TEST(destroy_gives_back_blocks_still_out) {
    fake_device *d = new_device((size_t)1 << 30, 1);
    zr_block_pool p;
    new_pool(&p, d);
    alloc_ok(&p, 100, 0);
    alloc_ok(&p, 5 * MIB, 0);
    void *c = alloc_ok(&p, 50 * MIB, 3);
    zr_pool_free(&p, c);
    CHECK(d->outstanding == 3);
    zr_pool_destroy(&p);
    CHECK(d->outstanding == 0 && d->in_use == 0 && p.st.reserved == 0 && p.n_free == 0 &&
          p.n_used == 0);
    free(d);
}

int main(void) {
    RUN(segment_sizes_follow_the_policy);
    RUN(small_blocks_share_a_segment_and_merge_back);
    RUN(large_blocks_split_and_merge_both_ways);
    RUN(streams_and_small_large_kept_apart);
    RUN(exact_segment_when_the_rounded_one_does_not_fit_then_out_of_memory);
    RUN(random_workload_keeps_the_invariants_and_the_bytes);
    RUN(varying_token_counts_reserve_little_over_the_largest_step);
    RUN(a_fixed_shape_takes_segments_once);
    RUN(the_gpu_tests_token_counts_take_no_segment_after_the_largest);
    RUN(destroy_gives_back_blocks_still_out);
    return test_summary();
}
