/* C tests for runtime/core/random.c's CPU fills: every element equals its element-by-element definition
 * (kernels/base/philox.h: zr_philox_normal / zr_philox_uniform at the fill's offset) bit for bit, for f32
 * and f64 tensors, a length that ends mid-block, and above the OpenMP threshold; the offset advances by
 * ceil(n / 4). */
#include "check.h"
#include "core/random.h"
#include "kernels/base/philox.h"

static zr_tensor *vec(zr_dtype dt, int64_t n) { return zr_tensor_new_cat(dt, zr_cpu(), 1, (int64_t[]){n}, ZR_MEM_OTHER, 0); }

static double at(const zr_tensor *t, int64_t i) {
    return t->dtype == ZR_F32 ? ((const float *)zr_tensor_data((zr_tensor *)t))[i]
                              : ((const double *)zr_tensor_data((zr_tensor *)t))[i];
}

/* kind 0 uniform [a, b), 1 normal (a, b), 2 bernoulli (a), as random.c's fill defines them */
static double want(int kind, zr_dtype dt, double a, double b, uint64_t seed, uint64_t off, int64_t i) {
    double v = kind == 1   ? a + b * zr_philox_normal(seed, off, (uint64_t)i)
               : kind == 0 ? a + (b - a) * (double)zr_philox_uniform(seed, off, (uint64_t)i)
                           : (double)(zr_philox_uniform(seed, off, (uint64_t)i) < a);
    return dt == ZR_F32 ? (double)(float)v : v;
}

static void check_fill(int kind, zr_dtype dt, int64_t n) {
    double a = kind == 2 ? 0.7 : 0.25, b = 1.5;
    uint64_t seed, off, off2;
    zr_random_get_state(&seed, &off);
    zr_tensor *t = vec(dt, n);
    CHECK(t != NULL);
    if (!t) return;
    zr_status st = kind == 1 ? zr_tensor_normal_(t, a, b) : kind == 0 ? zr_tensor_uniform_(t, a, b) : zr_tensor_bernoulli_(t, a);
    CHECK(st == ZR_OK);
    zr_random_get_state(&seed, &off2);
    CHECK_MSG(off2 == off + (uint64_t)(n + 3) / 4, "offset %llu -> %llu for %lld elements", (unsigned long long)off,
              (unsigned long long)off2, (long long)n);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (at(t, i) != want(kind, dt, a, b, seed, off, i)) bad = i;
    CHECK_MSG(bad < 0, "kind %d %s n %lld: element %lld is %.17g, its definition %.17g", kind, zr_dtype_name(dt),
              (long long)n, (long long)bad, bad < 0 ? 0 : at(t, bad), bad < 0 ? 0 : want(kind, dt, a, b, seed, off, bad));
    zr_tensor_release(t);
}

TEST(fills_equal_their_definition) {
    zr_manual_seed(1234);
    for (int kind = 0; kind < 3; kind++)
        for (int d = 0; d < 2; d++) {
            check_fill(kind, d ? ZR_F64 : ZR_F32, 1001);   /* ends mid-block, one thread */
            check_fill(kind, d ? ZR_F64 : ZR_F32, 200003); /* above the OpenMP threshold */
        }
}

int main(void) {
    RUN(fills_equal_their_definition);
    return test_summary();
}
