/* The mma.sync attention kernels' tiles (attention.cu) and their device helpers: cp.async,
 * ldmatrix, the m16n8k16 mma and element packing per 16-bit type, the XOR swizzle of shared-memory
 * tiles, tile loads and fragment loads from them. CUDA C++ only; attention.cu alone includes it. */
#ifndef ZR_CUDA_ATTENTION_MMA_CUH
#define ZR_CUDA_ATTENTION_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "ptx_copy.cuh"

extern "C" {
#include "../base/error.h"
}

#define ATT_BLK 64 /* queries and keys per tile */
#define ATT_THREADS 128
#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f

/* ---- PTX helpers ---------------------------------------------------------------------------- */

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::ldsm_x4;
using ptx::ldsm_x4_t;
using ptx::smem_u32;

/* Per element type: packing two floats into an A fragment register and the mma itself. */
template <typename T> struct mma_t;
template <> struct mma_t<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ float to_f(uint16_t h) {
        return __uint_as_float((uint32_t)h << 16);
    }
    static __device__ __forceinline__ uint16_t from_f(float f) {
        __nv_bfloat16 v = __float2bfloat16_rn(f);
        return *reinterpret_cast<uint16_t *>(&v);
    }
};
template <> struct mma_t<__half> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ float to_f(uint16_t h) {
        return __half2float(*reinterpret_cast<__half *>(&h));
    }
    static __device__ __forceinline__ uint16_t from_f(float f) {
        __half v = __float2half_rn(f);
        return *reinterpret_cast<uint16_t *>(&v);
    }
};

/* The zr_dtype of an element type. */
template <typename T> struct mma_dtype;
template <> struct mma_dtype<__nv_bfloat16> { static constexpr zr_dtype value = ZR_BF16; };
template <> struct mma_dtype<__half> { static constexpr zr_dtype value = ZR_F16; };

/* Swizzled index of (row, col) in a tile with D columns: the 16-byte chunk index is XORed with
 * row % 8 so that ldmatrix's 8 row addresses fall in 8 different bank groups. */
template <int D> static __device__ __forceinline__ int swz(int row, int col) {
    return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

/* cp.async a 64×D tile starting at row0 of a (T, D) matrix; rows >= T are zero-filled. */
template <int D>
static __device__ __forceinline__ void load_tile(uint16_t *s, const uint16_t *g, int row0, int T,
                                                 int tid) {
#pragma unroll
    for (int c = tid; c < ATT_BLK * D / 8; c += ATT_THREADS) {
        int row = c / (D / 8), ch = c % (D / 8);
        int gr = row0 + row;
        const uint16_t *src = g + (size_t)(gr < T ? gr : 0) * D + ch * 8;
        cp_async16(s + row * D + ((ch ^ (row & 7)) << 3), src, gr < T ? 16 : 0);
    }
}

/* A fragment (16×16) at (r0, c0) of a swizzled row-major tile. */
template <int D>
static __device__ __forceinline__ void lds_a(uint32_t a[4], const uint16_t *s, int r0, int c0,
                                             int lane) {
    ldsm_x4(a, s + swz<D>(r0 + (lane & 7) + ((lane >> 3) & 1) * 8, c0 + (lane >> 4) * 8));
}
/* B fragments of two n-tiles (n0, n0+8) × k16 at k0 from a tile stored [n][k]. */
template <int D>
static __device__ __forceinline__ void lds_b_nk(uint32_t b[4], const uint16_t *s, int n0, int k0,
                                                int lane) {
    ldsm_x4(b, s + swz<D>(n0 + (lane & 7) + (lane >> 4) * 8, k0 + ((lane >> 3) & 1) * 8));
}
/* B fragments of two n-tiles (n0, n0+8) × k16 at k0 from a tile stored [k][n] (transposed). */
template <int D>
static __device__ __forceinline__ void lds_b_kn(uint32_t b[4], const uint16_t *s, int k0, int n0,
                                                int lane) {
    ldsm_x4_t(b, s + swz<D>(k0 + (lane & 7) + ((lane >> 3) & 1) * 8, n0 + (lane >> 4) * 8));
}

#endif
