/* The cooperative twin of gemm_sm90.cu (same products, refusals and epilogues; gemm_sm90.h): a
 * persistent Hopper (sm_90a) bf16 GEMM whose CTA tile is 128 x 256, both consumer warpgroups on
 * the same tile (warpgroup w: rows 64w .. 64w + 63, all 256 columns, one m64n256k16 wgmma a k16
 * step). Per MAC it loads a quarter fewer bytes from L2 than a 128 x 128 tile and reads less shared
 * memory than two m64n128k16; the price is an epilogue no other warpgroup's main loop hides (the
 * producer fills the ring for the next tile meanwhile). */
#include "gemm_sm90.h"

#include "gemm_sm90.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "gemm_sm90_wide.cu needs -gencode arch=compute_90a,code=sm_90a (wgmma)"
#endif

using namespace sm90;

/* Tiles 128 x 256, 64 k a stage (GM_BK), 4 stages of A (128 x 64: 16 KB) and B (256 x 64: 32 KB):
 * 192 KB + 8 mbarriers, one block an SM (5 stages would be 240 KB, over the 227 KB a block may
 * have). 384 threads: consumer warpgroups 0 and 1, then the producer warpgroup (its first warp's
 * lane 0 issues every TMA load, the rest idle); setmaxnreg 232 / 40 as gemm_sm90.cu (128 f32
 * accumulators a consumer thread, as there). B [n][k] is one box of 256 rows (TMA's largest); B
 * [k][n] four 64-wide boxes (128-byte swizzle atoms) 8 KB apart, the descriptor's leading byte
 * offset that distance. */
#define GW_BM 128
#define GW_BN 256
#define GW_ST 4
#define GW_CONS 256
#define GW_THR (GW_CONS + 128)
#define GW_PRODUCER (GW_CONS / 32) /* first warp of the producer warpgroup */
static_assert((GW_ST & (GW_ST - 1)) == 0, "the ring's stage and phase are the count's low bits");

struct gw_smem {
    static constexpr int TA = GW_BM * GM_BK * 2, TB = GW_BN * GM_BK * 2; /* bytes a stage: 16, 32 KB */
    static constexpr int A = 0, B = A + GW_ST * TA, BAR = B + GW_ST * TB;
    static constexpr int BYTES = BAR + 8 * 2 * GW_ST + 1024; /* + alignment slack */
};
static_assert(gw_smem::BYTES <= 227 * 1024, "shared memory over the 227 KB a block may have");

/* Barriers and the parity rule.
 * Every block runs its tiles t = blockIdx.x + n·gridDim.x, n = 0, 1, .. (local tile n); tile n has
 * kt = ceil(k / 64) k blocks, ring loads j = n·kt .. n·kt + kt − 1 (stage j % 4, its (j / 4)-th use).
 * Both consumer warpgroups run every local tile, every load.
 *   full[s] (mbarrier, count 1): the producer arrives once (arrive.expect_tx: 48 KB, less the
 *     boxes it skips) per load into stage s, the TMA completes the bytes (out-of-bounds parts of a
 *     box count, zero-filled); every thread of both consumer warpgroups waits parity (j / 4) & 1
 *     for load j.
 *   empty[s] (mbarrier, count 8): each of the 8 consumer warps arrives once (lane 0) when its
 *     warpgroup's wgmma reading load j are complete (after wgmma.wait_group, which every lane
 *     passes, so no lane of the warp is still before load j's full wait); the producer waits
 *     parity (j / 4 − 1) & 1 before load j ≥ 4 (the release of load j − 4, the stage's previous
 *     use).
 *   Parities are never ambiguous: full[s]'s phase for load j + 4 needs load j's release by all 8
 *     warps, each given after that warp's own full wait for load j, so full never runs two phases
 *     ahead of any waiting warp however far one warpgroup trails the other (say in its epilogue);
 *     empty's phase for load j needs load j's full phase, which needs the producer's load j, so
 *     empty never runs two phases ahead of the producer.
 *   No named barriers: the warpgroups never wait for each other, only for full.
 * No deadlock: the producer fills loads in order and waits only for releases of loads 4 back; a
 *   consumer warp waits only for full of loads in order, and releases every load it waited for
 *   after at most its next load's wgmma are issued (wait_group 1), or at its tile's end (wait_group
 *   0), without waiting for anything in between; so load j + 4 is issued once both warpgroups are
 *   past load j + 1's issue or their tile's end, which they reach waiting only on earlier loads.
 * Start: C (f32, beta 1) or the bias is loaded into the accumulators before the tile's first
 *   full wait (all loads in flight at once); the first wgmma then accumulates (scale-d 1) instead
 *   of overwriting.
 * Epilogue: gm_epilogue (gemm_sm90.cuh), from the registers to global memory, masked at m and n;
 *   it touches no shared memory, so the producer fills the next tile's stages meanwhile (the
 *   releases came before it).
 * Partial tiles: A [k][m]'s second 64-wide box wholly past m, and B [k][n]'s boxes wholly past n,
 *   are not loaded (nor counted in expect_tx): their stage keeps stale values, which reach only
 *   output rows (columns) never stored. [m][k] and [n][k] boxes start inside the matrix (m0 < m,
 *   n0 < n) and are zero-filled past it.
 * Diagnostics (gm_args.dbg, GEMM_SM90_DBG_*): NO_STORE, NO_CLOAD, NO_GELU as in gemm_sm90.cu;
 *   NO_MMA runs with kt = 0 (no loads, no wgmma, no ring barrier used); SERIAL has no meaning here
 *   (no ping-pong) and the host refuses it. */
