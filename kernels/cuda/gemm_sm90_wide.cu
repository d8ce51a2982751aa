/* The cooperative twin of gemm_sm90.cu (same products, refusals and epilogues; gemm_sm90.h): a
 * persistent Hopper (sm_90a) bf16 GEMM whose CTA tile is 128 x 256, both consumer warpgroups on
 * the same tile (warpgroup w: rows 64w .. 64w + 63, all 256 columns, one m64n256k16 wgmma a k16
 * step). Per MAC it loads a quarter fewer bytes from L2 than a 128 x 128 tile and reads less shared
 * memory than two m64n128k16; the price is an epilogue no other warpgroup's main loop hides (the
 * producer fills the ring for the next tile meanwhile). With gemm_sm90_wide_cluster(2), clusters of
 * 2 blocks along m share each B tile (cuBLASLt's 2 x 1 layout): each block loads its own A and half
 * of B (128 of the 256 columns) and multicasts that half to both. */
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
 * offset that distance. With clusters of 2, rank r loads B's columns 128r .. 128r + 127: [n][k] one
 * box of 128 rows, [k][n] boxes 2r and 2r + 1. */
#define GW_BM 128
#define GW_BN 256
#define GW_ST 4
#define GW_CONS 256
#define GW_THR (GW_CONS + 128)
#define GW_PRODUCER (GW_CONS / 32) /* first warp of the producer warpgroup */

struct gw_smem {
    static constexpr int TA = GW_BM * GM_BK * 2, TB = GW_BN * GM_BK * 2; /* bytes a stage: 16, 32 KB */
    static constexpr int A = 0, B = A + GW_ST * TA, BAR = B + GW_ST * TB;
    static constexpr int BYTES = BAR + 8 * 2 * GW_ST;
};
static_assert(gw_smem::BYTES <= 227 * 1024, "shared memory over the 227 KB a block may have");

/* Barriers and the parity rule.
 * Units and items (gm_args): CL 1, a unit is a block and an item one 128 x 256 tile; CL 2, a unit
 * is a cluster of 2 blocks along m and an item the pair of tiles (2i, n), (2i + 1, n) of one B
 * tile, block rank r taking tile 2i + r. Unit u of G runs items t = u + n·G, n = 0, 1, .. (local
 * item n), both blocks of a cluster the same items; item n has kt = ceil(k / 64) k blocks, ring
 * loads j = n·kt .. n·kt + kt − 1 (stage j % 4, its (j / 4)-th use: gm_ring). Both consumer
 * warpgroups run every local item, every load.
 *   full[s] (mbarrier, count 1): the block's producer arrives once per load into stage s with
 *     arrive.expect_tx of every byte that will land in its block's stage s: CL 1, 48 KB less the
 *     boxes it skips; CL 2, its own A (16 KB, less a skipped [k][m] box; none for a tile wholly
 *     past m) and the whole 32 KB of B, of which it loads one 16 KB half (rank r: columns n0 +
 *     128r ..) and the peer the other, each multicast into both blocks and completing its bytes on
 *     the full[s] at the same offset in each. With CL 2 no B box is skipped: a box wholly past n
 *     reloads columns from n0 (they reach output columns ≥ n only), so every block's full[s] needs
 *     both producers' loads. TMA completes the bytes (out-of-bounds parts of a box count,
 *     zero-filled); the peer's bytes may land before this block's expect_tx of the phase (the tx
 *     count dips below 0; the phase cannot complete before the producer's arrival). Every thread
 *     of both consumer warpgroups waits parity (j / 4) & 1 for load j.
 *   empty[s] (mbarrier, count 8·CL): each of the 8 consumer warps (CL 2: of both blocks) releases
 *     load j (gm_release, gemm_sm90.cuh: lane r arrives on block r's; CL 2 remote arrivals with
 *     release at CTA scope, as CUTLASS) when its warpgroup's wgmma reading it are complete (after
 *     wgmma.wait_group, which every lane passes, so no lane of the warp is still before load j's
 *     full wait); the producer waits parity (j / 4 − 1) & 1 before load j ≥ 4 (the release of load
 *     j − 4, the stage's previous use, by all 8·CL warps).
 *   Parities are never ambiguous: full[s] of block X: its phase for load j + 4 needs bytes or the
 *     arrival of producers (X's, with CL 2 the peer's) that first waited for their empty[s] to
 *     complete load j, which takes load j's release by all 8 of X's warps, each given after that
 *     warp's own full wait for load j; so full never runs two phases ahead of any waiting warp
 *     however far one warpgroup trails the other (say in its epilogue). empty[s] of block X: an
 *     arrival for load j comes from a warp of block Z (X or its peer) after Z's full[s] wait for
 *     load j, which needs bytes of both producers (CL 2: no box skipped), X's among them, issued
 *     once X's empty[s] completed load j − 4; so empty never runs two phases ahead of X's
 *     producer.
 *   No named barriers: the warpgroups never wait for each other, only for full.
 * No deadlock (both blocks of a cluster run the same loads in the same order): the producers fill
 *   loads in order and wait only for releases of loads 4 back; a consumer warp waits only for full
 *   of loads in order, and releases every load it waited for after at most its next load's wgmma
 *   are issued (wait_group 1), or at its item's end (wait_group 0), without waiting for anything
 *   in between; so load j + 4 is issued once every warpgroup (of both blocks) is past load j + 1's
 *   issue or its item's end, which it reaches waiting only on earlier loads.
 * Cluster start and end (CL 2), as in gemm_sm90.cu: the mbarrier inits fenced to the cluster and
 *   a cluster barrier before any multicast or remote arrival; a cluster barrier at the end, which
 *   every thread reaches after its last load (producer) or remote arrival (consumers).
 * Start: C (f32, beta 1) or the bias is loaded into the accumulators before the tile's first
 *   full wait (all loads in flight at once); the first wgmma then accumulates (scale-d 1) instead
 *   of overwriting.
 * Epilogue: gm_epilogue (gemm_sm90.cuh), from the registers to global memory, masked at m and n;
 *   it touches no shared memory, so the producer fills the next tile's stages meanwhile (the
 *   releases came before it).
 * Partial tiles: A [k][m]'s second 64-wide box wholly past m, and (CL 1) B [k][n]'s boxes wholly
 *   past n, are not loaded (nor counted in expect_tx): their stage keeps stale values, which reach
 *   only output rows (columns) never stored; nor is A of a CL 2 tile wholly past m (its rows are
 *   never stored). [m][k] and [n][k] boxes start inside the matrix (m0 < m, the B box's start
 *   < n) and are zero-filled past it.
 * Diagnostics (gm_args.dbg, GEMM_SM90_DBG_*): NO_STORE, NO_CLOAD, NO_GELU as in gemm_sm90.cu;
 *   NO_MMA runs with kt = 0 (no loads, no wgmma, no ring barrier used); CLUSTER_SCOPE (CL 2) the
 *   ring's releases and waits at cluster scope; SERIAL has no meaning here (no ping-pong) and the
 *   host refuses it. */
