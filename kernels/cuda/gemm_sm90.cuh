/* Pieces every Hopper GEMM kernel of ours shares (gemm_sm90.cu: ping-pong 128 x 128 tiles,
 * gemm_sm90_wide.cu: cooperative 128 x 256): the kernel arguments and tile order, the epilogue
 * kinds, operand descriptors, the m64n256k16 wgmma, GELU, the accumulators' start (C or bias) and
 * the epilogues' stores, predicated loads, the host's tensor maps and arguments, and the cluster
 * pieces of both kernels' clusters of 2 (at the end: PTX, the ring's release and wait, the
 * launch). Device code needs sm_90a. */
#ifndef ZR_CUDA_GEMM_SM90_CUH
#define ZR_CUDA_GEMM_SM90_CUH

#include <cuda.h>

#include "attention_sm90.cuh"
#include "attention_sm90.h"
#include "fused_common.cuh"
#include "gemm_sm90.h"

enum { GM_EPI_BF16 = 0, GM_EPI_GELU_AUX = 1, GM_EPI_F32 = 2 };
#define GM_BK 64   /* k a stage: 128-byte swizzled rows, TMA's widest swizzled box */
#define GM_GROUP 8 /* m tiles a group of the tile order (L2 reuse of B) */

/* gemm_sm90_debug's flags (gemm_sm90.cu), which every kernel's host side passes on. */
extern int gm_dbg;
extern int gm_last_blocks; /* gemm_sm90_last_blocks */

struct gm_args {
    void *c, *aux;
    const __nv_bfloat16 *bias; /* NULL: none */
    int64_t ldc, ld_aux;
    /* ntu: m units of CL tiles (a cluster's CTAs take one m tile each); items = ntu · ntn, each
     * one CL x 1 tiles, a cluster's (a block's) work (CL 1, gemm_sm90_wide's only: ntu = ntm, an
     * item one tile) */
    int m, n, ntm, ntn, ntu, kt, items, beta;
    int dbg; /* GEMM_SM90_DBG_* (gemm_sm90.h): timing diagnostics, 0 in use */
};

namespace sm90 {

/* d (64×256, f32: 128 a thread) (+)= A (64×16 from descriptor a) · B (16×256 from descriptor b),
 * bf16: the widest wgmma. TA, TB, acc as wg_ss128's (attention_sm90.cuh). */
template <int TA, int TB>
static __device__ __forceinline__ void wg_ss256(float (&d)[128], uint64_t a, uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
                 "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
                 "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
                 "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "
                 "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "
                 "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
                 "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, "
                 "%123, %124, %125, %126, %127}, %128, %129, p, 1, 1, %131, %132;\n}\n"
                 : ZR_WG_OUT64(d), ZR_WG_OUT64((d + 64))
                 : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB));
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

/* The A part of a stage: output rows m0 .. m0 + 127, k0 .. k0 + 63, into a, completing on bar. A
 * [m][k] (TA 0): one box of 128 rows of 64 k; A [k][m]: two boxes of 64 k rows of 64 m, the second
 * only when a2 (rows m0 + 64 .. start before m; the caller's expect_tx counts 8 KB less without). */
template <int TA>
static __device__ __forceinline__ void gm_load_a(uint16_t *a, const CUtensorMap *ma, uint64_t *bar, int k0,
                                                 int m0, bool a2) {
    if (TA == 0) {
        tma_load4(a, ma, bar, k0, m0, 0, 0);
    } else {
        tma_load4(a, ma, bar, m0, k0, 0, 0);
        if (a2) tma_load4(a + 64 * 64, ma, bar, m0 + 64, k0, 0, 0);
    }
}

/* Work item t (0 .. items − 1) in groups of GM_GROUP m tiles (GM_GROUP / CL m units): a group's
 * items go down its m units first, then along n, so the blocks running at once share B's columns
 * and A's rows in L2. Cluster rank `rank` takes m tile CL · unit + rank (past m when ntm is odd
 * and CL 2: nothing stored). CL 1 (rank 0): the output tile t itself. */
template <int CL>
static __device__ __forceinline__ void gm_tile(int t, const gm_args &p, int rank, int &tm, int &tn) {
    constexpr int GU = GM_GROUP / CL;
    const int per = GU * p.ntn, grp = t / per, first = grp * GU, r = t - grp * per;
    const int gs = min(p.ntu - first, GU);
    tm = (first + r % gs) * CL + rank;
    tn = r / gs;
}
static_assert(GM_GROUP % 2 == 0, "a group holds whole pairs of m tiles");

