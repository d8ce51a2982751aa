/* Causal GQA flash attention backward for Hopper (sm_90a) at head_dim 128: attention_bwd_sm90.cu's
 * design (a producer warp filling a ring of Q, dO, lse and D; two consumer warpgroups of 64 keys
 * each holding their keys' dK and dV in registers; a dQ warp reduce-adding dQ tiles; the same
 * persistent schedule of 128-key work items) with 64 queries a step instead of 128, as
 * FlashAttention-3 takes at this head_dim: dK and dV of 64 keys x 128 are 128 registers a thread,
 * which leaves room for S^T and dP^T of 64 keys x 64 queries (32 each) and no more. Every 128-wide
 * row is two 64-column atoms of the 128-byte swizzle (two TMA boxes a tile row), as in the forward
 * (attention_fwd_sm90_d128.cu).
 * A consumer step (warpgroup w, keys kv0 + 64w ..; one query tile of 64):
 *   S^T = K_w Q^T and dP^T = V_w dO^T, eight k = 16 steps each with both operands in shared memory
 *     (K_w and V_w as registers would take 64 more);
 *   P^T and dS^T = P^T o (dP^T - D) in registers; dS^T also into shared memory;
 *   dV += P^T dO and dK += dS^T Q (A from registers, two m64n64 products a k-step, one an atom);
 *   after a named barrier (the other warpgroup's dS^T rows), dQ for columns 64w .. 64w + 63 =
 *     dS K[:, 64w ..] over all 128 keys, staged for the dQ warp's reduce-add (two 64 x 32 boxes).
 * Barriers, phases and the release order are the head_dim-64 kernel's (its comment); the query
 * tiles of item j start at tile 2j (the key tile's first query), and the first two carry the
 * causal mask (the second only for warpgroup 1). A narrow head_dim W (attn_sm90_narrow) runs the
 * same tiles over W-wide maps (TMA's zero fill past W: those columns of S^T, dP^T add nothing and
 * those of dK, dV, dQ come out 0); dK, dV are stored W columns a row, the f32 dQ and dK/dV partials
 * stay 128 wide (attention.cu's last pass converts W of them). At 96 (KS = 6) the products skip those
 * columns: S^T, dP^T over six k-steps, dV's, dK's second halves and the second warpgroup's dQ n32
 * (n64 with packed sequences), whose zero box the dQ warp does not add. */
#include "attention_sm90.h"

#include "attention_bwd_sm90.cuh"
#include "attention_sched.h"
#include "fused_common.cuh" /* num_sms */

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_bwd_sm90_d128.cu needs -gencode arch=compute_90a,code=sm_90a (wgmma)"
#endif

using namespace sm90;

#define B8_ST 2  /* Q/dO/lse/D stages (three measured slower: tests/bench/RESULTS.md, session 55) */

/* Shared memory from a 1024-byte boundary: K and V tiles [2 atoms][128 keys][64]; B8_ST stages of Q
 * and of dO [2][64 queries][64]; two dS^T buffers [128 keys][64 queries]; the two warpgroups' dQ
 * tiles (64 x 64 f32, two 64 x 32 boxes each); lse, D rows; the mbarriers (kvfull, kvempty,
 * full[B8_ST], empty[B8_ST], dqfull[2], dqempty[2]). */
struct b8_smem {
    static constexpr int KATOM = WS_BN * 64 * 2, QATOM = WS_BM128 * 64 * 2; /* bytes */
    static constexpr int DSB = WS_BN * WS_BM128 * 2;
    static constexpr int K = 0, V = K + 2 * KATOM, Q = V + 2 * KATOM, DO = Q + B8_ST * 2 * QATOM;
    static constexpr int DS = DO + B8_ST * 2 * QATOM, DQ = DS + 2 * DSB;
    static constexpr int L = DQ + 2 * 64 * 64 * 4, D = L + B8_ST * WS_BM128 * 4;
    static constexpr int BAR = D + B8_ST * WS_BM128 * 4;
    static constexpr int BYTES = BAR + 8 * (2 + 2 * B8_ST + 4);
};
static_assert(b8_smem::BYTES <= 227 * 1024, "shared memory over the 227 KB a block may have");

