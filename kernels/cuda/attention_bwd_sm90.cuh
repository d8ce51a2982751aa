/* Device code of the Hopper attention backwards (attention_bwd_sm90.cu at head_dim 64,
 * attention_bwd_sm90_d128.cu at 128): the work item and its decoding, P^T from raw scores and lse,
 * the causal mask, dS^T and the dV/dK products' A fragments, the dV/dK and dQ products, the dQ
 * tile's staging for its reduce-add, an L2 prefetch of a TMA box, the dK/dV epilogues; the roles
 * both kernels share (shared memory carving, mbarriers, the producer and dQ warps, a consumer step's
 * end). The persistent grid's order of the work items: attention_sched.h. Same build constraints
 * as attention_sm90.cuh. */
#ifndef ZR_CUDA_ATTENTION_BWD_SM90_CUH
#define ZR_CUDA_ATTENTION_BWD_SM90_CUH

#include <cuda.h>

#include "attention.h"
#include "attention_sched.h"
#include "attention_sm90.cuh"

namespace sm90 {

#define WS_BN 128              /* keys per work item (head_dim 64 and 128) */
#define WS_BM128 64            /* queries per step of the head_dim-128 kernel (64's: WS_BM, 128) */
#define WS_CONS 256            /* two consumer warpgroups */
#define WS_THR (WS_CONS + 128) /* + the producer warpgroup: producer warp, dQ warp, 2 idle */
#define WS_PRODUCER (WS_CONS / 32)
#define WS_DQWARP (WS_PRODUCER + 1)
#define WS_BAR_DS 1 /* named barrier: both warpgroups' dS^T written */

/* A work item: key tile j (WS_BN keys) of kv head hk of batch b, with split `split` of the kv head's
 * query group (query heads h0 .. h0 + Gs − 1; nsplit > 1 when items would be few): niter = Gs·nq
 * steps over the query tiles of BM rows from the key tile's first query on, step it is head
 * h0 + it / nq, query tile (WS_BN / BM)·j + it % nq. With packed sequences (VL; hi: one past the
 * last token of each token's sequence) nq stops at the tile holding the last query of the tile's
 * last key's sequence. */
struct ws_item {
    int j, split, bhk, b, hk, h0, nq, niter;
};
/* Item code x·nT + j (ws_sched_item, attention_sched.h): x = (b·Hkv + hk)·nsplit + split,
 * key tile j (weight rank j: key tile 0, the heaviest, has the most query tiles); nQ: query tiles
 * of BM rows in T. Item counts fit an int: 2^31 items would be 2^31 × 128 query rows, terabytes
 * of Q. */
template <bool VL, int BM>
static __device__ __forceinline__ ws_item ws_decode(int code, int nT, int nQ, int Hkv, int G,
                                                    int nsplit, const int32_t *hi, int T_) {
    static_assert(WS_BN % BM == 0, "query tiles must divide the key tile");
    constexpr int R = WS_BN / BM;
    ws_item t;
    const int x = code / nT;
    t.j = code - x * nT;
    t.split = x % nsplit;
    t.bhk = x / nsplit;
    t.b = t.bhk / Hkv;
    t.hk = t.bhk % Hkv;
    const int Gs = G / nsplit;
    t.h0 = t.hk * G + t.split * Gs;
    t.nq = nQ - R * t.j;
    if (VL) { /* packed sequences: the query tiles up to the end of the last key's sequence */
        const int last = (t.j + 1) * WS_BN < T_ ? (t.j + 1) * WS_BN - 1 : T_ - 1;
        const int qe = (hi[(size_t)t.b * T_ + last] + BM - 1) / BM;
        if (qe - R * t.j < t.nq) t.nq = qe - R * t.j;
    }
    t.niter = Gs * t.nq;
    return t;
}

/* A per-query row vector's values (lse, D) at this thread's 16 query columns of a half (8nt + 2t4
 * and + 1, accumulator layout), from p = the half's first column + 2t4 in shared memory: eight 8-byte
 * loads, issued ahead of the wgmma wait that precedes their use. */
static __device__ __forceinline__ void load_cols(float2 (&v)[8], const float *p) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
        v[nt] = *reinterpret_cast<const float2 *>(p + nt * 8);
}

