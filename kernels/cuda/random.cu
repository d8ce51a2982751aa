// Philox fills on CUDA (see random.h). Each Philox call writes the 4 elements that
// share the counter, so each normal pair's Box-Muller is done once. f64 (and integer) outputs
// compute the normals in double exactly as runtime/core/random.c does. f32, bf16, f16 normals use
// an f32 Box-Muller that keeps full f32 accuracy without IEEE division or library calls (-ln u1
// from the integer's exponent and CUDA's logf polynomial, sin/cos with the quadrant taken from the
// integer and CUDA's sincospif polynomials, sqrt by rsqrt and one Newton step: a few ulp of f32
// from the double result; f32 also does a + b z in f32; the Philox round keys are precomputed
// kernel parameters); bf16/f16 fall back to the double computation for the rare elements whose
// rounding to the narrow type that error could change, so those come out as the double path
// (and the CPU) gives them.
#include "common.cuh"
#include "../base/philox.h"
#include "random.h"

using namespace zrk;

namespace {

template <typename D> __device__ __forceinline__ D store_d(double x) { return (D)x; }
template <> __device__ __forceinline__ __nv_bfloat16 store_d<__nv_bfloat16>(double x) { return __float2bfloat16_rn((float)x); }
template <> __device__ __forceinline__ __half store_d<__half>(double x) { return __float2half_rn((float)x); }

template <typename D> struct fast_normal { enum { ok = 0 }; };
template <> struct fast_normal<float> { enum { ok = 1 }; };
template <> struct fast_normal<__nv_bfloat16> { enum { ok = 1 }; };
template <> struct fast_normal<__half> { enum { ok = 1 }; };

template <typename D> __device__ __forceinline__ unsigned short bits_of(D x) { return 0; }
template <> __device__ __forceinline__ unsigned short bits_of<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
template <> __device__ __forceinline__ unsigned short bits_of<__half>(__half x) { return __half_as_ushort(x); }

// The pair (lanes base, base+1) of r in double, as zr_philox_normal computes it.
__device__ __forceinline__ double normal_f64(const zr_philox4 &r, int base, int odd) {
    double u1 = ((double)(r.x[base] >> 8) + 1.0) / 16777217.0;
    double u2 = (double)(r.x[base + 1] >> 8) / 16777216.0;
    double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
    return odd ? rad * sin(th) : rad * cos(th);
}

// zr_philox (kernels/base/philox.h) with 32-bit multiplies (__umulhi and the low product): the same
// bits, but the compiler left philox.h's 64-bit products and xors in 64-bit arithmetic.
__device__ __forceinline__ zr_philox4 philox32(uint32_t k0, uint32_t k1, uint64_t counter) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
#pragma unroll
    for (int r = 0; r < 10; r++) {
        const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    zr_philox4 o = {{c0, c1, c2, c3}};
    return o;
}

// Round keys of zr_philox for one seed, made on the host: the rounds xor kernel-parameter
// operands instead of stepping the keys per call (20 integer adds of every 4 elements).
struct philox_keys {
    uint32_t k0[10], k1[10];
};
static philox_keys make_keys(uint64_t seed) {
    philox_keys K;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        K.k0[r] = k0, K.k1[r] = k1;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return K;
}

#ifndef RANDOM_WIDE
#define RANDOM_WIDE 1 /* 1: one mul.wide.u32 per product instead of mul.hi + mul.lo (3% faster) */
#endif
// (hi, lo) of the 64-bit product a * b.
__device__ __forceinline__ void mulhilo(uint32_t a, uint32_t b, uint32_t &hi, uint32_t &lo) {
#if RANDOM_WIDE
    asm("{\n\t.reg .u64 p;\n\tmul.wide.u32 p, %2, %3;\n\tmov.b64 {%1, %0}, p;\n\t}"
        : "=r"(hi), "=r"(lo) : "r"(a), "r"(b));
#else
    hi = __umulhi(a, b), lo = a * b;
#endif
}

// philox32 with the precomputed keys; round 0 has c2 = c3 = 0, so its products with them vanish.
__device__ __forceinline__ zr_philox4 philox_keyed(const philox_keys &K, uint64_t counter) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2, c3;
    {
        uint32_t hi0, lo0;
        mulhilo(0xD2511F53u, c0, hi0, lo0);
        c0 = c1 ^ K.k0[0], c1 = 0, c2 = hi0 ^ K.k1[0], c3 = lo0;
    }
#pragma unroll
    for (int r = 1; r < 10; r++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(0xD2511F53u, c0, hi0, lo0);
        mulhilo(0xCD9E8D57u, c2, hi1, lo1);
        const uint32_t n0 = hi1 ^ c1 ^ K.k0[r], n2 = hi0 ^ c3 ^ K.k1[r];
        c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
    }
    zr_philox4 o = {{c0, c1, c2, c3}};
    return o;
}

__device__ __forceinline__ float fbits(uint32_t b) { return __uint_as_float(b); }