/* Issues dV += P^T·dO and dK += dS^T·Q over the step's 64 queries (dO, Q: the stage's tiles; each
 * 128-wide accumulator as two 64-column halves, one an atom; N2 = 32: the second half's first 32
 * columns alone, a narrow head_dim's data) as one commit group, left in flight. */
template <typename T, int N2>
static __device__ __forceinline__ void dvdk_issue128(float (&dva)[2][32], float (&dka)[2][32],
                                                     const uint32_t (&pf)[4][4],
                                                     const uint32_t (&sf)[4][4], const sdesc &dO,
                                                     const sdesc &dQ) {
    reg_fence(dva[0]);
    reg_fence(dva[1]);
    reg_fence(dka[0]);
    reg_fence(dka[1]);
    wg_fence();
    static_assert(N2 == 64 || N2 == 32, "the second half is 64 or 32 columns");
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) {
        wg_rs64<T, 1>(dva[0], pf[kc], dO.at(kc * 2048), 1);
        if constexpr (N2 == 64) wg_rs64<T, 1>(dva[1], pf[kc], dO.at(b8_smem::QATOM + kc * 2048), 1);
        else wg_rs32<T, 1>(dva[1], pf[kc], dO.at(b8_smem::QATOM + kc * 2048), 1);
    }
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) {
        wg_rs64<T, 1>(dka[0], sf[kc], dQ.at(kc * 2048), 1);
        if constexpr (N2 == 64) wg_rs64<T, 1>(dka[1], sf[kc], dQ.at(b8_smem::QATOM + kc * 2048), 1);
        else wg_rs32<T, 1>(dka[1], sf[kc], dQ.at(b8_smem::QATOM + kc * 2048), 1);
    }
    wg_commit();
}

/* Issues d = A_w·B^T over head_dim 128 (KS k-steps, atom kk / 4: eight, or ceil(W / 16) where the
 * rest are TMA's zero columns) as one commit group: A_w this warpgroup's 64 rows of a 128-row tile
 * (a: their first row), B the stage's 64-row tile. */
template <typename T, int KS>
static __device__ __forceinline__ void sdp_issue(float (&d)[32], const sdesc &a, const sdesc &b) {
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
        wg_ss64<T, 0, 0>(d, a.at((kk >> 2) * b8_smem::KATOM + (kk & 3) * 32),
                         b.at((kk >> 2) * b8_smem::QATOM + (kk & 3) * 32), kk);
    wg_commit();
}

/* KS: the k-steps of S^T and dP^T that carry data (8; 6 at Phi-3's 96), 16·KS the columns of dK,
 * dV, dQ that do (the second 64-column halves' products n32 at 96) */