/* P^T = 2^(S^T·scale_log2 − lse·log2 e) on a warpgroup's 64 keys × 64 queries (accumulator layout:
 * element 4nt + e is query column 8nt + (e & 1) + 2·t4 of the half); nl: −lse·log2 e of this
 * thread's columns (load_cols; attention.cu's prep kernel scales lse, one multiply a row instead of
 * one per row and key tile here). */
static __device__ __forceinline__ void p_tile(float (&st)[32], const float2 (&nl)[8],
                                              float scale_log2) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        st[4 * nt] = ex2(fmaf(st[4 * nt], scale_log2, nl[nt].x));
        st[4 * nt + 1] = ex2(fmaf(st[4 * nt + 1], scale_log2, nl[nt].y));
        st[4 * nt + 2] = ex2(fmaf(st[4 * nt + 2], scale_log2, nl[nt].x));
        st[4 * nt + 3] = ex2(fmaf(st[4 * nt + 3], scale_log2, nl[nt].y));
    }
}

/* Zeroes P^T where the key comes after the query: d = (this thread's first key) − (its first query
 * column), both relative to the tile; element 4nt + e has key + 8·(e >> 1), query + 8nt + (e & 1).
 */
static __device__ __forceinline__ void mask_tile(float (&st)[32], int d) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (d + (e >> 1) * 8 > nt * 8 + (e & 1)) st[4 * nt + e] = 0.f;
}

/* Packed sequences: zeroes P^T where the query lies past the key's sequence: h0, h1 = one past the
 * last query of the sequences of this thread's keys (key, key + 8), less its first query column;
 * layout as mask_tile's. */
static __device__ __forceinline__ void mask_after(float (&st)[32], int h0, int h1) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (nt * 8 + (e & 1) >= ((e >> 1) ? h1 : h0)) st[4 * nt + e] = 0.f;
}

/* A warp's 16 rows wr .. wr + 15 (wr a multiple of 8) of a 64-column tile (accumulator layout,
 * packed by pack_a<T, 4>) into the [row][column] tile at sS (128-byte rows, 128-byte swizzle: the
 * 16-byte chunk k of row r at k ^ (r & 7)) by four stmatrix: the x4 form stores the four 8×8 blocks
 * of a k-step (rows wr.. and wr + 8.., columns 16kc.. and 16kc + 8..) from exactly f[kc][0..3],
 * lane l giving the address of row l % 8 of block l / 8. */
static __device__ __forceinline__ void st_rows16(uint16_t *sS, const uint32_t (&f)[4][4], int wr,
                                                 int lane) {
    const int blk = lane >> 3, rr = lane & 7, row = wr + rr + (blk & 1) * 8;
    /* the 16-byte chunk of columns 16kc + 8(blk >> 1) in row `row` is 2kc ^ x (row & 7 == rr) */
    const int x = (blk >> 1) ^ rr;
    const uint32_t a = smem_u32(sS + row * 64);
#pragma unroll
    for (int kc = 0; kc < 4; ++kc)
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                         a + (((2 * kc) ^ x) << 4)),
                     "r"(f[kc][0]), "r"(f[kc][1]), "r"(f[kc][2]), "r"(f[kc][3])
                     : "memory");
}

/* dS^T = P^T ∘ (dP^T − D) in place of dP^T (d: D of this thread's columns, load_cols; layout as in
 * p_tile); then P^T and dS^T packed into the A fragments of the dV and dK products (pf[kc], sf[kc]:
 * the k-step of queries 16kc..16kc + 15), and dS^T stored for the dQ product into the half's
 * [key][query] tile at sS (128-byte swizzle), the warp's 16 key rows from wr, by four stmatrix: the
 * x4 form stores the four 8×8 blocks of a k-step (rows wr.. and wr + 8.., queries 16kc.. and
 * 16kc + 8..) from exactly the fragments sf[kc][0..3], lane l giving the address of row l % 8 of
 * block l / 8 (16 contiguous bytes of the swizzled row). */
