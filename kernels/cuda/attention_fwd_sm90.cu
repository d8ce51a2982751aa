/* Causal GQA flash attention forward for Hopper (sm_90a), warp-specialised: a producer warpgroup
 * (one thread) loads Q and a 4-stage ring of K/V tiles with TMA (4-D maps over any (B, H, T, 64)
 * strides, 128-byte swizzle, rows past T zero-filled) onto mbarriers; three consumer warpgroups of
 * 64 queries each run wgmma (S = Q·K^T from shared memory, O += P·V with P from registers) and the
 * online softmax, each at its own pace: a stage is refilled once all twelve consumer warps have
 * released it. head_dim 64, bf16/f16. */
#include "attention_sm90.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <math.h>

#include "attention_sm90.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_fwd_sm90.cu needs -gencode arch=compute_90a,code=sm_90a (wgmma)"
#endif

using namespace sm90;

#define W_WG 3                   /* consumer warpgroups */
#define W_BM (64 * W_WG)         /* queries per block */
#define W_BN 128                 /* keys per tile */
#define W_ST 4                   /* K/V stages */
#define W_THR (W_WG * 128 + 128) /* consumers + the producer warpgroup */
#define W_LOG2E 1.4426950408889634f

/* grid: x = b*Hq + h, y = query tile counted from the last (heaviest first). Consumer warpgroup
 * w owns query rows 64w..64w+63 of the block's W_BM; key tiles of W_BN keys. Each
 * consumer iteration j issues S(j) = Q·K(j)^T, then O += P(j−1)·V(j−1), runs the softmax of tile
 * j while that product runs on the tensor cores, and releases stage j−1. */
template <typename T>
__global__ void __launch_bounds__(W_THR, 1)
    attn_fwd_ws_kernel(uint16_t *__restrict__ o, float *__restrict__ lse,
                       const __grid_constant__ CUtensorMap tq,
                       const __grid_constant__ CUtensorMap tk,
                       const __grid_constant__ CUtensorMap tv, zr_attn_strides so, int T_, int Hq,
                       int G, float scale_log2) {
    constexpr int BN = W_BN, NT = BN / 8, KC = BN / 16;
    extern __shared__ uint8_t smem_raw[];
    uint16_t *sQ = align1024(smem_raw);
    uint16_t *sK = sQ + W_BM * 64, *sV = sK + W_ST * BN * 64;
    uint64_t *barQ = reinterpret_cast<uint64_t *>(sV + W_ST * BN * 64);
    uint64_t *full = barQ + 1, *empty = full + W_ST;

    const int nQt = (T_ + W_BM - 1) / W_BM;
    const int qt = nQt - 1 - (int)blockIdx.y;
    const int bh = blockIdx.x, b = bh / Hq, h = bh % Hq;
    const int q0 = qt * W_BM;
    const int nkv = (min(T_, q0 + W_BM) + BN - 1) / BN;
    const int tid = threadIdx.x, wg = tid >> 7;
    if (tid == 0) {
        mbar_init(barQ, 1);
        for (int s = 0; s < W_ST; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 4 * W_WG);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == W_WG) { /* producer warpgroup: one thread issues every copy */
        reg_dealloc<24>();
        if (tid == W_WG * 128) {
            mbar_expect_tx(barQ, W_BM * 64 * 2);
            for (int w = 0; w < W_WG; ++w)
                tma_load4(sQ + w * 64 * 64, &tq, barQ, 0, q0 + 64 * w, h, b);
            for (int j = 0; j < nkv; ++j) {
                const int s = j % W_ST;
                if (j >= W_ST) mbar_wait(&empty[s], ((j / W_ST) - 1) & 1);
                mbar_expect_tx(&full[s], 2 * BN * 64 * 2);
                tma_load4(sK + s * BN * 64, &tk, &full[s], 0, j * BN, h / G, b);
                tma_load4(sV + s * BN * 64, &tv, &full[s], 0, j * BN, h / G, b);
            }
        }
        return;
    }

    reg_alloc<160>(); /* 128·24 + 384·160 registers: the whole file */
    const int warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int wrow0 = q0 + wg * 64, wlast = wrow0 + 63;
    /* last tile with a key <= this warpgroup's rows (a warpgroup whose rows are all past T
     * computes tile 0 and stores nothing: no branch around the wgmma code) */
    const int jmax = wrow0 >= T_ ? 0 : min(nkv - 1, wlast / BN);
    const uint32_t qa = smem_u32(sQ + wg * 64 * 64);
    const int qrow = wrow0 + warp * 16 + g; /* this thread's rows: qrow, qrow + 8 */

    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i)
        acc[i] = 0.f;
    uint32_t pf[KC][4];