/* A warpgroup's accumulators: acc[h] is one m64nN wgmma's (N = 2 N4: 128 or 256), rows m0 + 64h
 * .. + 63 of the output, columns n0 .. + N − 1; d[4 nt + e] of acc[h] is row m0 + 64h + 16 warp
 * + g + 8 (e >> 1), column n0 + 8 nt + 2 t4 + (e & 1) (g = lane / 4, t4 = lane % 4). */

/* The accumulators' start for the rows and columns above: C itself for f32 with beta 1, the bias
 * along every row for bf16 with a bias (zeros past n and m: never stored); false, with nothing
 * loaded, when the product starts from 0 (the first wgmma then overwrites). The loads are
 * independent, all issued before anything waits for them (in the ping-pong kernel they land
 * while the warpgroup waits for its turn), not one load → add → store chain each in the epilogue. */
template <int EPI, int H, int N4>
static __device__ __forceinline__ bool gm_acc_start(float (&acc)[H][N4], const gm_args &p, int m0, int n0,
                                                    int warp, int g, int t4) {
    /* every path defines every accumulator, in one basic block (predicated loads, no branches):
     * ptxas serialises all wgmma (C7515) when their accumulators are defined on some paths only */
    const bool on = !(p.dbg & GEMM_SM90_DBG_NO_CLOAD) && (EPI == GM_EPI_F32 ? p.beta : p.bias != nullptr);
#pragma unroll
    for (int nt = 0; nt < N4 / 4; ++nt) {
        const int col = n0 + nt * 8 + t4 * 2;
        if (EPI == GM_EPI_F32) {
#pragma unroll
            for (int h = 0; h < H; ++h)
#pragma unroll
                for (int e2 = 0; e2 < 2; ++e2) {
                    const int row = m0 + h * 64 + warp * 16 + g + e2 * 8;
                    ld_f32x2_or0(acc[h][4 * nt + 2 * e2], acc[h][4 * nt + 2 * e2 + 1],
                                 static_cast<const float *>(p.c) + (int64_t)row * p.ldc + col,
                                 on && col < p.n && row < p.m);
                }
        } else {
            uint32_t bb;
            ld_b32_or0(bb, p.bias + col, on && col < p.n);
            const float b0 = __uint_as_float(bb << 16), b1 = __uint_as_float(bb & 0xffff0000u);
#pragma unroll
            for (int h = 0; h < H; ++h)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[h][4 * nt + e] = e & 1 ? b1 : b0;
        }
    }
    return on;
}

/* The epilogue of the accumulators above (C or the bias already in them): from the registers
 * straight to global memory, masked at m and n, stores only (nothing when nostore). f32: pairs, a
 * row's 4 lanes one 32-byte sector. bf16: per pair of 8-column groups, the quad's 2 rows x 16
 * columns transposed so that each lane stores one 16-byte chunk (a row's 32 bytes: one sector);
 * GELU_AUX stores z to aux and gelu(z) to c (z itself with GEMM_SM90_DBG_NO_GELU). Every lane of
 * the warp must call it (the shuffles). */