template <typename T>
static __device__ __forceinline__ void ds_pack(float (&dpt)[32], const float (&st)[32],
                                               const float2 (&d)[8], uint32_t (&pf)[4][4],
                                               uint32_t (&sf)[4][4], uint16_t *sS, int wr,
                                               int lane) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            dpt[4 * nt + e] = st[4 * nt + e] * (dpt[4 * nt + e] - ((e & 1) ? d[nt].y : d[nt].x));
    pack_a<T, 4>(pf, st);
    pack_a<T, 4>(sf, dpt);
    st_rows16(sS, sf, wr, lane);
}

/* Issues dV += P^T·dO and dK += dS^T·Q over a half's 64 queries (aO, aQ: the half's first row of
 * the dO and Q tiles) as one commit group, left in flight. */
template <typename T>
static __device__ __forceinline__ void dvdk_issue(float (&dva)[32], float (&dka)[32],
                                                  const uint32_t (&pf)[4][4],
                                                  const uint32_t (&sf)[4][4], uint32_t aO,
                                                  uint32_t aQ) {
    const sdesc dO(aO), dQ(aQ);
    reg_fence(dva);
    reg_fence(dka);
    wg_fence();
#pragma unroll
    for (int kc = 0; kc < 4; ++kc)
        wg_rs64<T, 1>(dva, pf[kc], dO.at(kc * 16 * 128), 1);
#pragma unroll
    for (int kc = 0; kc < 4; ++kc)
        wg_rs64<T, 1>(dka, sf[kc], dQ.at(kc * 16 * 128), 1);
    wg_commit();
}

/* Issues dQ (64 queries × N, overwritten; N 64, or 32 where a narrow head_dim's last 32 columns
 * are TMA's zeros: dq[16..31] left alone) = dS · K over the block's 128 keys as one commit group:
 * aS, the [key][query] half of dS^T holding these queries; aK, the K tile. */
template <typename T, int N = 64>
static __device__ __forceinline__ void dq_issue(float (&dq)[32], uint32_t aS, uint32_t aK) {
    static_assert(N == 64 || N == 32, "dQ products are 64 or 32 columns wide");
    const sdesc dS(aS), dK(aK);
    reg_fence(dq);
    wg_fence();
#pragma unroll
    for (int kc = 0; kc < 8; ++kc) {
        if constexpr (N == 64) wg_ss64<T, 1, 1>(dq, dS.at(kc * 2048), dK.at(kc * 2048), kc);
        else wg_ss32<T, 1, 1>(dq, dS.at(kc * 2048), dK.at(kc * 2048), kc);
    }
    wg_commit();
}

/* A warpgroup's dQ tile (64×64 f32, accumulator layout; this thread's rows warp·16 + g, + 8) into
 * q4 as two 64×32 boxes in the dQ map's 128-byte swizzle (16-byte chunk ^ row % 8) for the TMA
 * reduce-add; one = the first box alone (an n32 product's: dq[16..31] hold nothing). */
static __device__ __forceinline__ void dq_stage(float *q4, const float (&dq)[32], int warp, int g,
                                                int t4, bool one) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        if (nt >= 4 && one) break;
        const int chunk = (nt & 3) * 2 + (t4 >> 1);
#pragma unroll
        for (int hlf = 0; hlf < 2; ++hlf) {
            const int row = warp * 16 + g + 8 * hlf; /* row & 7 == g */
            *reinterpret_cast<float2 *>(q4 + (nt >> 2) * 2048 + row * 32 + ((chunk ^ g) << 2) +
                                        2 * (t4 & 1)) =
                make_float2(dq[4 * nt + 2 * hlf], dq[4 * nt + 2 * hlf + 1]);
        }
    }
}

/* TMA prefetch: the box at coordinates (c0, c1, c2, c3) of the tensor map into L2 (no shared
 * memory, no completion), so that a later tma_load4 of it does not wait for HBM. */