template <int TA, int TB, int EPI, int CL>
__global__ void __launch_bounds__(GW_THR, 1)
    gemm_sm90_wide_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                          const gm_args p) {
    static_assert(CL == 1 || CL == 2, "clusters of 1 or 2 blocks");
    ZR_SMEM_1024(base);
    uint16_t *sA = reinterpret_cast<uint16_t *>(base + gw_smem::A);
    uint16_t *sB = reinterpret_cast<uint16_t *>(base + gw_smem::B);
    uint64_t *full = reinterpret_cast<uint64_t *>(base + gw_smem::BAR), *empty = full + GW_ST;
    const int tid = threadIdx.x, warp_id = warp_uniform(tid >> 5), lane = tid & 31;
    int b0, G, rank; /* the unit (block or cluster), the units in the grid, the block's rank in it */
    gm_unit<CL>(b0, G, rank);
    if (b0 >= p.items) return; /* the whole block (cluster): no item, no barrier used */
    gm_ring_init<CL, GW_ST>(full, empty, GW_CONS / 32); /* all 8 consumer warps consume a stage */
    const int kt = p.kt;
    const bool scoped = p.dbg & GEMM_SM90_DBG_CLUSTER_SCOPE;

    if (warp_id >= GW_PRODUCER) {
        reg_dealloc<40>();
        if (warp_id == GW_PRODUCER && lane == 0) {
            gm_ring<GW_ST> r;
            r.at(0);
            for (int t = b0; t < p.items; t += G) {
                int tm, tn;
                gm_tile<CL>(t, p, rank, tm, tn);
                const int m0 = tm * GW_BM, n0 = tn * GW_BN;
                const bool a1 = CL == 1 || m0 < p.m; /* CL 2: a tile wholly past m loads no A */
                const bool a2 = TA == 0 || m0 + 64 < p.m;
                /* B [k][n]: the 64-wide boxes that start before n (1 .. 4); CL 2 loads all 4 (2 a
                 * block), a box wholly past n from n0's columns instead */
                const int nb = TB == 0 || CL == 2 ? 4 : min(4, (p.n - n0 + 63) / 64);
                const uint32_t bytes = (!a1 ? 0 : a2 ? gw_smem::TA : gw_smem::TA / 2) + nb * (gw_smem::TB / 4);
                /* f32 C (beta 1) starts the accumulators, loaded when a tile begins, where no other
                 * warpgroup's main loop hides it: the next tile's C rows go to L2 meanwhile, a few
                 * rows a k block (this block's first tile's C before its first load) */
                const bool pf = EPI == GM_EPI_F32 && p.beta && !(p.dbg & GEMM_SM90_DBG_NO_CLOAD);
                int pm0 = 0, pn0 = 0, prows = 0, pcols = 0, per = 0;
                if (pf) {
                    if (t == b0) gm_prefetch_c_rows(p, m0, min(m0 + GW_BM, p.m), n0, min(GW_BN, p.n - n0));
                    if (t + G < p.items) {
                        int pm, pn;
                        gm_tile<CL>(t + G, p, rank, pm, pn);
                        pm0 = pm * GW_BM, pn0 = pn * GW_BN;
                        prows = max(0, min(GW_BM, p.m - pm0)), pcols = min(GW_BN, p.n - pn0);
                        per = kt > 0 ? (prows + kt - 1) / kt : 0;
                    }
                }
                for (int kb = 0; kb < kt; ++kb, r.next()) {
                    const uint32_t s = r.s;
                    if (r.again) gm_wait_empty<CL>(&empty[s], r.ph ^ 1, scoped); /* use j / 4 − 1's */
                    mbar_expect_tx(&full[s], bytes);
                    uint16_t *a = sA + s * (GW_BM * GM_BK), *b = sB + s * (GW_BN * GM_BK);
                    const int k0 = kb * GM_BK;
                    if (a1) gm_load_a<TA>(a, &ma, &full[s], k0, m0, a2);
                    if (CL == 2) { /* this block's 128 columns, into both blocks */
                        if (TB == 0) { /* B [n][k]: one box of 128 rows of 64 k, 16 KB at 16 KB · rank */
                            const int nh = n0 + 128 * rank < p.n ? n0 + 128 * rank : n0;
                            tma_load4_mc(b + rank * (128 * 64), &mb, &full[s], k0, nh, 0, 0, 3);
                        } else { /* B [k][n]: boxes 2 rank, 2 rank + 1 of 64 k rows of 64 n */
                            for (int i = 2 * rank; i < 2 * rank + 2; ++i) {
                                const int nc = n0 + 64 * i < p.n ? n0 + 64 * i : n0;
                                tma_load4_mc(b + i * 64 * 64, &mb, &full[s], nc, k0, 0, 0, 3);
                            }
                        }
                    } else if (TB == 0) { /* B [n][k]: one box of 256 rows of 64 k */
                        tma_load4(b, &mb, &full[s], k0, n0, 0, 0);
                    } else { /* B [k][n]: boxes of 64 k rows of 64 n */
                        for (int i = 0; i < nb; ++i)
                            tma_load4(b + i * 64 * 64, &mb, &full[s], n0 + 64 * i, k0, 0, 0);
                    }
                    if (per) gm_prefetch_c_rows(p, pm0 + min(kb * per, prows), pm0 + min(kb * per + per, prows), pn0, pcols);
                }
            }
        }
        if (CL > 1) { /* the warp whole again, then the end's cluster barrier */
            __syncwarp();
            cluster_sync();
        }
        return;
    }
    reg_alloc<232>();

    const int wg = warp_id >> 2, warp = warp_id & 3, g = lane >> 2, t4 = lane & 3;
    const uint32_t a_base = smem_u32(sA) + wg * 8192, b_base = smem_u32(sB); /* this warpgroup's 64 rows */
    const bool nostore = p.dbg & GEMM_SM90_DBG_NO_STORE;
    float acc[1][128];
    gm_ring<GW_ST> r; /* the next load's stage and parity (every load, in order) */
    r.at(0);
    for (int t = b0; t < p.items; t += G) {
        int tm, tn;
        gm_tile<CL>(t, p, rank, tm, tn);
        const int m0 = tm * GW_BM + wg * 64, n0 = tn * GW_BN; /* this warpgroup's rows */
        const bool start = gm_acc_start<EPI>(acc, p, m0, n0, warp, g, t4);
        reg_fence(acc[0]);
        for (int kb = 0; kb < kt; ++kb, r.next()) {
            const uint32_t s = r.s;
            mbar_wait(&full[s], r.ph);
            const sdesc sa(a_base + s * gw_smem::TA); /* as gemm_sm90.cu's: one add a product */
            const sdesc sb(b_base + s * gw_smem::TB, TB == 0 ? 1024 : 8192); /* [k][n]: atoms 8 KB apart */
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                /* A: [m][k] steps 32 bytes a k16 along its rows (this warpgroup's 64 rows 8 KB in);
                 * [k][m] 16 rows (2048 bytes) of box wg. B: [n][k] 32 bytes along its 256 rows;
                 * [k][n] 16 rows, its four 64-wide n atoms 8 KB apart */
                const uint64_t da = sa.at(TA == 0 ? kk * 32 : kk * 2048);
                const uint64_t db = sb.at(TB == 0 ? kk * 32 : kk * 2048);
                wg_ss256<TA, TB>(acc[0], da, db, start || kb > 0 || kk > 0);
            }
            wg_commit();
            if (kb > 0) {
                wg_wait<1>(); /* load j − 1's wgmma are done */
                gm_release<CL>(&empty[r.prev()], lane, scoped);
            }
        }
        wg_wait<0>();
        reg_fence(acc[0]);
        if (kt > 0) gm_release<CL>(&empty[r.prev()], lane, scoped); /* the last load's; kt 0: NO_MMA */
        gm_epilogue<EPI>(acc, p, m0, n0, warp, g, t4, nostore);
    }
    if (CL > 1) cluster_sync(); /* after this block's last remote arrival */
}