// -ln(u1) for u1 = (q1 + 1) / (2^24 + 1), q1 < 2^24, in f32 without a division: m = q1 + 1 =
// 2^e f exactly with f in [3/4, 3/2), so -ln u1 = (24 - e) ln2 + ln(1 + 2^-24) - log1p(f - 1),
// f - 1 exact; log1p by CUDA's logf polynomial; ln2 in two parts ((24 - e) ln2_hi is exact). No
// cancellation where the result is small (e = 24: both terms >= 0); within an ulp over all
// 2^24 inputs (checked against the double formula).
__device__ __forceinline__ float neg_log_u1(uint32_t q1) {
    const float m = (float)(q1 + 1u); // exact: m <= 2^24
    const int ib = __float_as_int(m);
    const int ex = (ib - 0x3f400000) & (int)0xff800000;
    const float g = __int_as_float(ib - ex) - 1.f; // in [-1/4, 1/2), exact
    const float k = (float)(24 - (ex >> 23));
    float p = fmaf(fbits(0xBD39BF78u), g, fbits(0x3DD80012u));
    p = fmaf(p, g, fbits(0xBE0778E0u));
    p = fmaf(p, g, fbits(0x3E146475u));
    p = fmaf(p, g, fbits(0xBE2A68DDu));
    p = fmaf(p, g, fbits(0x3E4CAF9Eu));
    p = fmaf(p, g, fbits(0xBE800042u));
    p = fmaf(p, g, fbits(0x3EAAAAE6u));
    p = fmaf(p, g, -0.5f);
    const float l = fmaf(g * p, g, g); // log1p(g)
    // ln(1 + 2^-24) = 2^-24 - 2^-49 + ...: 0x33800000 (2^-24) is it to f32 precision
    const float s = fmaf(k, 1.42860677e-06f, fbits(0x33800000u) - l);
    return fmaf(k, 0.693145751953125f, s);
}

// sin and cos of 2 pi q2 / 2^24 (q2 < 2^24): the nearest multiple j of pi/2 from the integer,
// the rest x pi with |x| <= 1/4 exact, CUDA's sincospif polynomials on it.
__device__ __forceinline__ void sincos_u24(uint32_t q2, float *sn, float *cs) {
    const uint32_t j = (q2 + 0x200000u) >> 22;
    const float x = (float)((int)q2 - (int)(j << 22)) * 0x1p-23f;
    const float x2 = x * x;
    float sp = fmaf(fbits(0xBF17ACC9u), x2, fbits(0x40233590u));
    sp = fmaf(sp, x2, fbits(0xC0A55DF6u));
    sp = fmaf(fbits(0x40490FDBu), x, sp * (x2 * x));
    float cp = fmaf(fbits(0x3E684E12u), x2, fbits(0xBFAAD2E0u));
    cp = fmaf(cp, x2, fbits(0x4081E0CFu));
    cp = fmaf(cp, x2, fbits(0xC09DE9E6u));
    cp = fmaf(cp, x2, 1.f);
    const float s0 = (j & 1) ? cp : sp, c0 = (j & 1) ? sp : cp;
    *sn = (j & 2) ? -s0 : s0;
    *cs = ((j + 1) & 2) ? -c0 : c0;
}

// sqrt(v) for normal v > 0: rsqrt and one Newton step (within an ulp).
__device__ __forceinline__ float sqrt_pos(float v) {
    float r;
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    const float y = v * r, e = fmaf(-y, y, v);
    return fmaf(e, 0.5f * r, y);
}

#ifndef RANDOM_GPT
#define RANDOM_GPT 2 /* Philox groups (of 4 elements) per thread per tile */
#endif
#ifndef RANDOM_NGPT
#define RANDOM_NGPT 8 /* the same for the normal kernel (H200, f32 2^28: 1 0.58 ms, 2 0.52, 4 0.50, 8 0.48) */
#endif

// Normal(a, b) into f32, bf16 or f16, tiled as philox_fill_kernel.
template <typename D, int GPT>
__global__ void __launch_bounds__(256) philox_normal_kernel(D *__restrict__ dst, int64_t n, double a, double b,
                                                            const __grid_constant__ philox_keys K, uint64_t offset) {
    const int64_t groups = (n + 3) / 4, tile = (int64_t)blockDim.x * GPT;
    const int64_t step = tile * gridDim.x;
    const bool vec4 = sizeof(D) == 4 && ((uintptr_t)dst & 15) == 0;
    const float af = (float)a, bf = (float)b;
    for (int64_t t0 = (int64_t)blockIdx.x * tile + threadIdx.x; t0 < groups; t0 += step) {
#pragma unroll
        for (int g = 0; g < GPT; ++g) {
            const int64_t j = t0 + (int64_t)g * blockDim.x;
            if (j >= groups) break;
            const zr_philox4 r = philox_keyed(K, offset + (uint64_t)j);
            D out[4];
            double v[4];
#pragma unroll
            for (int base = 0; base < 4; base += 2) {
                const float rad = sqrt_pos(2.f * neg_log_u1(r.x[base] >> 8));
                float sn, cs;
                sincos_u24(r.x[base + 1] >> 8, &sn, &cs);
                if (sizeof(D) == 4) { // f32: a + b z in f32 too (within an ulp or two of the double)
                    out[base] = store_d<D>(fmaf(bf, rad * cs, af));
                    out[base + 1] = store_d<D>(fmaf(bf, rad * sn, af));
                } else {
                    v[base] = a + b * (double)(rad * cs);
                    v[base + 1] = a + b * (double)(rad * sn);
                }
            }
            if (sizeof(D) == 2) {
#pragma unroll
                for (int k = 0; k < 4; k++) { // narrow type: redo in double where the rounding is in doubt
                    out[k] = store_d<D>(v[k]);
                    const double e = fabs(v[k] - a) * 0x1p-18;
                    if (bits_of<D>(store_d<D>(v[k] - e)) != bits_of<D>(store_d<D>(v[k] + e)))
                        out[k] = store_d<D>(a + b * normal_f64(r, k & 2, k & 1));
                }
            }
            const int64_t i0 = 4 * j;
            if (vec4 && i0 + 3 < n) {
                uint4 w;
                memcpy(&w, out, 16);
                *reinterpret_cast<uint4 *>(dst + i0) = w;
            } else if (sizeof(D) == 2 && i0 + 3 < n && ((uintptr_t)(dst + i0) & 7) == 0) {
                uint2 w;
                memcpy(&w, out, 8);
                *reinterpret_cast<uint2 *>(dst + i0) = w;
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++)
                    if (i0 + k < n) dst[i0 + k] = out[k];
            }
        }
    }
}