static __device__ __forceinline__ void tma_prefetch4(const void *map, int c0, int c1, int c2,
                                                     int c3) {
    asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(
                     reinterpret_cast<uint64_t>(map)),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

/* Epilogue of a warp's 16 keys wr .. wr + 15 of the item (kw = the first's index in the head), as
 * store_dkv with nsplit == 1, through shared memory: dK (scaled) into the warp's rows of tile sk and
 * dV of tile sv (st_rows16), then read back a 16-byte chunk a lane, 8 lanes a 128-byte row, and
 * stored so (dk, dv: rows 16-byte aligned). store_dkv's 4-byte stores spread each warp instruction
 * over 8 rows; on the H200 they kept the warp ~4,900 cycles an item (session 35: about a fifth of
 * an item at GPT-2's shape). The warp's rows of sk and sv must be free; they are read back
 * before it returns. */
template <typename T>
static __device__ __forceinline__ void
store_dkv_rows(uint16_t *dk, uint16_t *dv, const float (&dka)[32], const float (&dva)[32],
               const zr_attn_strides &sdk, const zr_attn_strides &sdv, int b, int hk, int kw,
               uint16_t *sk, uint16_t *sv, int wr, int T_, float scale, int lane) {
    {
        float ks[32];
        uint32_t f[4][4];
#pragma unroll
        for (int e = 0; e < 32; ++e)
            ks[e] = dka[e] * scale;
        pack_a<T, 4>(f, ks);
        st_rows16(sk, f, wr, lane);
        pack_a<T, 4>(f, dva);
        st_rows16(sv, f, wr, lane);
    }
    __syncwarp();
    uint16_t *gk = dk + b * sdk.sb + hk * sdk.sh, *gv = dv + b * sdv.sb + hk * sdv.sh;
#pragma unroll
    for (int it = 0; it < 4; ++it) {
        const int r = it * 4 + (lane >> 3), k = lane & 7, key = kw + r;
        const int so = (wr + r) * 64 + ((k ^ (r & 7)) << 3); /* (wr + r) & 7 == r & 7 */
        const uint4 xk = *reinterpret_cast<const uint4 *>(sk + so);
        const uint4 xv = *reinterpret_cast<const uint4 *>(sv + so);
        if (key < T_) {
            *reinterpret_cast<uint4 *>(gk + key * sdk.st + k * 8) = xk;
            *reinterpret_cast<uint4 *>(gv + key * sdv.st + k * 8) = xv;
        }
    }
    __syncwarp(); /* every lane's reads done before the warp writes these rows again */
}

/* Epilogue of a warpgroup's 64 keys, columns col0 .. col0 + 63 of DH: this thread's rows key0,
 * key0 + 8 (accumulator layout) of kv head hk of batch b. nsplit == 1: dk (scaled) and dv into
 * their strided outputs, columns below W (a narrow head_dim's rows are W wide); else f32 partials
 * (dk unscaled) at split's slot of ws_dkv, contiguous (B·Hkv, T, DH) each. */
template <typename T, int DH = 64>
static __device__ __forceinline__ void
store_dkv(uint16_t *dk, uint16_t *dv, float *ws_dkv, const float (&dka)[32], const float (&dva)[32],
          const zr_attn_strides &sdk, const zr_attn_strides &sdv, int b, int hk, int bhk, int key0,
          int t4, int T_, int split, int nsplit, int64_t kv_elems, float scale, int col0 = 0,
          int W = DH) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        const int c = col0 + nt * 8 + t4 * 2;
#pragma unroll
        for (int hlf = 0; hlf < 2; ++hlf) {
            const int key = key0 + hlf * 8;
            if (key >= T_) continue;
            const size_t off = ((size_t)bhk * T_ + key) * DH + c; /* contiguous partials */
            const int e = 4 * nt + 2 * hlf;
            if (nsplit == 1) {
                if (c >= W) continue;
                *reinterpret_cast<uint32_t *>(dk + b * sdk.sb + hk * sdk.sh + key * sdk.st + c) =
                    cvt<T>::pack(dka[e] * scale, dka[e + 1] * scale);
                *reinterpret_cast<uint32_t *>(dv + b * sdv.sb + hk * sdv.sh + key * sdv.st + c) =
                    cvt<T>::pack(dva[e], dva[e + 1]);
            } else {
                float *wk = ws_dkv + (size_t)split * kv_elems, *wv = wk + (size_t)nsplit * kv_elems;
                *reinterpret_cast<float2 *>(wk + off) = make_float2(dka[e], dka[e + 1]);
                *reinterpret_cast<float2 *>(wv + off) = make_float2(dva[e], dva[e + 1]);
            }
        }
    }
}