/* ---- host side ------------------------------------------------------------------------------ */

static int gw_cluster = 1; /* gemm_sm90_wide_cluster's setting */
extern "C" int gemm_sm90_wide_cluster(int n) {
    if (n != 1 && n != 2) return zr_error("gemm_sm90_wide_cluster: %d; clusters of 1 or 2 blocks only", n);
    gw_cluster = n;
    return 0;
}

/* Launches the instantiation on `grid` units (gm_launch_units, gemm_sm90.cuh). */
template <int TA, int TB, int EPI, int CL>
static int gw_launch(const CUtensorMap &ma, const CUtensorMap &mb, const gm_args &p, int grid,
                     cudaStream_t st) {
    static int smem_set[64], fits[64]; /* per device */
    return gm_launch_units<CL>(gemm_sm90_wide_kernel<TA, TB, EPI, CL>, GW_THR, gw_smem::BYTES, smem_set, fits,
                               grid, ma, mb, p, st, "gemm_sm90_wide");
}

/* The instantiation for layout (ta, tb), epilogue EPI and clusters of cl; the kernel's TB is
 * wgmma's: 1 = B stored [k][n], which is tb 0. */
template <int EPI>
static int gw_layouts(int cl, int ta, int tb, const CUtensorMap &ma, const CUtensorMap &mb, const gm_args &p,
                      int grid, cudaStream_t st) {
    typedef int (*launch)(const CUtensorMap &, const CUtensorMap &, const gm_args &, int, cudaStream_t);
    static const launch by_layout[2][2][2] = {
        {{gw_launch<0, 1, EPI, 1>, gw_launch<0, 0, EPI, 1>}, {gw_launch<1, 1, EPI, 1>, gw_launch<1, 0, EPI, 1>}},
        {{gw_launch<0, 1, EPI, 2>, gw_launch<0, 0, EPI, 2>}, {gw_launch<1, 1, EPI, 2>, gw_launch<1, 0, EPI, 2>}}};
    return by_layout[cl == 2][ta][tb](ma, mb, p, grid, st);
}

extern "C" int gemm_sm90_wide(const zr_gemm_desc *g, int grid, cudaStream_t stream) {
    if (gemm_sm90_check(g)) return -1;
    if (gm_dbg & GEMM_SM90_DBG_SERIAL)
        return zr_error("gemm_sm90_wide: GEMM_SM90_DBG_SERIAL set; the cooperative kernel has no "
                        "ping-pong to serialise (gemm_sm90_debug(0) or without that bit)");
    CUtensorMap ma, mb;
    gm_args p;
    const int cl = gw_cluster; /* the maps' B box, the arguments' units and the launch agree */
    if (gm_setup(g, GW_BM, GW_BN, cl, "gemm_sm90_wide", ma, mb, p)) return -1;
    const int ta = !!g->ta, tb = !!g->tb;
    if (g->c_dtype == ZR_F32) return gw_layouts<GM_EPI_F32>(cl, ta, tb, ma, mb, p, grid, stream);
    if (g->epilogue == ZR_GEMM_EPI_GELU_AUX) return gw_layouts<GM_EPI_GELU_AUX>(cl, ta, tb, ma, mb, p, grid, stream);
    return gw_layouts<GM_EPI_BF16>(cl, ta, tb, ma, mb, p, grid, stream);
}