#pragma unroll
    for (int kc = 0; kc < KC; ++kc)
        pf[kc][0] = pf[kc][1] = pf[kc][2] = pf[kc][3] = 0u;
    mbar_wait(barQ, 0);

    for (int j = 0; j <= jmax; ++j) {
        const int s = j % W_ST;
        mbar_wait(&full[s], (j / W_ST) & 1);
        const uint32_t ka = smem_u32(sK + s * BN * 64);
        float sc[4 * NT];
        reg_fence(acc);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            wg_ss128<T>(sc, desc128(qa + kk * 32), desc128(ka + kk * 32), kk);
        wg_commit();
        { /* O += P(j−1)·V(j−1) while this tile's softmax runs (at j = 0, P = 0 and stage 0) */
            const uint32_t vp = smem_u32(sV + (j ? (j - 1) % W_ST : 0) * BN * 64);
#pragma unroll
            for (int kc = 0; kc < KC; ++kc)
                wg_rs64<T, 1>(acc, pf[kc], desc128(vp + kc * 2048), 1);
            wg_commit();
        }
        wg_wait<1>();
        reg_fence(sc);
        float al0, al1, rs0, rs1;
        softmax_step<NT>(sc, m0, m1, al0, al1, rs0, rs1, j * BN + BN - 1 > wrow0, j * BN + t4 * 2,
                         qrow, scale_log2);
        wg_wait<0>();
        reg_fence(acc);
        if (j > 0 && lane == 0) mbar_arrive(&empty[(j - 1) % W_ST]);
        fwd_rescale(acc, l0, l1, al0, al1, rs0, rs1);
        pack_p<T>(pf, sc);
    }
    { /* PV of the last tile */
        const uint32_t vl = smem_u32(sV + (jmax % W_ST) * BN * 64);
        reg_fence(acc);
        reg_fence(pf);
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < KC; ++kc)
            wg_rs64<T, 1>(acc, pf[kc], desc128(vl + kc * 2048), 1);
        wg_commit();
        wg_wait<0>();
        reg_fence(acc);
        if (lane == 0) mbar_arrive(&empty[jmax % W_ST]);

        /* O through this warp's 16 rows of the (no longer read) Q tile, then 16-byte stores */
        fwd_epilogue<T>(acc, l0, l1, m0, m1, scale_log2, sQ, wg * 64 + warp * 16, q0,
                        o + b * so.sb + h * so.sh, so.st, lse + (size_t)bh * T_, T_, lane);
    }
    /* Tiles past this warpgroup's rows: release them once loaded, so the ring keeps turning for
     * the other warpgroups (an early release would count towards an older phase). */
    for (int j = jmax + 1; j < nkv; ++j) {
        mbar_wait(&full[j % W_ST], (j / W_ST) & 1);
        if (lane == 0) mbar_arrive(&empty[j % W_ST]);
    }
}

/* ---- host side ------------------------------------------------------------------------------ */

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn;
    static int tried;
    if (!tried) {
        tried = 1;
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}

extern "C" int attn_sm90_fwd_tma_ready(void) {
    return encode_fn() != NULL;
}

extern "C" int attn_sm90_tmap(CUtensorMap *m, CUtensorMapDataType ty, const void *base,
                              const uint64_t dims[4], const uint64_t strides[3],
                              const uint32_t box[4]) {
    if (!encode_fn()) return -1;
    cuuint64_t d[4] = {dims[0], dims[1], dims[2], dims[3]};
    cuuint64_t sb[3] = {strides[0], strides[1], strides[2]};
    cuuint32_t bx[4] = {box[0], box[1], box[2], box[3]}, es[4] = {1, 1, 1, 1};
    return encode_fn()(m, ty, 4, (void *)base, d, sb, bx, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                       CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? 0
               : -1;
}

extern "C" int attn_sm90_head_map(CUtensorMap *m, const void *base, const zr_attn_strides *sd,
                                  int64_t B, int64_t H, int64_t T_, int rows, zr_dtype dt) {
    const uint64_t dims[4] = {64, (uint64_t)T_, (uint64_t)H, (uint64_t)B};
    const uint64_t strides[3] = {(uint64_t)sd->st * 2, (uint64_t)sd->sh * 2, (uint64_t)sd->sb * 2};
    const uint32_t box[4] = {64, (uint32_t)rows, 1, 1};
    return attn_sm90_tmap(m, dt == ZR_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                          base, dims, strides, box);
}

template <typename T>
static int ws_launch(void *o, float *lse, const void *q, const void *k, const void *v,
                     const zr_attn_layout &L, int64_t B, int64_t Hq, int64_t Hkv, int64_t T_,
                     float scale, zr_dtype dt, cudaStream_t st) {
    CUtensorMap mq, mk, mv;
    if (attn_sm90_head_map(&mq, q, &L.q, B, Hq, T_, 64, dt) ||
        attn_sm90_head_map(&mk, k, &L.k, B, Hkv, T_, W_BN, dt) ||
        attn_sm90_head_map(&mv, v, &L.v, B, Hkv, T_, W_BN, dt))
        return -1;
    const int smem = (W_BM * 64 + 2 * W_ST * W_BN * 64) * 2 + 1024 + 8 * (1 + 2 * W_ST);
    auto kern = attn_fwd_ws_kernel<T>;
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    dim3 grid((unsigned)(B * Hq), (unsigned)((T_ + W_BM - 1) / W_BM));
    kern<<<grid, W_THR, smem, st>>>((uint16_t *)o, lse, mq, mk, mv, L.o, (int)T_, (int)Hq,
                                    (int)(Hq / Hkv), scale * W_LOG2E);
    return 0;
}

extern "C" int attn_sm90_forward(void *o, float *lse, const void *q, const void *k, const void *v,
                                 const zr_attn_layout *L, int64_t B, int64_t Hq, int64_t Hkv,
                                 int64_t T, float scale, zr_dtype dt, cudaStream_t st) {
    if (!encode_fn()) return -1;
    if (dt == ZR_BF16)
        return ws_launch<__nv_bfloat16>(o, lse, q, k, v, *L, B, Hq, Hkv, T, scale, dt, st);
    return ws_launch<__half>(o, lse, q, k, v, *L, B, Hq, Hkv, T, scale, dt, st);
}