template <typename T, bool VL, int KS>
__global__ void __launch_bounds__(WS_THR, 1)
    attn_bwd_sm90_d128_kernel(uint16_t *__restrict__ dk, uint16_t *__restrict__ dv,
                              float *__restrict__ ws_dkv, const __grid_constant__ CUtensorMap tq,
                              const __grid_constant__ CUtensorMap tdo,
                              const __grid_constant__ CUtensorMap tk,
                              const __grid_constant__ CUtensorMap tv,
                              const __grid_constant__ CUtensorMap tdq, const float *__restrict__ nl2,
                              const float *__restrict__ Dd, zr_attn_strides sdk, zr_attn_strides sdv,
                              const int32_t *__restrict__ hi, int T_, int nQ, const ws_sched sc,
                              int Hq, int Hkv, int G, int nsplit, int64_t kv_elems, int W, float scale,
                              float scale_log2) {
    static_assert(KS == 8 || KS == 6, "head_dim 128, or 96's six k-steps");
    constexpr int N2 = 16 * KS - 64; /* the columns of the second half that carry data */
    const int nT = sc.nT;
    constexpr int KAE = b8_smem::KATOM / 2, QAE = b8_smem::QATOM / 2; /* elements of an atom */
    ZR_SMEM_1024(base);
    const ws_bufs m = ws_carve<b8_smem, B8_ST>(base);
    uint16_t *const sK = m.sK, *const sV = m.sV, *const sQ = m.sQ, *const sdO = m.sdO, *const sdS = m.sdS;
    float *const sL = m.sL, *const sD = m.sD;
    uint64_t *const kvfull = m.kvfull, *const full = m.full;

    const int tid = threadIdx.x, warp_id = warp_uniform(tid >> 5), lane = tid & 31;

    if (tid == 0) ws_init_bars<B8_ST>(kvfull);
    __syncthreads(); /* the last block-wide barrier: the roles part here */

    /* 24 + 2 · 240 = 504 registers a sub-partition */
    if (warp_id >= WS_PRODUCER) {
        ws_side_roles<VL, WS_BM128, 2, B8_ST, 24, 16 * KS>(
            warp_id, {&tq, &tdo, &tk, &tv, &tdq, nl2, Dd, hi, T_, nT, nQ, Hq, Hkv, G, nsplit}, sc, m, lane);
        return;
    }
    reg_alloc<240>();

    /* consumers */
    const int wg = warp_id >> 2, warp = warp_id & 3, g = lane >> 2, t4 = lane & 3;
    /* S^T's and dP^T's A: this warpgroup's 64 rows of each K / V atom; dQ's B: K's atom wg */
    const sdesc dKw(smem_u32(sK + wg * 64 * 64)), dVw(smem_u32(sV + wg * 64 * 64));
    const uint32_t aKd = smem_u32(sK + wg * KAE);
    int c = 0; /* the block's step */
    for (int r = 0, w; (w = ws_sched_item(sc, r, gridDim.x, blockIdx.x)) >= 0; ++r) {
        const ws_item t = ws_decode<VL, WS_BM128>(w, nT, nQ, Hkv, G, nsplit, hi, T_);
        const int kv0 = t.j * WS_BN;
        const int key0 = kv0 + wg * 64 + warp * 16 + g; /* this thread's keys: key0, key0 + 8 */
        int hi0 = T_, hi1 = T_; /* packed sequences: one past the last query of each key's */
        if (VL) {
            const int32_t *hr = hi + (size_t)t.b * T_;
            if (key0 < T_) hi0 = hr[key0];
            if (key0 + 8 < T_) hi1 = hr[key0 + 8];
        }
        const int himin = hi0 < hi1 ? hi0 : hi1;
        float dka[2][32], dva[2][32];
#pragma unroll
        for (int e = 0; e < 32; ++e)
            dka[0][e] = dka[1][e] = dva[0][e] = dva[1][e] = 0.f;
        mbar_wait(kvfull, r & 1);

        for (int it = 0, iq = 0; it < t.niter; ++it, ++c, iq = iq + 1 == t.nq ? 0 : iq + 1) {
            const int s = c % B8_ST;
            mbar_wait(&full[s], (c / B8_ST) & 1);
            const sdesc dQs(smem_u32(sQ + 2 * s * QAE)), dOs(smem_u32(sdO + 2 * s * QAE));
            const float *cL = sL + s * WS_BM128, *cD = sD + s * WS_BM128;
            uint16_t *cdS = sdS + (c & 1) * (b8_smem::DSB / 2); /* [key][query] */
            const int qc = (2 * t.j + iq) * WS_BM128;               /* the step's first query */

            float st[32], dpt[32]; /* overwritten by the first k-step (acc = 0) */
            reg_fence(st);
            reg_fence(dpt);
            wg_fence();
            sdp_issue<T, KS>(st, dKw, dQs);
            sdp_issue<T, KS>(dpt, dVw, dOs);
            float2 cols[8]; /* −lse·log2 e, then D, of this thread's query columns */
            load_cols(cols, cL + t4 * 2);
            wg_wait<1>(); /* S^T done, dP^T may still run */
            reg_fence(st);
            p_tile(st, cols, scale_log2);
            if (iq < 2) mask_tile(st, key0 - qc - t4 * 2);
            if (VL && qc + WS_BM128 > himin) mask_after(st, hi0 - qc - t4 * 2, hi1 - qc - t4 * 2);
            load_cols(cols, cD + t4 * 2);
            wg_wait<0>();
            reg_fence(dpt);
            uint32_t pf[4][4], sf[4][4];
            ds_pack<T>(dpt, st, cols, pf, sf, cdS, wg * 64 + warp * 16, lane);
            dvdk_issue128<T, N2>(dva, dka, pf, sf, dOs, dQs);
            fence_proxy_async();
            bar_sync(WS_BAR_DS, WS_CONS); /* the other warpgroup's dS^T rows are written too */

            float dq[32]; /* dQ[:, 64wg ..] = dS (64 queries × 128 keys) · K[:, 64wg ..] */
            /* columns 64.. of which 32 carry data (not with packed sequences: there ptxas serialises
             * the wgmma for want of registers, C7511, where the two shapes meet) */
            const bool dq32 = !VL && N2 < 64 && wg == 1;
            if (dq32) dq_issue<T, N2>(dq, smem_u32(cdS), aKd);
            else dq_issue<T>(dq, smem_u32(cdS), aKd);
            wg_wait<1>(); /* dV/dK products done: Q, dO, lse, D of stage s are read */
            reg_fence(dva[0]);
            reg_fence(dva[1]);
            reg_fence(dka[0]);
            reg_fence(dka[1]);
            reg_fence(pf);
            reg_fence(sf);
            ws_step_end(dq, m, s, c, it == t.niter - 1, wg, warp, lane, dq32);
        }

#pragma unroll
        for (int a = 0; a < 2; ++a)
            store_dkv<T, 128>(dk, dv, ws_dkv, dka[a], dva[a], sdk, sdv, t.b, t.hk, t.bhk, key0, t4, T_,
                              t.split, nsplit, kv_elems, scale, 64 * a, W);
    }
}