/* A backward kernel's shared memory carved by its layout S (offsets K, V, Q, DO, DS, DQ, L, D, BAR
 * from a 1024-byte boundary) with ST ring stages: the tiles, then the mbarriers consecutive from
 * kvfull (ws_init_bars' order). */
struct ws_bufs {
    uint16_t *sK, *sV, *sQ, *sdO, *sdS;
    float *sdQ, *sL, *sD;
    uint64_t *kvfull, *kvempty, *full, *empty, *dqfull, *dqempty;
};
template <class S, int ST> static __device__ __forceinline__ ws_bufs ws_carve(uint8_t *base) {
    ws_bufs m;
    m.sK = reinterpret_cast<uint16_t *>(base + S::K);
    m.sV = reinterpret_cast<uint16_t *>(base + S::V);
    m.sQ = reinterpret_cast<uint16_t *>(base + S::Q);
    m.sdO = reinterpret_cast<uint16_t *>(base + S::DO);
    m.sdS = reinterpret_cast<uint16_t *>(base + S::DS);
    m.sdQ = reinterpret_cast<float *>(base + S::DQ);
    m.sL = reinterpret_cast<float *>(base + S::L);
    m.sD = reinterpret_cast<float *>(base + S::D);
    m.kvfull = reinterpret_cast<uint64_t *>(base + S::BAR);
    m.kvempty = m.kvfull + 1;
    m.full = m.kvempty + 1;
    m.empty = m.full + ST;
    m.dqfull = m.empty + ST;
    m.dqempty = m.dqfull + 2;
    return m;
}

/* The backward kernels' mbarriers, consecutive from kvfull: kvfull, kvempty, full[ST], empty[ST],
 * dqfull[2], dqempty[2] (their roles: attention_bwd_sm90.cu's kernel comment). Thread 0 alone. */
template <int ST> static __device__ __forceinline__ void ws_init_bars(uint64_t *kvfull) {
    uint64_t *kvempty = kvfull + 1, *full = kvempty + 1, *empty = full + ST, *dqfull = empty + ST,
             *dqempty = dqfull + 2;
    mbar_init(kvfull, 1);
    mbar_init(kvempty, WS_CONS / 32);
    for (int s = 0; s < ST; ++s) {
        mbar_init(&full[s], 1 + 32); /* the expect_tx arrival + one cp.async arrival a lane */
        mbar_init(&empty[s], WS_CONS / 32);
    }
    for (int w = 0; w < 2; ++w) {
        mbar_init(&dqfull[w], 128);
        mbar_init(&dqempty[w], 1);
    }
    mbar_init_fence();
}

/* Operands of the backward kernels' producer and dQ warps: the tensor maps (kernel parameters),
 * −lse·log2 e and D by query row, packed sequences' hi, the schedule and the shape (nQ: query tiles
 * of the kernel's BM rows). */
struct ws_roles {
    const CUtensorMap *tq, *tdo, *tk, *tv, *tdq;
    const float *nl2, *Dd;
    const int32_t *hi;
    int T_, nT, nQ, Hq, Hkv, G, nsplit;
};

/* The producer warp (attention_bwd_sm90.cu's kernel comment) of a kernel with NA 64-column atoms a
 * row (head_dim 64·NA), BM queries a step and ST ring stages: per item K and V (NA boxes each) and
 * an L2 prefetch of the next item's, per step Q and dO (NA boxes each) by TMA and the step's lse and
 * D rows by cp.async. K, V: [NA][WS_BN][64] tiles; Q, dO: ST stages of [NA][BM][64]; lse, D: ST
 * stages of BM floats. */