template <int TA, int TB, int EPI>
__global__ void __launch_bounds__(GW_THR, 1)
    gemm_sm90_wide_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                          const gm_args p) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *base = reinterpret_cast<uint8_t *>(align1024(smem_raw));
    uint16_t *sA = reinterpret_cast<uint16_t *>(base + gw_smem::A);
    uint16_t *sB = reinterpret_cast<uint16_t *>(base + gw_smem::B);
    uint64_t *full = reinterpret_cast<uint64_t *>(base + gw_smem::BAR), *empty = full + GW_ST;
    const int tid = threadIdx.x, warp_id = tid >> 5, lane = tid & 31;
    if ((int)blockIdx.x >= p.items) return; /* the whole block: no tile, no barrier used */
    if (tid == 0) {
        for (int s = 0; s < GW_ST; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], GW_CONS / 32);
        }
        mbar_init_fence();
    }
    __syncthreads(); /* the last block-wide barrier */
    const int G = gridDim.x, b0 = blockIdx.x, kt = p.kt;

    if (warp_id >= GW_PRODUCER) {
        reg_dealloc<40>();
        if (warp_id == GW_PRODUCER && lane == 0) {
            uint32_t j = 0;
            for (int t = b0; t < p.items; t += G) {
                int tm, tn;
                gm_tile<1>(t, p, 0, tm, tn); /* clusters of 1: item t is tile t */
                const int m0 = tm * GW_BM, n0 = tn * GW_BN;
                const bool a2 = TA == 0 || m0 + 64 < p.m;
                /* B [k][n]: the 64-wide boxes that start before n (1 .. 4) */
                const int nb = TB == 0 ? 4 : min(4, (p.n - n0 + 63) / 64);
                const uint32_t bytes = (a2 ? gw_smem::TA : gw_smem::TA / 2) + nb * (gw_smem::TB / 4);
                /* f32 C (beta 1) starts the accumulators, loaded when a tile begins, where no other
                 * warpgroup's main loop hides it: the next tile's C rows go to L2 meanwhile, a few
                 * rows a k block (this block's first tile's C before its first load) */
                const bool pf = EPI == GM_EPI_F32 && p.beta && !(p.dbg & GEMM_SM90_DBG_NO_CLOAD);
                int pm0 = 0, pn0 = 0, prows = 0, pcols = 0, per = 0;
                if (pf) {
                    if (t == b0) gm_prefetch_c_rows(p, m0, min(m0 + GW_BM, p.m), n0, min(GW_BN, p.n - n0));
                    if (t + G < p.items) {
                        int pm, pn;
                        gm_tile<1>(t + G, p, 0, pm, pn);
                        pm0 = pm * GW_BM, pn0 = pn * GW_BN;
                        prows = min(GW_BM, p.m - pm0), pcols = min(GW_BN, p.n - pn0);
                        per = kt > 0 ? (prows + kt - 1) / kt : 0;
                    }
                }
                for (int kb = 0; kb < kt; ++kb, ++j) {
                    const uint32_t s = j % GW_ST;
                    if (j >= GW_ST) mbar_wait(&empty[s], ((j / GW_ST) - 1) & 1);
                    mbar_expect_tx(&full[s], bytes);
                    uint16_t *a = sA + s * (GW_BM * GM_BK), *b = sB + s * (GW_BN * GM_BK);
                    const int k0 = kb * GM_BK;
                    gm_load_a<TA>(a, &ma, &full[s], k0, m0, a2);
                    if (TB == 0) { /* B [n][k]: one box of 256 rows of 64 k */
                        tma_load4(b, &mb, &full[s], k0, n0, 0, 0);
                    } else { /* B [k][n]: boxes of 64 k rows of 64 n */
                        for (int i = 0; i < nb; ++i)
                            tma_load4(b + i * 64 * 64, &mb, &full[s], n0 + 64 * i, k0, 0, 0);
                    }
                    if (per) gm_prefetch_c_rows(p, pm0 + min(kb * per, prows), pm0 + min(kb * per + per, prows), pn0, pcols);
                }
            }
        }
        return;
    }
    reg_alloc<232>();

    const int wg = warp_id >> 2, warp = warp_id & 3, g = lane >> 2, t4 = lane & 3;
    const uint32_t a_base = smem_u32(sA) + wg * 8192, b_base = smem_u32(sB); /* this warpgroup's 64 rows */
    const bool nostore = p.dbg & GEMM_SM90_DBG_NO_STORE;
    float acc[1][128];
    for (int n = 0, t = b0; t < p.items; ++n, t += G) {
        int tm, tn;
        gm_tile<1>(t, p, 0, tm, tn); /* clusters of 1: item t is tile t */
        const int m0 = tm * GW_BM + wg * 64, n0 = tn * GW_BN; /* this warpgroup's rows */
        const uint32_t j0 = (uint32_t)n * kt;
        const bool start = gm_acc_start<EPI>(acc, p, m0, n0, warp, g, t4);
        reg_fence(acc[0]);
        for (int kb = 0; kb < kt; ++kb) {
            const uint32_t j = j0 + kb, s = j % GW_ST;
            mbar_wait(&full[s], (j / GW_ST) & 1);
            const uint32_t a = a_base + s * gw_smem::TA, b = b_base + s * gw_smem::TB;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                /* A: [m][k] steps 32 bytes a k16 along its rows (this warpgroup's 64 rows 8 KB in);
                 * [k][m] 16 rows (2048 bytes) of box wg. B: [n][k] 32 bytes along its 256 rows;
                 * [k][n] 16 rows, its four 64-wide n atoms 8 KB apart */
                const uint64_t da = TA == 0 ? desc128(a + kk * 32) : desc128(a + kk * 2048);
                const uint64_t db = TB == 0 ? desc128(b + kk * 32) : desc128_lbo(b + kk * 2048, 8192);
                wg_ss256<TA, TB>(acc[0], da, db, start || kb > 0 || kk > 0);
            }
            wg_commit();
            if (kb > 0) {
                wg_wait<1>(); /* load j − 1's wgmma are done */
                if (lane == 0) mbar_arrive(&empty[(j - 1) % GW_ST]);
            }
        }
        wg_wait<0>();
        reg_fence(acc[0]);
        if (lane == 0 && kt > 0) mbar_arrive(&empty[(j0 + kt - 1) % GW_ST]); /* kt 0: NO_MMA */
        gm_epilogue<EPI>(acc, p, m0, n0, warp, g, t4, nostore);
    }
}

