/* A persistent Hopper (sm_90a) bf16 GEMM with f32 accumulation in CUTLASS's "warp-specialized
 * ping-pong" design: one TMA producer warp feeds a ring of 4 or 6 stages (gemm_sm90_stages) of
 * 128x64 A and B tiles, two consumer warpgroups each own whole 128x128 output tiles and take
 * turns on the tensor cores, so
 * one's epilogue (bf16, +bias, +bias+GELU with the pre-activation kept, f32 D = C + product) runs
 * under the other's main loop; C (beta 1) and the bias start the accumulators, loaded while the
 * warpgroup waits for its turn. With gemm_sm90_cluster(2), clusters of 2 blocks along m share each
 * B tile: each block loads half of it and multicasts it to both (a quarter less L2 -> SM traffic).
 * The interface and what it takes: gemm_sm90.h. */
#include "gemm_sm90.h"

#include "gemm_sm90.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "gemm_sm90.cu needs -gencode arch=compute_90a,code=sm_90a (wgmma)"
#endif

using namespace sm90;

/* Tiles 128 x 128 (two m64n128k16 wgmma a k16 step a warpgroup: 128 f32 accumulators a thread),
 * 64 k a stage (128-byte swizzled rows: TMA's widest swizzled box). 384 threads: consumer
 * warpgroups 0 and 1, then the producer warpgroup (its first warp's lane 0 issues every TMA load,
 * the rest idle). setmaxnreg 232 / 40 (CUTLASS's split): 2 · 128 · 232 + 128 · 40 = 64512 of the
 * SM's 65536 registers (ptxas -v, CUDA 13: 168 registers a thread at launch, 0 bytes spilled, for
 * all 48 instantiations: clusters of 1 and 2, 4 and 6 stages). Shared memory: ST stages of A and B
 * (ST · 32 KB: 128 KB for 4, 192 KB for 6; 7 would be 224 KB, at the 227 KB limit with the
 * barriers) + 2 ST mbarriers, one block an SM. */
#define GM_BM 128
#define GM_BN 128
#define GM_CONS 256
#define GM_THR (GM_CONS + 128)
#define GM_PRODUCER (GM_CONS / 32) /* first warp of the producer warpgroup */
#define GM_BAR_TURN 1              /* named barriers 1, 2: warpgroup 0's, 1's turn to issue */

template <int ST>
struct gm_smem {
    static constexpr int T = GM_BM * GM_BK * 2; /* bytes of an A (or B) stage: 16 KB */
    static constexpr int A = 0, B = A + ST * T, BAR = B + ST * T;
    static constexpr int BYTES = BAR + 8 * 2 * ST;
    static_assert(BYTES <= 227 * 1024, "shared memory over the 227 KB a block may have");
};

