/* Pieces every Hopper GEMM kernel of ours shares (gemm_sm90.cu, and any other tile shape): the
 * epilogue kinds, operand descriptors, GELU, the 16-byte bf16 stores of accumulator fragments,
 * predicated loads, and the host's tensor-map encoding. Device code needs sm_90a. */
#ifndef ZR_CUDA_GEMM_SM90_CUH
#define ZR_CUDA_GEMM_SM90_CUH

#include <cuda.h>

#include "attention_sm90.cuh"
#include "attention_sm90.h"
#include "fused_common.cuh"

enum { GM_EPI_BF16 = 0, GM_EPI_GELU_AUX = 1, GM_EPI_F32 = 2 };

namespace sm90 {

/* The 128-byte-swizzle descriptor of an MN-major operand two 64-wide atoms across (N = 128): the
 * leading byte offset is the distance between the atoms (PTX ISA, "Leading Dimension Byte
 * Offset": MN-major, swizzled). */
static __device__ __forceinline__ uint64_t desc128_lbo(uint32_t a, uint32_t lbo) {
    return (desc128(a) & ~((uint64_t)0x3FFF << 16)) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16);
}

/* GELU, tanh form, as 0.5 (1 + tanh u) = sigmoid(2u) (kernels/cuda/elementwise.cu's gelu_tanh):
 * z / (1 + 2^(−2u log2 e)), the polynomial's constants folded with −2 log2 e; the special-function
 * unit's 2^x and reciprocal (each ~2^-22 relative), no IEEE reciprocal's refinement and slow-path
 * branch. Large negative z: 2^+inf = inf, 1 / inf = 0, so GELU gives −0. */
static __device__ __forceinline__ float gm_gelu(float z) {
    const float a = z * fmaf(-0.1029432395800235f, z * z, -2.302208198144325f);
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(1.f + ex2(a)));
    return z * r;
}

/* A quad's 4 x 4 words transposed: lane t's w[i] becomes lane i's w[t] (two xor-shuffle rounds,
 * 2 x 2 blocks then within them). */
static __device__ __forceinline__ void quad_transpose(uint32_t (&w)[4], int t4) {
    const bool o1 = t4 & 1, o2 = t4 & 2;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const uint32_t a0 = w[2 * k], a1 = w[2 * k + 1];
        const uint32_t r = __shfl_xor_sync(0xffffffffu, o1 ? a0 : a1, 1);
        w[2 * k] = o1 ? r : a0;
        w[2 * k + 1] = o1 ? a1 : r;
    }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
        const uint32_t a0 = w[b], a1 = w[2 + b];
        const uint32_t r = __shfl_xor_sync(0xffffffffu, o2 ? a0 : a1, 2);
        w[b] = o2 ? r : a0;
        w[2 + b] = o2 ? a1 : r;
    }
}

/* z: this lane's 4 bf16 pairs (word i of the quad's chunks i = 0..3, columns 2 t4, 2 t4 + 1 of
 * each); after the transpose the lane holds chunk t4 whole and stores its 16 bytes at dst when st.
 * Every lane of the warp must call it (the shuffles). */
static __device__ __forceinline__ void gm_store_chunk(uint16_t *dst, const float (&z)[8], int t4,
                                                      bool st) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        w[i] = cvt<__nv_bfloat16>::pack(z[2 * i], z[2 * i + 1]);
    quad_transpose(w, t4);
    if (st) /* one 16-byte store */
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(w[0]), "r"(w[1]),
                     "r"(w[2]), "r"(w[3])
                     : "memory");
}

/* x, y = the 2 floats at q when pr, else 0 (a predicated load: no branch). */
static __device__ __forceinline__ void ld_f32x2_or0(float &x, float &y, const float *q, bool pr) {
    asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\nmov.b32 %0, 0;\nmov.b32 %1, 0;\n"
                 "@q ld.global.v2.f32 {%0, %1}, [%3];\n}\n"
                 : "=f"(x), "=f"(y)
                 : "r"((int)pr), "l"(q));
}
/* x = the 4 bytes at q when pr, else 0. */
static __device__ __forceinline__ void ld_b32_or0(uint32_t &x, const void *q, bool pr) {
    asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %1, 0;\nmov.b32 %0, 0;\n@q ld.global.b32 %0, [%2];\n}\n"
                 : "=r"(x)
                 : "r"((int)pr), "l"(q));
}
} /* namespace sm90 */

/* ---- host side ---- */

/* The map of a row-major bf16 matrix of `outer` rows of `inner` elements (row stride ld), in
 * boxes of box_rows rows × 64 elements, 128-byte swizzled, zero fill past its edges. */
static int gm_map(CUtensorMap *m, const void *p, int64_t inner, int64_t outer, int64_t ld,
                  uint32_t box_rows) {
    const uint64_t row = (uint64_t)ld * 2, dims[4] = {(uint64_t)inner, (uint64_t)outer, 1, 1};
    const uint64_t strides[3] = {row, row * (uint64_t)outer, row * (uint64_t)outer};
    const uint32_t box[4] = {64, box_rows, 1, 1};
    return attn_sm90_tmap(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, p, dims, strides, box);
}

static bool al16p(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* ---- clusters: a 2-CTA GEMM multicasting the operand its CTAs share ---- */
namespace sm90 {
static __device__ __forceinline__ uint32_t cluster_rank() { /* this CTA's rank in its cluster */
    uint32_t r;
    asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
static __device__ __forceinline__ uint32_t cluster_id_x() {
    uint32_t r;
    asm("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
    return r;
}
static __device__ __forceinline__ uint32_t cluster_count_x() { /* clusters in the grid along x */
    uint32_t r;
    asm("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
    return r;
}
/* Every thread of the cluster: arrive (release), then wait (acquire) for the cluster's others. */
static __device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
/* Arrives (release, cluster scope) on the mbarrier at b's offset in CTA `cta` of the cluster. */
static __device__ __forceinline__ void mbar_arrive_cluster(uint64_t *b, uint32_t cta) {
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_u32(b)),
                 "r"(cta)
                 : "memory");
}
/* mbar_wait with acquire at cluster scope (for a phase that the other CTA's arrivals complete); the
 * retry loop inside the asm. */
static __device__ __forceinline__ void mbar_wait_cluster(uint64_t *b, uint32_t parity) {
    asm volatile("{\n.reg .pred p;\nGM_WAIT_%=:\n"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra GM_WAIT_%=;\n}\n" ::"r"(smem_u32(b)), "r"(parity)
                 : "memory");
}
/* tma_load4 multicast: the box lands at dst's offset in every CTA of the cluster whose bit is set
 * in mask, and completes its bytes on the mbarrier at bar's offset in each of them. */
static __device__ __forceinline__ void tma_load4_mc(void *dst, const void *map, uint64_t *bar, int c0,
                                                    int c1, int c2, int c3, uint16_t mask) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%3, %4, %5, %6}], [%2], %7;\n" ::"r"(smem_u32(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2),
                 "r"(c3), "h"(mask)
                 : "memory");
}
} /* namespace sm90 */

#endif
