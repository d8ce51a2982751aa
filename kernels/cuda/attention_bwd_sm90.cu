/* Causal GQA flash attention backward for Hopper (sm_90a), warp-specialised in FlashAttention-3's
 * layout: a producer warp fills a 2-stage ring of Q, dO (TMA) and lse, D (cp.async) on mbarriers;
 * two consumer warpgroups of 64 keys each run S^T, dP^T, dV, dK and dQ with wgmma; a dQ warp adds
 * their dQ tiles from shared memory to the f32 accumulator with TMA reduce-adds. head_dim 64,
 * bf16/f16. Also the host-side checks the forward shares (which calls the Hopper kernels take). */
#include "attention_sm90.h"

#include "attention_bwd_sm90.cuh"
#include "attention_sched.h"
#include "fused_common.cuh" /* num_sms */

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_bwd_sm90.cu needs -gencode arch=compute_90a,code=sm_90a (wgmma)"
#endif

using namespace sm90;

/* Tiles: 128 keys per work item (64 per consumer warpgroup: each keeps its keys' dK, dV in
 * registers), 128 queries per step (two halves of 64, so that S^T and dP^T take 32 registers each).
 * FA3 uses the same 128×128 for head_dim 64. Shared memory: K, V 32 KB; Q, dO 2 × 32 KB; dS^T 2 ×
 * 32 KB; dQ 32 KB = 192 KB, which leaves no room for a third Q/dO stage nor a second K/V buffer
 * (227 KB per block). */
#define WS_BM 128              /* queries per step */
#define WS_ST 2                /* Q/dO/lse/D stages */
static_assert(WS_BM == WS_BN, "the diagonal tile's mask assumes square tiles");

/* Shared memory, in this order from a 1024-byte boundary (every tile a multiple of 1 KB). */
struct ws_smem {
    static constexpr int K = 0, V = K + WS_BN * 64 * 2, Q = V + WS_BN * 64 * 2;
    static constexpr int DO = Q + WS_ST * WS_BM * 64 * 2, DS = DO + WS_ST * WS_BM * 64 * 2;
    static constexpr int DQ = DS + 2 * WS_BN * WS_BM * 2; /* two dS^T buffers */
    static constexpr int L = DQ + 2 * 64 * 64 * 4;        /* dQ: 64×64 f32 per warpgroup */
    static constexpr int D = L + WS_ST * WS_BM * 4, BAR = D + WS_ST * WS_BM * 4;
    static constexpr int BYTES = BAR + 8 * (2 + 2 * WS_ST + 4);
};
static_assert(ws_smem::BYTES <= 227 * 1024, "shared memory over the 227 KB a block may have");

/* Persistent: grid = attn_sm90_blocks(1, items) blocks (one per SM, at most one per pair of items),
 * block blk runs items ws_sched_item(sc, r), r = 0, 1, ... (pairs of equal cost, neighbouring
 * heads at one time, then single tiles heaviest first: see attention_sched.h; against
 * heaviest-first over all heads dealt in rounds, session 12 measured GPT-2's MHA backward 1.29 ->
 * 1.04-1.07 ms and T = 8192 6.84 -> 6.60, the rest alike); every role walks the same item
 * sequence and keeps running counters across items: the block's step c (all items' steps in
 * order) picks ring stage c % WS_ST with phase (c / WS_ST) & 1, dQ buffer phase c & 1 and dS^T
 * buffer c & 1; the item count r gives the K/V barriers' phase r & 1.
 *   producer warp: per item, K and V (TMA, barrier kvfull; r > 0: after the item's first ring
 *     stage, once kvempty says the previous item's products have read K and V), and an L2 prefetch
 *     of the next item's K and V (each K/V tile is read by one item per split: from HBM); per step
 *     waits empty[s], then Q, dO (TMA) and lse, D rows (cp.async, zero past T) complete full[s]
 *     (1 + 32 arrivals). So the next item's first stage is in flight while the consumers finish
 *     the previous item (its slot was freed a step earlier), its K/V load while they store dK, dV,
 *     and its second stage (freed just before kvempty) queues behind K/V, which is needed first.
 *   consumer warpgroup w (keys kv0 + 64w ..), per item: waits kvfull, zeroes dK, dV, loads its K_w
 *     and V_w rows into registers (ldmatrix); per step and 64-query half, S^T = K_w Q^T and
 *     dP^T = V_w dO^T (A from those registers, B from shared memory), P^T, dS^T =
 *     P^T ∘ (dP^T − D) in registers; dV += P^T dO and dK += dS^T Q with A from registers; dS^T also
 *     to shared memory (buffer c & 1). Then one named barrier (the other warpgroup's dS^T rows),
 *     dQ for queries 64w.. of the tile = dS K over all 128 keys; the stage released once half 1's
 *     dV/dK products are done (empty[s], one arrival a warp); everything waited for (no wgmma
 *     crosses a loop's back edge); after the item's last step K and V released (kvempty, one
 *     arrival a warp: the dQ product is the last reader of K); dQ (f32) written to this
 *     warpgroup's swizzled buffer: dqfull[w] (128 arrivals). After the item: dK, dV stored.
 *   dQ warp: per step and warpgroup, waits dqfull[w], reduce-adds the 64×64 tile into dqacc (two
 *     64×32 boxes; rows past T skipped by the map), and once the copy has read shared memory
 *     releases the buffer: dqempty[w].
 * dS^T's double buffer needs no second barrier: a warpgroup writes buffer c & 1 again at c + 2,
 * after passing step c + 1's barrier, which the other one reaches only after its step c (and its
 * dQ product's reads of that buffer) completed. No phase of a barrier can be lapped: each
 * barrier's next phase needs an arrival from the side that waits on the current one (within a
 * warpgroup, the named barrier keeps warps less than a step apart). With one block per item
 * (attn_sm90_grid(.., -1)) this is the non-persistent kernel: item blockIdx.x, K/V first, no
 * prefetch. */