/* ---- host side ------------------------------------------------------------------------------ */

template <int TA, int TB, int EPI>
static int gw_launch(const CUtensorMap &ma, const CUtensorMap &mb, const gm_args &p, int grid,
                     cudaStream_t st) {
    auto kern = gemm_sm90_wide_kernel<TA, TB, EPI>;
    static int smem_set[64]; /* per device */
    if (gm_smem_limit((const void *)kern, smem_set, gw_smem::BYTES, "gemm_sm90_wide")) return -1;
    kern<<<grid, GW_THR, gw_smem::BYTES, st>>>(ma, mb, p);
    return launch_check("gemm_sm90_wide");
}

/* The instantiation for layout (ta, tb) and epilogue EPI; the kernel's TB is wgmma's: 1 = B stored
 * [k][n], which is tb 0. */
template <int EPI>
static int gw_layouts(int ta, int tb, const CUtensorMap &ma, const CUtensorMap &mb, const gm_args &p,
                      int grid, cudaStream_t st) {
    static int (*const by_layout[2][2])(const CUtensorMap &, const CUtensorMap &, const gm_args &, int,
                                        cudaStream_t) = {{gw_launch<0, 1, EPI>, gw_launch<0, 0, EPI>},
                                                         {gw_launch<1, 1, EPI>, gw_launch<1, 0, EPI>}};
    return by_layout[ta][tb](ma, mb, p, grid, st);
}

extern "C" int gemm_sm90_wide(const zr_gemm_desc *g, int grid, cudaStream_t stream) {
    if (gemm_sm90_check(g)) return -1;
    if (gm_dbg & GEMM_SM90_DBG_SERIAL)
        return zr_error("gemm_sm90_wide: GEMM_SM90_DBG_SERIAL set; the cooperative kernel has no "
                        "ping-pong to serialise (gemm_sm90_debug(0) or without that bit)");
    CUtensorMap ma, mb;
    gm_args p;
    if (gm_setup(g, GW_BM, GW_BN, 1, "gemm_sm90_wide", ma, mb, p)) return -1;
    const int blocks = gm_units(grid, 1, num_sms(), p.items);
    gm_last_blocks = blocks;
    const int ta = !!g->ta, tb = !!g->tb;
    if (g->c_dtype == ZR_F32) return gw_layouts<GM_EPI_F32>(ta, tb, ma, mb, p, blocks, stream);
    if (g->epilogue == ZR_GEMM_EPI_GELU_AUX) return gw_layouts<GM_EPI_GELU_AUX>(ta, tb, ma, mb, p, blocks, stream);
    return gw_layouts<GM_EPI_BF16>(ta, tb, ma, mb, p, blocks, stream);
}