template <bool VL, int BM, int NA, int ST>
static __device__ __forceinline__ void ws_producer(const ws_roles &a, const ws_sched &sc,
                                                   const ws_bufs &m, int lane) {
    constexpr int R = WS_BN / BM;
    uint16_t *sK = m.sK, *sV = m.sV, *sQ = m.sQ, *sdO = m.sdO;
    float *sL = m.sL, *sD = m.sD;
    uint64_t *kvfull = m.kvfull, *kvempty = m.kvempty, *full = m.full, *empty = m.empty;
    auto load_kv = [&](const ws_item &t) { /* lane 0 */
        mbar_expect_tx(kvfull, 2 * NA * WS_BN * 64 * 2);
        for (int h = 0; h < NA; ++h) {
            tma_load4(sK + h * WS_BN * 64, a.tk, kvfull, 64 * h, t.j * WS_BN, t.hk, t.b);
            tma_load4(sV + h * WS_BN * 64, a.tv, kvfull, 64 * h, t.j * WS_BN, t.hk, t.b);
        }
    };
    int c = 0; /* the block's step */
    for (int r = 0, w; (w = ws_sched_item(sc, r, gridDim.x, blockIdx.x)) >= 0; ++r) {
        const ws_item t = ws_decode<VL, BM>(w, a.nT, a.nQ, a.Hkv, a.G, a.nsplit, a.hi, a.T_);
        if (r == 0 && lane == 0) load_kv(t);
        const int wn = ws_sched_item(sc, r + 1, gridDim.x, blockIdx.x);
        if (wn >= 0 && lane == 0) {
            const ws_item u = ws_decode<VL, BM>(wn, a.nT, a.nQ, a.Hkv, a.G, a.nsplit, a.hi, a.T_);
            for (int h = 0; h < NA; ++h) {
                tma_prefetch4(a.tk, 64 * h, u.j * WS_BN, u.hk, u.b);
                tma_prefetch4(a.tv, 64 * h, u.j * WS_BN, u.hk, u.b);
            }
        }
        for (int it = 0; it < t.niter; ++it, ++c) {
            const int s = c % ST, h = t.h0 + it / t.nq, i = R * t.j + it % t.nq;
            if (c >= ST) mbar_wait(&empty[s], ((c / ST) - 1) & 1);
            if (lane == 0) {
                mbar_expect_tx(&full[s], 2 * NA * BM * 64 * 2);
                for (int x = 0; x < NA; ++x) {
                    tma_load4(sQ + (s * NA + x) * BM * 64, a.tq, &full[s], 64 * x, i * BM, h, t.b);
                    tma_load4(sdO + (s * NA + x) * BM * 64, a.tdo, &full[s], 64 * x, i * BM, h, t.b);
                }
            }
            /* −lse·log2 e and D, zero past T: P = 1 there, but dO = D = 0 so it adds 0 */
            const size_t roff = ((size_t)t.b * a.Hq + h) * a.T_;
#pragma unroll
            for (int m = 0; m < BM / 32; ++m) {
                const int cc = lane + 32 * m, row = i * BM + cc, ok = row < a.T_;
                cp_async4(sL + s * BM + cc, a.nl2 + roff + (ok ? row : 0), ok ? 4 : 0);
                cp_async4(sD + s * BM + cc, a.Dd + roff + (ok ? row : 0), ok ? 4 : 0);
            }
            cp_async_mbar_arrive(&full[s]);
            if (r > 0 && it == 0) {
                /* lane 0 alone waits: lanes 1-31 waiting apart from it could miss a phase (an
                 * item of one step completes kvempty's next phase without them, and a parity wait
                 * two phases behind never returns), then wait at __syncwarp */
                if (lane == 0) {
                    mbar_wait(kvempty, (r - 1) & 1); /* item r − 1 has read K and V */
                    load_kv(t);
                }
                __syncwarp();
            }
        }
    }
    cp_async_wait<0>(); /* no copy of this thread outlives it */
}