template <typename T, bool ROWS, bool VL>
__global__ void __launch_bounds__(WS_THR, 1)
    attn_bwd_sm90_kernel(uint16_t *__restrict__ dk, uint16_t *__restrict__ dv,
                       float *__restrict__ ws_dkv, const __grid_constant__ CUtensorMap tq,
                       const __grid_constant__ CUtensorMap tdo,
                       const __grid_constant__ CUtensorMap tk,
                       const __grid_constant__ CUtensorMap tv,
                       const __grid_constant__ CUtensorMap tdq, const float *__restrict__ nl2,
                       const float *__restrict__ Dd, zr_attn_strides sdk, zr_attn_strides sdv,
                       const int32_t *__restrict__ hi, int T_, const ws_sched sc, int Hq, int Hkv, int G, int nsplit,
                       int64_t kv_elems, float scale, float scale_log2) {
    const int nT = sc.nT;
    ZR_SMEM_1024(base);
    const ws_bufs m = ws_carve<ws_smem, WS_ST>(base);
    uint16_t *const sK = m.sK, *const sV = m.sV, *const sQ = m.sQ, *const sdO = m.sdO, *const sdS = m.sdS;
    float *const sL = m.sL, *const sD = m.sD;
    uint64_t *const kvfull = m.kvfull, *const full = m.full;

    const int tid = threadIdx.x, warp_id = warp_uniform(tid >> 5), lane = tid & 31;

    if (tid == 0) ws_init_bars<WS_ST>(kvfull);
    __syncthreads(); /* the last block-wide barrier: the roles part here */

    /* Registers: ptxas budgets 168 a thread for 12 warps (3 per SM sub-partition of 16,384);
     * setmaxnreg hands the producer warpgroup's back and gives the consumers 232 (40 + 2 · 232 =
     * 504 per sub-partition). ptxas allocates each branch for its setmaxnreg as long as the
     * branches do not merge again (the producer warpgroup returns). */
    if (warp_id >= WS_PRODUCER) {
        ws_side_roles<VL, WS_BM, 1, WS_ST, 40>(
            warp_id, {&tq, &tdo, &tk, &tv, &tdq, nl2, Dd, hi, T_, nT, nT, Hq, Hkv, G, nsplit}, sc, m, lane);
        return;
    }
    reg_alloc<232>();

    /* consumers */
    const int wg = warp_id >> 2, warp = warp_id & 3, g = lane >> 2, t4 = lane & 3;
    const uint32_t aK = smem_u32(sK);
    int c = 0; /* the block's step */
    for (int r = 0, w; (w = ws_sched_item(sc, r, gridDim.x, blockIdx.x)) >= 0; ++r) {
        const ws_item t = ws_decode<VL, WS_BM>(w, nT, nT, Hkv, G, nsplit, hi, T_);
        const int kv0 = t.j * WS_BN;
        const int key0 = kv0 + wg * 64 + warp * 16 + g; /* this thread's keys: key0, key0 + 8 */
        /* packed sequences: one past the last query of each key's sequence (none past T) */
        int hi0 = T_, hi1 = T_;
        if (VL) {
            const int32_t *hr = hi + (size_t)t.b * T_;
            if (key0 < T_) hi0 = hr[key0];
            if (key0 + 8 < T_) hi1 = hr[key0 + 8];
        }
        const int himin = hi0 < hi1 ? hi0 : hi1;
        float dka[32], dva[32];
#pragma unroll
        for (int e = 0; e < 32; ++e)
            dka[e] = dva[e] = 0.f;
        mbar_wait(kvfull, r & 1);
        /* this warpgroup's K and V rows as the register A operands of S^T and dP^T, the same for
         * every step of the item (from shared memory, the SS form read them again every step:
         * session 19 measured the backward 4-6% faster this way) */
        uint32_t kf[4][4], vf[4][4];
        a_frags_64(kf, sK, wg * 64, warp, lane);
        a_frags_64(vf, sV, wg * 64, warp, lane);

        /* iq: the step's query tile relative to the key tile (it % t.nq, counted: a division
         * a step cost more than the rest of the step's bookkeeping) */
        for (int it = 0, iq = 0; it < t.niter; ++it, ++c, iq = iq + 1 == t.nq ? 0 : iq + 1) {
            const int s = c % WS_ST;
            mbar_wait(&full[s], (c / WS_ST) & 1);
            const uint32_t aQ = smem_u32(sQ + s * WS_BM * 64),
                           adO = smem_u32(sdO + s * WS_BM * 64);
            const sdesc dQs(aQ), dOs(adO);
            const float *cL = sL + s * WS_BM, *cD = sD + s * WS_BM;
            uint16_t *cdS = sdS + (c & 1) * WS_BN * WS_BM; /* [half][key][query of the half] */
            const bool diag = iq == 0;

            uint32_t pf[4][4], sf[4][4]; /* A operands of the dV/dK products of the current half */
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                float st[32], dpt[32]; /* overwritten by the first k-step (acc = 0) */
                reg_fence(st);
                reg_fence(dpt);
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < 4; ++kk)
                    wg_rs64<T, 0>(st, kf[kk], dQs.at(hh * 64 * 128 + kk * 32), kk);
                wg_commit();
#pragma unroll
                for (int kk = 0; kk < 4; ++kk)
                    wg_rs64<T, 0>(dpt, vf[kk], dOs.at(hh * 64 * 128 + kk * 32), kk);
                wg_commit();
                /* S^T done, dP^T may still run; in half 1 also half 0's dV/dK products (the
                 * groups complete in order), so pf/sf, their A operands, may be overwritten below */
                float2 cols[8]; /* −lse·log2 e, then D, of this thread's query columns */
                load_cols(cols, cL + hh * 64 + t4 * 2);
                wg_wait<1>();
                reg_fence(st);
                if (hh == 1) {
                    reg_fence(pf);
                    reg_fence(sf);
                    reg_fence(dva);
                    reg_fence(dka);
                }
                p_tile(st, cols, scale_log2);
                if (diag) mask_tile(st, key0 - kv0 - hh * 64 - t4 * 2);
                if (VL) {
                    const int qc = (t.j + iq) * WS_BM + hh * 64; /* the half's first query */
                    if (qc + 64 > himin) mask_after(st, hi0 - qc - t4 * 2, hi1 - qc - t4 * 2);
                }
                load_cols(cols, cD + hh * 64 + t4 * 2);
                wg_wait<0>();
                reg_fence(dpt);
                ds_pack<T>(dpt, st, cols, pf, sf,
                           cdS + hh * WS_BN * 64 /* [key][query of this half] */,
                           wg * 64 + warp * 16, lane);
                dvdk_issue<T>(dva, dka, pf, sf, adO + hh * 64 * 128, aQ + hh * 64 * 128);
            }
            fence_proxy_async();
            bar_sync(WS_BAR_DS, WS_CONS); /* the other warpgroup's dS^T rows are written too */

            /* dQ rows 64wg .. +63 of the query tile: dS (64 queries × 128 keys, from half wg of
             * dS^T) · K */
            float dq[32]; /* overwritten by the first k-step */
            dq_issue<T>(dq, smem_u32(cdS + wg * WS_BN * 64), aK);
            wg_wait<1>(); /* half 1's dV/dK products done: Q, dO, lse, D of stage s are read */
            reg_fence(dva);
            reg_fence(dka);
            reg_fence(pf);
            reg_fence(sf);
            ws_step_end(dq, m, s, c, it == t.niter - 1, wg, warp, lane);
        }

        if constexpr (ROWS) { /* the warp's rows of the dS^T buffer no step uses until the next */
            uint16_t *fb = sdS + (c & 1) * WS_BN * WS_BM;
            store_dkv_rows<T>(dk, dv, dka, dva, sdk, sdv, t.b, t.hk, kv0 + wg * 64 + warp * 16,
                              fb, fb + WS_BN * 64, wg * 64 + warp * 16, T_, scale, lane);
        } else {
            store_dkv<T>(dk, dv, ws_dkv, dka, dva, sdk, sdv, t.b, t.hk, t.bhk, key0, t4, T_,
                         t.split, nsplit, kv_elems, scale);
        }
    }
}