template <int EPI, int H, int N4>
static __device__ __forceinline__ void gm_epilogue(const float (&acc)[H][N4], const gm_args &p, int m0, int n0,
                                                   int warp, int g, int t4, bool nostore) {
    if (EPI == GM_EPI_F32) {
#pragma unroll
        for (int nt = 0; nt < N4 / 4; ++nt) {
            const int col = n0 + nt * 8 + t4 * 2;
            if (col >= p.n || nostore) break; /* n a multiple of 8: a pair is in or out */
#pragma unroll
            for (int h = 0; h < H; ++h) {
#pragma unroll
                for (int e2 = 0; e2 < 2; ++e2) {
                    const int row = m0 + h * 64 + warp * 16 + g + e2 * 8;
                    if (row >= p.m) continue;
                    float2 *d = reinterpret_cast<float2 *>(static_cast<float *>(p.c) + (int64_t)row * p.ldc + col);
                    *d = make_float2(acc[h][4 * nt + 2 * e2], acc[h][4 * nt + 2 * e2 + 1]);
                }
            }
        }
    } else {
#pragma unroll
        for (int np = 0; np < N4 / 8; ++np) {
            const int sc = n0 + np * 16 + (t4 & 1) * 8; /* the chunk this lane stores */
#pragma unroll
            for (int h = 0; h < H; ++h) {
                const int row = m0 + h * 64 + warp * 16 + g + 8 * (t4 >> 1);
                const bool st = row < p.m && sc < p.n && !nostore;
                /* z[2i], z[2i + 1]: word i = (row g, group 2np), (g, 2np + 1), (g + 8, 2np),
                 * (g + 8, 2np + 1) */
                float z[8];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int d = 4 * (2 * np + (i & 1)) + 2 * (i >> 1);
                    z[2 * i] = acc[h][d];
                    z[2 * i + 1] = acc[h][d + 1];
                }
                if (EPI == GM_EPI_GELU_AUX) {
                    gm_store_chunk(static_cast<uint16_t *>(p.aux) + (int64_t)row * p.ld_aux + sc, z, t4, st);
                    if (!(p.dbg & GEMM_SM90_DBG_NO_GELU))
#pragma unroll
                        for (int i = 0; i < 8; ++i)
                            z[i] = gm_gelu(z[i]);
                }
                gm_store_chunk(static_cast<uint16_t *>(p.c) + (int64_t)row * p.ldc + sc, z, t4, st);
            }
        }
    }
}

/* Rows r0 .. r1 − 1 of a tile's f32 C (columns n0 .. n0 + cols − 1, cols a multiple of 8: the
 * row's bytes a multiple of 32; ldc a multiple of 8, c 16-byte aligned) fetched into L2 ahead of
 * the accumulator start that loads them (bulk L2 prefetch: no shared memory, no barrier, a hint
 * that changes no result). */
static __device__ __forceinline__ void gm_prefetch_c_rows(const gm_args &p, int r0, int r1, int n0, int cols) {
    const float *c = static_cast<const float *>(p.c);
    for (int r = r0; r < r1; ++r)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(c + (int64_t)r * p.ldc + n0),
                     "r"((uint32_t)cols * 4)
                     : "memory");
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

/* The tensor maps and kernel arguments of g (checked by gemm_sm90_check) for bm x bn output tiles
 * in clusters of cl blocks along m (1 or 2: gm_args' ntu, items): A in boxes of bm rows of 64 k
 * ([m][k]) or of 64 k rows of 64 m ([k][m]), B in boxes of bn / cl rows ([n][k]: with cl 2 each
 * block loads half of the tile's rows) or 64 x 64 ([k][n]). gm_dbg's flags go with the arguments
 * (NO_MMA: no k blocks). Returns -1 with a message naming who when a map cannot be encoded or the
 * tiles are too many. */
static int gm_setup(const zr_gemm_desc *g, int bm, int bn, int cl, const char *who, CUtensorMap &ma,
                    CUtensorMap &mb, gm_args &p) {
    const int ta = !!g->ta, tb = !!g->tb;
    if (gm_map(&ma, g->a, ta ? g->m : g->k, ta ? g->k : g->m, g->lda, ta ? 64 : bm) ||
        gm_map(&mb, g->b, tb ? g->k : g->n, tb ? g->n : g->k, g->ldb, tb ? bn / cl : 64))
        return zr_error("%s: a tensor map (TMA) cannot be encoded for m=%lld n=%lld k=%lld "
                        "lda=%lld ldb=%lld (use cuBLASLt)", who, (long long)g->m, (long long)g->n,
                        (long long)g->k, (long long)g->lda, (long long)g->ldb);
    p.c = g->c, p.aux = g->aux, p.bias = (const __nv_bfloat16 *)g->bias;
    p.ldc = g->ldc, p.ld_aux = g->ld_aux;
    p.m = (int)g->m, p.n = (int)g->n, p.ntm = (p.m + bm - 1) / bm, p.ntn = (p.n + bn - 1) / bn;
    p.ntu = (p.ntm + cl - 1) / cl;
    p.kt = (int)((g->k + GM_BK - 1) / GM_BK), p.beta = g->beta != 0.0, p.dbg = gm_dbg;
    if (gm_dbg & GEMM_SM90_DBG_NO_MMA) p.kt = 0; /* no k blocks: nothing loaded or multiplied */
    if ((int64_t)p.ntm * p.ntn > 0x40000000)
        return zr_error("%s: %lld x %lld output tiles is too many (use cuBLASLt)", who, (long long)p.ntm,
                        (long long)p.ntn);
    p.items = p.ntu * p.ntn;
    return 0;
}

