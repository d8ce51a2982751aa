/* Causal GQA flash attention forward for Hopper (sm_90a) in FlashAttention-3's layout: a producer
 * warp loads Q and a ring of K/V tiles by TMA (4-D maps over any (B, H, T, 64) strides, 128-byte
 * swizzle, rows past T zero-filled); three (or two) consumer warpgroups of 64 queries each run the
 * softmax of key tile j + 1 while the tensor cores run P·V of tile j (and the other warpgroups'
 * products). head_dim 64, bf16/f16. Also the tensor-map helpers the backward shares. */
#include "attention_sm90.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include "attention_sm90.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_fwd_sm90.cu needs -gencode arch=compute_90a,code=sm_90a (wgmma)"
#endif

using namespace sm90;

/* Tiles: 64 queries per consumer warpgroup (192 or 128 a tile), 128 keys per step. A warpgroup's
 * 64 rows start at a multiple of 64, so they lie in one 128-key tile, their diagonal: the only one
 * they need masked; a tile's key tiles past it (at most one, with 192 rows) they release unread.
 * The consumers need room for S (64 registers), O (32) and P (32) at once, which the overlap needs:
 * setmaxnreg gives them 240 of 24 + 2 · 240 (or 160 of 24 + 3 · 160) ≤ 512 per SM sub-partition.
 * A stage holds K and V of one tile (32 KB); a consumer holds two stages at a time (V of j, K of
 * j + 1), so the ring needs three to keep a load ahead; four fit next to two Q buffers (2 · 24 +
 * 128 KB). Measured (H100, bursts, B4 H32/8; session 66): the forward in 192-query tiles against
 * 128, T512 0.025 -> 0.024 ms, T2048 0.193 -> 0.172, T8192 2.476 -> 2.162, GPT-2's B64 H12 T1024
 * 0.386 -> 0.363: a third fewer K/V tiles from L2 a query, and a third warpgroup's softmax beside
 * the other two's products. */
#define F2_BN SM90_FWD_TILE /* keys a step */
#define F2_ST 4
#define F2_LOG2E 1.4426950408889634f
static_assert((F2_ST & (F2_ST - 1)) == 0, "the ring's stage and phase are the count's low bits");

/* NW consumer warpgroups of 64 queries each: a tile of 64·NW queries, NW = 3 (FlashAttention-3's
 * tile at head_dim 64) or 2 (T <= 128, where a third warpgroup would have no rows). ptxas compiles
 * the consumers' code to setmaxnreg's count (160 with three), not to the launch's (128 at 512
 * threads), unless that code holds a trap (see the softmax pin below): the two-warpgroup kernel's
 * trap holds its consumers to the launch's 168, which they fit. */
template <int NW> struct f2_cfg {
    static constexpr int BM = 64 * NW, CONS = 128 * NW, THR = CONS + 128, PRODUCER = CONS / 32;
    static constexpr int NREG = NW == 2 ? 240 : 160;
    static_assert(NW == 2 || NW == 3, "two or three consumer warpgroups");
};

/* Shared memory from a 1024-byte boundary: two Q tiles (BM rows each), F2_ST stages of K and V,
 * the mbarriers (qfull[2], qempty[2], full[F2_ST], empty[F2_ST]). */
template <int NW> struct f2_smem {
    static constexpr int QT = f2_cfg<NW>::BM * 64 * 2, KV = F2_BN * 64 * 2; /* bytes of a Q, a K tile */
    static constexpr int Q = 0, K = Q + 2 * QT, V = K + F2_ST * KV, BAR = V + F2_ST * KV;
    static constexpr int BYTES = BAR + 8 * (4 + 2 * F2_ST);
    static_assert(BYTES <= 227 * 1024, "shared memory over the 227 KB a block may have");
};