/* ---- host side ------------------------------------------------------------------------------ */

static int g_force_fwd = -1, g_force_bwd = -1;

extern "C" void attn_sm90_force(int fwd, int bwd) {
    g_force_fwd = fwd;
    g_force_bwd = bwd;
}

static int g_grid_fwd, g_grid_bwd;

extern "C" void attn_sm90_grid(int fwd, int bwd) {
    g_grid_fwd = fwd;
    g_grid_bwd = bwd;
}

extern "C" int attn_sm90_blocks(int bwd, int64_t tiles) {
    const int cap = bwd ? g_grid_bwd : g_grid_fwd;
    if (cap < 0) return (int)tiles;
    const int n = cap > 0 ? cap : num_sms();
    if (tiles <= n) return (int)tiles; /* a block per tile */
    if (!bwd) return n;
    /* the backward's blocks run pairs of items (ws_sched_item): every block has one while there are
     * no more blocks than pairs */
    return (int)((tiles + 1) / 2 < n ? (tiles + 1) / 2 : n);
}

/* Compute capability 9.0 exactly (the sm_90a code runs nowhere else); cached per device. */
extern "C" int attn_sm90_device_ok(void) {
    static int cache[64]; /* 0 unknown, 1 yes, 2 no */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    if (!cache[dev]) {
        int ma = 0, mi = 0;
        cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev);
        cache[dev] = (ma == 9 && mi == 0) ? 1 : 2;
    }
    return cache[dev] == 1;
}