/* The units (blocks, or clusters of cl) to launch: grid 0 for `fit` (as many as run at once), n > 0
 * for at most n blocks (n / cl units, at least 1); never more than the work items. */
static int gm_units(int grid, int cl, int fit, int items) {
    int u = grid > 0 ? (grid / cl > 1 ? grid / cl : 1) : fit;
    return u < items ? u : items;
}

/* Lets kernel kern use bytes of dynamic shared memory, once per device (set: that kernel's own
 * flags, 64 devices); -1 with a message naming who when refused. */
static int gm_smem_limit(const void *kern, int *set, int bytes, const char *who) {
    int dev = 0;
    cudaGetDevice(&dev);
    if (dev >= 0 && dev < 64 && set[dev]) return 0;
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
        return zr_error("%s: %d bytes of shared memory a block refused: %s", who, bytes,
                        cudaGetErrorString(cudaGetLastError()));
    if (dev >= 0 && dev < 64) set[dev] = 1;
    return 0;
}

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
/* Arrives on the mbarrier at b's offset in CTA `cta` of the cluster, release at CTA scope (PTX's
 * default; CUTLASS's ClusterBarrier::arrive(cta_id, pred), which PipelineTmaAsync::consumer_release
 * uses): a ring release, whose stage only the async proxy touches (see gm_release). */
static __device__ __forceinline__ void mbar_arrive_remote(uint64_t *b, uint32_t cta) {
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_u32(b)), "r"(cta)
                 : "memory");
}
/* Arrives (release, cluster scope) on the mbarrier at b's offset in CTA `cta` of the cluster: what
 * session 16's ring used (GEMM_SM90_DBG_CLUSTER_SCOPE brings it back); ptxas puts MEMBAR.ALL.CTA,
 * MEMBAR.ALL.GPU, ERRBAR and CGAERRBAR before the arrive. */
static __device__ __forceinline__ void mbar_arrive_cluster(uint64_t *b, uint32_t cta) {
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_u32(b)),
                 "r"(cta)
                 : "memory");
}
/* mbar_wait with acquire at cluster scope; the retry loop inside the asm. ptxas follows every
 * successful try_wait with CCTL.IVALL (the SM's L1 invalidated): GEMM_SM90_DBG_CLUSTER_SCOPE only. */
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

/* A consumer warp's release of a ring stage, once its wgmma reading it are complete (after
 * wgmma.wait_group, which every lane passes): CL 1, lane 0 arrives on the block's empty barrier;
 * CL 2, lane r on block r's (its own and the peer's: either block's next fill of the stage writes
 * into both blocks' shared memory). One instruction, both lanes at once: no chain of remote
 * arrivals; a stage's empty barrier counts CL x the consumer warps. Release at CTA scope, as
 * CUTLASS: the stage's bytes are written by TMA and read by wgmma only (the async proxy), and the
 * reads are complete (wait_group) before the arrive is issued; the barrier carries no generic-proxy
 * data between the CTAs, so a cluster-scope release would order nothing more, and costs a
 * MEMBAR.ALL.GPU before every release (SASS of session 16's code, which ran the main loop at half
 * rate). scoped (GEMM_SM90_DBG_CLUSTER_SCOPE): that code again, to measure the difference. */
template <int CL>
static __device__ __forceinline__ void gm_release(uint64_t *e, int lane, bool scoped) {
    if (CL == 1) {
        if (lane == 0) mbar_arrive(e);
    } else if (lane < CL) {
        if (scoped)
            mbar_arrive_cluster(e, (uint32_t)lane);
        else
            mbar_arrive_remote(e, (uint32_t)lane);
    }
}
/* The producer's wait for a stage's release (parity as the kernels say): acquire at CTA scope (the
 * TMA it then issues follows the wait in the thread's program order, as in CUTLASS's
 * producer_acquire); scoped: acquire at cluster scope (an L1 invalidate after every wait). */
template <int CL>
static __device__ __forceinline__ void gm_wait_empty(uint64_t *e, uint32_t parity, bool scoped) {
    if (CL > 1 && scoped)
        mbar_wait_cluster(e, parity);
    else
        mbar_wait(e, parity);
}