/* Persistent (FlashAttention-3's design): gridDim.x = attn_sm90_blocks(0, tiles) blocks, one per SM
 * by default (176 KB of shared memory: one block an SM), one per tile with attn_sm90_grid(-1, ..),
 * which is the non-persistent kernel (each block's round 0 only, in today's order). Block i runs
 * the tiles fwd_tile_id(n), n = 0, 1, .. (heaviest first, dealt to the blocks in rounds of gridDim.x,
 * every other round in reverse): a static schedule every role computes alike. It balances well
 * enough: tile costs (key steps) never increase with t, so within a round a block's tile
 * costs at most its neighbour's before it; dealing every other round backwards pairs the heavier
 * half of one round with the lighter half of the next. Busiest block against the mean (key steps +
 * half a step a tile, 132 blocks): B4 H32/8 T512 +3.1%, T2048 +3.1%, T8192 +0.0%, B64 H12 T1024
 * +0.3%; dealt in block order every round, T8192 +1.5% and T1024 +1.6%; an atomic tile counter
 * (greedy) +3.1%, +0.3%, +0.0%, +0.3% — not worth the hand-over of each tile id (figures for
 * 128-query tiles). A tile (b, h, qt) owns queries q0 = BM qt .. + BM − 1 and key tiles kt = kt_hi,
 * kt_hi − 1, .., 0 in that order, kt_hi the one holding its last row before T; a warpgroup starts at
 * its diagonal (so its running maxima start finite and no later tile needs a mask), releasing the
 * tile before it unread, and one with no row before T releases every load unread. With
 * packed sequences (VL: seg) the key tiles stop at the one holding the start of the first query's
 * sequence (fwd_first_key_tile_at), and a tile before a row's own start masks those keys (mask_before;
 * the diagonal, first, holds each row's own key, so the maxima still start finite).
 * Counters that run across a block's tiles, computed identically by every role: n, the block's
 * tile count (Q buffer n % 2, its n / 2-th use), and kv, the K/V tiles of its earlier tiles (key step
 * it of the tile is ring load j = kv + it: stage j % F2_ST, its j / F2_ST-th use).
 *   producer warp, lane 0, per tile: waits qempty[n % 2] (phase n / 2 − 1: the epilogue of tile
 *     n − 2 no longer uses the buffer; skipped for n < 2), loads Q (qfull[n % 2]); then per step
 *     waits empty[j % F2_ST] (phase j / F2_ST − 1: load j − F2_ST released; skipped for j < F2_ST),
 *     loads K and V (full[j % F2_ST]). So tile n + 1's Q and first K/V load while tile n's last
 *     products and epilogue run.
 *   consumer warpgroup w (queries q0 + 64w ..), per tile: for each load before its diagonal waits
 *     full and releases it (empty); waits qfull[n % 2] (phase n / 2);
 *     S_0 = Q·K_0^T, its softmax (masked) → P_0; then per step it ≥ 1 waits full (phase
 *     j / F2_ST), issues S_it = Q·K_it^T and O += P_{it−1}·V_{it−1}, waits for S_it alone, runs
 *     its softmax while P·V runs, waits for P·V, releases load j − 1 (empty, one arrival a warp)
 *     and rescales O and l; P·V of the last tile after the loop, and its release. No wgmma is in
 *     flight across either loop's back edge. The epilogue stages O through the warp's 16 rows of
 *     the tile's Q buffer (only its own warpgroup's S products read them, all done); once the
 *     staged rows are back in registers each thread fences its shared-memory accesses against
 *     the async proxy (the TMA that reloads the buffer), the warp syncs, lane 0 arrives on
 *     qempty[n % 2] (4·NW arrivals a phase), and only then go O's global stores. A warpgroup with
 *     no row before T waits full and releases each of the tile's loads, then waits qfull and
 *     arrives on qempty (a release before its load's full would count toward the buffer's
 *     previous phase).
 * No deadlock: a wait only needs arrivals that precede it in the other roles' program order —
 * the producer issues everything tile n's consumers wait for (its Q, then its K/V loads in order)
 * before any wait of its own that needs tile n's consumers (qempty of tile n − 1 is waited for
 * before tile n + 1's Q; empty of load j − F2_ST before load j, released at step j − F2_ST + 1 ≤
 * j − 3 or at the end of that load's tile, needing no load past j − 3). Parities are never
 * ambiguous: no barrier runs two phases ahead of a waiter, as each reuse of a buffer waits for
 * the release of its previous use.
 * Rows past T in a warpgroup that has rows before T are computed (their keys past T are TMA's zero
 * fill, so everything stays finite) and not stored; keys past T only meet rows past T (key > row is
 * masked on the diagonal).
 * No ping-pong: FlashAttention-3 has each warpgroup issue its products only in its turn (a named
 * barrier a group: bar.sync, issue, bar.arrive for the other), so that one's softmax runs under the
 * other's products. At head_dim 64 the exponentials cost as much as the products, the turn put each
 * issue on the other warpgroup's critical path, and without it (session 18, `bench_fused attention`,
 * alternating binaries) the forward ran 2-4% faster: B4 T2048 0.185 -> 0.180 ms, GPT-2's shape
 * 0.324 -> 0.315, T8192 within noise. (The turns: `git show a2f9a48^:kernels/cuda/
 * attention_fwd_sm90.cu`.) */