/* ---- host side ------------------------------------------------------------------------------ */

template <typename T>
static void bwd128_launch(const attn_sm90_bwd_maps &m, void *dk, void *dv, float *wkv,
                          const float *nl2, const float *Dd, const zr_attn_layout &L, int64_t B,
                          int64_t Hq, int64_t Hkv, int64_t T_, int64_t Dh, int ns, int64_t nkv,
                          float scale, cudaStream_t st) {
    auto kern = Dh == 96 ? (L.seg ? attn_bwd_sm90_d128_kernel<T, true, 6> : attn_bwd_sm90_d128_kernel<T, false, 6>)
                         : (L.seg ? attn_bwd_sm90_d128_kernel<T, true, 8> : attn_bwd_sm90_d128_kernel<T, false, 8>);
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, b8_smem::BYTES);
    const int nT = (int)((T_ + WS_BN - 1) / WS_BN), nQ = (int)((T_ + WS_BM128 - 1) / WS_BM128);
    const int nbh = (int)(B * Hkv * ns);
    const int blocks = attn_sm90_blocks(1, (int64_t)nbh * nT);
    const ws_sched sc = ws_schedule(nbh, nT, blocks);
    kern<<<blocks, WS_THR, b8_smem::BYTES, st>>>(
        (uint16_t *)dk, (uint16_t *)dv, wkv, m.q, m.dout, m.k, m.v, m.dq, nl2, Dd, L.dk, L.dv,
        L.seg ? L.seg + B * T_ : nullptr, (int)T_, nQ, sc, (int)Hq, (int)Hkv, (int)(Hq / Hkv), ns,
        nkv, (int)Dh, scale, scale * 1.4426950408889634f);
}

extern "C" void attn_sm90_backward128(const attn_sm90_bwd_maps *m, void *dk, void *dv, float *wkv,
                                      const float *nl2, const float *Dd, const zr_attn_layout *L,
                                      int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t Dh, int ns,
                                      int64_t nkv, float scale, zr_dtype dt, cudaStream_t st) {
    if (dt == ZR_BF16)
        bwd128_launch<__nv_bfloat16>(*m, dk, dv, wkv, nl2, Dd, *L, B, Hq, Hkv, T, Dh, ns, nkv, scale, st);
    else
        bwd128_launch<__half>(*m, dk, dv, wkv, nl2, Dd, *L, B, Hq, Hkv, T, Dh, ns, nkv, scale, st);
}