/* Barriers and the parity rule.
 * Units and items: CL 1, a unit is a block and an item one output tile; CL 2, a unit is a cluster
 *   of 2 blocks along m and an item the pair of tiles (2i, n), (2i + 1, n) of one B tile, block
 *   rank r taking tile 2i + r. Unit u of G runs items t = u + n·G, n = 0, 1, .. (local item n), both
 *   blocks of a cluster the same items; item n has kt = ceil(k / 64) k blocks, ring loads
 *   j = n·kt .. n·kt + kt − 1 (ST stages: stage j % ST, its use j / ST; gm_ring steps both, from a
 *   64-bit j). Consumer warpgroup w runs the local items n ≡ w (mod 2).
 *   full[s] (mbarrier, count 1): the block's producer arrives once per load into stage s with
 *     arrive.expect_tx of every byte that will land in its block's stage s: CL 1, 32 KB less the
 *     8 KB boxes it skips; CL 2, its own A (8 KB less a skipped box; none for a tile wholly past m)
 *     and the whole 16 KB of B, of which it loads one 8 KB half (rank r: n0 + 64r ..) and the peer
 *     the other, each multicast into both blocks and completing its bytes on the full[s] at the same
 *     offset in each. With CL 2 no B half is skipped: a half wholly past n reloads half 0's columns
 *     (they reach output columns ≥ n only), so every block's full[s] needs both producers' loads
 *     (used below). TMA completes the bytes (out-of-bounds parts of a box count, zero-filled); the
 *     peer's bytes may land before this block's expect_tx of the phase (the tx count dips below 0;
 *     the phase cannot complete before the producer's arrival). The consumer warpgroup of load j
 *     waits parity (j / ST) & 1 (all 128 threads).
 *   empty[s] (mbarrier, count 4·CL): each warp of the warpgroup consuming load j (CL 2: in both
 *     blocks) releases it (gm_release, gemm_sm90.cuh) after wgmma.wait_group; the producer waits
 *     parity (j / ST − 1) & 1 before load j ≥ ST (the release of load j − ST, the stage's previous
 *     use, by all 4·CL warps). CL 2: the releases are remote arrivals with release at CTA scope
 *     and the wait acquires at CTA scope, as CUTLASS's PipelineTmaAsync (why that suffices, and
 *     what cluster scope cost: gm_release); CUTLASS counts one arrival a consumer warpgroup a
 *     peer, this ring one a warp a peer (each warp past its own wait_group), issued by lanes 0 and
 *     1 in one instruction.
 *   Parities are never ambiguous: nothing of use v of a stage reaches a barrier still in phase v − 1,
 *     and no barrier runs two phases ahead of its waiter.
 *     full[s] of block X: the arrival and bytes of use v come from producers (X's, and with CL 2 the
 *       peer's) that first waited for their empty[s] to complete use v − 1, which takes X's
 *       consumers' releases of use v − 1, given after their full[s] wait for it (so also the
 *       stage's data is read before it is overwritten, in either block).
 *     empty[s] of block X: an arrival of use v comes from a consumer warp of block Z (X or its peer)
 *       after Z's full[s] wait for use v, which needs bytes from both producers (CL 2: no half
 *       skipped), X's among them, issued once X's empty[s] completed use v − 1. (Were rank 1's half
 *       skipped, rank 0's consumers could arrive for use v on rank 1's empty[s] still in phase
 *       v − 1: hence no skipping.) Neither runs ahead: empty[s]'s use v needs full[s]'s use v, which
 *       needs the producer's wait for use v − 1; full[s]'s use v + 1 needs the releases of use v.
 *   turn (named barriers 1 + w, 256 threads, per block: one warpgroup's bar.sync + the other's
 *     bar.arrive): warpgroup w waits on 1 + w before issuing its item's first wgmma; once its last
 *     k block's wgmma are issued it arrives on 2 − w (the other's turn) if the unit has a next item
 *     (n + 1, the other's). Warpgroup 1 arrives on barrier 1 once at the start (warpgroup 0 runs
 *     item 0). So barrier 1 sees ceil(N/2) syncs and 1 + (the odd items with a successor)
 *     arrivals, barrier 2 floor(N/2) syncs and (the even items with a successor) arrivals: equal
 *     (N the unit's items). Neither barrier gets two arrivals ahead: between two arrivals on one
 *     barrier the arriving warpgroup waits on the other.
 * No deadlock, by induction on j (both blocks of a cluster run the same loads in the same order):
 *   filling load j (in both blocks) waits only for the releases of load j − ST; releasing load i
 *   waits at most for the fill of load i + 1 (a warpgroup issues the next k block's wgmma before
 *   it waits for the previous one's) and, through the turn, for the other warpgroup's issue of
 *   earlier loads; a warpgroup waits for its turn only after releasing all loads of its previous
 *   item (its epilogue waits for nothing). So every chain of waits goes down in j, across blocks
 *   too: the peer enters only through the fills and releases of loads, which both blocks' producers
 *   and consumers take in the same order.
 * Cluster start and end (CL 2): the mbarrier inits are made visible to the cluster
 *   (fence.mbarrier_init.release.cluster) and a cluster barrier follows, before any multicast or
 *   remote arrival can reach the peer; a cluster barrier at the end, which every thread reaches
 *   after its last load (producer) or remote arrival (consumers), so no block exits while its peer
 *   may still arrive on its barriers; every byte multicast into a block has landed by then (its
 *   consumers waited for all of them).
 * Start: C (f32, beta 1) or the bias is loaded into the accumulators before the turn wait (all
 *   loads in flight at once, landing while the other warpgroup's main loop runs); the first wgmma
 *   then accumulates (scale-d 1) instead of overwriting.
 * Epilogue: from the accumulator registers straight to global memory, masked at m and n (f32 pairs,
 *   a row's 4 lanes one 32-byte sector; bf16 through a quad transpose, 16 bytes a lane, a row's
 *   two lanes one sector); stores only, no loads; it touches no shared memory, so the next item's
 *   loads never wait for it. A CL 2 tile wholly past m loads no A (its stage keeps stale values),
 *   multiplies and releases like any other and stores nothing.
 * Diagnostics (gm_args.dbg, GEMM_SM90_DBG_*): SERIAL moves the turn's arrival after the epilogue
 *   (the same count of arrivals, so the argument above holds); NO_MMA runs with kt = 0 (no loads,
 *   no wgmma, no ring barrier used); CLUSTER_SCOPE (CL 2) makes the ring's releases and the
 *   producer's waits cluster-scoped (the same arrivals and waits). */
