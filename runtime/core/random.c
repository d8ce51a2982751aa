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

/* Elements 4g .. 4g + 3 of a fill (kind: 0 uniform [a,b), 1 normal(a,b), 2 bernoulli(a)) from one
 * Philox block: the values zr_philox_uniform / zr_philox_normal give element by element. */
static void block4(int kind, double a, double b, uint64_t off, int64_t g, double v[4]) {
    if (kind == 1) {
        zr_philox_normal4(g_seed, off, (uint64_t)g, v);
        for (int l = 0; l < 4; l++) v[l] = a + b * v[l];
        return;
    }
    zr_philox4 r = zr_philox(g_seed, off + (uint64_t)g);
    for (int l = 0; l < 4; l++) {
        float u = zr_u01(r.x[l]);
        v[l] = kind == 0 ? a + (b - a) * (double)u : (double)(u < a);
    }
}

static zr_status fill(zr_tensor *t, int kind, double a, double b) {
    int64_t n = zr_tensor_numel(t), blocks = (n + 3) / 4;
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
        for (int64_t g = 0; g < blocks; g++) {
            double v[4];
            block4(kind, a, b, off, g, v);
            for (int l = 0; l < 4 && 4 * g + l < n; l++) p[4 * g + l] = (float)v[l];
        }
    } else {
        zr_tensor *tmp = zr_tensor_new_cat(ZR_F64, zr_cpu(), dst->ndim, dst->shape, ZR_MEM_WORKSPACE, 0);
        if (!tmp) st = ZR_ERR;
        else {
            double *p = zr_tensor_data(tmp);
#pragma omp parallel for if (n > 65536)
            for (int64_t g = 0; g < blocks; g++) {
                double v[4];
                block4(kind, a, b, off, g, v);
                for (int l = 0; l < 4 && 4 * g + l < n; l++) p[4 * g + l] = v[l];
            }
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

/* torch.randperm(n, generator) on the CPU, for a generator seeded with torch.Generator().manual_seed(seed):
 * the generator is the Mersenne Twister MT19937 initialised from the seed's low 32 bits (init_genrand, as
 * at::mt19937 does), and the permutation is torch's randperm_cpu: 0..n-1, then for i = 0..n-2 position i
 * swapped with i + random() % (n - i) (random64() for n of UINT32_MAX / 20 or more). The Trainer's random
 * order (transformers' RandomSampler under accelerate: seed + epoch) comes out as torch's. */
typedef struct {
    uint32_t s[624];
    int i;
} mt19937;
static void mt_seed(mt19937 *m, uint32_t seed) {
    m->s[0] = seed;
    for (int j = 1; j < 624; j++) m->s[j] = 1812433253u * (m->s[j - 1] ^ (m->s[j - 1] >> 30)) + (uint32_t)j;
    m->i = 624;
}
static uint32_t mt_next(mt19937 *m) {
    if (m->i >= 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (m->s[k] & 0x80000000u) | (m->s[(k + 1) % 624] & 0x7fffffffu);
            m->s[k] = m->s[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        m->i = 0;
    }
    uint32_t y = m->s[m->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}
void zr_randperm_torch(int64_t n, uint64_t seed, int64_t *out) {
    mt19937 m;
    mt_seed(&m, (uint32_t)(seed & 0xffffffffu));
    for (int64_t i = 0; i < n; i++) out[i] = i;
    int small = n < (int64_t)(UINT32_MAX / 20);
    for (int64_t i = 0; i < n - 1; i++) {
        uint64_t r = mt_next(&m);
        if (!small) r = (r << 32) | mt_next(&m);
        int64_t z = (int64_t)(r % (uint64_t)(n - i));
        int64_t t = out[i];
        out[i] = out[z + i];
        out[z + i] = t;
    }
}

/* numpy.random.default_rng(seed).permutation(n), the order Hugging Face datasets' shuffle(seed=) and
 * train_test_split(seed=) take: SeedSequence(seed) (the seed's 32-bit words hashed into a pool of four,
 * four 64-bit words drawn from it) seeds PCG64 (XSL-RR 128/64: state and increment from those words), and
 * Generator.shuffle swaps position i = n-1 .. 1 with random_interval(i): a 32-bit draw (the low half of a
 * 64-bit output, then its high half) masked to the smallest all-ones mask >= i, redrawn while above i
 * (64-bit draws for i >= 2^32). */
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
static uint32_t ss_hashmix(uint32_t v, uint32_t *h) {
    v ^= *h;
    *h *= SS_MULT_A;
    v *= *h;
    return v ^ (v >> 16);
}
static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t r = 0xca01f9ddu * x - 0x4973f715u * y;
    return r ^ (r >> 16);
}
typedef struct {
    unsigned __int128 state, inc;
    int has32;
    uint32_t buf32;
} np_pcg64;
static void pcg_step(np_pcg64 *g) {
    const unsigned __int128 mult = ((unsigned __int128)2549297995355413924ull << 64) | 4865540595714422341ull;
    g->state = g->state * mult + g->inc;
}
static uint64_t pcg_next64(np_pcg64 *g) {
    pcg_step(g);
    uint64_t hi = (uint64_t)(g->state >> 64), lo = (uint64_t)g->state;
    unsigned rot = (unsigned)(hi >> 58);
    uint64_t x = hi ^ lo;
    return (x >> rot) | (x << ((64 - rot) & 63));
}
static uint32_t pcg_next32(np_pcg64 *g) {
    if (g->has32) {
        g->has32 = 0;
        return g->buf32;
    }
    uint64_t v = pcg_next64(g);
    g->has32 = 1;
    g->buf32 = (uint32_t)(v >> 32);
    return (uint32_t)v;
}
void zr_randperm_numpy(int64_t n, uint64_t seed, int64_t *out) {
    uint32_t entropy[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, pool[4], h = SS_INIT_A;
    int n_entropy = (seed >> 32) ? 2 : 1;
    for (int i = 0; i < 4; i++) pool[i] = ss_hashmix(i < n_entropy ? entropy[i] : 0, &h);
    for (int s = 0; s < 4; s++)
        for (int d = 0; d < 4; d++)
            if (s != d) pool[d] = ss_mix(pool[d], ss_hashmix(pool[s], &h));
    uint32_t w[8], hb = SS_INIT_B;
    for (int i = 0; i < 8; i++) {
        uint32_t v = pool[i % 4] ^ hb;
        hb *= SS_MULT_B;
        v *= hb;
        w[i] = v ^ (v >> 16);
    }
    uint64_t v64[4];
    for (int i = 0; i < 4; i++) v64[i] = (uint64_t)w[2 * i] | ((uint64_t)w[2 * i + 1] << 32);
    np_pcg64 g = {0, 0, 0, 0};
    g.inc = ((((unsigned __int128)v64[2] << 64) | v64[3]) << 1) | 1u;
    pcg_step(&g);
    g.state += ((unsigned __int128)v64[0] << 64) | v64[1];
    pcg_step(&g);
    for (int64_t i = 0; i < n; i++) out[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        uint64_t max = (uint64_t)i, mask = max, j;
        for (int b = 1; b < 64; b <<= 1) mask |= mask >> b;
        if (max <= 0xffffffffu) {
            while ((j = (pcg_next32(&g) & mask)) > max) {}
        } else {
            while ((j = (pcg_next64(&g) & mask)) > max) {}
        }
        int64_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}