/* The dQ warp: per step and consumer warpgroup, waits dqfull[wg], reduce-adds the warpgroup's
 * 64 x 64 f32 tile at sdQ + 4096·wg (two 64 x 32 boxes) into the accumulator and releases it
 * (dqempty[wg]) once read. BM 128 (head_dim 64): the warpgroups' tiles are the step's two 64-query
 * halves; BM 64 (head_dim 128): its query rows' two 64-column halves. Rows past T are skipped by
 * the map; boxes at columns DQW and past (a narrow head_dim's zeros) are not added. */
template <bool VL, int BM, int DQW>
static __device__ __forceinline__ void ws_dq_role(const ws_roles &a, const ws_sched &sc,
                                                  const float *sdQ, uint64_t *dqfull, int lane) {
    constexpr int R = WS_BN / BM;
    uint64_t *dqempty = dqfull + 2;
    int c = 0;
    for (int r = 0, w; (w = ws_sched_item(sc, r, gridDim.x, blockIdx.x)) >= 0; ++r) {
        const ws_item t = ws_decode<VL, BM>(w, a.nT, a.nQ, a.Hkv, a.G, a.nsplit, a.hi, a.T_);
        for (int it = 0; it < t.niter; ++it, ++c) {
            const int h = t.h0 + it / t.nq, i = R * t.j + it % t.nq;
#pragma unroll
            for (int wg = 0; wg < 2; ++wg) {
                mbar_wait(&dqfull[wg], c & 1);
                if (lane == 0) {
                    const int row0 = i * BM + (BM == 128 ? 64 * wg : 0), col0 = BM == 128 ? 0 : 64 * wg;
                    if (row0 < a.T_) {
                        tma_reduce_add4(a.tdq, sdQ + wg * 4096, col0, row0, h, t.b);
                        if (col0 + 32 < DQW) /* a narrow head_dim's last box is all zeros */
                            tma_reduce_add4(a.tdq, sdQ + wg * 4096 + 2048, col0 + 32, row0, h, t.b);
                    }
                    bulk_commit();
                    bulk_wait_read<0>();
                    mbar_arrive(&dqempty[wg]);
                }
                __syncwarp();
            }
        }
    }
    if (lane == 0) bulk_wait<0>(); /* every reduce-add written */
}

/* The producer warpgroup's part of a backward kernel (warps WS_PRODUCER ..): its registers handed
 * back down to NREG a thread (setmaxnreg), then the producer warp's role and the dQ warp's; the two
 * other warps have nothing to do. The caller returns after it. */
template <bool VL, int BM, int NA, int ST, int NREG, int DQW = 128>
static __device__ __forceinline__ void ws_side_roles(int warp_id, const ws_roles &ro,
                                                     const ws_sched &sc, const ws_bufs &m, int lane) {
    reg_dealloc<NREG>();
    if (warp_id == WS_PRODUCER)
        ws_producer<VL, BM, NA, ST>(ro, sc, m, lane);
    else if (warp_id == WS_DQWARP)
        ws_dq_role<VL, BM, DQW>(ro, sc, m.sdQ, m.dqfull, lane);
}

/* The end of a consumer warp's step c (ring stage s) once its dV/dK products are done, the dQ
 * product's group the one left in flight: the stage released (empty[s], one arrival a warp), the
 * dQ warp's read of this warpgroup's buffer and the dQ product waited for, K and V released after
 * the item's last step (last: the dQ product is the last reader of K), dQ staged in the buffer for
 * the dQ warp (dqfull[wg]; one: its first box alone, dq_stage). */
static __device__ __forceinline__ void ws_step_end(float (&dq)[32], const ws_bufs &m, int s, int c,
                                                   bool last, int wg, int warp, int lane,
                                                   bool one = false) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&m.empty[s]);
    if (c > 0) mbar_wait(&m.dqempty[wg], (c - 1) & 1); /* the dQ warp has read our buffer */
    wg_wait<0>();
    reg_fence(dq);
    if (last) {
        __syncwarp();
        if (lane == 0) mbar_arrive(m.kvempty);
    }
    dq_stage(m.sdQ + wg * 4096, dq, warp, lane >> 2, lane & 3, one);
    fence_proxy_async(); /* visible to the TMA unit's reads */
    mbar_arrive(&m.dqfull[wg]);
}

} /* namespace sm90 */

#endif