template <int TA, int TB, int EPI, int CL, int ST>
__global__ void __launch_bounds__(GM_THR, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                     const gm_args p) {
    static_assert(CL == 1 || CL == 2, "clusters of 1 or 2 blocks");
    static_assert(ST >= 3, "a warpgroup holds 2 stages (the k block it issues, the one it waits on)");
    using SM = gm_smem<ST>;
    ZR_SMEM_1024(base);
    uint16_t *sA = reinterpret_cast<uint16_t *>(base + SM::A);
    uint16_t *sB = reinterpret_cast<uint16_t *>(base + SM::B);
    uint64_t *full = reinterpret_cast<uint64_t *>(base + SM::BAR), *empty = full + ST;
    const int tid = threadIdx.x, warp_id = warp_uniform(tid >> 5), lane = tid & 31;
    int b0, G, rank; /* the unit (block or cluster), the units in the grid, the block's rank in it */
    gm_unit<CL>(b0, G, rank);
    if (b0 >= p.items) return; /* the whole block (cluster): no item, no barrier used */
    /* a stage's consumers: the 4 warps of ONE warpgroup (the ping-pong's other warpgroup never
     * reads it), each releasing it once: a count that is too small completes more than one phase
     * of empty[s] a use (a hang or a fault once k has more blocks than the ring has stages) */
    gm_ring_init<CL, ST>(full, empty, GM_CONS / 2 / 32);
    const int kt = p.kt;
    const bool scoped = p.dbg & GEMM_SM90_DBG_CLUSTER_SCOPE;

    if (warp_id >= GM_PRODUCER) {
        reg_dealloc<40>();
        if (warp_id == GM_PRODUCER && lane == 0) {
            gm_ring<ST> r;
            r.at(0);
            for (int t = b0; t < p.items; t += G) {
                int tm, tn;
                gm_tile<CL>(t, p, rank, tm, tn);
                const int m0 = tm * GM_BM, n0 = tn * GM_BN;
                /* an MN-major operand's second 64-wide box wholly past m (n) is not loaded: its
                 * stage keeps stale values, which only reach output rows (columns) never stored;
                 * nor is A of a CL 2 tile wholly past m. CL 2 loads this block's half of B, a half
                 * wholly past n as half 0's columns (both halves always land: see above). */
                const bool a1 = CL == 1 || m0 < p.m;
                const bool a2 = TA == 0 || m0 + 64 < p.m, b2 = TB == 0 || n0 + 64 < p.n;
                const uint32_t a_bytes = !a1 ? 0 : a2 ? SM::T : SM::T / 2;
                const uint32_t b_bytes = CL == 2 || b2 ? SM::T : SM::T / 2;
                const int nh = rank == 0 || n0 + 64 < p.n ? n0 + 64 * rank : n0;
                for (int kb = 0; kb < kt; ++kb, r.next()) {
                    const uint32_t s = r.s;
                    if (r.again) gm_wait_empty<CL>(&empty[s], r.ph ^ 1, scoped); /* use j / ST − 1's */
                    mbar_expect_tx(&full[s], a_bytes + b_bytes);
                    uint16_t *a = sA + s * (GM_BM * GM_BK), *b = sB + s * (GM_BN * GM_BK);
                    const int k0 = kb * GM_BK;
                    if (a1) gm_load_a<TA>(a, &ma, &full[s], k0, m0, a2);
                    if (CL == 2) { /* B [n][k]: 64 n rows of 64 k (the map's box); [k][n]: 64 k
                                    * rows of 64 n; either way 8 KB at 8 KB · rank, into both */
                        uint16_t *bh = b + rank * (64 * 64);
                        if (TB == 0)
                            tma_load4_mc(bh, &mb, &full[s], k0, nh, 0, 0, 3);
                        else
                            tma_load4_mc(bh, &mb, &full[s], nh, k0, 0, 0, 3);
                    } else if (TB == 0) { /* B [n][k] */
                        tma_load4(b, &mb, &full[s], k0, n0, 0, 0);
                    } else { /* B [k][n] */
                        tma_load4(b, &mb, &full[s], n0, k0, 0, 0);
                        if (b2) tma_load4(b + 64 * 64, &mb, &full[s], n0 + 64, k0, 0, 0);
                    }
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
    if (wg == 1) bar_arrive(GM_BAR_TURN, GM_CONS); /* warpgroup 0 goes first */
    const uint32_t a_base = smem_u32(sA), b_base = smem_u32(sB);
    const bool serial = p.dbg & GEMM_SM90_DBG_SERIAL, nostore = p.dbg & GEMM_SM90_DBG_NO_STORE;
    float acc[2][64];
    for (int n = wg, t = b0 + wg * G; t < p.items; n += 2, t += 2 * G) {
        int tm, tn;
        gm_tile<CL>(t, p, rank, tm, tn);
        const int m0 = tm * GM_BM, n0 = tn * GM_BN;
        gm_ring<ST> r; /* load j = n·kt + kb's stage and parity */
        r.at((uint64_t)n * kt);
        const bool start = gm_acc_start<EPI>(acc, p, m0, n0, warp, g, t4);
        reg_fence(acc[0]);
        reg_fence(acc[1]);
        bar_sync(GM_BAR_TURN + wg, GM_CONS);
        for (int kb = 0; kb < kt; ++kb, r.next()) {
            const uint32_t s = r.s;
            mbar_wait(&full[s], r.ph);
            /* descriptors as a base and offsets (sdesc: one add a product, not a mask, shift and
             * or: the loop's instructions were 16 a wgmma, cuBLASLt's ~8) */
            const sdesc sa(a_base + s * SM::T);
            const sdesc sb(b_base + s * SM::T, TB == 0 ? 1024 : 8192); /* [k][n]: atoms 8 KB apart */
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                /* B: [n][k] steps 32 bytes a k16 along its rows; [k][n] 16 rows (2048 bytes),
                 * its two 64-wide n atoms 8 KB apart */
                const uint64_t db = sb.at(TB == 0 ? kk * 32 : kk * 2048);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    /* A: [m][k]: rows 64h.. at 8 KB each half; [k][m]: box h */
                    const uint64_t da = sa.at(h * 8192 + (TA == 0 ? kk * 32 : kk * 2048));
                    wg_ss128<__nv_bfloat16, TA, TB>(acc[h], da, db, start || kb > 0 || kk > 0);
                }
            }
            wg_commit();
            if (kb > 0) {
                wg_wait<1>(); /* load j − 1's wgmma are done */
                gm_release<CL>(&empty[r.prev()], lane, scoped);
            }
        }
        if (t + G < p.items && !serial) bar_arrive(GM_BAR_TURN + 1 - wg, GM_CONS); /* the other's turn */
        wg_wait<0>();
        reg_fence(acc[0]);
        reg_fence(acc[1]);
        if (kt > 0) gm_release<CL>(&empty[r.prev()], lane, scoped); /* the last load's; kt 0: NO_MMA */

        /* epilogue (gemm_sm90.cuh): acc[h] holds rows m0 + 64h .. + 63 */
        gm_epilogue<EPI>(acc, p, m0, n0, warp, g, t4, nostore);
        if (t + G < p.items && serial) bar_arrive(GM_BAR_TURN + 1 - wg, GM_CONS); /* no overlap */
    }
    if (CL > 1) cluster_sync(); /* after this block's last remote arrival: see above */
}

/* ---- host side ------------------------------------------------------------------------------ */

int gm_dbg; /* gemm_sm90_debug's flags (declared in gemm_sm90.cuh) */
int gm_last_blocks; /* blocks of the last launch, either kernel (gemm_sm90_last_blocks) */
extern "C" int gemm_sm90_last_blocks(void) { return gm_last_blocks; }
extern "C" int gemm_sm90_debug(int flags) {
    if (flags & ~63)
        return zr_error("gemm_sm90_debug: flags %d; only the GEMM_SM90_DBG_* bits (0..63) exist", flags);
    gm_dbg = flags;
    return 0;
}

static int gm_cluster = 1; /* gemm_sm90_cluster's setting */
extern "C" int gemm_sm90_cluster(int n) {
    if (n != 1 && n != 2) return zr_error("gemm_sm90_cluster: %d; clusters of 1 or 2 blocks only", n);
    gm_cluster = n;
    return 0;
}

static int gm_stages = 4; /* gemm_sm90_stages' setting */
extern "C" int gemm_sm90_stages(int n) {
    if (n != 4 && n != 6) return zr_error("gemm_sm90_stages: %d; rings of 4 or 6 stages only", n);
    gm_stages = n;
    return 0;
}

extern "C" int gemm_sm90_check(const zr_gemm_desc *g) {
    const char *fn = "gemm_sm90";
    if (g->ab_dtype != ZR_BF16)
        return zr_error("%s: inputs are %s; only bf16 is taken (use cuBLASLt)", fn, zr_dtype_name(g->ab_dtype));
    if (g->batch != 1 || g->alpha != 1.0)
        return zr_error("%s: batch %lld, alpha %g; only one product with alpha 1 is taken (use cuBLASLt)",
                        fn, (long long)g->batch, g->alpha);
    if (g->m <= 0 || g->n <= 0 || g->k <= 0 || g->m % 8 || g->n % 8 || g->k % 8 || g->m > 0x40000000 ||
        g->n > 0x40000000 || g->k > 0x40000000)
        return zr_error("%s: m=%lld n=%lld k=%lld; each must be a positive multiple of 8 below 2^30 (use cuBLASLt)",
                        fn, (long long)g->m, (long long)g->n, (long long)g->k);
    const int64_t arow = g->ta ? g->m : g->k, brow = g->tb ? g->k : g->n;
    if (g->lda % 8 || g->ldb % 8 || g->ldc % 8 || g->lda < arow || g->ldb < brow || g->ldc < g->n)
        return zr_error("%s: lda=%lld ldb=%lld ldc=%lld; each must be a multiple of 8 and hold its row "
                        "(%lld, %lld, %lld) (use cuBLASLt)", fn, (long long)g->lda, (long long)g->ldb,
                        (long long)g->ldc, (long long)arow, (long long)brow, (long long)g->n);
    if (!al16p(g->a) || !al16p(g->b) || !al16p(g->c) || (g->bias && !al16p(g->bias)))
        return zr_error("%s: a, b, c and bias must be 16-byte aligned (use cuBLASLt)", fn);
    if (g->c_dtype == ZR_BF16) {
        if (g->beta != 0.0)
            return zr_error("%s: bf16 output with beta %g; only beta 0 is taken (use cuBLASLt)", fn, g->beta);
        if (g->epilogue == ZR_GEMM_EPI_GELU_AUX) {
            if (!g->aux || !al16p(g->aux) || g->ld_aux % 8 || g->ld_aux < g->n)
                return zr_error("%s: the GELU epilogue needs aux 16-byte aligned with ld_aux (%lld) a "
                                "multiple of 8, at least n (use cuBLASLt)", fn, (long long)g->ld_aux);
        } else if (g->epilogue != ZR_GEMM_EPI_NONE) {
            return zr_error("%s: epilogue %d not taken (none, bias, GELU_AUX only; use cuBLASLt)", fn, g->epilogue);
        }
    } else if (g->c_dtype == ZR_F32) {
        if (g->bias || g->epilogue != ZR_GEMM_EPI_NONE || (g->beta != 0.0 && g->beta != 1.0))
            return zr_error("%s: f32 output takes no bias or epilogue and beta 0 or 1 (beta %g) (use cuBLASLt)",
                            fn, g->beta);
    } else {
        return zr_error("%s: output %s not taken (bf16 or f32; use cuBLASLt)", fn, zr_dtype_name(g->c_dtype));
    }
    if (!attn_sm90_device_ok())
        return zr_error("%s: no compute capability 9.0 device; the wgmma kernel runs on 9.0 only (use cuBLASLt)", fn);
    if (!attn_sm90_tma_ready())
        return zr_error("%s: the driver offers no tensor-map encoder (TMA) (use cuBLASLt)", fn);
    return 0;
}

/* Launches the instantiation on `grid` units (gm_launch_units, gemm_sm90.cuh). */
template <int TA, int TB, int EPI, int CL, int ST>
static int gm_launch(const CUtensorMap &ma, const CUtensorMap &mb, const gm_args &p, int grid,
                     cudaStream_t st) {
    static int smem_set[64], fits[64]; /* per device */
    return gm_launch_units<CL>(gemm_sm90_kernel<TA, TB, EPI, CL, ST>, GM_THR, gm_smem<ST>::BYTES, smem_set,
                               fits, grid, ma, mb, p, st, "gemm_sm90");
}

template <int EPI, int CL, int ST>
static int gm_layouts(int ta, int tb, const CUtensorMap &ma, const CUtensorMap &mb, const gm_args &p,
                      int grid, cudaStream_t st) {
    /* the kernel's TB is wgmma's: 1 = B stored [k][n], which is tb 0 */
    if (!ta && tb) return gm_launch<0, 0, EPI, CL, ST>(ma, mb, p, grid, st);
    if (!ta && !tb) return gm_launch<0, 1, EPI, CL, ST>(ma, mb, p, grid, st);
    if (ta && tb) return gm_launch<1, 0, EPI, CL, ST>(ma, mb, p, grid, st);
    return gm_launch<1, 1, EPI, CL, ST>(ma, mb, p, grid, st);
}

/* Clusters of cl (1, 2), rings of stages (4, 6). */
template <int EPI>
static int gm_variants(int cl, int stages, int ta, int tb, const CUtensorMap &ma, const CUtensorMap &mb,
                       const gm_args &p, int grid, cudaStream_t st) {
    if (cl == 2)
        return stages == 6 ? gm_layouts<EPI, 2, 6>(ta, tb, ma, mb, p, grid, st)
                           : gm_layouts<EPI, 2, 4>(ta, tb, ma, mb, p, grid, st);
    return stages == 6 ? gm_layouts<EPI, 1, 6>(ta, tb, ma, mb, p, grid, st)
                       : gm_layouts<EPI, 1, 4>(ta, tb, ma, mb, p, grid, st);
}

extern "C" int gemm_sm90(const zr_gemm_desc *g, int grid, cudaStream_t stream) {
    if (gemm_sm90_check(g)) return -1;
    CUtensorMap ma, mb;
    gm_args p;
    const int cl = gm_cluster, sts = gm_stages; /* the maps' B box, the arguments' units and the launch agree */
    if (gm_setup(g, GM_BM, GM_BN, cl, "gemm_sm90", ma, mb, p)) return -1;
    const int ta = !!g->ta, tb = !!g->tb;
    if (g->c_dtype == ZR_F32) return gm_variants<GM_EPI_F32>(cl, sts, ta, tb, ma, mb, p, grid, stream);
    if (g->epilogue == ZR_GEMM_EPI_GELU_AUX)
        return gm_variants<GM_EPI_GELU_AUX>(cl, sts, ta, tb, ma, mb, p, grid, stream);
    return gm_variants<GM_EPI_BF16>(cl, sts, ta, tb, ma, mb, p, grid, stream);
}