/* The block's unit (itself, or CL 2 its cluster), the units in the grid, and its rank in the unit. */
template <int CL>
static __device__ __forceinline__ void gm_unit(int &b0, int &G, int &rank) {
    b0 = CL == 1 ? (int)blockIdx.x : (int)cluster_id_x();
    G = CL == 1 ? (int)gridDim.x : (int)cluster_count_x(), rank = CL == 1 ? 0 : (int)cluster_rank();
}
/* The ring's mbarriers: ST full (count 1) and ST empty (count CL x cw, cw the warps that release
 * each use of a stage, one gm_release each: exactly, or a use completes more than one phase), made
 * visible to the block, or with CL 2 to the cluster before any multicast or remote arrival can
 * reach the peer (fence.mbarrier_init, then a cluster barrier). Every thread of the block: the
 * last block-wide barrier. */
template <int CL, int ST>
static __device__ __forceinline__ void gm_ring_init(uint64_t *full, uint64_t *empty, int cw) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < ST; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], CL * cw);
        }
        mbar_init_fence();
    }
    if (CL == 1)
        __syncthreads();
    else
        cluster_sync();
}

/* A ring position: stage s of ST, the parity ph of that stage's use (use u = j / ST of load j:
 * ph = u & 1), and again (u > 0: the producer waits for use u − 1's release, parity ph ^ 1),
 * stepped load by load. Set from a 64-bit load index, so that a count past 2^32 loads (ST not a
 * power of two) cannot put a block's stages out of step. */
template <int ST>
struct gm_ring {
    uint32_t s, ph, again;
    __device__ __forceinline__ void at(uint64_t j) {
        s = (uint32_t)(j % ST), ph = (uint32_t)((j / ST) & 1), again = j >= ST;
    }
    __device__ __forceinline__ void next() {
        if (++s == ST) s = 0, ph ^= 1, again = 1;
    }
    __device__ __forceinline__ uint32_t prev() const { return s ? s - 1 : ST - 1; } /* load j − 1's stage */
};
} /* namespace sm90 */

/* Launches kern (clusters of CL blocks along x when CL > 1, through cudaLaunchKernelEx) on `grid`
 * units (gm_units: 0, as many as fit at once, else at most grid / CL, at least 1), never more
 * than p.items; fits (per device, 0 before the first launch) keeps the units that fit at once:
 * the SMs for CL 1, cudaOccupancyMaxActiveClusters for clusters (an H100/H200's GPCs are not all
 * even: it may be below half the SMs). Sets gm_last_blocks; who names the kernel in errors. */
template <int CL, typename K>
static int gm_launch_units(K kern, int threads, int smem, int *smem_set, int *fits, int grid,
                           const CUtensorMap &ma, const CUtensorMap &mb, const gm_args &p, cudaStream_t st,
                           const char *who) {
    static_assert(CL == 1 || CL == 2, "clusters of 1 or 2 blocks");
    if (gm_smem_limit((const void *)kern, smem_set, smem, who)) return -1;
    int dev = 0;
    cudaGetDevice(&dev);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = CL, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(threads), cfg.dynamicSmemBytes = smem, cfg.stream = st;
    cfg.attrs = at, cfg.numAttrs = 1;
    int fit = dev >= 0 && dev < 64 ? fits[dev] : 0;
    if (!fit) {
        fit = num_sms() / CL;
        if (CL > 1) {
            cfg.gridDim = dim3(CL * fit);
            const cudaError_t e = cudaOccupancyMaxActiveClusters(&fit, kern, &cfg);
            if (e != cudaSuccess || fit < 1)
                return zr_error("%s: no cluster of %d blocks (%d bytes of shared memory each) fits on this "
                                "device: %s", who, CL, smem,
                                e != cudaSuccess ? cudaGetErrorString(cudaGetLastError()) : "0 clusters");
        }
        if (dev >= 0 && dev < 64) fits[dev] = fit;
    }
    const int units = gm_units(grid, CL, fit, p.items);
    gm_last_blocks = CL * units;
    if (CL == 1) {
        kern<<<units, threads, smem, st>>>(ma, mb, p);
    } else {
        cfg.gridDim = dim3(CL * units);
        const cudaError_t e = cudaLaunchKernelEx(&cfg, kern, ma, mb, p);
        if (e != cudaSuccess) {
            cudaGetLastError(); /* not left for the next launch's check */
            return zr_error("%s: cluster launch (%d x %d blocks) failed: %s", who, units, CL, cudaGetErrorString(e));
        }
    }
    return launch_check(who);
}

#endif