static int supported(int64_t Dh, zr_dtype dt) {
    return (Dh == 64 || Dh == 128 || attn_sm90_narrow(Dh)) && (dt == ZR_BF16 || dt == ZR_F16) &&
           attn_sm90_device_ok();
}

/* the forwards: head_dim 64 (attention_fwd_sm90.cu) and 128 or narrow (attention_fwd_sm90_d128.cu);
 * the backwards: 64 (here) and 128 or narrow (attention_bwd_sm90_d128.cu) */
extern "C" int attn_sm90_fwd_ok(int64_t Dh, zr_dtype dt) {
    return g_force_fwd != 0 && supported(Dh, dt) && attn_sm90_tma_ready();
}
extern "C" int attn_sm90_bwd_ok(int64_t Dh, zr_dtype dt) {
    return g_force_bwd != 0 && supported(Dh, dt) && attn_sm90_tma_ready();
}

/* Split while there are fewer than 200 items. Tuned for one block per item; kept for the persistent
 * grid, where it still lets few, long items spread (a model of the snake schedule on 132 SMs, in
 * 128×128 steps: B4 T512 H32/8, 128 items, 16 steps a block unsplit, 10 split twice, 9.7 the
 * average); issue 18's T >= 2048 and GPT-2 (G = 1) are not split. */
extern "C" int attn_sm90_bwd_nsplit(int64_t B, int64_t Hkv, int64_t G, int64_t T) {
    const int64_t blocks = B * Hkv * ((T + WS_BN - 1) / WS_BN);
    int ns = 1;
    while (G % (ns * 2) == 0 && blocks * ns < 200)
        ns *= 2;
    return ns;
}


extern "C" int attn_sm90_backward_maps(attn_sm90_bwd_maps *m, float *dqacc, const void *dout,
                                       const void *q, const void *k, const void *v,
                                       const zr_attn_layout *L, int64_t B, int64_t Hq, int64_t Hkv,
                                       int64_t T_, int64_t Dh, zr_dtype dt) {
    /* dqacc: (B, Hq, T, 64 or 128) f32 contiguous, reduce-added in boxes of 64 rows × 32 columns */
    const int64_t Dc = attn_sm90_width(Dh); /* a narrow head_dim's accumulator: 128 wide */
    const uint64_t qd[4] = {(uint64_t)Dc, (uint64_t)T_, (uint64_t)Hq, (uint64_t)B};
    const uint64_t qs[3] = {(uint64_t)Dc * 4, (uint64_t)(T_ * Dc) * 4, (uint64_t)(Hq * T_ * Dc) * 4};
    const uint32_t qb[4] = {32, 64, 1, 1};
    /* queries a step, keys an item: head_dim 64's kernel 128 and 128, 128's 64 and 128 */
    const int bm = Dc == 64 ? WS_BM : WS_BM128, bn = WS_BN;
    return attn_sm90_head_map(&m->q, q, &L->q, B, Hq, T_, Dh, bm, dt) ||
                   attn_sm90_head_map(&m->dout, dout, &L->dout, B, Hq, T_, Dh, bm, dt) ||
                   attn_sm90_head_map(&m->k, k, &L->k, B, Hkv, T_, Dh, bn, dt) ||
                   attn_sm90_head_map(&m->v, v, &L->v, B, Hkv, T_, Dh, bn, dt) ||
                   attn_sm90_tmap(&m->dq, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, dqacc, qd, qs, qb)
               ? -1
               : 0;
}