// Uniform and bernoulli fills of every dtype, and normals of f64 and integer dtypes (in double).
// A block covers a tile of blockDim * GPT groups per step: group tile + g * blockDim + thread,
// so each of a thread's GPT stores is coalesced across the warp.
template <typename D, int GPT>
__global__ void __launch_bounds__(256) philox_fill_kernel(D *__restrict__ dst, int64_t n, int kind, double a, double b,
                                                          uint64_t seed, uint64_t offset) {
    const int64_t groups = (n + 3) / 4, tile = (int64_t)blockDim.x * GPT;
    const int64_t step = tile * gridDim.x;
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    const bool vec4 = sizeof(D) == 4 && ((uintptr_t)dst & 15) == 0;
    for (int64_t t0 = (int64_t)blockIdx.x * tile + threadIdx.x; t0 < groups; t0 += step) {
#pragma unroll
        for (int g = 0; g < GPT; ++g) {
            const int64_t j = t0 + (int64_t)g * blockDim.x;
            if (j >= groups) break;
            zr_philox4 r = philox32(k0, k1, offset + (uint64_t)j);
            double v[4];
            D out[4];
            if (kind == 1) {
#pragma unroll
                for (int k = 0; k < 4; k++) v[k] = a + b * normal_f64(r, k & 2, k & 1);
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    float u = zr_u01(r.x[k]);
                    v[k] = kind == 0 ? a + (b - a) * (double)u : (double)((double)u < a);
                }
            }
#pragma unroll
            for (int k = 0; k < 4; k++) out[k] = store_d<D>(v[k]);
            const int64_t i0 = 4 * j;
            if (vec4 && i0 + 3 < n) {
                uint4 w;
                memcpy(&w, out, 16);
                *reinterpret_cast<uint4 *>(dst + i0) = w;
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++)
                    if (i0 + k < n) dst[i0 + k] = out[k];
            }
        }
    }
}

template <typename D>
int launch(void *dst, int64_t n, int kind, double a, double b, uint64_t seed, uint64_t offset, cudaStream_t s) {
    if (kind == 1 && fast_normal<D>::ok)
        philox_normal_kernel<D, RANDOM_NGPT><<<grid_for(((n + 3) / 4 + RANDOM_NGPT - 1) / RANDOM_NGPT, 256), 256, 0, s>>>(
            (D *)dst, n, a, b, make_keys(seed), offset);
    else
        philox_fill_kernel<D, RANDOM_GPT><<<grid_for(((n + 3) / 4 + RANDOM_GPT - 1) / RANDOM_GPT, 256), 256, 0, s>>>(
            (D *)dst, n, kind, a, b, seed, offset);
    return launch_check("random fill (cuda)");
}

}  // namespace

extern "C" int random_fill_cuda(void *dst, zr_dtype dt, int64_t n, int kind, double a, double b, uint64_t seed,
                                uint64_t offset, cudaStream_t stream) {
    if (n <= 0) return 0;
    switch (dt) {
    case ZR_F32: return launch<float>(dst, n, kind, a, b, seed, offset, stream);
    case ZR_BF16: return launch<__nv_bfloat16>(dst, n, kind, a, b, seed, offset, stream);
    case ZR_F16: return launch<__half>(dst, n, kind, a, b, seed, offset, stream);
    case ZR_F64: return launch<double>(dst, n, kind, a, b, seed, offset, stream);
    case ZR_I32: return launch<int32_t>(dst, n, kind, a, b, seed, offset, stream);
    case ZR_I64: return launch<int64_t>(dst, n, kind, a, b, seed, offset, stream);
    case ZR_U8: return launch<uint8_t>(dst, n, kind, a, b, seed, offset, stream);
    default: return zr_error("random fill (cuda): unknown dtype %d", (int)dt);
    }
}
