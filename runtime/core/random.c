/* Philox-based random fills (see random.h and kernels/base/philox.h). */
#include "core/random.h"

#include "kernels/base/philox.h"

static uint64_t g_seed = 0x5eed, g_offset;
static zr_device_random_fn device_fill;

void zr_manual_seed(uint64_t seed) {
    g_seed = seed;
    g_offset = 0;
}
void zr_random_get_state(uint64_t *seed, uint64_t *offset) {
    *seed = g_seed;
    *offset = g_offset;
}
void zr_random_set_state(uint64_t seed, uint64_t offset) {
    g_seed = seed;
    g_offset = offset;
}
uint64_t zr_random_reserve(int64_t n) {
    uint64_t o = g_offset;
    g_offset += (uint64_t)(n + 3) / 4;
    return o;
}
void zr_random_set_device_fill(zr_device_random_fn fn) { device_fill = fn; }

/* kind: 0 uniform [a,b), 1 normal(a,b), 2 bernoulli(a) */
static zr_status fill(zr_tensor *t, int kind, double a, double b) {
    int64_t n = zr_tensor_numel(t);
    uint64_t off = zr_random_reserve(n);
    zr_tensor *dst = t;
    if (!zr_tensor_is_contiguous(t)) dst = zr_tensor_empty_like(t);
    if (!dst) return ZR_ERR;
    zr_status st = ZR_OK;
    if (dst->storage->device.type != ZR_CPU) {
        st = device_fill ? device_fill(dst, kind, a, b, g_seed, off) : zr_error("no CUDA backend");
    } else if (dst->dtype == ZR_F32) {
        float *p = zr_tensor_data(dst);
#pragma omp parallel for if (n > 65536)
        for (int64_t i = 0; i < n; i++)
            p[i] = kind == 0   ? (float)(a + (b - a) * zr_philox_uniform(g_seed, off, (uint64_t)i))
                   : kind == 1 ? (float)(a + b * zr_philox_normal(g_seed, off, (uint64_t)i))
                               : (float)(zr_philox_uniform(g_seed, off, (uint64_t)i) < a);
    } else {
        zr_tensor *tmp = zr_tensor_new_cat(ZR_F64, zr_cpu(), dst->ndim, dst->shape, ZR_MEM_WORKSPACE, 0);
        if (!tmp) st = ZR_ERR;
        else {
            double *p = zr_tensor_data(tmp);
#pragma omp parallel for if (n > 65536)
            for (int64_t i = 0; i < n; i++)
                p[i] = kind == 0   ? a + (b - a) * (double)zr_philox_uniform(g_seed, off, (uint64_t)i)
                       : kind == 1 ? a + b * zr_philox_normal(g_seed, off, (uint64_t)i)
                                   : (double)(zr_philox_uniform(g_seed, off, (uint64_t)i) < a);
            st = zr_tensor_copy_(dst, tmp);
            zr_tensor_release(tmp);
        }
    }
    if (!st && dst != t) st = zr_tensor_copy_(t, dst);
    if (dst != t) zr_tensor_release(dst);
    return st;
}

zr_status zr_tensor_uniform_(zr_tensor *t, double lo, double hi) { return fill(t, 0, lo, hi); }
zr_status zr_tensor_normal_(zr_tensor *t, double mean, double std) { return fill(t, 1, mean, std); }
zr_status zr_tensor_bernoulli_(zr_tensor *t, double keep) { return fill(t, 2, keep, 0); }

void zr_randperm(int64_t n, uint64_t seed, int64_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        zr_philox4 r = zr_philox(seed, (uint64_t)i);
        uint64_t bits = ((uint64_t)r.x[0] << 32) | r.x[1];
        int64_t j = (int64_t)(bits % (uint64_t)(i + 1));
        int64_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}