/* The kernel with store_dkv_rows as its epilogue runs when it can (unsplit items; dk, dv rows 16-byte
 * aligned: their bases and strides, the element stride within a row being 1 as for every Hopper
 * operand) and the items are short: T <= g_rows_max_t. Measured on the H200 at the power cap
 * (`ab_attention.sh --sustained`, sessions 35-36): GPT-2's shape (T = 1024) backward -7%, T = 2048
 * even; at T = 8192 this instance was +1.1-1.3% (its epilogue runs ~15 times an SM there, so its
 * main loop's code is the likelier cause), so T = 8192 keeps the other. */
static int64_t g_rows_max_t = 2048;

extern "C" int64_t attn_sm90_dkv_rows_max_t(int64_t t) {
    const int64_t was = g_rows_max_t;
    g_rows_max_t = t;
    return was;
}

static bool dkv_rows(const void *dk, const void *dv, const zr_attn_layout &L, int ns, int64_t T_) {
    const uint64_t a = (uintptr_t)dk | (uintptr_t)dv | (uint64_t)(L.dk.sb | L.dk.sh | L.dk.st) * 2 |
                       (uint64_t)(L.dv.sb | L.dv.sh | L.dv.st) * 2;
    return ns == 1 && (a & 15) == 0 && T_ <= g_rows_max_t;
}

template <typename T>
static void bwd_launch(const attn_sm90_bwd_maps &m, void *dk, void *dv, float *wkv,
                       const float *nl2, const float *Dd, const zr_attn_layout &L, int64_t B,
                       int64_t Hq, int64_t Hkv, int64_t T_, int ns, int64_t nkv, float scale,
                       cudaStream_t st) {
    const bool rows = dkv_rows(dk, dv, L, ns, T_);
    auto kern = L.seg ? (rows ? attn_bwd_sm90_kernel<T, true, true> : attn_bwd_sm90_kernel<T, false, true>)
                      : (rows ? attn_bwd_sm90_kernel<T, true, false> : attn_bwd_sm90_kernel<T, false, false>);
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, ws_smem::BYTES);
    /* the tile and item counts as arguments, not derived in the kernel: a value computed before the
     * roles part is live across setmaxnreg, where ptxas spills it */
    const int nT = (int)((T_ + WS_BN - 1) / WS_BN), nbh = (int)(B * Hkv * ns);
    const int blocks = attn_sm90_blocks(1, (int64_t)nbh * nT);
    const ws_sched sc = ws_schedule(nbh, nT, blocks);
    kern<<<blocks, WS_THR, ws_smem::BYTES, st>>>(
        (uint16_t *)dk, (uint16_t *)dv, wkv, m.q, m.dout, m.k, m.v, m.dq, nl2, Dd, L.dk, L.dv,
        L.seg ? L.seg + B * T_ : nullptr, (int)T_, sc, (int)Hq, (int)Hkv, (int)(Hq / Hkv), ns, nkv, scale,
        scale * 1.4426950408889634f);
}

extern "C" void attn_sm90_backward(const attn_sm90_bwd_maps *m, void *dk, void *dv, float *wkv,
                                   const float *nl2, const float *Dd, const zr_attn_layout *L,
                                   int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t Dh, int ns,
                                   int64_t nkv, float scale, zr_dtype dt, cudaStream_t st) {
    if (Dh > 64)
        attn_sm90_backward128(m, dk, dv, wkv, nl2, Dd, L, B, Hq, Hkv, T, Dh, ns, nkv, scale, dt, st);
    else if (dt == ZR_BF16)
        bwd_launch<__nv_bfloat16>(*m, dk, dv, wkv, nl2, Dd, *L, B, Hq, Hkv, T, ns, nkv, scale, st);
    else
        bwd_launch<__half>(*m, dk, dv, wkv, nl2, Dd, *L, B, Hq, Hkv, T, ns, nkv, scale, st);
}