template <typename T, bool VL, int NW>
__global__ void __launch_bounds__(f2_cfg<NW>::THR, 1)
    attn_fwd_sm90_kernel(uint16_t *__restrict__ o, float *__restrict__ lse,
                        const __grid_constant__ CUtensorMap tq,
                        const __grid_constant__ CUtensorMap tk,
                        const __grid_constant__ CUtensorMap tv, zr_attn_strides so,
                        const int32_t *__restrict__ seg, int T_, int B, int Hq, int G,
                        float scale_log2, int qoff) {
    using C = f2_cfg<NW>;
    using SM = f2_smem<NW>;
    ZR_SMEM_1024(base);
    uint16_t *sQ = reinterpret_cast<uint16_t *>(base + SM::Q);
    uint16_t *sK = reinterpret_cast<uint16_t *>(base + SM::K);
    uint16_t *sV = reinterpret_cast<uint16_t *>(base + SM::V);
    uint64_t *qfull = reinterpret_cast<uint64_t *>(base + SM::BAR);
    uint64_t *qempty = qfull + 2, *full = qempty + 2, *empty = full + F2_ST;

    const int nQt = (T_ + C::BM - 1) / C::BM, BH = B * Hq, ntiles = BH * nQt;
    /* tid >> 5, not warp_uniform (the GEMMs' and the backward's): with it this kernel ran 4-5% slower
     * under load at the same cycles at the base clock (session 29, B4 H32/8 T2048/T8192, GPT-2's shape) */
    const int tid = threadIdx.x, warp_id = tid >> 5, lane = tid & 31;
    if ((int)blockIdx.x >= ntiles) return; /* the whole block: no tile, no barrier used */
    if (tid == 0) {
        mbar_init_ring(qfull, qempty, 2, C::CONS / 32);
        mbar_init_ring(full, empty, F2_ST, C::CONS / 32);
        mbar_init_fence();
    }
    __syncthreads(); /* the last block-wide barrier: the roles part here and never merge again */

    if (warp_id >= C::PRODUCER) {
        reg_dealloc<24>();
        if (warp_id == C::PRODUCER && lane == 0) {
            unsigned j = 0; /* ring loads so far */
            for (int n = 0, t = fwd_tile_id(0); t < ntiles; t = fwd_tile_id(++n)) {
                const fwd_tile w(t, BH, nQt, Hq);
                const unsigned qb = n & 1;
                if (n >= 2) mbar_wait(&qempty[qb], ((n >> 1) - 1) & 1);
                const int q0 = w.qt * C::BM - qoff; /* < 0 in a tile before row 0: zero fill */
                mbar_expect_tx(&qfull[qb], SM::QT);
                tma_load4(sQ + qb * C::BM * 64, &tq, &qfull[qb], 0, q0, w.h, w.b);
                const int kt0 = VL ? fwd_first_key_tile_at(seg, w.b, q0 > 0 ? q0 : 0, T_) : 0;
                for (int kt = fwd_last_key_tile(q0, C::BM, T_); kt >= kt0; --kt, ++j) {
                    const unsigned s = j % F2_ST;
                    if (j >= F2_ST) mbar_wait(&empty[s], ((j / F2_ST) - 1) & 1);
                    mbar_expect_tx(&full[s], 2 * SM::KV);
                    tma_load4(sK + s * F2_BN * 64, &tk, &full[s], 0, kt * F2_BN, w.h / G, w.b);
                    tma_load4(sV + s * F2_BN * 64, &tv, &full[s], 0, kt * F2_BN, w.h / G, w.b);
                }
            }
        }
        return;
    }
    reg_alloc<C::NREG>();

    const int wg = warp_id >> 2, warp = warp_id & 3, g = lane >> 2, t4 = lane & 3;
    unsigned kv = 0; /* the producer's j at this tile's first load */
    for (int n = 0, t = fwd_tile_id(0); t < ntiles; t = fwd_tile_id(++n)) {
        const fwd_tile w(t, BH, nQt, Hq);
        const int q0 = w.qt * C::BM - qoff, r0 = q0 + wg * 64;
        const int kt_hi = fwd_last_key_tile(q0, C::BM, T_);
        const int nkv = kt_hi + 1 - (VL ? fwd_first_key_tile_at(seg, w.b, q0 > 0 ? q0 : 0, T_) : 0);
        if (r0 >= T_ || r0 < 0) { /* no row in 0..T-1: every load released unread */
            for (int it = 0; it < nkv; ++it) {
                mbar_wait(&full[(kv + it) % F2_ST], ((kv + it) / F2_ST) & 1);
                if (lane == 0) mbar_arrive(&empty[(kv + it) % F2_ST]);
            }
            mbar_wait(&qfull[n & 1], (n >> 1) & 1);
            if (lane == 0) mbar_arrive(&qempty[n & 1]);
            kv += nkv;
            continue;
        }
        /* the warpgroup's diagonal key tile qt: 64 rows from a multiple of 64 lie in one 128-key
         * tile; the tile's key tiles past it (at most one, with 192 rows) are all masked for these
         * rows, so released unread */
        const int qt = r0 / F2_BN, skip = kt_hi - qt;
        for (int it = 0; it < skip; ++it) {
            mbar_wait(&full[(kv + it) % F2_ST], ((kv + it) / F2_ST) & 1);
            if (lane == 0) mbar_arrive(&empty[(kv + it) % F2_ST]);
        }
        kv += skip;
        uint16_t *sQb = sQ + (n & 1) * C::BM * 64;
        const int qrow = r0 + warp * 16 + g; /* this thread's rows: qrow, qrow + 8 */
        /* packed sequences: the first key of each of the rows' sequences (0 past T), and the key
         * tiles before the last one that starts at or after the higher of them need no mask */
        int lo0 = 0, lo1 = 0;
        if (VL) rows_lo(seg, w.b, qrow, T_, lo0, lo1);
        const int lomax = lo0 > lo1 ? lo0 : lo1;
        const uint32_t qa = smem_u32(sQb + wg * 64 * 64);
        float m0 = -INFINITY, m1 = -INFINITY, l0, l1, al0, al1, rs0, rs1;
        float acc[32], sc[64];
        uint32_t pf[8][4];
#pragma unroll
        for (int i = 0; i < 32; ++i)
            acc[i] = 0.f;
        /* The products' descriptors, made ahead of their issue (ds, dv: a stage's K and V) as a
         * base plus offsets: ptxas had interleaved ~90 instructions of descriptor arithmetic with
         * the wgmma instructions (it still moves each into uniform registers right before use). */
        const sdesc dq0(qa);
        /* NW = 2: held, 32 registers; NW = 3 (160 registers): made at each issue, which measured
         * faster than holding them there (session 66, B4 H32/8 T8192: 2.162 vs 2.326 ms) */
        constexpr bool PRE = NW == 2;
        uint64_t ds[PRE ? 8 : 1], dv[PRE ? 8 : 1];
        uint32_t ka_ = 0, va_ = 0;
        auto desc_s = [&](uint32_t ka) { /* ds[2kk], ds[2kk + 1]: Q and K of k-step kk */
            if constexpr (PRE) {
                const sdesc dk0(ka);
#pragma unroll
                for (int kk = 0; kk < 4; ++kk) {
                    ds[2 * kk] = dq0.at(kk * 32);
                    ds[2 * kk + 1] = dk0.at(kk * 32);
                }
                reg_fence(ds);
            } else {
                ka_ = ka;
            }
        };
        auto desc_pv = [&](uint32_t va) { /* dv[kc]: the rows 16kc.. of V */
            if constexpr (PRE) {
                const sdesc dv0(va);
#pragma unroll
                for (int kc = 0; kc < 8; ++kc)
                    dv[kc] = dv0.at(kc * 2048);
                reg_fence(dv);
            } else {
                va_ = va;
            }
        };
        auto issue_s = [&]() { /* sc = Q·K^T (64×128) */
            if constexpr (PRE) {
#pragma unroll
                for (int kk = 0; kk < 4; ++kk)
                    wg_ss128<T>(sc, ds[2 * kk], ds[2 * kk + 1], kk);
            } else {
                const sdesc dk0(ka_);
#pragma unroll
                for (int kk = 0; kk < 4; ++kk)
                    wg_ss128<T>(sc, dq0.at(kk * 32), dk0.at(kk * 32), kk);
            }
            wg_commit();
        };
        auto issue_pv = [&]() { /* acc += P·V (64×64) */
            if constexpr (PRE) {
#pragma unroll
                for (int kc = 0; kc < 8; ++kc)
                    wg_rs64<T, 1>(acc, pf[kc], dv[kc], 1);
            } else {
                const sdesc dv0(va_);
#pragma unroll
                for (int kc = 0; kc < 8; ++kc)
                    wg_rs64<T, 1>(acc, pf[kc], dv0.at(kc * 2048), 1);
            }
            wg_commit();
        };

        /* step 0: the diagonal tile (load kv) */
        mbar_wait(&qfull[n & 1], (n >> 1) & 1);
        mbar_wait(&full[kv % F2_ST], (kv / F2_ST) & 1);
        {
            desc_s(smem_u32(sK + (kv % F2_ST) * F2_BN * 64));
            wg_fence();
            issue_s();
            wg_wait<0>();
            reg_fence(sc);
            if (VL && qt * F2_BN < lomax) mask_before<16>(sc, qt * F2_BN + t4 * 2, lo0, lo1);
            softmax_step<16>(sc, m0, m1, al0, al1, rs0, rs1, true, qt * F2_BN + t4 * 2, qrow,
                             scale_log2);
            l0 = rs0;
            l1 = rs1;
            pack_a<T, 8>(pf, sc);
        }

        for (int it = 1; it < nkv - skip; ++it) {
            const unsigned j = kv + it, s = j % F2_ST, sp = (j - 1) % F2_ST;
            mbar_wait(&full[s], (j / F2_ST) & 1);
            desc_s(smem_u32(sK + s * F2_BN * 64));
            desc_pv(smem_u32(sV + sp * F2_BN * 64));
            reg_fence(acc);
            reg_fence(pf);
            wg_fence();
            issue_s();
            issue_pv();
            wg_wait<1>(); /* S_it done; P·V of it − 1 may still run */
            reg_fence(sc);
            if (VL && (qt - it) * F2_BN < lomax)
                mask_before<16>(sc, (qt - it) * F2_BN + t4 * 2, lo0, lo1);
            softmax_step<16>(sc, m0, m1, al0, al1, rs0, rs1, false, 0, qrow, scale_log2);
            /* Pins the softmax before the P·V wait: without it ptxas hoists that wait to the first
             * shuffle (at R151 of 240: not for registers), and the exponentials wait for P·V. The
             * row sums are sums of 2^x, so their sign bit is never set (a NaN from inf/NaN inputs
             * is the canonical 0x7fffffff); the branch ends the basic block after the last
             * exponential, and the wait stays below it. Not with three warpgroups: a trap in the
             * consumers' code makes ptxas compile them to the launch's 128 registers instead of
             * setmaxnreg's 160 (336 bytes spilled, the wgmma serialised; without it, no spill). */
            if (NW == 2 && ((__float_as_uint(rs0) | __float_as_uint(rs1)) >> 31)) __trap();
            wg_wait<0>();
            reg_fence(acc);
            reg_fence(pf);
            if (lane == 0) mbar_arrive(&empty[sp]);
            fwd_rescale(acc, l0, l1, al0, al1, rs0, rs1);
            pack_a<T, 8>(pf, sc);
        }

        { /* P·V of the last tile */
            const unsigned sl = (kv + nkv - skip - 1) % F2_ST;
            desc_pv(smem_u32(sV + sl * F2_BN * 64));
            reg_fence(acc);
            reg_fence(pf);
            wg_fence();
            issue_pv();
            wg_wait<0>();
            reg_fence(acc);
            if (lane == 0) mbar_arrive(&empty[sl]);
        }

        /* O through this warp's 16 rows of the Q buffer (only this warpgroup's S products read
         * them, and they are done), which goes back to the producer before O's global stores:
         * each lane orders its shared-memory accesses before the async proxy's (the TMA that
         * reloads the buffer), then one arrival for the warp */
        fwd_epilogue<T>(acc, l0, l1, m0, m1, scale_log2, sQb, wg * 64 + warp * 16, q0,
                        o + w.b * so.sb + w.h * so.sh, so.st,
                        lse + ((size_t)w.b * Hq + w.h) * T_, T_, lane, [&]() {
                            fence_proxy_async();
                            __syncwarp();
                            if (lane == 0) mbar_arrive(&qempty[n & 1]);
                        });
        kv += nkv - skip;
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

extern "C" int attn_sm90_tma_ready(void) {
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
                                  int64_t B, int64_t H, int64_t T_, int64_t Dh, int rows, zr_dtype dt) {
    const uint64_t dims[4] = {(uint64_t)Dh, (uint64_t)T_, (uint64_t)H, (uint64_t)B};
    const uint64_t strides[3] = {(uint64_t)sd->st * 2, (uint64_t)sd->sh * 2, (uint64_t)sd->sb * 2};
    const uint32_t box[4] = {64, (uint32_t)rows, 1, 1};
    return attn_sm90_tmap(m, dt == ZR_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                          base, dims, strides, box);
}

static int g_fwd_rows; /* attn_sm90_fwd_rows: 0 automatic, else 128 or 192 */
static int g_fwd_tail = 1; /* attn_sm90_fwd_tail */

extern "C" int attn_sm90_fwd_tail(int on) {
    const int was = g_fwd_tail;
    g_fwd_tail = on;
    return was;
}

extern "C" int attn_sm90_fwd_rows(int rows) {
    const int was = g_fwd_rows;
    g_fwd_rows = rows;
    return was;
}

/* Where the tiles start: shifted back before row 0 (attn_sm90_fwd_tail, the default) by the largest
 * multiple of 64 rows that keeps the last tile's overhang past T (so now under 64 rows): the idle
 * warpgroups fall before row 0, in the head's first and cheapest tile, not in its last and heaviest
 * as with tiles from row 0 (up to BM − 1 rows past T there). A multiple of 64, so every warpgroup's
 * rows still lie in one key tile; each row meets the same key tiles in the same order (the same
 * bits). Key steps a head (the tile's; warpgroup steps are equal): T1024 32 -> 27, T2048 101 -> 96,
 * T8192 1429 -> 1408, T512 9 -> 8. Measured (H100, bursts, medians of 5 alternating rounds, fwd ms,
 * 192-query tiles; session 66): GPT-2's B64 H12 T1024 0.368 -> 0.329, B4 H32/8 T2048 0.177 -> 0.173,
 * T8192 2.099 -> 2.079, T512 0.025 both. */
static int fwd_qoff(int64_t T_, int bm) {
    if (!g_fwd_tail) return 0;
    const int64_t over = (T_ + bm - 1) / bm * bm - T_;
    return (int)(over / 64 * 64);
}

template <typename T, int NW>
static int fwd_launch(void *o, float *lse, const void *q, const void *k, const void *v,
                      const zr_attn_layout &L, int64_t B, int64_t Hq, int64_t Hkv, int64_t T_,
                      float scale, zr_dtype dt, cudaStream_t st) {
    using C = f2_cfg<NW>;
    CUtensorMap mq, mk, mv;
    if (attn_sm90_head_map(&mq, q, &L.q, B, Hq, T_, 64, C::BM, dt) ||
        attn_sm90_head_map(&mk, k, &L.k, B, Hkv, T_, 64, F2_BN, dt) ||
        attn_sm90_head_map(&mv, v, &L.v, B, Hkv, T_, 64, F2_BN, dt))
        return -1;
    auto kern = L.seg ? attn_fwd_sm90_kernel<T, true, NW> : attn_fwd_sm90_kernel<T, false, NW>;
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, f2_smem<NW>::BYTES);
    /* the kernel's tile ids (< tiles + blocks) fit an int: 2^30 tiles would be 16 TB of Q */
    const int grid = attn_sm90_blocks(0, B * Hq * ((T_ + C::BM - 1) / C::BM));
    kern<<<grid, C::THR, f2_smem<NW>::BYTES, st>>>((uint16_t *)o, lse, mq, mk, mv, L.o, L.seg,
                                                   (int)T_, (int)B, (int)Hq, (int)(Hq / Hkv),
                                                   scale * F2_LOG2E, fwd_qoff(T_, C::BM));
    return 0;
}

/* Queries a tile of the head_dim-64 forward: 192 (faster at every T measured, 512 to 8192: see the
 * tiles' comment above), 128 where T <= 128 (a third warpgroup would have no rows). */
static int fwd_rows(int64_t T_) {
    if (g_fwd_rows) return g_fwd_rows;
    return T_ > 128 ? 192 : 128;
}

template <typename T>
static int fwd_launch_rows(void *o, float *lse, const void *q, const void *k, const void *v,
                           const zr_attn_layout &L, int64_t B, int64_t Hq, int64_t Hkv, int64_t T_,
                           float scale, zr_dtype dt, cudaStream_t st) {
    if (fwd_rows(T_) == 192)
        return fwd_launch<T, 3>(o, lse, q, k, v, L, B, Hq, Hkv, T_, scale, dt, st);
    return fwd_launch<T, 2>(o, lse, q, k, v, L, B, Hq, Hkv, T_, scale, dt, st);
}

extern "C" int attn_sm90_forward(void *o, float *lse, const void *q, const void *k, const void *v,
                                 const zr_attn_layout *L, int64_t B, int64_t Hq, int64_t Hkv,
                                 int64_t T, float scale, zr_dtype dt, cudaStream_t st) {
    if (!encode_fn()) return -1;
    if (dt == ZR_BF16)
        return fwd_launch_rows<__nv_bfloat16>(o, lse, q, k, v, *L, B, Hq, Hkv, T, scale, dt, st);
    return fwd_launch_rows<__half>(o, lse, q, k, v, *L, B, Hq, Hkv, T, scale, dt, st);
}
