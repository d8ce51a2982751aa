// Philox fills on CUDA (see random.h). Each Philox call writes the 4 elements that
// share the counter, so each normal pair's Box-Muller is done once. f64 (and integer) outputs
// compute the normals in double exactly as runtime/random.c does. f32, bf16 and f16 outputs use
// f32 Box-Muller written to keep full f32 accuracy (log1pf of an exact quotient, sincospif of an
// exact argument: a few ulp of f32 from the double result; f32 also does a + b z in f32);
// bf16/f16 fall back to the double
// computation for the rare elements whose rounding to the narrow type that error could change,
// so those come out as the double path (and the CPU) gives them.
#include "common.cuh"
#include "philox.h"
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

// zr_philox (kernels/philox.h) with 32-bit multiplies (__umulhi and the low product): the same
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

#ifndef RANDOM_GPT
#define RANDOM_GPT 2 /* Philox groups (of 4 elements) per thread per tile */
#endif

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
            if (kind == 1 && fast_normal<D>::ok) {
#pragma unroll
                for (int base = 0; base < 4; base += 2) {
                    const uint32_t q1 = r.x[base] >> 8, q2 = r.x[base + 1] >> 8;
                    // -log(u1) with u1 = (q1 + 1) / (2^24 + 1): log1p of an exact quotient
                    const float t = log1pf((float)(16777216u - q1) / (float)(q1 + 1));
                    const float rad = sqrtf(2.f * t);
                    float sn, cs;
                    sincospif((float)q2 * (1.f / 8388608.f), &sn, &cs); // th = pi * (2 u2), exact
                    if (sizeof(D) == 4) { // f32: a + b z in f32 too (within an ulp or two of the double)
                        out[base] = store_d<D>(fmaf((float)b, rad * cs, (float)a));
                        out[base + 1] = store_d<D>(fmaf((float)b, rad * sn, (float)a));
                    } else {
                        v[base] = a + b * (double)(rad * cs);
                        v[base + 1] = a + b * (double)(rad * sn);
                    }
                }
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if (sizeof(D) == 4) continue;
                    out[k] = store_d<D>(v[k]);
                    if (sizeof(D) == 2) { // narrow type: redo in double where the rounding is in doubt
                        const double e = fabs(v[k] - a) * 0x1p-18;
                        if (bits_of<D>(store_d<D>(v[k] - e)) != bits_of<D>(store_d<D>(v[k] + e)))
                            out[k] = store_d<D>(a + b * normal_f64(r, k & 2, k & 1));
                    }
                }
            } else {
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
            }
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
